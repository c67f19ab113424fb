"""Real framework training loops, each measuring the data wait its own loop sees.

Usage: framework_jobs.py lightning|hf|accelerate|stateful|lightning_validation|lightning_sanity OUT.json

Each trains a tiny model for about TRAIN_S seconds on a dataset whose samples
sleep (2 fork workers, batches of 8), prints ``ready {json}`` at the first
batch of the phase a test measures and ``fit-done`` at the end, and writes
OUT.json: ``spans``, the loop's own [epoch, wait start, wait end] per batch
(perf_counter_ns, the probe's clock), taken from the framework's callbacks or
hooks, and ``facts``. The wait the loop sees is the gap from the end of one
step to the start of the next: the framework fetches the batch in it. Where
the framework meters its next() itself (Lightning's profiler), that meter.
"""

import json
import os
import sys
import time

import torch
from quiet_lightning import quiet_trainer
from torch.utils.data import DataLoader, Dataset

import dlwatch.hook  # noqa: F401  (the one line)

TRAIN_S = float(os.environ.get("TRAIN_S", "5"))
# Train until this file exists (or TRAIN_S passes): a test snapshotting on a
# loaded box says when it is done.
STOP_FILE = os.environ.get("STOP_FILE")
# 8 samples: 48 ms a batch in one worker, 24 ms with two; the loop's step is
# STEP_S plus the model's (the transformers step is the slowest: its samples
# take twice as long, so every loop waits about half of its time).
SAMPLE_S = 0.006
STEP_S = 0.012
BATCH = 8
TEXT = "the quick brown fox jumps over the lazy dog "


class SleepyVectors(Dataset):
    def __len__(self):
        return 100000

    def __getitem__(self, i):
        time.sleep(SAMPLE_S)
        return torch.full((8,), float(i)), torch.zeros(1)


class SleepyText(Dataset):
    """Lines of text; the collate below tokenizes them."""

    def __len__(self):
        return 100000

    def __getitem__(self, i):
        time.sleep(SAMPLE_S)
        k = i % len(TEXT)
        return TEXT[k:] + TEXT[:k]


class CharCollate:
    """A tokenizing collate: characters to ids, padded, with labels."""

    def __init__(self, length: int = 32) -> None:
        self.vocab = {c: i + 1 for i, c in enumerate(sorted(set(TEXT)))}
        self.length = length

    def __call__(self, lines):
        ids = torch.zeros(len(lines), self.length, dtype=torch.long)
        for r, line in enumerate(lines):
            toks = [self.vocab.get(c, 0) for c in line[: self.length]]
            ids[r, : len(toks)] = torch.tensor(toks)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


class Spans:
    """The loop's own view: the gap between the end of one step and the start
    of the next is its wait for data."""

    def __init__(self, out: str) -> None:
        self.out = out
        self.spans: list[list[int]] = []
        self.t_end: int | None = None
        self.t0: float | None = None
        self.facts: dict = {}
        # Set where the framework meters its own next() (Lightning's profiler):
        # those spans are the truth, not the gap between the step's hooks, which
        # also holds the framework's bookkeeping.
        self.metered = False

    def wait(self, t0: int, t1: int) -> None:
        self.metered = True
        self.spans.append([0, t0, t1])

    def step_start(self, info: dict | None = None) -> None:
        now = time.perf_counter_ns()
        if self.t0 is None:
            self.t0 = time.monotonic()
            print("ready", json.dumps(info or {}), flush=True)
        if self.t_end is not None and not self.metered:
            self.spans.append([0, self.t_end, now])

    def step_end(self) -> bool:
        """True when the run should stop."""
        time.sleep(STEP_S)
        self.t_end = time.perf_counter_ns()
        if STOP_FILE and os.path.exists(STOP_FILE):
            return True
        return self.t0 is not None and time.monotonic() - self.t0 > TRAIN_S

    def write(self) -> None:
        with open(self.out, "w") as f:
            json.dump({"spans": self.spans, "facts": self.facts}, f)
        print("fit-done", flush=True)


def vector_loader(cls=DataLoader, **kw):
    return cls(SleepyVectors(), batch_size=BATCH, num_workers=2, multiprocessing_context="fork", **kw)


def _tiny_module(spans: Spans):
    """A one-layer LightningModule that marks each training step's start."""
    import lightning as L

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 1)

        def on_train_batch_start(self, batch, i):
            spans.step_start({"framework": "lightning"})

        def training_step(self, batch, i):
            x, y = batch
            return torch.nn.functional.mse_loss(self.lin(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    return Tiny


def lightning(spans: Spans) -> None:
    import lightning as L
    from lightning.pytorch.profilers import Profiler

    class FetchMeter(Profiler):
        """Lightning's own meter of its data wait: the fit loop wraps each
        next() of its data fetcher in the profiler's 'train_dataloader_next'."""

        def start(self, action_name: str) -> None:
            if action_name.endswith("train_dataloader_next"):
                self.t0 = time.perf_counter_ns()

        def stop(self, action_name: str) -> None:
            if action_name.endswith("train_dataloader_next") and spans.t0 is not None:
                spans.wait(self.t0, time.perf_counter_ns())

        def summary(self) -> str:
            return ""

    class Data(L.LightningDataModule):
        def train_dataloader(self):
            return vector_loader()

    class Model(_tiny_module(spans)):
        def on_train_batch_end(self, outputs, batch, i):
            if spans.step_end():
                self.trainer.should_stop = True

    trainer = quiet_trainer(profiler=FetchMeter())
    trainer.fit(Model(), datamodule=Data())


# The validation's first batch in lightning_validation: a cold read, longer
# than the stall threshold the test sets.
VAL_FIRST_S = float(os.environ.get("VAL_FIRST_S", "5"))


class SlowFirst(Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, i):
        if i == 0:
            time.sleep(VAL_FIRST_S)
        return torch.zeros(8), torch.zeros(1)


def lightning_validation(spans: Spans) -> None:
    """Two epochs of 20 training batches, each followed by a validation
    whose first batch takes VAL_FIRST_S (num_workers=0): the train loader is
    paused meanwhile, not stalled, and the validation stops at its length
    (no StopIteration), its loader's epoch left open while training runs."""

    class Model(_tiny_module(spans)):
        def train_dataloader(self):
            return vector_loader()

        def val_dataloader(self):
            return DataLoader(SlowFirst(), batch_size=BATCH, num_workers=0)

        def on_train_batch_end(self, outputs, batch, i):
            time.sleep(STEP_S)

        def validation_step(self, batch, i):
            return self.training_step(batch, i)

    quiet_trainer(max_epochs=2, limit_train_batches=20).fit(Model())


def lightning_sanity(spans: Spans) -> None:
    """Lightning's sanity check (its default, 2 validation batches), then
    training until stopped with no validation in between: the sanity
    loader's epoch is left open (Lightning stops it at 2 batches) while the
    loop takes from the train loader."""

    class Model(_tiny_module(spans)):
        def train_dataloader(self):
            return vector_loader()

        def val_dataloader(self):
            return DataLoader(SleepyVectors(), batch_size=BATCH, num_workers=0)

        def on_train_batch_end(self, outputs, batch, i):
            if spans.step_end():
                self.trainer.should_stop = True

        def validation_step(self, batch, i):
            return self.training_step(batch, i)

    quiet_trainer(num_sanity_val_steps=2, check_val_every_n_epoch=1000).fit(Model())


def hf(spans: Spans) -> None:
    os.environ["HF_HUB_OFFLINE"] = "1"
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

    collate = CharCollate()
    config = GPT2Config(vocab_size=len(collate.vocab) + 1, n_positions=32, n_embd=16, n_layer=1, n_head=2)

    class Timing(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            spans.step_start({"framework": "transformers"})

        def on_step_end(self, args, state, control, **kw):
            if spans.step_end():
                control.should_training_stop = True

    args = TrainingArguments(
        output_dir=os.path.join(os.path.dirname(spans.out), "hf"),
        per_device_train_batch_size=BATCH,
        dataloader_num_workers=2,
        max_steps=100000,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        remove_unused_columns=False,
    )
    trainer = Trainer(
        model=GPT2LMHeadModel(config),
        args=args,
        train_dataset=SleepyText(),
        data_collator=collate,
        callbacks=[Timing()],
    )
    trainer.train()


def accelerate(spans: Spans) -> None:
    from accelerate import Accelerator

    acc = Accelerator(cpu=True)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    model, opt, dl = acc.prepare(model, opt, vector_loader())
    for x, y in dl:
        spans.step_start({"framework": "accelerate", "loader_type": type(dl).__name__})
        acc.backward(torch.nn.functional.mse_loss(model(x), y))
        opt.step()
        opt.zero_grad()
        if spans.step_end():
            break


def stateful(spans: Spans) -> None:
    """Train a while, keep the loader's state_dict, then resume from it in a
    new StatefulDataLoader: the measured phase is the resumed one."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    first = vector_loader(StatefulDataLoader)
    seen = []
    for i, (x, _) in enumerate(first):
        seen.append(int(x[0, 0]))
        if i == 9:
            state = first.state_dict()
            break
    # The batch after the 10th, as an uninterrupted loader would give it.
    expected_next = seen[-1] + BATCH
    del first
    resumed = vector_loader(StatefulDataLoader)
    resumed.load_state_dict(state)
    it = iter(resumed)
    spans.facts["batches_before_resume"] = len(seen)
    for x, _ in it:
        spans.step_start({"framework": "torchdata"})
        spans.facts.setdefault("first_after_resume", int(x[0, 0]))
        spans.facts["expected_first_after_resume"] = expected_next
        spans.facts["batches_after_resume"] = spans.facts.get("batches_after_resume", 0) + 1
        if spans.step_end():
            break


if __name__ == "__main__":
    # One thread for the model's ops: on a shared 2-core box a tiny model's
    # step with torch's default threads takes 100s of ms, not a few.
    torch.set_num_threads(1)
    if sys.argv[1] == "hf":
        SAMPLE_S *= 2
    spans = Spans(sys.argv[2])
    globals()[sys.argv[1]](spans)
    spans.write()
