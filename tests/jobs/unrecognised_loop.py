"""A training loop over something dlwatch does not recognise: a plain list of
batches, stepped by a real optimizer. Run under ``dlwatch run``: the job is
listed ("hooked; training … but no loader seen yet") from its first optimizer
step. Prints ``ready {json}`` after the first step; trains for ``--seconds``
(or until ``--stop-file`` exists), with a CPU-heavy step so that its CPU is
measurable (and must count as the job's, not "other processes")."""

import argparse
import json
import os
import time

import torch


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--stop-file")
    a = p.parse_args()
    torch.set_num_threads(1)
    batches = [torch.randn(64, 256) for _ in range(32)]
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    end = time.monotonic() + a.seconds
    said = False
    while time.monotonic() < end and not (a.stop_file and os.path.exists(a.stop_file)):
        for x in batches:
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()
            if not said:
                print("ready " + json.dumps({"pid": os.getpid()}), flush=True)
                said = True


if __name__ == "__main__":
    main()
