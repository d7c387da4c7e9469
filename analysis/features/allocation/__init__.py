"""`bcrit allocate`: the timestep-sampler comparison, its paired ratios and its view."""
