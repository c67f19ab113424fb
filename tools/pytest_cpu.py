"""A pytest plugin that writes each test's CPU time, for finding where the
suite's minutes go (docs/development.md):

    PYTHONPATH=tools PYTEST_ADDOPTS="-p pytest_cpu" PYTEST_CPU_OUT=/tmp/cpu.jsonl bash .ci/run
    python tools/pytest_cpu.py /tmp/cpu.jsonl [TOP]   # the total and the top tests

One JSON line per test: its node id, the wall seconds of its setup, call and
teardown, the CPU seconds of the pytest process (``self``) and of the child
processes it waited for (``children``: a job, its DataLoader workers once the
job has reaped them). Processes nobody waits for (orphans, servers such as
sshd or prometheus) are not counted, so the sum is a floor. Under xdist each
worker appends its own lines to the same file (one write per line).
"""

from __future__ import annotations

import json
import os
import resource
import time

import pytest

OUT = os.environ.get("PYTEST_CPU_OUT", "pytest-cpu.jsonl")


def _cpu() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    t0, (own0, kids0) = time.monotonic(), _cpu()
    yield
    (own1, kids1), wall = _cpu(), time.monotonic() - t0
    line = {
        "id": item.nodeid,
        "start": round(time.time() - wall, 2),  # when it began: where a tier's tail idles
        "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
        "wall": round(wall, 2),
        "self": round(own1 - own0, 2),
        "children": round(kids1 - kids0, 2),
    }
    with open(OUT, "a") as f:
        f.write(json.dumps(line) + "\n")


def main(path: str, top: int = 25) -> None:
    """Print the total and the ``top`` tests by CPU of a file written above."""
    rows = [json.loads(line) for line in open(path) if line.strip()]
    for r in rows:
        r["cpu"] = r["self"] + r["children"]
    cpu, wall = sum(r["cpu"] for r in rows), sum(r["wall"] for r in rows)
    print(f"{len(rows)} tests: {cpu:.0f} CPU s in {wall:.0f} s of their own wall time")
    for r in sorted(rows, key=lambda r: -r["cpu"])[:top]:
        print(f"{r['cpu']:7.1f} CPU s {r['wall']:7.1f} s  {r['id']}")


if __name__ == "__main__":
    import sys

    main(sys.argv[1], *(int(a) for a in sys.argv[2:3]))
