"""The notebook the notebook tests and bench/notebook_cost.py execute.

``build(...)`` returns an nbformat notebook: a cell that starts the panel, a
cell with a data-bound loop of 2 workers that measures its own data wait, and a
cell that stops the panel. The loop's cell prints one JSON line of its own
figures, which the test compares with what the saved panel shows.
"""

from __future__ import annotations

import nbformat

LOOP = '''
import json, os, time
import torch
from torch.utils.data import DataLoader, Dataset

class SlowReads(Dataset):
    """Each sample waits {sample_ms} ms (storage-like) and costs a little CPU."""
    def __len__(self):
        return 100_000
    def __getitem__(self, i):
        time.sleep({sample_ms} / 1000)
        return torch.full((16,), float(i))

loader = DataLoader(SlowReads(), batch_size={batch_size}, num_workers=2, persistent_workers=True)
wait = 0.0
n = 0
t0 = time.perf_counter()
it = iter(loader)
while time.perf_counter() - t0 < {seconds}:
    a = time.perf_counter()
    batch = next(it)
    wait += time.perf_counter() - a
    x = time.perf_counter()
    while time.perf_counter() - x < {step_ms} / 1000:  # the model's step
        pass
    n += 1
total = time.perf_counter() - t0
print(json.dumps({{"own_wait": wait / total, "batches": n, "batches_per_s": n / total}}))
'''

# The same cell goes on idle after training (an eval, a sleep, a print).
TAIL = """
time.sleep({idle_s})
print("idle for {idle_s} s after training")
"""


def build(
    seconds: float = 12.0,
    sample_ms: float = 10.0,
    batch_size: int = 4,
    step_ms: float = 12.0,
    panel: str = "%load_ext dlwatch\n%dlwatch",
    idle_s: float = 0.0,
    tail_idle_s: float = 0.0,
    stop: bool = True,
) -> nbformat.NotebookNode:
    """``idle_s``: a cell that sleeps after the loop's; ``tail_idle_s``: the
    loop's own cell sleeps after training; ``stop``: a last cell runs
    ``%dlwatch stop`` (without it the panel is saved as the loop left it)."""
    nb = nbformat.v4.new_notebook()
    cells = [nbformat.v4.new_code_cell(panel)]
    cells.append(
        nbformat.v4.new_code_cell(
            LOOP.format(seconds=seconds, sample_ms=sample_ms, batch_size=batch_size, step_ms=step_ms)
            + (TAIL.format(idle_s=tail_idle_s) if tail_idle_s else "")
        )
    )
    if idle_s:
        cells.append(nbformat.v4.new_code_cell(f"import time; time.sleep({idle_s})"))
    if stop:
        cells.append(_stop_cell())
    nb.cells = cells
    return nb


def _stop_cell() -> nbformat.NotebookNode:
    return nbformat.v4.new_code_cell(
        "import json, dlwatch.notebook\n%dlwatch stop\n"
        "s = dlwatch.notebook.current()\n"
        "print(json.dumps({'frames_by_state': s.frames_by_state, 'state': s.state, 'error': s.error}))"
    )
