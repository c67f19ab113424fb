"""dlwatch tune's pure parts: the override document and its application to a
real DataLoader, the trial meter, the search and the recommendation, and the
hint's verify command."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dlwatch import overrides, search
from dlwatch.diagnose.engine import REGISTRY
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
        "import dlwatch.hook, torch, torch.utils.data as d, dlwatch.probe.overrides as o;"
        "ld = d.DataLoader(torch.arange(8), batch_size=2);"
        "print(d.DataLoader.__init__.__module__, o._spec, d.DataLoader.__iter__.__module__,"
        " hasattr(ld, '_dlw_replay'), len({int(x[0]) for x in ld}))"
    )
    env = {k: v for k, v in os.environ.items() if k != overrides.ENV_VAR}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    # No override and no replay: every batch is a new one (a normal run never replays).
    want = ["torch.utils.data.dataloader", "None", "torch.utils.data.dataloader", "False", "4"]
    assert out.stdout.split() == want, out.stderr


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


def test_a_script_that_trains_without_a_dataloader_is_said_so_not_waited_on():
    # A QA run: tune waited its whole 120 s first-batch timeout on a loop over
    # tensors, then said "no batch within the first-batch timeout".
    m = TrialMeter(trial_s=4.0, warmup_s=2.0)
    for t, steps in ((0.0, 0), (1.0, 30), (2.0, 60), (21.0, 600)):
        s = snap(t, 0)
        s["jobs"][0]["loaders"] = []
        s["jobs"][0]["train_threads"] = [{"thread": "MainThread", "steps": steps, "main": True}]
        m.feed(s)
        # A warm-up on dummy tensors before the loader is made steps too: not before 20 s.
        assert m.stuck is (t >= 20.0), t
    assert m.stuck and m.stuck_reason.startswith(
        "the script trains (the optimizer stepped 600 times) but iterates"
    )
    # A loader seen, its first batch still to come (a slow first epoch start): waited on as before.
    m = TrialMeter(trial_s=4.0, warmup_s=2.0)
    s = snap(0.0, 0)
    s["jobs"][0]["train_threads"] = [{"thread": "MainThread", "steps": 500, "main": True}]
    m.feed(s)
    m.feed(dict(s, time=s["time"] + 30.0))
    assert not m.stuck


def test_meter_measures_the_steady_state_on_the_jobs_clock():
    m = TrialMeter(trial_s=4.0, warmup_s=2.0)
    m.feed(snap(0.0, 0))
    m.feed(snap(1.0, 5))  # first batch
    assert m.phase == "warm-up"
    # (no batch from 1 s to 3 s: a first step of 3 s; the warm-up counts from its end at 4 s)
    for i in range(3, 11):
        m.feed(snap(float(i), 5 + 20 * (i - 3)))
    assert m.phase == "steady" and m.done and m.steady_from == 1006.0
    f = m.figures()
    assert f["batches_per_s"] == pytest.approx(20.0)
    assert f["samples_per_s"] == pytest.approx(160.0)
    assert f["data_wait_fraction"] == 0.5
    assert f["cpu_cores"] == pytest.approx(1.0)  # 0.6 main + 2 x 0.2 workers
    assert f["worker_uss_bytes"] == 20 << 20
    assert f["epoch_start_ms"] == 40.0 and f["first_epoch_start_ms"] == 300.0
    assert f["worker_cpu_share_of_busy"] == pytest.approx(0.2 / 0.9, abs=1e-3)


def test_a_first_step_of_seconds_never_enters_the_steady_state():
    # timm on an H100: a 14 s first step, then ~15 batches/s
    m = TrialMeter(trial_s=4.0, warmup_s=2.0)
    m.feed(snap(0.0, 0))
    m.feed(snap(1.0, 1))  # first batch; its step takes 14 s
    t, n = 1.0, 1
    while t < 15.0:
        t += 0.5
        m.feed(snap(t, n, wait=0.0))
        assert m.phase == "warm-up", t
    while not m.done:
        t += 0.5
        n += 7 if int(t * 2) % 2 else 8
        m.feed(snap(t, n))
        assert t < 30
    f = m.figures()
    assert f["batches_per_s"] == pytest.approx(15.0, rel=0.05)
    assert m.steady_from >= 1000.0 + 15.5 + 2.0
    assert f["data_wait_fraction"] == 0.5  # no window of the stall is in it


def test_a_stall_after_the_first_step_waits_for_the_loop_to_step_again():
    m = TrialMeter(trial_s=4.0, warmup_s=2.0)
    m.feed(snap(0.0, 0))
    m.feed(snap(1.0, 1))
    for t, n in [(2.0, 2), (3.0, 3), (4.0, 4), (5.0, 5)]:  # 1 s steps
        m.feed(snap(t, n))
    assert m.phase == "steady"  # settled at 4 s (warm-up 2 s past the first step's end at 2 s)
    m2 = TrialMeter(trial_s=4.0, warmup_s=2.0)
    m2.feed(snap(0.0, 0))
    m2.feed(snap(1.0, 1))
    m2.feed(snap(1.5, 2))
    m2.feed(snap(1.75, 3))  # then a second slow step: 5 s without a batch
    for t in (2.0, 3.0, 4.0, 5.0, 6.0):
        m2.feed(snap(t, 3))
        assert m2.phase == "warm-up", t
    m2.feed(snap(6.75, 4))
    assert m2.phase == "steady" and m2.steady_from == 1006.75


def test_a_slow_but_even_pace_settles_after_two_steps():
    m = TrialMeter(trial_s=4.0, warmup_s=2.0)
    m.feed(snap(0.0, 0))
    m.feed(snap(0.5, 1))
    t, n = 0.5, 1
    while m.phase != "steady":
        t += 0.5
        n += 1 if t % 3 == 0 else 0  # a batch every 3 s
        m.feed(snap(t, n))
        assert t < 10
    assert m.steady_from - 1000.0 <= 6.5


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


def test_a_loop_loading_off_the_cpu_without_workers_is_judged_io_bound_from_the_start():
    # A QA run: an Accelerate job at 0 workers waiting 83 %, its processes at
    # 0.0 cores: tune capped its first step at one worker per core ("no
    # workers to judge CPU vs I/O by") while the live hint advised 5.
    base = trial(0, 0, 10.0, wait=0.83, share=None, wait_ms_mean=80.0, step_ms_mean=15.0, cpu_cores=0.05)
    cfg, why = search.propose([base], search.Options())
    assert cfg == {"num_workers": 6} and "I/O-bound" in why, (cfg, why)
    # Loading on a CPU (the job's CPU near its wait): the per-core cap stays.
    busy = dict(base, cpu_cores=0.9)
    cfg, why = search.propose([busy], search.Options())
    assert cfg == {"num_workers": 2} and "no workers to judge" in why, (cfg, why)


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
    # 4 is now 91 on average, 9 % below 100, but its own repeats (97, 85) say
    # the box's noise is 13 %: 8 workers are not measurably faster.
    trials.append(trial(4, 4, 85.0))
    assert search.choose(trials).settings["num_workers"] == 4


def test_the_noise_allowance_widens_to_what_repeats_measured():
    trials = [trial(0, 1, 25.0), trial(1, 8, 100.0), trial(2, 4, 93.0)]
    assert search.noise_allowance(search.groups(trials)) == search.NOISE_FLOOR
    assert search.choose(trials).settings["num_workers"] == 8  # 7 % slower: beyond 5 %
    trials.append(trial(3, 8, 88.0))  # the same setting measured 100 and 88: 13 % apart
    assert search.measured_noise(search.groups(trials)) == pytest.approx(12 / 94)
    assert search.choose(trials).settings["num_workers"] == 4  # 93 vs 94: equal within that noise
    trials.append(trial(4, 8, 20.0))  # a wild repeat: the allowance stops at the cap
    assert search.noise_allowance(search.groups(trials)) == search.NOISE_CAP


def test_the_search_stops_when_the_fastest_is_within_noise_of_the_ceiling():
    trials = [trial(0, 1, 25.0, share=0.05), trial(1, 8, 96.0, wait=0.02)]
    why = search.ceiling_reached(trials, 100.0)
    assert why is not None and "96 % of the ceiling" in why and "dlwatch profile" in why
    assert search.ceiling_reached(trials, 110.0) is None
    assert search.ceiling_reached(trials, None) is None


def test_an_explicit_grid_runs_even_when_the_baseline_is_not_data_bound():
    trials = [trial(0, 2, 50.0, wait=0.03)]
    cfg, why = search.propose(trials, search.Options(workers=[2, 4]))
    assert cfg == {"num_workers": 4} and "--workers grid" in why and "not data-bound" in why
    trials.append(trial(1, 4, 50.5, wait=0.02))
    cfg, why = search.propose(trials, search.Options(workers=[2, 4]))
    assert cfg == {"num_workers": 4} and "repeat" in why  # the leaders are measured again


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
    # In the class the script builds; a framework's wrapper is never named (measure leaves it out).
    assert code_line(best, base, "StreamingDataLoader").startswith("StreamingDataLoader(..., num_workers=6")
    assert code_line(best, base, "no name()").startswith("DataLoader(..., num_workers=6")


def test_code_line_speaks_the_frameworks_terms_and_leaves_torchs_default_prefetch_out():
    base = {"num_workers": 0, "prefetch_factor": None, "pin_memory": False, "persistent_workers": False}
    best = dict(base, num_workers=8, prefetch_factor=2)
    assert code_line(best, base) == "DataLoader(..., num_workers=8)"
    assert code_line(best, base, None, "transformers") == "TrainingArguments(..., dataloader_num_workers=8)"
    more = dict(best, persistent_workers=True, prefetch_factor=4)
    assert code_line(more, base, None, "transformers") == (
        "TrainingArguments(..., dataloader_num_workers=8, dataloader_persistent_workers=True, "
        "dataloader_prefetch_factor=4)"
    )
    assert code_line(best, base, None, "accelerate").endswith("the one you pass to accelerator.prepare()")
    assert "train_dataloader()" in code_line(best, base, None, "lightning")


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
    # Only rules whose advice tune can measure get the command (engine._run_rules).
    assert REGISTRY["add-workers"].tunable and not REGISTRY["worker-memory-growth"].tunable
    # A rank of a torchrun run: its command alone has no rendezvous to join.
    rank = dict(job, rank=1, world_size=2, cmdline="python -u train.py")
    out = with_tune_command(h, {"jobs": [rank]})["suggestion"]
    assert "dlwatch tune --" not in out and "rerunning the whole run" in out, out


# --- the ceiling ----------------------------------------------------------------


def test_a_replay_trials_steady_state_starts_once_the_loader_replays():
    def rsnap(t, batches, state):
        s = snap(t, batches)
        s["jobs"][0]["loaders"][0]["replay"] = {"state": state, "batches_cached": 20, "limited_by": None}
        return s

    m = TrialMeter(trial_s=3.0, warmup_s=0.0, replay=True)
    m.feed(rsnap(0.0, 5, "warm-up"))
    m.feed(rsnap(1.0, 20, "caching"))
    m.feed(rsnap(2.0, 40, "replaying"))  # seen replaying: the next snapshot's window is all replay
    assert m.phase == "warm-up"
    for i in range(3, 8):
        m.feed(rsnap(float(i), 40 + 100 * (i - 2), "replaying"))
    f = m.figures()
    assert m.phase == "steady" and f["batches_per_s"] == pytest.approx(100.0)
    assert f["replay"]["batches_cached"] == 20


def test_a_replay_that_never_starts_is_reported_not_waited_on():
    m = TrialMeter(trial_s=3.0, warmup_s=0.0, replay=True)
    m.feed(snap(0.0, 5))
    m.feed(snap(1.0, 10))
    assert not m.stuck
    m.feed(snap(100.0, 500))
    assert m.stuck and "did not start replaying" in m.stuck_reason


def fake_runner(rates: dict, wait: float = 0.5, library: str | None = None, knobs: dict | None = None):
    """A runner that 'measures' each setting at the given batches/s (the
    ceiling trial at rates["replay"]); records the overrides it was given."""
    calls = []

    def run(cmd, env, override, trial_s, loader_id=None, warmup_s=None, on_progress=None, first_epoch=False):
        from dlwatch.tune.runner import TrialOutcome

        calls.append(override)
        replay = bool(override and "replay" in override)
        nw = (override or {}).get("num_workers", 1)
        rate = rates["replay" if replay else nw]
        loader = {"dataset": "DS", "batch_size": 8, "num_workers": nw, "prefetch_factor": 2,
                  "pin_memory": False, "persistent_workers": False}  # fmt: skip
        if library is not None:
            loader.update(library=library, knobs=knobs)
        fig = {
            "loader_id": 0, "loader": loader, "batches_per_s": rate, "samples_per_s": rate * 8,
            "data_wait_fraction": 0.01 if replay else wait, "worker_cpu_share_of_busy": 0.05,
            "worker_ms_per_batch": 40.0, "step_ms_mean": 10.0, "wait_ms_mean": 30.0, "usable_cores": 2.0,
            "cpu_cores": 0.5,
            "loaders_seen": [{"id": 0, "dataset": "DS", "batch_size": 8, "num_workers": nw}],
            "hint_speedups": {} if replay else {"io-bound": 6.0, "enable-persistent-workers": 1.2},
            "replay": {"state": "replaying", "batches_cached": 20, "batches_wanted": 20,
                       "bytes_cached": 1 << 20, "limited_by": None} if replay else None,
        }  # fmt: skip
        return TrialOutcome("ok", fig, elapsed_s=1.0)

    return run, calls


def test_a_data_bound_baseline_gets_a_ceiling_trial_and_the_report_shows_it():
    from dlwatch.tune import report
    from dlwatch.tune.sweep import Sweep, TuneOptions

    run, calls = fake_runner({1: 25.0, 4: 80.0, 8: 82.0, "replay": 100.0})
    doc = Sweep(["job"], {}, TuneOptions(max_trials=3), runner=run).run()
    assert "replay" in calls[1] and calls[1]["loader"] == {"index": 0, "dataset": "DS", "batch_size": 8}
    assert [t["index"] for t in doc["trials"]] == [0, 1, 2]  # the ceiling trial is not one of them
    c = doc["ceiling"]
    assert (c["batches_per_s"], c["speedup"], c["method"], c["batches_cached"]) == (100.0, 4.0, "replay", 20)
    text = report.summary(doc)
    assert "data is free: ceiling" in text and "4.00x" in text and "20 cached batches replayed" in text
    assert "of the ceiling 4.00x" in text
    assert "in place" not in text and c["in_place"] is None
    # A loop that changed its batches in place got copies: the row says so.
    assert "the loop changes its batches in place: each replay was a copy" in report.summary(
        {**doc, "ceiling": {**c, "in_place": True}}
    )
    # The hints' promises, bounded by the measured ceiling.
    assert sorted(c["hints"], key=lambda h: h["id"]) == [
        {"id": "enable-persistent-workers", "promised": 1.2, "expected_speedup": 1.2},
        {"id": "io-bound", "promised": 6.0, "expected_speedup": 4.0},
    ]
    assert "io-bound hint promised 6.00x: at most 4.00x" in text
    base_row = next(line for line in text.splitlines() if line.endswith("baseline"))
    assert "1.00x" in base_row


def test_the_sweep_stops_once_a_setting_is_within_noise_of_the_ceiling():
    from dlwatch.tune.sweep import Sweep, TuneOptions

    run, calls = fake_runner({1: 25.0, 4: 97.0, 8: 98.0, "replay": 100.0})
    doc = Sweep(["job"], {}, TuneOptions(max_trials=8), runner=run).run()
    assert len(doc["trials"]) == 2 and "of the ceiling" in doc["stopped_because"]
    assert "no longer the limit" in doc["stopped_because"]


def test_no_ceiling_trial_when_the_loop_does_not_wait_or_when_asked():
    from dlwatch.tune.sweep import Sweep, TuneOptions

    run, calls = fake_runner({1: 25.0, "replay": 26.0}, wait=0.03)
    doc = Sweep(["job"], {}, TuneOptions(), runner=run).run()
    assert len(calls) == 1 and doc["ceiling"] is None and "not data-bound" in doc["stopped_because"]
    run, calls = fake_runner({1: 25.0, 4: 80.0, "replay": 100.0})
    doc = Sweep(["job"], {}, TuneOptions(max_trials=2, ceiling=False), runner=run).run()
    assert not any("replay" in (c or {}) for c in calls) and doc["ceiling"] is None


def test_the_baseline_row_reads_one_by_definition_whatever_its_repeats_measured():
    from dlwatch.tune import report

    trials = [trial(0, 1, 23.0, samples_per_s=184.0), trial(1, 4, 80.0), trial(2, 1, 27.0, config={})]
    doc = {"baseline": trials[0], "trials": trials, "ceiling": None}
    rows = report.table(doc).splitlines()[1:]
    assert "1.00x" in rows[0] and "1.00x" in rows[2]  # both trials of the baseline setting
    assert "3.20x" in rows[1]  # 80 over the baseline's mean, 25
    # The recommended setting's row reads the recommendation's own figure (a
    # QA run: 2.28x in its row, "measured 2.27x" under the table).
    doc.update(best=trials[1], speedup=3.186, recommendation="num_workers=4")
    rows = report.table(doc).splitlines()[1:]
    assert "3.19x" in rows[1] and "1.00x" in rows[0]
    # Two rows of one setting read the same speed-up, their mean: said so (a
    # new user read 19.9 and 22.1 batches/s, both "1.15x", as an error).
    trials.append(trial(3, 4, 79.0))
    rows = report.table(doc).splitlines()[1:]
    assert rows[1].endswith("speed-up: its 2 trials' mean") and rows[3].endswith(
        "speed-up: its 2 trials' mean"
    )
    assert "trials' mean" not in rows[0] + rows[2]  # the baseline's 1.00x is so by definition


def test_group_cpu_counts_workers_that_exited_inside_the_window():
    from dlwatch.tune.runner import _GroupCpu

    # A group leader whose child burns ~0.6 s of CPU and exits (reaped) in the window.
    code = (
        "import os, time\n"
        "time.sleep(0.3)\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    t = time.process_time()\n"
        "    while time.process_time() - t < 0.6: pass\n"
        "    os._exit(0)\n"
        "os.waitpid(pid, 0)\n"
        "time.sleep(30)\n"
    )
    p = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        import time

        time.sleep(0.2)
        g = _GroupCpu()
        g.sample(p.pid)
        t0 = time.monotonic()
        deadline = t0 + 20
        while time.monotonic() < deadline:
            time.sleep(0.2)
            g.sample(p.pid)
            if g.last and g.last[1] - g.first[1] >= 0.55:
                break
        assert g.last[1] - g.first[1] >= 0.55  # the child's CPU, though it is gone
        assert g.cores is not None and g.cores > 0
    finally:
        p.kill()
        p.wait()


def test_a_pipeline_tune_cannot_set_is_measured_once_and_said_so():
    from dlwatch.tune import report
    from dlwatch.tune.sweep import Sweep, TuneOptions

    knobs = {"ParallelMapper.num_workers": 2, "ParallelMapper.method": "thread"}
    run, calls = fake_runner({1: 25.0, 4: 80.0, "replay": 100.0}, library="torchdata.nodes", knobs=knobs)
    doc = Sweep(["job"], {}, TuneOptions(max_trials=4), runner=run).run()
    assert calls == [None]  # the baseline only: no override, no replay trial
    why = doc["stopped_because"]
    assert "torchdata.nodes (ParallelMapper.num_workers=2, ParallelMapper.method=thread)" in why
    assert "not a torch DataLoader" in why and "dlwatch compare" in why
    assert "Stopped: the loop's pipeline is torchdata.nodes" in report.summary(doc)
    # MONAI's ThreadDataLoader is a DataLoader: its settings are set as any.
    run, calls = fake_runner({1: 25.0, 4: 80.0, 8: 82.0, "replay": 100.0}, library="monai", knobs={})
    doc = Sweep(["job"], {}, TuneOptions(max_trials=3), runner=run).run()
    assert len(calls) > 1 and any("replay" in (c or {}) for c in calls)


def test_no_recommendation_when_nothing_but_the_baseline_measured():
    """A QA run: every setting with workers crashed (a worker that cannot
    load), and tune said "keep your settings … no setting tried was faster
    beyond noise", exit 0; Ctrl-C before a second trial said the same."""
    from dlwatch.tune import report
    from dlwatch.tune.runner import TrialOutcome
    from dlwatch.tune.sweep import Sweep, TuneOptions

    good, _ = fake_runner({n: 20.0 for n in range(65)})

    def run(cmd, env, override, trial_s, **kw):
        out = good(cmd, env, override, trial_s, **kw)
        if (override or {}).get("num_workers"):
            return TrialOutcome("crashed", out.figures, reason="exited with code 1")
        return out

    doc = Sweep(["job"], {}, TuneOptions(max_trials=3, ceiling=False), runner=run).run()
    assert doc["trials"][0]["status"] == "ok" and len(doc["trials"]) > 1
    said = report.no_recommendation(doc)
    assert said is not None
    assert said.startswith("No recommendation: every other setting tried failed: trial 2 (num_workers="), said
    text = report.summary(doc)
    assert said in text and "keep your settings" not in text

    # Stopped by Ctrl-C with the baseline alone measured.
    base = trial(0, 2, 30.0)
    code = "DataLoader(..., num_workers=2)"
    doc = {"baseline": base, "trials": [base], "best": base, "recommendation": code, "interrupted": True}
    doc["ceiling"] = None
    said = "No recommendation: no setting but your own was measured before Ctrl-C."
    assert report.no_recommendation(doc) == said
    assert "keep your settings" not in report.summary(doc)
    # The search itself saw nothing likely faster after the baseline: its verdict stands.
    doc["interrupted"] = False
    assert report.no_recommendation(doc) is None
    assert "Recommendation: keep your settings" in report.summary(doc)
    # --max-trials 1 (or a budget that fits only the baseline) tried nothing else.
    doc["stopped_because"] = "--max-trials 1 reached"
    said = report.no_recommendation(doc)
    assert said == (
        "No recommendation: only your own settings were measured (--max-trials 1 reached); "
        "allow more trials for other settings to be tried."
    )
    assert said in report.summary(doc) and "keep your settings" not in report.summary(doc)


def test_a_trial_that_exits_early_says_how_far_dlwatch_saw_it_get():
    from types import SimpleNamespace

    from dlwatch.tune.runner import _exit_reason

    m = SimpleNamespace(batches_seen=0, phase="starting", steady_s=0.0)
    assert _exit_reason(0, m) == "exited with code 0 before dlwatch saw a batch"  # a 1 s script: 23 batches
    m.batches_seen, m.phase = 23, "warm-up"
    assert _exit_reason(1, m).startswith("exited with code 1 during warm-up, after 23 batches")


def test_a_script_that_refuses_to_run_twice_is_said_so_and_trial_gives_each_run_a_name():
    """A QA run of OpenCLIP: the first run made logs/<--name>, every later
    trial exited "Experiment already exists", and tune said the script breaks
    with those settings. Its runs are told apart by ``{trial}`` in the
    command; without it, the same error from two settings reads as a refusal
    to rerun."""
    from dlwatch.tune import report
    from dlwatch.tune.runner import TrialOutcome
    from dlwatch.tune.sweep import Sweep, TuneOptions

    good, _ = fake_runner({n: 20.0 + n for n in range(65)})
    names: list[str] = []

    def run(cmd, env, override, trial_s, **kw):
        name = cmd[cmd.index("--name") + 1]
        if name in names:
            out = TrialOutcome("crashed", {}, reason="exited with code 1 before dlwatch saw a batch")
            out.stderr_tail = ["Error. Experiment already exists. Use --name to specify a new experiment."]
            return out
        names.append(name)
        return good(cmd, env, override, trial_s, **kw)

    opts = TuneOptions(max_trials=3, ceiling=False)
    doc = Sweep(["train.py", "--name", "clip"], {}, opts, runner=run).run()
    assert [t["status"] for t in doc["trials"]] == ["ok", "crashed", "crashed"]
    said = report.no_recommendation(doc)
    assert said is not None
    assert said.startswith("No recommendation: your settings ran, then every other"), said
    assert "(Error. Experiment already exists." in said and "--name tune{trial}" in said, said
    assert "breaks with those settings" not in said

    names.clear()
    doc = Sweep(["train.py", "--name", "tune{trial}"], {}, opts, runner=run).run()
    assert names == ["tune1", "tune2", "tune3"]
    assert [t["status"] for t in doc["trials"]] == ["ok", "ok", "ok"]
    assert doc["command"] == ["train.py", "--name", "tune{trial}"]  # as given
    assert report.no_recommendation(doc) is None

    # One failed setting cannot tell a refusal from the setting's own failure:
    # the usual verdict, with the rerun named as the other possibility.
    names.clear()
    opts = TuneOptions(max_trials=2, ceiling=False)
    doc = Sweep(["train.py", "--name", "clip"], {}, opts, runner=run).run()
    said = report.no_recommendation(doc)
    assert said.startswith("No recommendation: every other setting tried failed: trial 2"), said
    assert said.endswith("put {trial} in the command where a fresh name helps: each run gets its number."), (
        said
    )


def test_a_change_must_beat_the_noise_clearly_to_replace_your_settings():
    """A new user's sweep: baseline 0 workers, 2 workers "1.15x" beside 12 %
    noise; alternated runs measured 0.90x. Kept unless it beats 1.5 times
    the noise allowance."""
    from dlwatch.search import choose

    def trials(gain):
        rows = [trial(0, 0, 20.0), trial(1, 0, 17.6), trial(2, 2, 20.0 * gain), trial(3, 2, 20.0 * gain)]
        rows[0]["config"] = rows[1]["config"] = {}
        return rows

    assert choose(trials(1.15)).settings["num_workers"] == 0  # 12 % noise: 1.15x is not clear
    assert choose(trials(1.30)).settings["num_workers"] == 2


def test_trials_beside_other_processes_say_the_figures_may_not_hold():
    from dlwatch.tune import report

    base, other = trial(0, 0, 1.1), trial(1, 2, 3.4)
    base["other_cpu_cores"], other["other_cpu_cores"] = 1.0, 0.2
    doc = {"baseline": base, "trials": [base, other], "best": other, "recommendation": "x", "ceiling": None}
    said = report.load_note(doc)
    assert said.startswith(
        "Other processes used these cores while the trials ran (trial 1 1.0, trial 2 0.2"
    ), said
    assert said in report.summary(doc) and report.annotate(doc)["load_note"] == said
    base["other_cpu_cores"] = 0.1
    doc.pop("load_note")
    assert report.load_note(doc) is None and "load_note" not in report.annotate(doc)
