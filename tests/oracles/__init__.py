"""Oracles and simulators with known answers: the noisy quadratic model's closed form (expected loss, ground-truth
B_crit, its allocation and schedule closed forms, simulated sweeps and the adaptive loop on them) and the synthetic
sweeps with known B_crit. Imported by tests and benchmarks, never by the product (analysis/, trainables/,
orchestrator/)."""
