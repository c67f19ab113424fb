"""What the notebook panel costs a training loop in the same kernel.

One real Jupyter kernel (nbclient, headless) runs a data-bound loop of 2
workers (CPU-bound samples, so the panel's collector competes for the same
cores) for ``--seconds`` per arm, with the panel off and on, alternated in
ABBA order over ``--pairs`` pairs. The hook is imported in both arms: what is
measured is the panel (the collector child, the reader thread, the display
updates), not the probe, whose cost bench/overhead.py measures.

    .venv/bin/python bench/notebook_cost.py            # 3 pairs of 10 s, about 2 minutes
    .venv/bin/python bench/notebook_cost.py --quick    # 1 pair of 4 s
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import nbclient
import nbformat

CELL = """
import json, time
import psutil
import dlwatch.hook, dlwatch.notebook
import torch
from torch.utils.data import DataLoader, Dataset

class Crunch(Dataset):
    def __len__(self):
        return 10**7
    def __getitem__(self, i):
        s = 0
        for k in range({work}):
            s += k * k
        return torch.full((16,), float(s % 7))

loader = DataLoader(Crunch(), batch_size=4, num_workers=2, persistent_workers=True)
it = iter(loader)
for _ in range(20):
    next(it)

def run(seconds):
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        next(it)
        x = time.perf_counter()
        while time.perf_counter() - x < {step_ms} / 1000:
            pass
        n += 1
    return n / (time.perf_counter() - t0)

rounds = []
for p in range({pairs}):
    order = ("off", "on") if p % 2 == 0 else ("on", "off")
    for arm in order:
        cpu = None
        if arm == "on":
            dlwatch.notebook.show()
            time.sleep(2.0)  # the collector has connected and is sampling
            feed = psutil.Process(dlwatch.notebook.current().proc.pid)
            c0, w0 = sum(feed.cpu_times()[:2]), time.perf_counter()
        rate = run({seconds})
        if arm == "on":
            cpu = (sum(feed.cpu_times()[:2]) - c0) / (time.perf_counter() - w0)
            dlwatch.notebook.stop()
        rounds.append((arm, rate, cpu))
print("RESULT " + json.dumps(rounds))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--work", type=int, default=20000, help="Python loop iterations per sample")
    ap.add_argument("--step-ms", type=float, default=5.0)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.seconds, args.pairs = 4.0, 1
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(
            CELL.format(work=args.work, step_ms=args.step_ms, pairs=args.pairs, seconds=args.seconds)
        )
    ]
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3").execute()
    text = "".join(o.get("text", "") for o in nb.cells[0].outputs if o.get("output_type") == "stream")
    line = next((ln for ln in text.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        print("no result from the kernel:\n" + text, file=sys.stderr)
        return 1
    rounds = json.loads(line[len("RESULT ") :])
    off = [r for a, r, _ in rounds if a == "off"]
    on = [r for a, r, _ in rounds if a == "on"]
    cpu = [c for a, _, c in rounds if a == "on"]
    ratios = [b / a for a, b in zip(off, on)]
    print(f"{'arm':<10}{'batches/s per run':<40}{'median':>10}")
    print(f"{'panel off':<10}{' '.join(f'{r:.1f}' for r in off):<40}{statistics.median(off):>10.1f}")
    print(f"{'panel on':<10}{' '.join(f'{r:.1f}' for r in on):<40}{statistics.median(on):>10.1f}")
    pairs = " ".join(f"{r:.3f}" for r in ratios)
    print(f"on/off ratio per pair: {pairs}; median {statistics.median(ratios):.3f}")
    core = statistics.median(cpu) * 100
    print(f"the panel's collector used {core:.1f} % of one core (median of the 'on' runs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
