"""From runs to numbers: steps-to-target, the Pareto fit and B_crit with its bootstrap interval, the trust flags,
the GNS views at a target, throughput, the branched-study estimator and the headline answer."""
