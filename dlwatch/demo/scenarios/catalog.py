"""Named demo workloads, each built to make one input-pipeline problem visible.

A scenario is only an argument list for ``demo/train.py``; extra flags given on
the command line after ``--scenario NAME`` override it (argparse keeps the last
value). The numbers are tuned for the reference 2-core box with torch on CPU:
there the step is a sleep standing in for accelerator work, so the training
process leaves the cores to the workers, as it would while a GPU computes.

Scenarios run until stopped (``--epochs 0``) unless ``--duration`` is given.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Scenario", "SCENARIOS", "DEFAULT_SCENARIO", "scenario_args"]


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    args: tuple[str, ...]
    # The hint id this scenario is designed to show (docs/hints/index.md),
    # None where the outcome depends on the box (data-bound) or none is wanted.
    hint: str | None = None


# A demo runs until its launcher stops it; --duration on the command line wins.
_RUN_FOREVER = ("--epochs", "0")


def _s(name: str, description: str, args: str, hint: str | None = None) -> Scenario:
    """``args``: the flags as one string, split on whitespace (no value has a space)."""
    return Scenario(name, description, _RUN_FOREVER + tuple(args.split()), hint)


_CATALOG = [
    _s(
        "data-bound",
        "2 workers spend ~60 ms of CPU per batch, the step takes 15 ms: "
        "the loop waits for data about half the time",
        "--num-workers 2 --batch-size 32 --dataset-size 4096 --sample-ms 1.9 --cost-kind "
        "cpu --sample-jitter 0.2 --step-ms 15 --persistent-workers",
    ),
    _s(
        "healthy",
        "2 persistent workers at ~50 % load keep the queue full for a 40 ms step: "
        "almost no data wait, nothing to fix",
        # The step is longer than elsewhere because receiving a batch from a
        # worker costs the loop ~1-1.5 ms on the reference box even when it is
        # ready; against 40 ms that floor stays at a few percent.
        "--num-workers 2 --batch-size 32 --dataset-size 4096 --sample-ms 1.2 --cost-kind "
        "cpu --sample-jitter 0.1 --step-ms 40 --persistent-workers --pin-memory",
    ),
    _s(
        "no-workers",
        "num_workers=0: the training loop loads every batch itself (16 ms of loading per 15 ms step)",
        "--num-workers 0 --batch-size 32 --dataset-size 4096 --sample-ms 0.5 --cost-kind cpu --step-ms 15",
        hint="no-workers",
    ),
    _s(
        "add-workers",
        "1 worker spends 40 ms of CPU per batch, the step takes 10 ms: Little's law "
        "says 4 workers; the free cores say how many fit",
        "--num-workers 1 --batch-size 32 --dataset-size 4096 --sample-ms 1.25 --cost-kind "
        "cpu --step-ms 10 --persistent-workers",
        hint="add-workers",
    ),
    _s(
        "io-bound",
        "4 workers mostly wait on slow reads (160 ms per batch, little CPU) "
        "for a 10 ms step: more workers or caching help past the core count",
        "--num-workers 4 --batch-size 32 --dataset-size 4096 --sample-ms 5 --cost-kind "
        "sleep --sample-jitter 0.3 --step-ms 10 --persistent-workers",
        hint="io-bound",
    ),
    _s(
        "cpu-bound-preprocessing",
        "2 workers saturate both cores with ~100 ms of augmentation per batch "
        "for a 10 ms step: more workers cannot help",
        "--num-workers 2 --batch-size 32 --dataset-size 4096 --sample-ms 3 --cost-kind "
        "cpu --step-ms 10 --persistent-workers",
        hint="cpu-bound-preprocessing",
    ),
    _s(
        "workers-oversubscribe-cores",
        "6 CPU-bound workers fight over 2 cores: each batch takes longer, throughput does not improve",
        "--num-workers 6 --batch-size 32 --dataset-size 4096 --sample-ms 1.5 --cost-kind "
        "cpu --step-ms 10 --persistent-workers",
        hint="workers-oversubscribe-cores",
    ),
    _s(
        "worker-thread-oversubscription",
        "each of 2 workers runs a 4-thread intra-op pool (like OpenCV/BLAS "
        "defaults): 8 busy threads on 2 cores",
        "--num-workers 2 --batch-size 32 --dataset-size 4096 --sample-ms 1 --cost-kind "
        "cpu --worker-threads 4 --step-ms 15 --persistent-workers",
        hint="worker-thread-oversubscription",
    ),
    _s(
        "enable-persistent-workers",
        "spawned, non-persistent workers are restarted every 8-batch epoch: "
        "seconds of stall per epoch against ~0.1 s of work",
        "--num-workers 2 --batch-size 32 --dataset-size 256 --sample-ms 0.2 --cost-kind "
        "cpu --step-ms 10 --start-method spawn --no-persistent-workers",
        hint="enable-persistent-workers",
    ),
    _s(
        "worker-memory-growth",
        "forked workers read a dataset of Python objects (copy-on-read, 8 KiB per "
        "sample) and keep 16 KiB per batch: worker USS climbs",
        "--num-workers 2 --batch-size 32 --dataset-size 20000 --sample-ms 0.3 --cost-kind "
        "sleep --step-ms 20 --start-method fork --persistent-workers "
        "--leak-bytes-per-sample 8192 --grow-bytes-per-batch 16384",
        hint="worker-memory-growth",
    ),
    _s(
        "pipeline-has-headroom",
        "4 workers make cheap batches (3 ms) for a slow 50 ms step: "
        "the queue stays full and the workers idle",
        "--num-workers 4 --batch-size 32 --dataset-size 4096 --sample-ms 0.1 --cost-kind "
        "cpu --step-ms 50 --persistent-workers",
        hint="pipeline-has-headroom",
    ),
    _s(
        "enable-pin-memory",
        "batches of 64 224x224 images (38 MiB) are copied to the GPU from pageable "
        "memory (only meaningful with CUDA; on CPU it runs like healthy)",
        "--num-workers 2 --batch-size 64 --dataset-size 4096 --sample-ms 0.3 --cost-kind "
        "cpu --step-ms 20 --persistent-workers --no-pin-memory --device auto --image-size 224",
        hint="enable-pin-memory",
    ),
    _s(
        "main-loop-cpu-bound",
        "data is ready but the step itself burns the training thread's CPU "
        "(launch overhead stand-in): the GPU would sit idle",
        "--num-workers 2 --batch-size 32 --dataset-size 4096 --sample-ms 0.2 --cost-kind "
        "cpu --step-ms 20 --step-kind cpu --persistent-workers",
        hint="main-loop-cpu-bound",
    ),
]

SCENARIOS: dict[str, Scenario] = {s.name: s for s in _CATALOG}
DEFAULT_SCENARIO = "data-bound"


def scenario_args(name: str) -> list[str]:
    """The argument list of scenario ``name``; KeyError names the known ones."""
    try:
        return list(SCENARIOS[name].args)
    except KeyError:
        raise KeyError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}") from None
