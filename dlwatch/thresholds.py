"""The loader thresholds that the diagnosis, ``dlwatch tune`` and autotune
share: when a loop is data-bound, when workers are CPU- vs I/O-bound, and how
many workers Little's law asks for.

stdlib only, in the lowest layer: the probe's autotune (inside the training
job) decides by the same numbers as the hints and the tuner.
"""

from __future__ import annotations

import math

# Loop time spent waiting for data above which the job is "data-bound". docs/hints/index.md
# says "material (≥ 5–10 %)"; 10 % is where a fix buys a visible speed-up and
# epoch-boundary noise no longer matters.
DATA_BOUND_WAIT = 0.10
# Mean worker busy fraction from which the workers are "the limit": above it a
# worker hardly ever sits idle waiting for the next index (RULES.md: ~0.8). The
# hooked rules (rules_workers) and the attached ones (rules_sampled) share it.
WORKERS_SATURATED_BUSY = 0.80
# Share of busy time a worker spends on a CPU from which loading counts as
# CPU-bound; below it the worker mostly sleeps inside fetch (I/O). The catalog's
# io-bound example is "CPU < 50 % of busy time"; one boundary keeps the two
# hints mutually exclusive.
CPU_BOUND_MIN_SHARE = 0.50
# Multiplier on the Little's-law ratio. 1.0: the fetch time is measured under
# the current contention and the prefetch queue (prefetch_factor batches per
# worker) already absorbs jitter, so the plain ratio is the honest minimum; the
# 40 ms / 10 ms -> 4 workers example of docs/overview.md holds exactly.
LITTLE_SAFETY = 1.0
# Sanity ceiling for the uncapped I/O-bound recommendation: a tiny step time
# must not turn into "use 400 workers" (every worker costs memory and a pid).
IO_MAX_RECOMMENDED_WORKERS = 64


def ceil_ratio(a: float, b: float) -> int:
    # 0.7 / 0.1 is 6.999999999999999 and 0.3 / 0.1 is 2.9999999999999996 in
    # binary floating point: a tolerance keeps exact ratios exact (40/10 -> 4).
    return max(0, math.ceil(a / b - 1e-9))


def little_workers(worker_ms: float, step_ms: float) -> int:
    """Workers needed so the pool delivers a batch every ``step_ms``."""
    return max(1, ceil_ratio(worker_ms * LITTLE_SAFETY, step_ms))
