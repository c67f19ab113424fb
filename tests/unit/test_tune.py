"""dlwatch tune's pure parts: the override document and its application to a
real DataLoader, the trial meter, the search and the recommendation, and the
hint's verify command."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dlwatch import overrides, search
from dlwatch.diagnose.render import tune_command, with_tune_command
from dlwatch.probe import overrides as probe_overrides
from dlwatch.tune.measure import TrialMeter
from dlwatch.tune.sweep import code_line

# --- overrides -------------------------------------------------------------------

BAD_OVERRIDES = [
    "[1]",
    "{",
    '{"num_workers": -1}',
    '{"num_workers": true}',
    '{"prefetch_factor": 0}',
    '{"pin_memory": 1}',
    '{"workers": 2}',
    '{"loader": {"index": -1}}',
    '{"loader": "some"}',
]


def test_parse_accepts_the_documented_document_and_rejects_garbage():
    doc = overrides.parse(
        '{"loader": {"index": 1, "dataset": "ImageFolder", "batch_size": 64}, "num_workers": 4, '
        '"prefetch_factor": 4, "pin_memory": true, "persistent_workers": true}'
    )
    assert doc["loader"] == {"index": 1, "dataset": "ImageFolder", "batch_size": 64}
    assert overrides.parse('{"num_workers": 0}')["loader"] == "all"
    for bad in BAD_OVERRIDES:
        with pytest.raises(overrides.OverrideError):
            overrides.parse(bad)


def test_resolve_never_produces_what_torch_rejects():
    base = {"num_workers": 4, "prefetch_factor": 4, "pin_memory": False, "persistent_workers": True,
            "multiprocessing_context": "spawn"}  # fmt: skip
    zero = overrides.resolve(base, {"num_workers": 0}, lambda: True)
    assert zero == {"num_workers": 0, "prefetch_factor": None, "pin_memory": False,
                    "persistent_workers": False, "multiprocessing_context": None}  # fmt: skip
    assert overrides.resolve(base, {"pin_memory": True}, lambda: False)["pin_memory"] is False
    assert overrides.resolve(base, {"pin_memory": True}, lambda: True)["pin_memory"] is True


def test_the_selected_loader_and_only_it_gets_the_settings():
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, TensorDataset

    os.environ[overrides.ENV_VAR] = overrides.encode(
        {
            "loader": {"index": 1, "dataset": "TensorDataset", "batch_size": 4},
            "num_workers": 2,
            "prefetch_factor": 5,
            "persistent_workers": True,
        }  # fmt: skip
    )
    try:
        probe_overrides.install()
        ds = TensorDataset(torch.arange(32))
        a = DataLoader(ds, 4)  # index 0 of its kind: untouched
        b = DataLoader(ds, 8, num_workers=1)  # another batch size: untouched
        c = DataLoader(ds, batch_size=4)  # index 1: changed, positional or not
        assert (a.num_workers, b.num_workers) == (0, 1)
        assert (c.num_workers, c.prefetch_factor, c.persistent_workers) == (2, 5, True)
        assert [int(x) for (bt,) in c for x in bt] == list(range(32))
    finally:
        probe_overrides.uninstall()
        os.environ.pop(overrides.ENV_VAR, None)
    assert DataLoader(TensorDataset(torch.arange(4)), batch_size=4).num_workers == 0


def test_without_the_variable_the_hook_leaves_dataloader_alone():
    code = (
        "import dlwatch.hook, torch.utils.data as d, dlwatch.probe.overrides as o;"
        "print(d.DataLoader.__init__.__module__, o._spec)"
    )
    env = {k: v for k, v in os.environ.items() if k != overrides.ENV_VAR}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["torch.utils.data.dataloader", "None"], out.stderr


# --- the meter ------------------------------------------------------------------


def snap(t: float, batches: int, wait: float = 0.5, lid: int = 0, extra=()) -> dict:
    ld = {
        "id": lid, "num_workers": 2, "batch_size": 8, "pin_memory": False, "persistent_workers": False,
        "prefetch_factor": 2, "dataset": "DS", "epoch": 0, "batches_total": batches, "batches_per_s": 10.0,
        "data_wait_fraction": wait, "wait_ms_mean": 5.0, "step_ms_mean": 5.0,
        "window_mono_ns": [None, int(t * 1e9) + 7], "epoch_start_ms": [300.0, 40.0], "epoch_ms": [2000.0],
        "workers": [
            {"id": i, "pid": 100 + i, "cpu_percent": 20.0, "busy_fraction": 0.9, "uss_bytes": 10 << 20,
             "rss_bytes": 50 << 20, "state": "S"}
            for i in range(2)
        ],
    }  # fmt: skip
    job = {
        "pid": 9,
        "state": "live",
        "main_cpu_percent": 60.0,
        "cmdline": "python t.py",
        "loaders": [ld, *extra],
    }
    return {"time": 1000.0 + t, "host": {"usable_cores": 2.0}, "jobs": [job], "hints": []}


def test_meter_measures_the_steady_state_on_the_jobs_clock():
    m = TrialMeter(trial_s=4.0, warmup_s=2.0)
    m.feed(snap(0.0, 0))
    m.feed(snap(1.0, 5))  # first batch
    assert m.phase == "warm-up"
    for i in range(3, 9):
        m.feed(snap(float(i), 5 + 20 * (i - 3)))
    assert m.phase == "steady" and m.done
    f = m.figures()
    assert f["batches_per_s"] == pytest.approx(20.0)
    assert f["samples_per_s"] == pytest.approx(160.0)
    assert f["data_wait_fraction"] == 0.5
    assert f["cpu_cores"] == pytest.approx(1.0)  # 0.6 main + 2 x 0.2 workers
    assert f["worker_uss_bytes"] == 20 << 20
    assert f["epoch_start_ms"] == 40.0 and f["first_epoch_start_ms"] == 300.0
    assert f["worker_cpu_share_of_busy"] == pytest.approx(0.2 / 0.9, abs=1e-3)


def test_meter_reports_the_loader_the_loop_spends_its_time_on():
    m = TrialMeter(trial_s=3.0, warmup_s=0.0)
    for i in range(5):
        val = snap(float(i), 2 * i, lid=1)["jobs"][0]["loaders"][0]
        m.feed(snap(float(i), 1 + 10 * i, extra=[val]))
    assert m.busiest() == 0
    assert [x["id"] for x in m.figures()["loaders_seen"]] == [0, 1]


# --- the search -----------------------------------------------------------------


def trial(index, nw, rate, wait=0.4, share=0.2, config=None, status="ok", **kw) -> dict:
    settings = {"num_workers": nw, "prefetch_factor": 2 if nw else None, "pin_memory": False,
                "persistent_workers": False}  # fmt: skip
    return {
        "index": index, "config": config if config is not None else ({"num_workers": nw} if index else {}),
        "settings": settings, "status": status, "batches_per_s": rate, "data_wait_fraction": wait,
        "worker_cpu_share_of_busy": share, "worker_ms_per_batch": 40.0, "step_ms_mean": 5.0,
        "wait_ms_mean": 20.0, "usable_cores": 2.0, "epoch_start_ms": None, "epoch_ms": None, **kw,
    }  # fmt: skip


def test_not_data_bound_stops_after_the_baseline():
    cfg, why = search.propose([trial(0, 2, 50.0, wait=0.03)], search.Options())
    assert cfg is None and "not data-bound" in why and "3 %" in why


def test_io_bound_starts_at_littles_law_past_the_cores_and_climbs_while_waiting():
    cfg, why = search.propose([trial(0, 1, 25.0, wait=0.8, share=0.05)], search.Options())
    assert cfg == {"num_workers": 8} and "Little" in why
    cfg, _ = search.propose([trial(0, 1, 25.0, share=0.05), trial(1, 8, 150.0, wait=0.2)], search.Options())
    assert cfg == {"num_workers": 16}


def test_cpu_bound_never_goes_past_the_usable_cores():
    trials = [trial(0, 1, 25.0, wait=0.8, share=0.95)]
    cfg, why = search.propose(trials, search.Options())
    assert cfg == {"num_workers": 2} and "CPU-bound" in why
    trials.append(trial(1, 2, 45.0, wait=0.5, share=0.95))
    for _ in range(6):
        cfg, _ = search.propose(trials, search.Options())
        if cfg is None:
            break
        assert (cfg.get("num_workers") or 0) <= 2
        trials.append(trial(len(trials), cfg.get("num_workers", 1), 44.0, config=cfg))


def test_once_the_loop_is_fed_fewer_workers_are_tried():
    trials = [trial(0, 1, 25.0, share=0.05), trial(1, 8, 190.0, wait=0.01)]
    assert search.propose(trials, search.Options())[0] == {"num_workers": 4}


def test_a_crashed_setting_is_not_retried():
    trials = [trial(0, 1, 25.0, share=0.05), trial(1, 8, None, status="crashed")]
    cfg, _ = search.propose(trials, search.Options())
    assert cfg != {"num_workers": 8}


def test_pin_memory_only_with_cuda():
    # CPU-bound at the core count, prefetch_factor already tried: pinning is what is left.
    trials = [
        trial(0, 2, 25.0, share=0.95),
        trial(1, 2, 25.0, share=0.95, config={"num_workers": 2, "prefetch_factor": 4}),
    ]
    assert search.propose(trials, search.Options(cuda=True))[0] == {"num_workers": 2, "pin_memory": True}
    assert search.propose(trials, search.Options(cuda=False))[0] is None


def test_recommendation_prefers_fewer_workers_within_noise():
    trials = [trial(0, 1, 25.0), trial(1, 8, 100.0), trial(2, 4, 97.0), trial(3, 2, 60.0)]
    assert search.choose(trials).settings["num_workers"] == 4
    trials.append(trial(4, 4, 85.0))  # 4 is now 91 on average: beyond noise of 100
    assert search.choose(trials).settings["num_workers"] == 8


def test_grid_replaces_the_search():
    trials = [trial(0, 1, 25.0, share=0.05)]
    opts = search.Options(workers=[0, 1, 3])
    assert search.propose(trials, opts)[0] == {"num_workers": 0}
    trials.append(trial(1, 0, 10.0))
    assert search.propose(trials, opts)[0] == {"num_workers": 3}


def test_code_line_names_what_changed():
    base = {"num_workers": 1, "prefetch_factor": 2, "pin_memory": False, "persistent_workers": False}
    best = dict(base, num_workers=6, persistent_workers=True, prefetch_factor=4)
    assert (
        code_line(best, base) == "DataLoader(..., num_workers=6, persistent_workers=True, prefetch_factor=4)"
    )


# --- the hint's verify command -------------------------------------------------------


def test_worker_hints_name_the_tune_command():
    job = {"pid": 9, "cmdline": "python train.py --epochs 3", "loaders": [{"id": 0, "num_workers": 2}]}
    assert tune_command(job, {"num_workers": 4, "current": 2}) == (
        "dlwatch tune --workers 2,4 -- python train.py --epochs 3"
    )
    h = {"id": "add-workers", "job_pid": 9, "loader_id": 0, "suggestion": "set num_workers=4",
         "evidence": {"recommended_num_workers": 4}}  # fmt: skip
    out = with_tune_command(h, {"jobs": [job]})
    assert out["suggestion"] == (
        "set num_workers=4; verify with `dlwatch tune --workers 2,4 -- python train.py --epochs 3`"
    )
    other = dict(h, id="worker-memory-growth")
    assert with_tune_command(other, {"jobs": [job]}) is other
