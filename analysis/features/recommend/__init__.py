"""`bcrit recommend`: a batch size / workers / accumulation split from the answer and the throughput model, and its
report."""
