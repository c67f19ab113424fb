"""A real PyTorch Lightning ``Trainer.fit`` or an HF Accelerate-prepared loader,
instrumented with the one line a user adds.

Usage: fault_frameworks.py lightning|accelerate

Prints ``ready {json}`` at the first training batch, then trains for about
TRAIN_S seconds (sleep-based dataset cost, 2 fork workers) and exits.
"""

import json
import os
import sys
import time

import torch
from quiet_lightning import quiet_trainer
from torch.utils.data import DataLoader, Dataset

import dlwatch.hook  # noqa: F401  (the one line)

TRAIN_S = float(os.environ.get("TRAIN_S", "6"))


class Slow(Dataset):
    def __len__(self):
        return 100000

    def __getitem__(self, i):
        time.sleep(0.002)
        return torch.randn(8), torch.randn(1)


def make_loader():
    return DataLoader(Slow(), batch_size=8, num_workers=2, multiprocessing_context="fork")


_t0 = None


def tick(loader_info: dict) -> bool:
    """Called per training batch; True when the run should stop."""
    global _t0
    if _t0 is None:
        _t0 = time.monotonic()
        print("ready", json.dumps(loader_info), flush=True)
    time.sleep(0.005)
    return time.monotonic() - _t0 > TRAIN_S


def lightning():
    import lightning as L

    class M(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 1)

        def training_step(self, batch, i):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.lin(x), y)
            if tick(
                {
                    "framework": "lightning",
                    "worker_init_fn_is_none": self.trainer.train_dataloader.worker_init_fn is None,
                }
            ):
                self.trainer.should_stop = True
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    trainer = quiet_trainer()
    dl = make_loader()
    trainer.fit(M(), train_dataloaders=dl)
    print("fit-done", dl.worker_init_fn is None, flush=True)


def accelerate():
    from accelerate import Accelerator

    acc = Accelerator(cpu=True)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    model, opt, dl = acc.prepare(model, opt, make_loader())
    for x, y in dl:
        loss = torch.nn.functional.mse_loss(model(x), y)
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        if tick({"framework": "accelerate", "loader_type": type(dl).__name__}):
            break
    print("fit-done", flush=True)


if __name__ == "__main__":
    globals()[sys.argv[1]]()
