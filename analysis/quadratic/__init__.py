"""The noisy quadratic model: closed-form expected losses, its ground-truth B_crit (through the same fit as measured
runs), simulated sweeps, and its sampler-allocation and batch-schedule closed forms. The known answer every
estimator and the ``quadratic`` workload are tested against."""
