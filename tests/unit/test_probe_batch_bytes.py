"""The batch's host bytes, read at each epoch's first batch (what a
pageable .to('cuda') copies; enable-pin-memory weighs it)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

from dlwatch.probe.stats import MAX_BATCH_ITEMS, batch_footprint, host_bytes


def test_tensors_in_lists_tuples_and_dicts_are_counted():
    x = torch.zeros(8, 3, 4, dtype=torch.float32)  # 384 bytes
    y = torch.zeros(8, dtype=torch.int64)  # 64 bytes
    assert host_bytes(x) == 384
    assert host_bytes((x, y)) == 448
    assert host_bytes({"image": x, "meta": {"label": y, "name": ["a", "b"]}}) == 448


def test_tensors_already_on_a_device_are_not_host_bytes():
    on_gpu = SimpleNamespace(nbytes=1 << 20, device=SimpleNamespace(type="cuda"))
    # all on the GPU: nothing to copy, so no pin-memory hint (it would ask to
    # pin CUDA tensors, which torch refuses)
    assert host_bytes([on_gpu]) == 0 and batch_footprint([on_gpu]) == (0, True, None)
    assert host_bytes([on_gpu, torch.zeros(4, dtype=torch.uint8)]) == 4
    assert batch_footprint([torch.zeros(4, dtype=torch.uint8)]) == (4, False, 4)


def test_numpy_arrays_are_host_memory_whatever_numpy_says_of_their_device():
    # NumPy >= 2 answers ndarray.device with the string "cpu" (the array
    # API), which once read as "on a device": autotune left a loader whose
    # collate_fn returns NumPy (JAX-style) alone, as if CUDA made its batches.
    # Its bytes are not the tensors' that pin_memory pins or /dev/shm carries.
    batch = {"image": np.zeros((8, 3, 4), dtype=np.float32), "label": np.zeros(8, dtype=np.int64)}
    assert batch_footprint(batch) == (0, False, 8)  # nothing to pin: no pin-memory advice
    assert batch_footprint({**batch, "t": torch.zeros(8, dtype=torch.uint8)}) == (8, False, 8)
    jax_like = SimpleNamespace(nbytes=16, shape=(2, 2), device=SimpleNamespace(platform="cpu"))
    assert batch_footprint(jax_like) == (0, False, 2)
    on_tpu = SimpleNamespace(nbytes=16, shape=(2, 2), device=SimpleNamespace(platform="tpu"))
    assert batch_footprint(on_tpu) == (0, True, 2)


def test_the_first_dimension_the_arrays_share_is_the_batchs_rows():
    x, y = torch.zeros(12, 64, dtype=torch.long), torch.zeros(12, 64, dtype=torch.long)
    assert batch_footprint((x, y)).rows == 12  # nanoGPT's get_batch: [B, T] twice
    assert batch_footprint({"ids": x, "mask": x, "meta": {"len": torch.zeros(12)}}).rows == 12
    # Arrays that disagree, a 0-d tensor, no array at all: nothing is guessed.
    assert batch_footprint((x, torch.zeros(5))).rows is None
    assert batch_footprint(torch.tensor(3.0)).rows is None
    assert batch_footprint(["text", "more"]).rows is None


def test_no_tensor_or_odd_objects_give_none_and_never_raise():
    assert host_bytes(["text", b"bytes", 3, None]) is None

    class Hostile:
        @property
        def nbytes(self):
            raise RuntimeError("no")

    assert host_bytes(Hostile()) is None


def test_a_huge_batch_is_counted_as_far_as_the_bound():
    many = [torch.zeros(1, dtype=torch.uint8) for _ in range(3 * MAX_BATCH_ITEMS)]
    assert 0 < host_bytes(many) < MAX_BATCH_ITEMS


def test_the_loader_frame_carries_the_first_batchs_bytes(probe):
    dl = DataLoader(TensorDataset(torch.zeros(40, 16)), batch_size=4)  # 4 x 16 x 4 bytes
    for _ in dl:
        pass
    st = next(s for s in probe.snapshot() if s.loader_ref() is dl)
    assert st.frame(time.perf_counter_ns())["batch_bytes"] == 256
