"""The engine never assigns a Python number to one element of a tensor (``t[i] = n``) while serving.

Why: on CUDA that is a blocking copy from the host that waits for the stream to drain (torch 2.11),
and the engine did it at every join (the batch row's slot) and every retire (``model.release``): py-spy
at c=128 on an H100 (2026-12-07, call 27) found the engine thread waiting there in two thirds of its
samples, the decode pipeline emptied every step. ``fill_`` or a slice launches a kernel instead. The
GPU test (``tests/inference_model/test_no_host_sync.py``) catches the waits themselves; this one runs
on the CPU, where nothing waits, by watching every tensor item assignment the inference package makes
while requests are admitted, prefilled (riding in decode steps, or in calls of their own), decode,
retire and free their slots.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
from ttsfleet.inference.engine import Engine, EngineConfig
from ttsfleet.inference.prompt import build_prompt

from .conftest import run_requests

NUMBERS = (int, float, bool, np.number)


def _one_element(t: torch.Tensor, index: object) -> bool:
    """Whether ``t[index]`` names a single element (one int per dimension)."""
    ints = index if isinstance(index, tuple) else (index,)
    return len(ints) == t.dim() and all(isinstance(i, int | np.integer) for i in ints)


@pytest.fixture
def item_assignments(monkeypatch) -> list[str]:  # noqa: ANN001
    """``file:line`` of every ``t[i] = number`` made from ``ttsfleet.inference`` or ``ttsfleet.kernels``
    code from now on, on any thread (the real assignment still runs)."""
    seen: list[str] = []
    real = torch.Tensor.__setitem__

    def watched(self: torch.Tensor, index: object, value: object) -> None:
        caller = sys._getframe(1)
        module = caller.f_globals.get("__name__", "")
        if isinstance(value, NUMBERS) and _one_element(self, index) and \
                module.startswith(("ttsfleet.inference", "ttsfleet.kernels")):
            seen.append(f"{caller.f_code.co_filename}:{caller.f_lineno}")
        real(self, index, value)

    monkeypatch.setattr(torch.Tensor, "__setitem__", watched)
    return seen


def test_the_watch_sees_an_item_assignment(item_assignments) -> None:  # the check below can fail
    from ttsfleet.inference import engine_messages

    t = torch.zeros(3)
    exec("t[1] = 5", {"__name__": "ttsfleet.inference.example", "t": t})  # noqa: S102
    t[2] = 7  # from this test's own module: not the package's
    assert len(item_assignments) == 1 and t.tolist() == [0.0, 5.0, 7.0]
    assert engine_messages  # imported: the package's modules are the ones watched


@pytest.mark.parametrize("mixed", ["on", "off"], ids=["mixed-steps", "prefill-calls"])
def test_serving_requests_assigns_no_single_elements(parts, item_assignments, mixed: str) -> None:
    from ttsfleet.inference.mixed_step import MIXED_STEPS_SWITCH

    model, codec, tok = parts
    MIXED_STEPS_SWITCH.set(mixed)
    eng = Engine(model, codec, EngineConfig(max_running_requests=3, max_queue=8, cuda_graph_max_bs=4,
                                            pad_to_buckets=True))
    eng.start()
    try:  # six requests of different lengths through three slots: joins beside decoding rows, retires,
        # slots reused
        prompt = build_prompt(tok, model.config, "No single elements.")
        ends = run_requests(eng, prompt, 6, [3, 5, 7, 4, 6, 8], ignore_eos=True)
    finally:
        eng.stop()
        MIXED_STEPS_SWITCH.reset()
    assert ends == ["done"] * 6
    assert eng.stats.steps > 6
    assert (eng.stats.mixed_steps > 0) == (mixed == "on")  # each path taken where asked
    assert item_assignments == []
