"""From runs to numbers: steps-to-target, the Pareto fit and B_crit with its bootstrap interval, the trust flags,
the GNS views at a target, bands and the headline answer."""
