"""A torchrun-launched loop (no process group needed): each rank iterates a
DataLoader until the stop file appears."""

import os
import sys
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

if __name__ == "__main__":
    stop = sys.argv[1]
    dl = DataLoader(TensorDataset(torch.arange(64).float()), batch_size=4)
    deadline = time.monotonic() + 60
    while not os.path.exists(stop) and time.monotonic() < deadline:
        for _ in dl:
            time.sleep(0.01)
