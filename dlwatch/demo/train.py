"""A small, real PyTorch training run whose input pipeline can be made slow on purpose.

It is dlwatch's demo and its end-to-end test workload: every cost is a flag, so
a test can build a job with a known data-wait fraction, worker load or memory
growth, and compare what the monitor shows with what the loop measured itself
(``--report``).

    python demo/train.py --num-workers 2 --sample-ms 2 --step-ms 15 --report r.json
    python -m dlwatch.demo.train --scenario data-bound
    dlwatch run -- python -m dlwatch.demo.train --scenario io-bound

Instrumentation is never imported here unless ``--hook`` asks for it, so the
demo also serves as the "without dlwatch" side of comparisons.

This module is the command line; the datasets, costs and model are in
``workload.py``, the loop and its measurements in ``loop.py``. It runs as a
module or as a script by path (its siblings are then imported from its folder).
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

# torch warns on every import (workers included) when NumPy is absent; the demo
# never uses NumPy, so the warning is noise on the user's terminal.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
warnings.filterwarnings("ignore", message=".*pin_memory.*no accelerator is found")

import torch  # noqa: E402
from torch.utils.data import DataLoader, Dataset, IterableDataset  # noqa: E402

# The checker reads the package form; the script form names the same files.
if TYPE_CHECKING or __package__:
    from . import loop, workload
else:  # run as a script: this file's folder is sys.path[0]
    import loop
    import workload

if TYPE_CHECKING:
    from .scenarios import Scenario

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2


# --------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------


def _nonneg_float(text: str) -> float:
    value = float(text)
    if not value >= 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def _pos_float(text: str) -> float:
    value = _nonneg_float(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return value


def _nonneg_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _pos_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return value


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be within 0..1, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m dlwatch.demo.train",
        description="Synthetic training job with a tunable input pipeline (dlwatch demo and test workload).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    bool_flag = argparse.BooleanOptionalAction
    g = p.add_argument_group("scenario")
    g.add_argument(
        "--scenario",
        metavar="NAME",
        help="start from a named scenario's flags; flags given here override them",
    )
    g.add_argument("--list-scenarios", action="store_true", help="print the scenarios and exit")

    g = p.add_argument_group("dataset")
    g.add_argument("--dataset-size", type=_pos_int, default=2048)
    g.add_argument("--image-size", type=_pos_int, default=32)
    g.add_argument(
        "--iterable",
        action=bool_flag,
        default=False,
        help="IterableDataset sharded by worker instead of a map-style dataset",
    )
    g.add_argument("--sample-ms", type=_nonneg_float, default=0.0, help="extra cost of producing one sample")
    g.add_argument(
        "--cost-kind",
        choices=("sleep", "cpu", "mixed"),
        default="cpu",
        help="sleep: off-CPU like storage reads; cpu: single-threaded work "
        "(budgeted in CPU time, so contention stretches it); mixed: half each",
    )
    g.add_argument(
        "--sample-jitter",
        type=_fraction,
        default=0.0,
        help="per-sample cost varies uniformly by +- this fraction",
    )
    g.add_argument(
        "--batch-cost-ms", type=_nonneg_float, default=0.0, help="extra fixed cost per batch, paid in collate"
    )
    g.add_argument(
        "--worker-threads",
        type=_pos_int,
        default=None,
        help="give each worker an intra-op pool of N threads and do the CPU "
        "cost as parallel ops (thread oversubscription)",
    )
    g.add_argument(
        "--leak-bytes-per-sample",
        type=_nonneg_int,
        default=0,
        help="dataset holds this many bytes of small Python objects per "
        "sample and reads them (copy-on-read growth in forked workers)",
    )
    g.add_argument(
        "--grow-bytes-per-batch",
        type=_nonneg_int,
        default=0,
        help="each worker keeps this many bytes per batch it builds",
    )
    g.add_argument(
        "--grow-limit-bytes",
        type=_nonneg_int,
        default=256 << 20,
        help="stop growing a worker past this many kept bytes",
    )

    g = p.add_argument_group("DataLoader")
    g.add_argument("--num-workers", type=_nonneg_int, default=2)
    g.add_argument("--batch-size", type=_pos_int, default=32)
    g.add_argument("--pin-memory", action=bool_flag, default=None, help="default: on when the device is CUDA")
    g.add_argument("--persistent-workers", action=bool_flag, default=False)
    g.add_argument("--prefetch-factor", type=_pos_int, default=None, help="default: torch's (2)")
    g.add_argument(
        "--start-method",
        choices=("fork", "spawn", "forkserver"),
        default=None,
        help="worker multiprocessing context (default: the platform's)",
    )
    g.add_argument("--shuffle", action=bool_flag, default=True)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--drop-last", action=bool_flag, default=False)

    g = p.add_argument_group("model and step")
    g.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    g.add_argument(
        "--step-ms",
        type=_nonneg_float,
        default=0.0,
        help="target time of one training step (0: the real model's time)",
    )
    g.add_argument(
        "--step-kind",
        choices=("auto", "sleep", "cpu", "gpu"),
        default="auto",
        help="how a step is padded to --step-ms: sleep (off-CPU, like waiting "
        "on a GPU), cpu (busy main thread), gpu (spin kernel); "
        "auto: gpu on CUDA, else sleep",
    )
    g.add_argument(
        "--step-threads",
        type=_pos_int,
        default=None,
        help="with --step-kind cpu: the step is N x --step-ms of CPU work on torch's intra-op "
        "pool of N threads (a CPU training step: other processes on the cores stretch it)",
    )

    g = p.add_argument_group("run")
    g.add_argument("--epochs", type=_nonneg_int, default=2, help="0: until stopped")
    g.add_argument("--steps-per-epoch", type=_pos_int, default=None)
    g.add_argument(
        "--duration", type=_pos_float, default=None, help="stop after this many seconds (checked every step)"
    )
    g.add_argument(
        "--val", action=bool_flag, default=False, help="also iterate a validation loader after each epoch"
    )
    g.add_argument(
        "--val-size",
        type=_pos_int,
        default=None,
        help="validation samples (default: a fifth of --dataset-size)",
    )

    g = p.add_argument_group("output")
    g.add_argument("--report", metavar="PATH", help="write the loop's own measurements as JSON")
    g.add_argument(
        "--report-interval",
        type=_pos_float,
        default=None,
        metavar="S",
        help="also rewrite the report every S seconds (atomically)",
    )
    g.add_argument(
        "--checksum-batches",
        type=_nonneg_int,
        default=8,
        help="hash the first N training batches into the report's checksum",
    )
    g.add_argument("--hook", action="store_true", help="import dlwatch.hook before building the loaders")
    g.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    return p


def _scenarios() -> tuple[dict[str, Scenario], str]:
    if TYPE_CHECKING or __package__:
        from .scenarios import DEFAULT_SCENARIO, SCENARIOS
    else:
        # Run as a script: this file's folder is sys.path[0].
        from scenarios import DEFAULT_SCENARIO, SCENARIOS
    return SCENARIOS, DEFAULT_SCENARIO


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = build_parser()
    first = parser.parse_args(argv)
    if first.list_scenarios:
        return first
    if first.scenario is None:
        return first
    scenarios, _ = _scenarios()
    if first.scenario not in scenarios:
        parser.error(f"unknown scenario {first.scenario!r}; known: {', '.join(scenarios)}")
    # Scenario first, then the user's flags: argparse keeps the last value.
    args = parser.parse_args(list(scenarios[first.scenario].args) + argv)
    return args


def list_scenarios() -> str:
    scenarios, default = _scenarios()
    width = max(map(len, scenarios))
    lines = []
    for s in scenarios.values():
        mark = " (default demo)" if s.name == default else ""
        lines.append(f"{s.name:<{width}}  {s.description}{mark}")
        lines.append(f"{'':<{width}}  args: {' '.join(s.args)}")
    return "\n".join(lines)


def _log(args: argparse.Namespace, message: str) -> None:
    if not args.quiet:
        print(f"[demo {os.getpid()}] {message}", file=sys.stderr, flush=True)


def _import_hook() -> str | None:
    try:
        import dlwatch.hook  # noqa: F401
    except ModuleNotFoundError as e:
        if e.name in ("dlwatch", "dlwatch.hook"):
            return (
                f"--hook: cannot import dlwatch.hook ({e}). Install dlwatch in this "
                "environment (pip install -e .), or instrument from outside with "
                "`dlwatch run -- python -m dlwatch.demo.train ...`."
            )
        raise
    return None


def make_loader(
    args: argparse.Namespace,
    dataset: Dataset[Any],
    collate: Callable[[list[Any]], Any],
    worker_init: Callable[[int], None],
    generator: torch.Generator | None,
    shuffle: bool,
    pin_memory: bool,
) -> DataLoader[Any]:
    kwargs: dict[str, Any] = dict(
        batch_size=args.batch_size,
        drop_last=args.drop_last,
        pin_memory=pin_memory,
        collate_fn=collate,
        num_workers=args.num_workers,
    )
    if not isinstance(dataset, IterableDataset):
        kwargs.update(shuffle=shuffle, generator=generator)
    if args.num_workers > 0:
        kwargs.update(persistent_workers=args.persistent_workers, worker_init_fn=worker_init)
        if args.prefetch_factor is not None:
            kwargs["prefetch_factor"] = args.prefetch_factor
        if args.start_method is not None:
            kwargs["multiprocessing_context"] = args.start_method
    return DataLoader(dataset, **kwargs)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.list_scenarios:
        print(list_scenarios())
        return EXIT_OK

    if args.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    elif args.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda, but torch sees no CUDA device", file=sys.stderr)
        return EXIT_USAGE
    else:
        device = torch.device(args.device)
    step_kind = args.step_kind
    if step_kind == "auto":
        step_kind = "gpu" if device.type == "cuda" else "sleep"
    if step_kind == "gpu" and device.type != "cuda":
        print("error: --step-kind gpu needs a CUDA device", file=sys.stderr)
        return EXIT_USAGE
    pin_memory = device.type == "cuda" if args.pin_memory is None else args.pin_memory
    if args.num_workers == 0:
        ignored = [
            flag
            for flag, on in (
                ("--persistent-workers", args.persistent_workers),
                ("--prefetch-factor", args.prefetch_factor is not None),
                ("--start-method", args.start_method is not None),
            )
            if on
        ]
        if ignored:
            _log(args, f"num_workers=0: ignoring {', '.join(ignored)}")

    # The model is tiny and its time is set by --step-ms; an intra-op pool
    # would only add overhead (tens of ms per step on 2 cores) and compete with
    # the workers whose load the demo is meant to show. Without workers the
    # trainer is the one loading data, so --worker-threads applies to it.
    threads = args.worker_threads if args.num_workers == 0 and args.worker_threads else 1
    torch.set_num_threads(args.step_threads or threads)

    if args.hook:
        problem = _import_hook()
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            return EXIT_ERROR

    torch.manual_seed(args.seed)
    cost = workload.CostSpec(args.sample_ms, args.cost_kind, args.worker_threads or 1)
    spec = workload.DataSpec(
        size=args.dataset_size,
        image_size=args.image_size,
        seed=args.seed,
        cost=cost,
        jitter=args.sample_jitter,
        leak_bytes_per_sample=args.leak_bytes_per_sample,
        shuffle=args.shuffle,
    )
    dataset_cls = workload.SyntheticImageStream if args.iterable else workload.SyntheticImages
    train_set = dataset_cls(spec)
    collate = workload.DemoCollate(cost, args.batch_cost_ms, args.grow_bytes_per_batch, args.grow_limit_bytes)
    worker_init = workload.DemoWorkerInit(args.worker_threads)
    train_loader = make_loader(
        args,
        train_set,
        collate,
        worker_init,
        torch.Generator().manual_seed(args.seed),
        args.shuffle,
        pin_memory,
    )
    val_loader = None
    if args.val:
        val_size = args.val_size or max(1, args.dataset_size // 5)
        # A different seed so validation images differ from training ones.
        val_spec = replace(spec, size=val_size, seed=args.seed + 1, shuffle=False, leak_bytes_per_sample=0)
        val_loader = make_loader(args, dataset_cls(val_spec), collate, worker_init, None, False, pin_memory)

    trainer = workload.Trainer(
        workload.build_model(spec.channels, spec.num_classes),
        device,
        pin_memory,
        args.step_ms,
        step_kind,
        args.step_threads if step_kind == "cpu" else None,
    )
    trainer.warm_up((args.batch_size, spec.channels, spec.image_size, spec.image_size), spec.num_classes)
    config = dict(vars(args))
    config.update(
        device=str(device),
        step_kind=step_kind,
        pin_memory=pin_memory,
        start_method=(args.start_method or torch.multiprocessing.get_start_method())
        if args.num_workers
        else None,
        torch_version=torch.__version__,
        argv=argv,
        cpu_count=os.cpu_count(),
    )

    run = loop.Run(args, config)
    run.stop.install()
    _log(
        args,
        f"{args.num_workers} workers ({config['start_method'] or 'in-process'}), "
        f"batch {args.batch_size}, {args.cost_kind} {args.sample_ms:g} ms/sample, "
        f"step {args.step_ms:g} ms ({step_kind}), device {device}"
        + (f", scenario {args.scenario}" if args.scenario else ""),
    )
    try:
        epoch = 0
        while args.epochs == 0 or epoch < args.epochs:
            run.phase = "train"
            before = (run.train.batches, run.train.wait_s, run.train.compute_s)
            run.run_epoch(train_loader, run.train, trainer.train_step, epoch, args.steps_per_epoch)
            last = run.train.epochs[-1]
            line = (
                f"epoch {epoch}: {last['batches']} batches in {last['epoch_s']:.2f} s, "
                f"first batch {last['first_batch_ms'] or 0:.0f} ms, "
                f"data wait {_pct(run.train.wait_s - before[1], run.train.compute_s - before[2])}"
            )
            val = run.val  # set exactly when val_loader is
            if val_loader is not None and val is not None and run.stop_reason is None:
                run.phase = "val"
                vb = (val.wait_s, val.compute_s)
                run.run_epoch(val_loader, val, trainer.val_step, epoch, args.steps_per_epoch)
                line += (
                    f"; val {val.epochs[-1]['batches']} batches, data wait "
                    f"{_pct(val.wait_s - vb[0], val.compute_s - vb[1])}"
                )
            _log(args, line)
            epoch += 1
            if run.stop_reason is not None:
                break
        run.phase = "done"
    except KeyboardInterrupt:
        run.stop_reason = "signal SIGINT (forced)"
        run.phase = "done"
    except BaseException as e:
        # Kept in the report so a test that finds a short run can say why.
        run.error = f"{type(e).__name__}: {e}"
        raise
    finally:
        elapsed_loop = time.perf_counter() - run.t0
        run.last_loss = trainer.last_loss
        run.write_report(final=True)
        # Persistent workers are otherwise left to interpreter teardown, which
        # can leak their semaphores and race the exit.
        for loader in (train_loader, val_loader):
            _close_loader(loader)
    s = run.train
    _log(
        args,
        f"done: {s.batches} batches in {elapsed_loop:.2f} s, data wait "
        f"{_pct(s.wait_s, s.compute_s)}" + (f" (stopped: {run.stop_reason})" if run.stop_reason else ""),
    )
    return EXIT_OK


def _close_loader(loader: DataLoader[Any] | None) -> None:
    it = getattr(loader, "_iterator", None)
    if loader is not None and it is not None:
        loader._iterator = None
        shutdown = getattr(it, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()


def _pct(wait: float, compute: float) -> str:
    total = wait + compute
    return f"{100 * wait / total:.1f}%" if total > 0 else "n/a"


def run_and_exit(argv: list[str] | None = None) -> None:
    """``main``, then the process's exit without the interpreter's last
    garbage collections over torch's objects."""
    code = main(argv)
    # When main returns the run is over: its report written, its loaders'
    # workers shut down (70 ms after a SIGTERM, strace says). What is left
    # is the atexit handlers (the hook's among them) and the interpreter's
    # teardown, whose collections walk every object torch made: over half
    # a second on the 2-core box. Frozen, those objects are left to the
    # exit; the atexit handlers, the threads' end and the modules' teardown
    # still run. SIGTERM to exit, medians of three runs: 0.82 -> 0.29 s with
    # the data-bound scenario's two workers, 0.75 -> 0.21 s without. Every
    # `dlwatch tune` trial of the demo and every `dlwatch demo` that is quit
    # ends that much sooner.
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    run_and_exit()
