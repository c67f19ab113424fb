"""Which loader a profile burst follows (control.busiest_loader): a real
publisher's frames, real DataLoaders through the probe's patches."""

from __future__ import annotations

import gc

import torch
from torch.utils.data import DataLoader, TensorDataset

from dlwatch.probe.publisher import BUSY_FRAMES, Publisher


def _loader(n: int = 8) -> DataLoader:
    return DataLoader(TensorDataset(torch.arange(float(n))), batch_size=2)


def test_a_loader_between_two_epochs_is_still_the_one_to_profile(probe, tmp_path):
    pub = Publisher(directory=str(tmp_path))
    dl = _loader()
    pub.build_frame()
    for _ in dl:  # one whole epoch; its iterator is gone once it ends
        pass
    gc.collect()
    pub.build_frame()
    st = next(s for s in probe.snapshot() if s.loader_ref() is dl)
    assert st.iter_ref() is None, "the epoch's iterator should be gone"
    # It stepped within the publisher's last second: a burst asked now (the
    # next epoch's workers starting) is for it, not "nothing to profile".
    assert pub._control.busiest_loader() is st
    # A second of frames later with no batch, it has stopped: nothing to profile.
    for _ in range(BUSY_FRAMES):
        pub.build_frame()
    assert pub._control.busiest_loader() is None


def test_a_live_iterator_comes_before_a_loader_that_finished_its_epoch(probe, tmp_path):
    pub = Publisher(directory=str(tmp_path))
    done, stepping = _loader(16), _loader(16)
    pub.build_frame()
    for _ in done:
        pass
    it = iter(stepping)
    next(it)
    gc.collect()
    pub.build_frame()
    # The finished loader returned 8 batches in that second, the live one 1.
    assert pub._control.busiest_loader() is next(s for s in probe.snapshot() if s.loader_ref() is stepping)
