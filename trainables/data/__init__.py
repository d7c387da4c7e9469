"""Datasets of the trial: the shipped digits, and fast-DiT latent folders."""

from trainables.data.datasets import Dataset, DatasetError, describe_dataset, load_dataset

__all__ = ["Dataset", "DatasetError", "describe_dataset", "load_dataset"]
