"""Counts in every rule's text as a person writes them (issue 43): "1 worker",
"2 workers", "1 core's worth", never "1 workers" or "waited 1 cores' worth".

Every case of the rule table (test_diagnose_rules.CASES) is judged again with
its loaders cut to 1 and to 2 workers and the box to 1, 2 and 8 usable cores,
and every hint's message and suggestion is read for a count whose noun
disagrees with it."""

from __future__ import annotations

import copy
import re

import pytest

from dlwatch.diagnose import evaluate
from dlwatch.snapshot import count_of, plural
from tests.unit.test_diagnose_rules import CASES, growth_snaps, run

# "1 workers", "1 cores' worth", "1 usable cores"; and "2 worker is", "3 core's".
ONE_MANY = re.compile(
    r"(?<![\d.,])1 (?:usable |busy |CPU-bound |DataLoader |idle )?"
    r"(?:workers|cores|batches|threads|epochs|trainers|processes|samples|loaders|ranks)\b"
)
MANY_ONE = re.compile(
    r"(?<![\d.,])(?:0|[2-9]|\d\d+|\d+\.\d+) (?:usable |busy |CPU-bound |DataLoader |idle )?"
    r"(?:worker|core|batch|thread|epoch|trainer|process|sample|loader|rank)(?: is|'s|\b(?![-/]))"
)


def _variants(snap: dict):
    for nw in (1, 2):
        for usable in (1.0, 2.0, 8.0):
            s = copy.deepcopy(snap)
            s.setdefault("host", {})["usable_cores"] = usable
            for job in s.get("jobs") or []:
                for ld in job.get("loaders") or []:
                    ws = ld.get("workers") or []
                    if ws and all(isinstance(w, dict) for w in ws):
                        while len(ws) < nw:
                            ws.append(dict(ws[-1], id=len(ws), pid=ws[-1]["pid"] + 100))
                        ld["workers"] = ws[:nw]
                        ld["num_workers"] = nw
            yield f"nw={nw} usable={usable:g}", s


def _texts(hints):
    for h in hints:
        yield h["id"], h["message"]
        yield h["id"], h["suggestion"]


# "its CPU figures account for 782 ms of the 500 ms each batch takes": a
# part larger than its whole (the cycle model's misfit, capacity.misfit).
PART_OF = re.compile(r"account for (?:only )?(\d+) ms of the (\d+) ms")


def _bad(text: str) -> list[str]:
    out = [m.group(0) for m in ONE_MANY.finditer(text)] + [m.group(0) for m in MANY_ONE.finditer(text)]
    return out + [m.group(0) for m in PART_OF.finditer(text) if int(m.group(1)) > int(m.group(2))]


def test_plural_and_count_of():
    assert count_of(1, "worker") == "1 worker" and count_of(2, "worker") == "2 workers"
    assert count_of(0, "batch") == "0 batches" and count_of(1, "batch") == "1 batch"
    assert count_of(1.0, "core") == "1 core" and count_of(0.5, "core") == "0.5 cores"
    assert count_of(1.04, "core", "{:.1f}") == "1.0 cores"  # as written: not exactly one
    assert count_of(1, "core's") + " worth" == "1 core's worth"
    assert count_of(2, "core's") + " worth" == "2 cores' worth"
    assert plural(1, "process") == "process" and plural(3, "process") == "processes"
    assert plural(2, "is") == "are" and plural(1, "is") == "is"
    # The check below finds what it is for.
    assert _bad("1 workers run 5 threads") and _bad("waited 1 cores' worth") and _bad("its 2 worker is")
    assert not _bad("1 worker runs 5 threads; 2 workers; 1 core's worth; 2 cores' worth; a 2-core box")
    assert _bad("its CPU figures account for 782 ms of the 500 ms each batch takes now")


def test_every_rule_counts_as_a_person_writes():
    fired: set[str] = set()
    found = []
    for name, snap, _hid, _fires in CASES:
        for how, s in _variants(snap):
            hints = evaluate(s)
            for hid, text in _texts(hints):
                fired.add(hid)
                found += [(name, how, hid, b, text) for b in _bad(text)]
    for nw in (1, 2):
        for hid, text in _texts(run(growth_snaps(40, nw=nw))[0]):
            fired.add(hid)
            found += [("growth", nw, hid, b, text) for b in _bad(text)]
    assert not found, "\n".join(map(str, found[:20]))
    # The variants reach the rules whose texts count things.
    assert {
        "add-workers",
        "io-bound",
        "cpu-bound-preprocessing",
        "workers-oversubscribe-cores",
        "worker-thread-oversubscription",
        "worker-memory-growth",
        "no-workers",
    } <= fired, sorted(fired)


@pytest.mark.parametrize("n", [1, 2])
def test_count_of_reads_its_number_as_written(n):
    assert count_of(n, "epoch") == f"{n} epoch{'s' if n != 1 else ''}"


def test_the_live_views_epoch_line_counts_that_epochs_batches():
    from dlwatch.tui import fmt
    from dlwatch.tui.loader import epoch_stats

    ld = {"epoch": 4, "epoch_ms_last": 26000.0, "epoch_batches": [46, 46, 46], "batches_total": 144}
    line = epoch_stats(ld, fmt.Palette()).plain
    assert "last epoch 26 s, 46 batches" in line and "144 batches in all" in line, line
    one = epoch_stats(dict(ld, epoch_batches=[1], batches_total=1), fmt.Palette()).plain
    assert "last epoch 26 s, 1 batch ·" in one and "1 batch in all" in one and not _bad(one), one


def test_the_jobs_command_line_pastes_back_into_a_shell_as_it_ran():
    # A QA run: `shard-{0000..0063}.tar` in the suggested `dlwatch tune -- …`
    # expanded into 64 arguments when pasted, and 'two words' split in two.
    import shlex
    import subprocess
    import sys

    # And empty arguments: torchvision's reference train.py run with
    # `--output-dir ''` lost the '' and the suggested line failed.
    args = ["--train-data", "/d/shard-{0000..0063}.tar", "--note", "two words", "--x=$HOME", "", "-o", ""]
    code = "from dlwatch.probe.identity import _cmdline; print(_cmdline())"
    cmd = [sys.executable, "-X", "utf8", "-c", code, *args]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    assert shlex.split(out.strip()) == [sys.executable, "-X", "utf8", "-c", code, *args]


@pytest.mark.parametrize(
    ("cmdline", "now", "want"),
    [
        ("python -m open_clip_train.main --workers 2 --batch-size 64", 2, ("--workers 2", "--workers {}")),
        ("python main.py -a resnet18 -j 4 /data", 4, ("-j 4", "-j {}")),  # pytorch/examples' imagenet
        ("python train.py data.num_workers=0 model.x=1", 0, ("data.num_workers=0", "data.num_workers={}")),
        (
            "python run_clm.py --dataloader_num_workers 4",
            4,
            ("--dataloader_num_workers 4", "--dataloader_num_workers {}"),
        ),
        ("python t.py --num-workers=8", 8, ("--num-workers=8", "--num-workers={}")),
        # LightningCLI (Lightning's imagenet.py example): the module's init arguments
        ("python imagenet.py fit --model.workers 0", 0, ("--model.workers 0", "--model.workers {}")),
        ("python main.py fit --data.num_workers=4", 4, ("--data.num_workers=4", "--data.num_workers={}")),
        ("python t.py --workers 3", 2, None),  # not the count measured: another loader's, or not it
        ("python t.py --workers 2 --eval-workers 2", 2, None),  # which one is not known
        ("python t.py --world-size 2 --batch 2", 2, None),
        ("python t.py --workers 'unbalanced", 2, None),
    ],
)
def test_the_command_line_option_that_sets_the_worker_count(cmdline, now, want):
    from dlwatch.diagnose.render import workers_option

    assert workers_option(cmdline, now) == want


def test_a_worker_count_hint_names_the_scripts_own_option():
    # A QA run of OpenCLIP: "set num_workers=1 in DataLoader(...)", where its
    # user sets --workers.
    from tests.unit.test_diagnose_rules import get, job, loader, snap

    ld = loader(nw=0, wait=0.6, step_ms=20.0, wait_ms=30.0)
    j = job(loaders=[ld], main_cpu=60.0, main_thread_cpu=60.0)
    j["cmdline"] = "python -m open_clip_train.main --workers 0 --batch-size 64"
    h = get(evaluate(snap([j], usable=4.0, other_cpu_cores=0.0)), "no-workers")
    n = h["evidence"]["recommended_num_workers"]
    assert n and f"(your command line sets it: --workers 0 → --workers {n})" in h["suggestion"]
