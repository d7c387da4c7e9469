"""Datasets of the trial: the shipped digits, packed latent stores and fast-DiT latent folders."""

from trainables.data.base import Dataset, DatasetError, dataset_error_in
from trainables.data.datasets import describe_dataset, load_dataset

__all__ = ["Dataset", "DatasetError", "dataset_error_in", "describe_dataset", "load_dataset"]
