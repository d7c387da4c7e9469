"""The shared core that training builds on (``trainables`` imports only this package of the analysis): metric names,
timestep bins, batch-size stages and their learning-rate rules, the GNS estimators, the timestep-sampler
allocations and the range of a worker's device share. Numpy only; nothing here imports another ``analysis``
sub-package."""
