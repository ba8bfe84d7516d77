"""Prefill calls on a CUDA stream of their own, beside the decode steps (``TTSFLEET_PREFILL_STREAM``).

Why: on an H100 the served engine's stream is never idle between its spans at c=64 and c=128, and a
prefill call holds it ~9-10 ms a prompt of ~350 tokens (~30 % of the stream at c=64, ~36 % at
c=128), most of it waiting for the host to launch the call's pieces (its span per prompt matches the
host's prefill phase per prompt: ``benchmarks/inference_h200/README.md``, 2026-12-06d). Every decode
step queued behind that call waits for it. On a side stream the call's launches and its GPU work
no longer stand between two decode steps: the step runs beside it (the prefill compute-bound, the
step reading weights), and the prompt's request joins the batch once the call's completion event is
done, a step or two later than when it joined at once.

Ordering: the side stream first waits for everything already queued on the engine's stream, so a
freed slot's last decode writes and its release are done before a new prompt fills it; decode steps
launched after the call never touch its slots (the request joins only once the call is done), and
the padded rows of both write the shared scratch slot, whose contents nobody reads. Off by default
until measured (``benchmarks/inference_h200/next_calls.sh 18``). On the CPU a call's work is done
when it returns: the deferral alone runs there, which is what the CPU tests check.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ttsfleet.switches import ProcessSwitch, one_of

PREFILL_STREAM_ENV = "TTSFLEET_PREFILL_STREAM"
PREFILL_STREAM_SWITCH: ProcessSwitch[str] = ProcessSwitch(
    PREFILL_STREAM_ENV, "off", one_of(PREFILL_STREAM_ENV, ("off", "on"), "off"))


class Done:
    """The completion of a call whose work was done when it returned (the CPU)."""

    @staticmethod
    def query() -> bool:
        return True

    @staticmethod
    def synchronize() -> None:
        return None


class SidePrefill:
    """Runs prefill calls on a side stream (CUDA) and hands back each call's completion: a CUDA event,
    or :class:`Done` on the CPU. ``spans`` (:class:`~ttsfleet.inference.engine_phases.GpuSpans`):
    each call's GPU span is added to it as ``prefill``."""

    def __init__(self, device: Any, spans: Any = None) -> None:
        import torch

        self.stream = torch.cuda.Stream(device=device) if device.type == "cuda" else None
        self.spans = spans

    def run(self, call: Callable[[], None]) -> Any:
        """``call()`` (one ``model.prefill_batch``) on the side stream, after the engine's queued work."""
        if self.stream is None:
            call()
            return Done()
        import torch

        from .engine_phases import GpuSpans

        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            if self.spans is not None:
                return self.spans.time("prefill", call)
            call()
            return GpuSpans.mark()
