"""A training loop that refuses to run twice with the same ``--name`` (as
OpenCLIP does: "Experiment already exists" once logs/<name> is there), for
``dlwatch tune``'s ``{trial}`` field. Runs until stopped."""

import argparse
import os
import sys
import time

from torch.utils.data import DataLoader
from tune_crash_job import Sleepy  # the same sleeping samples (the job's own folder is on sys.path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", required=True)
    ap.add_argument("--logs", required=True)
    args = ap.parse_args()
    path = os.path.join(args.logs, args.name)
    if os.path.exists(path):
        print("Error. Experiment already exists. Use --name to specify a new experiment.", file=sys.stderr)
        sys.exit(1)
    os.makedirs(path)
    loader = DataLoader(Sleepy(), batch_size=4, num_workers=1)
    while True:
        for _ in loader:
            time.sleep(0.002)


if __name__ == "__main__":
    main()
