"""Autotune's pure parts: when it is on, which knobs its search may move, what
it says at exit and in the live view. Real jobs: tests/e2e/test_autotune.py."""

from __future__ import annotations

import pytest

from dlwatch import search
from dlwatch.probe import autotune
from dlwatch.tui import fmt
from dlwatch.tui.loader import autotune_line


@pytest.mark.parametrize(
    "env, on",
    [
        ({}, False),
        ({"DLWATCH_AUTOTUNE": "1"}, True),
        ({"DLWATCH_AUTOTUNE": "yes"}, True),
        ({"DLWATCH_AUTOTUNE": "0"}, False),
        # a tune trial measures fixed settings
        ({"DLWATCH_AUTOTUNE": "1", "DLWATCH_OVERRIDES": '{"num_workers": 2}'}, False),
    ],
)
def test_enabled(env, on):
    assert autotune.enabled(env) is on


def _trial(nw: int, rate: float, wait: float, **kw) -> dict:
    settings = {"num_workers": nw, "prefetch_factor": 2 if nw else None, "pin_memory": False,
                "persistent_workers": False}  # fmt: skip
    return {"status": "ok", "config": {"num_workers": nw} if kw.pop("changed", False) else {},
            "settings": settings, "batches_per_s": rate, "data_wait_fraction": wait, "step_ms_mean": 10.0,
            "worker_ms_per_batch": 40.0, "worker_cpu_share_of_busy": 0.1, "usable_cores": 2.0,
            "epoch_start_ms": 300.0, "epoch_ms": 4000.0, "steady_s": 4.0, **kw}  # fmt: skip


def test_the_search_never_offers_a_knob_autotune_cannot_move():
    # a loader whose epoch starts stall: tune would try persistent_workers
    trials = [
        _trial(1, 25.0, 0.75),
        _trial(4, 90.0, 0.05, changed=True, epoch_start_ms=900.0, epoch_ms=2000.0),
    ]
    full = search.Options()
    limited = search.Options(knobs=autotune.AUTOTUNE_KNOBS)
    seen_full, seen_limited = set(), set()
    for opts, seen in ((full, seen_full), (limited, seen_limited)):
        ts = list(trials)
        for _ in range(8):
            config, _why = search.propose(ts, opts)
            if config is None:
                break
            seen.update(config)
            ts.append(dict(_trial(config.get("num_workers", 1), 50.0, 0.2), config=config))
    assert "persistent_workers" in seen_full
    assert seen_limited <= {"num_workers", "prefetch_factor"}


def test_an_iterable_or_worker_init_loader_is_left_alone():
    import torch
    from torch.utils.data import DataLoader, IterableDataset, TensorDataset

    class It(IterableDataset):
        def __iter__(self):
            yield from range(3)

    ds = TensorDataset(torch.zeros(8, 2))
    assert autotune._left_alone(DataLoader(ds)) is None
    assert "iterable" in autotune._left_alone(DataLoader(It()))
    assert "worker_init_fn" in autotune._left_alone(DataLoader(ds, worker_init_fn=lambda i: None))


def test_live_view_line():
    pal = fmt.DEFAULT_PALETTE
    assert autotune_line({}, pal) is None
    left = autotune_line({"autotune": {"state": "left alone", "reason": "an iterable dataset"}}, pal)
    assert left is not None and "left alone: an iterable dataset" in left.plain
    at = {"state": "converged", "original": {"num_workers": 1}, "changes": [{"epoch": 2}]}
    at |= {"current": {"num_workers": 8, "prefetch_factor": 2}, "epoch_batches_per_s": [24.0, 110.0, 118.0]}
    line = autotune_line({"autotune": at}, pal).plain
    assert (
        "converged" in line
        and "num_workers 1 → 8" in line
        and "4.92× the first" in line
        and "1 change" in line
    )


def test_exit_line_names_the_setting_to_paste():
    class Loader:
        num_workers, prefetch_factor, pin_memory, persistent_workers = 1, 2, False, False
        dataset = None
        worker_init_fn = None
        _dataset_kind = 0

    loader = Loader()
    t = autotune.LoaderTuner(loader)
    t.trials = [_trial(1, 25.0, 0.8), dict(_trial(8, 110.0, 0.05), config={"num_workers": 8})]
    t.state = "converged"
    loader.num_workers = 8  # as autotune applied it
    line = t.summary_line()
    assert line.startswith("dlwatch autotune: NoneType loader converged to DataLoader(..., num_workers=8, ")
    assert "4.40×" in line
    t.trials = [_trial(1, 25.0, 0.02)]
    t.reason = "not data-bound: the training loop waits for data 2 % of the time"
    assert "kept DataLoader(..., num_workers=1, prefetch_factor=2): not data-bound" in t.summary_line()


def test_exit_line_names_the_setting_the_job_runs_with():
    # Converged to 7 workers; the epochs run at 7 afterwards read a little
    # slower, and 6 (measured once on the way) came within noise of the
    # fastest: the fewest-workers pick is now 6, but the job runs with 7.
    class Loader:
        num_workers, prefetch_factor, pin_memory, persistent_workers = 7, 2, False, False
        dataset = None

    loader = Loader()
    t = autotune.LoaderTuner(loader)
    t.trials = [_trial(1, 25.0, 0.8)] + [
        dict(_trial(nw, rate, 0.05), config={"num_workers": nw})
        for nw, rate in ((7, 100.0), (6, 98.0), (7, 96.0), (7, 97.0))
    ]
    assert search.choose(t.trials).settings["num_workers"] == 6
    t.state = "converged"
    line = t.summary_line()
    assert "converged to DataLoader(..., num_workers=7, " in line and "3.91×" in line, line
    loader.num_workers = 3  # a setting never measured: the search's pick
    assert "num_workers=6" in t.summary_line()


def test_a_slow_first_step_is_left_out_of_the_first_epochs_pace(probe, monkeypatch):
    # issue 31: a first step of seconds (cudnn benchmark, compile) is no
    # setting's pace; the script's own setting was judged with it in.
    import time

    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from dlwatch.probe import patches

    monkeypatch.setattr(patches, "after_new_iterator", autotune.after_new_iterator)
    autotune.install()
    try:
        dl = DataLoader(TensorDataset(torch.zeros(60, 2)), batch_size=2)  # 30 batches
        for i, _batch in enumerate(dl):
            time.sleep(1.5 if i == 0 else 0.04)
        iter(dl)  # the next epoch's start: autotune measures the first
        t = autotune.tuner_of(dl)
        assert t is not None and t.first_step_s is not None and t.first_step_s >= 1.5
        first = t.trials[0]
        # 29 batches over ~1.2 s (about 24/s); with the first step in: 30 over ~2.7 s (11/s)
        assert first["batches_per_s"] > 18, first
        assert first["step_ms_mean"] < 200, first
    finally:
        autotune.uninstall()


class _SlowToStart:
    """Each new worker's first sample takes 0.4 s (opening files, say): a
    stall at every epoch's start that more workers do not shorten."""

    warm = False  # per process: a new epoch's forked workers start cold

    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int):
        import time

        import torch

        if not type(self).warm:
            type(self).warm = True
            time.sleep(0.4)
        return torch.zeros(2)


@pytest.mark.parametrize("persistent", [False, True])
def test_every_pooled_epochs_start_is_left_out_of_the_wait(probe, monkeypatch, persistent):
    # The first epoch (19 batches once its first step is left out) is too
    # short to judge and is pooled with the second; both start with a 0.4 s
    # stall. Only the second's was left out of the wait: 0.4 s over ~1.9 s
    # of loop read 17 %, a loop waiting for nothing else was "data-bound"
    # (fresh-clone run 40 and this box: "did not converge", the job kept its setting).
    # Persistent workers start once: the first epoch's start, pooled, stayed in
    # the pace and the wait (20 %), where a setting is judged from each epoch's first batch.
    import time

    from torch.utils.data import DataLoader

    from dlwatch.probe import patches

    monkeypatch.setattr(patches, "after_new_iterator", autotune.after_new_iterator)
    autotune.install()
    try:
        # persistent: only the first epoch's workers start (slowly); the next epoch's start is a reset
        dl = DataLoader(_SlowToStart(), batch_size=2, num_workers=1, persistent_workers=persistent)
        for _epoch in range(2):
            for _batch in dl:
                time.sleep(0.05)
        iter(dl)  # the third epoch's start: autotune measures the first two together
        t = autotune.tuner_of(dl)
        assert t is not None
        first = next(x for x in t.trials if x["status"] == "ok")
        assert first["epoch_ms"] > 1800, first  # both epochs (~1 s of steps each), one trial
        assert first["data_wait_fraction"] < 0.10, first
        assert t.state == "converged" and "not data-bound" in t.reason, (t.state, t.reason)
    finally:
        autotune.uninstall()


def test_a_loader_whose_batches_come_out_on_a_device_is_left_alone(probe, monkeypatch):
    # Batches made on the GPU by the dataset (num_workers=0): more workers
    # would put CUDA in forked workers, which fails inside the training loop.
    # The meta device stands in for CUDA on this machine.
    import time

    import torch
    from torch.utils.data import DataLoader, Dataset

    from dlwatch.probe import patches

    class OnDevice(Dataset):
        def __len__(self):
            return 40

        def __getitem__(self, i):
            time.sleep(0.01)  # a loop that waits for its data: the search would add workers
            return torch.zeros(2, device="meta")

    monkeypatch.setattr(patches, "after_new_iterator", autotune.after_new_iterator)
    autotune.install()
    try:
        dl = DataLoader(OnDevice(), batch_size=2)
        for _epoch in range(2):
            for _batch in dl:
                pass
        # Left alone at the second epoch's start, however short the first was
        # (a short one is pooled with the next, and the decision waited for it).
        t = autotune.tuner_of(dl)
        assert t is not None and t.state == "left alone", (t.state, t.reason)
        assert "already on the GPU" in t.reason and dl.num_workers == 0
    finally:
        autotune.uninstall()


def test_a_loader_whose_collate_returns_numpy_is_not_taken_for_one_on_a_device(probe, monkeypatch):
    # JAX-style training iterates a DataLoader whose collate_fn returns NumPy
    # arrays; NumPy >= 2 says ndarray.device == "cpu" (a string), once read
    # as "on a device", and autotune left the loader alone for it.
    import time

    import numpy as np
    from torch.utils.data import DataLoader, Dataset

    from dlwatch.probe import patches

    class Slow(Dataset):
        def __len__(self):
            return 40

        def __getitem__(self, i):
            time.sleep(0.01)
            return np.zeros(2, dtype=np.float32)

    monkeypatch.setattr(patches, "after_new_iterator", autotune.after_new_iterator)
    autotune.install()
    try:
        dl = DataLoader(Slow(), batch_size=2, collate_fn=np.stack)
        for _epoch in range(2):
            for _batch in dl:
                pass
        t = autotune.tuner_of(dl)
        assert t is not None and "already on the GPU" not in (t.reason or ""), (t.state, t.reason)
    finally:
        autotune.uninstall()


def _warn_once_here() -> None:
    import warnings

    warnings.warn("a warning the job has seen", UserWarning, stacklevel=1)


def test_workers_past_the_cores_start_without_torchs_warning_or_touching_the_filters(probe, monkeypatch):
    # Autotune may pick more workers than cores (I/O-bound loading): torch's
    # "This DataLoader will create N worker processes" is not the script's.
    # Silenced for that loader's iterator alone: catching it swapped the
    # process's warning filters, and every warning the job had seen once was
    # shown again after each autotuned epoch.
    import os
    import warnings

    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from dlwatch.probe import patches

    many = (os.cpu_count() or 1) + 1
    dl = DataLoader(TensorDataset(torch.zeros(8, 2)), batch_size=2, num_workers=1)

    def more_workers(loader):
        loader.num_workers = many
        return True

    monkeypatch.setattr(autotune, "before_epoch", more_workers)
    monkeypatch.setattr(patches, "after_new_iterator", lambda *a, **k: None)
    autotune.install()
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("default")
            _warn_once_here()
            assert len(list(iter(dl))) == 4 and dl.num_workers == many
            _warn_once_here()  # the same place: shown once, as without autotune
    finally:
        autotune.uninstall()
    texts = [str(w.message) for w in seen]
    assert texts.count("a warning the job has seen") == 1, texts
    assert not [t for t in texts if "This DataLoader will create" in t], texts
    # torch's own check is the class's method again, on this loader too
    assert "check_worker_number_rationality" not in vars(dl)
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        dl.check_worker_number_rationality()
    assert [w for w in again if "This DataLoader will create" in str(w.message)]
