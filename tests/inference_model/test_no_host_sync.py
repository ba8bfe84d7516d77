"""The engine's per-request cache bookkeeping queues on the stream and never waits for the GPU (CUDA).

Why a test: assigning a Python number to one element of a CUDA tensor (``cache.lengths[slot] = 0``)
copies it from the host and waits for the stream to drain (torch 2.11), and the engine did that at
every join and retire: py-spy of the served engine at c=128 on an H100 (2026-12-07, call 27) found the
engine thread there in two thirds of its samples, the decode pipeline emptied every step. These run
the bookkeeping under ``torch.cuda.set_sync_debug_mode("error")``, which raises on any such wait.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
from ttsfleet.inference.loader import load_model
from ttsfleet.inference.prefix import restore_prefix, snapshot_prefix

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="host syncs are a CUDA matter")


@contextmanager
def no_syncs() -> Iterator[None]:
    """Any operation that waits for the GPU inside raises (torch's sync debug mode)."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_the_debug_mode_catches_a_sync() -> None:  # the check below can fail
    x = torch.ones(4, device="cuda")
    with pytest.raises(RuntimeError, match="synchroniz"), no_syncs():
        x.sum().item()


def test_release_prefill_hand_off_and_prefix_restore_do_not_wait_for_the_gpu() -> None:
    model = load_model("tiny", device="cuda", dtype=torch.float32)
    cache = model.new_cache(4, 32)
    dim = model.config.dim
    h = torch.randn(1, dim, device="cuda")
    prefix = snapshot_prefix(cache, 0, torch.zeros(1 + model.config.num_codebooks, 5, dtype=torch.int64))
    slots_buf = torch.zeros(8, dtype=torch.int64, device="cuda")
    with no_syncs():
        model.release(cache, 1)
        model._finish_prefill(cache, 2, h, model.norm(h), start=0, end=5)
        restore_prefix(cache, 3, prefix)
        slots_buf[3].fill_(2)  # the engine's join
    assert cache.lengths.tolist() == [0, 0, 5, 5]
    assert cache.steps[1].item() == 0 and slots_buf[3].item() == 2
