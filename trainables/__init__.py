"""bcrit.trainables: one DiT training trial (Ray Train TorchTrainer, DDP), built on `analysis`."""
