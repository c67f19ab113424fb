"""In the frameworks' own terms (issue 32): which loader an HF Trainer or
Lightning iterates for evaluation, an evaluation's pause not counted as the
training loader's step, a finished loader's hints ending with it, and the
advice naming the framework's knob."""

from __future__ import annotations

import time

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from dlwatch.diagnose import Diagnoser, evaluate
from dlwatch.diagnose.facts import setting
from dlwatch.probe.framework import _classify
from tests.unit.test_diagnose_rules import T0, job, loader, snap


@pytest.mark.parametrize(
    ("filename", "func", "expected"),
    [
        ("/venv/site-packages/transformers/trainer.py", "evaluation_loop", ("transformers", "eval")),
        ("/venv/site-packages/transformers/trainer.py", "_inner_training_loop", ("transformers", "train")),
        ("/venv/site-packages/transformers/trainer.py", "train", ("transformers", None)),
        ("/venv/site-packages/lightning/pytorch/loops/evaluation_loop.py", "run", ("lightning", "eval")),
        ("/venv/site-packages/lightning/pytorch/loops/fit_loop.py", "advance", ("lightning", "train")),
        ("/venv/site-packages/pytorch_lightning/loops/training_epoch_loop.py", "run", ("lightning", "train")),
        ("/venv/site-packages/accelerate/data_loader.py", "__iter__", ("accelerate", None)),
        ("/home/me/train.py", "evaluation_loop", (None, None)),
    ],
)
def test_which_framework_and_role_a_frame_says(filename, func, expected):
    assert _classify(filename, func) == expected


def _as_framework(src: str, filename: str):
    """A function whose code object lives in ``filename``, as a framework's would."""
    ns: dict = {}
    exec(compile(src, filename, "exec"), ns)
    return ns


def test_an_evaluation_is_labelled_and_its_pause_is_not_the_training_loaders_step(probe):
    trainer = _as_framework(
        "import time\n"
        "def evaluation_loop(dl):\n"
        "    for _ in dl:\n"
        "        time.sleep(0.1)\n"
        "def _inner_training_loop(dl):\n"
        "    return iter(dl)\n",
        "/venv/site-packages/transformers/trainer.py",
    )
    train = DataLoader(TensorDataset(torch.arange(40.0)), batch_size=2)
    evals = DataLoader(TensorDataset(torch.arange(6.0)), batch_size=2)
    it = trainer["_inner_training_loop"](train)
    for _ in range(3):
        next(it)
        time.sleep(0.01)
    trainer["evaluation_loop"](evals)  # 0.3 s with the training loader between batches
    next(it)
    st = {s.loader_ref(): s for s in probe.snapshot()}
    f_train = st[train].frame(time.perf_counter_ns())
    f_eval = st[evals].frame(time.perf_counter_ns())
    assert (f_train["framework"], f_train["role"]) == ("transformers", "train")
    assert (f_eval["framework"], f_eval["role"]) == ("transformers", "eval")
    # Three 10 ms steps, the last one up to the evaluation's start: not its 300 ms.
    assert 25e6 <= f_train["step_ns"] < 200e6, f_train["step_ns"]
    assert f_train["epoch_open"] is True
    # The evaluation's loader ran to its end: no epoch runs, though it lives.
    assert f_eval["epoch_open"] is False


def test_an_evaluation_left_open_at_its_length_does_not_count_the_training_as_its_step(probe):
    """Lightning's evaluation stops at the loader's length, without the
    StopIteration that ends an epoch: the training between two validations
    read as the eval loader's step (a QA run: "step 8967 ms")."""
    lit = _as_framework(
        "import time\n"
        "def run(dl, n):\n"
        "    it = iter(dl)\n"
        "    for _ in range(n):\n"
        "        next(it)\n"
        "        time.sleep(0.01)\n"
        "    return it\n",
        "/venv/site-packages/lightning/pytorch/loops/evaluation_loop.py",
    )
    fit = _as_framework(
        "def advance(dl):\n    return iter(dl)\n", "/venv/site-packages/lightning/pytorch/loops/fit_loop.py"
    )
    train = DataLoader(TensorDataset(torch.arange(40.0)), batch_size=2)
    evals = DataLoader(TensorDataset(torch.arange(6.0)), batch_size=2)
    kept = lit["run"](evals, 3)  # every batch, no StopIteration: the epoch stays open
    it = fit["advance"](train)  # training takes the loop back
    for _ in range(3):
        next(it)
        time.sleep(0.1)  # 0.3 s of training
    st = {s.loader_ref(): s for s in probe.snapshot()}
    f_eval = st[evals].frame(time.perf_counter_ns())
    assert f_eval["role"] == "eval" and f_eval["step_ns"] < 100e6, f_eval["step_ns"]
    del kept


def test_a_finished_loaders_hints_end_with_it():
    diag = Diagnoser()
    shown = []
    for k in range(20):
        ld = loader(nw=0, wait=0.4, step_ms=60.0, batches=1000 + 10 * k, window_s=3.0)
        # The evaluation ends at 8 s; its window's figures stay as they were.
        ld["epoch_open"] = k < 8
        j = job(loaders=[ld], main_cpu=40.0, main_thread_cpu=40.0)
        hints = diag.update(snap([j], t=T0 + k, usable=2.0, other_cpu_cores=0.0, gpus=[], gpu_status="n/a"))
        shown.append(any(h["id"] == "no-workers" for h in hints))
    assert shown[5] and not any(shown[8 + 6 :])


def test_the_advice_names_the_frameworks_knob():
    ld = {"framework": "transformers", "role": "eval"}
    assert setting(ld, "num_workers", 4).startswith("dataloader_num_workers=4 in TrainingArguments")
    assert (
        "the DataLoader your val_dataloader() returns (in your LightningModule or LightningDataModule)"
        in setting({"framework": "lightning", "role": "eval"}, "num_workers", 2)
    )
    assert "accelerator.prepare()" in setting({"framework": "accelerate"}, "num_workers", 2)
    assert setting({}, "persistent_workers", True) == "persistent_workers=True in DataLoader(...)"
    # A hint on an HF Trainer's evaluation loader, in its terms.
    s = snap(
        [
            job(
                loaders=[loader(nw=0, wait=0.4, step_ms=60.0, framework="transformers", role="eval")],
                main_cpu=40.0,
            )
        ],
        usable=8.0,
        other_cpu_cores=0.0,
    )
    (h,) = [h for h in evaluate(s) if h["id"] == "no-workers"]
    assert h["message"].startswith("Loader 0 (eval) of PID 1000")
    assert "set dataloader_num_workers=" in h["suggestion"] and "in DataLoader(...)" not in h["suggestion"]


def test_the_advice_names_the_loader_class_the_script_builds(probe):
    # A DataLoader subclass (litdata's and Mosaic's StreamingDataLoader,
    # torchdata's StatefulDataLoader) is what the script writes; a framework's
    # own wrapper (Accelerate's DataLoaderShard) is not, and its terms win.
    from torch.utils.data import DataLoader

    class StreamingDataLoader(DataLoader):
        pass

    for cls, named in ((StreamingDataLoader, "StreamingDataLoader"), (DataLoader, None)):
        dl = cls(list(range(4)), batch_size=2)
        list(dl)
        (st,) = [s for s in probe.snapshot() if s.loader_ref() is dl]
        assert st.config.get("loader_class") == named
    ld = {"loader_class": "StreamingDataLoader"}
    assert setting(ld, "persistent_workers", True) == "persistent_workers=True in StreamingDataLoader(...)"
    assert "accelerator.prepare()" in setting(ld | {"framework": "accelerate"}, "num_workers", 2)
    assert setting({"loader_class": "not a name()"}, "num_workers", 2) == "num_workers=2 in DataLoader(...)"
