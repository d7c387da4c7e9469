"""The shared core that training builds on (``trainables`` imports only this package of the analysis): metric names,
timestep bins, batch-size stages and their learning-rate rules, the GNS estimators and the timestep-sampler
allocations. Numpy only; nothing here imports another ``analysis`` sub-package."""
