"""Prefill calls on a CUDA stream of their own, beside the decode steps (``TTSFLEET_PREFILL_STREAM``).

Why: on an H100 the served engine's stream is never idle between its spans at c=64 and c=128, and a
prefill call holds it ~9-10 ms a prompt of ~350 tokens (~30 % of the stream at c=64, ~36 % at
c=128), most of it waiting for the host to launch the call's pieces (its span per prompt matches the
host's prefill phase per prompt: ``benchmarks/inference_h200/README.md``, 2026-12-06d). Every decode
step queued behind that call waits for it. On a side stream the call's launches and its GPU work
no longer stand between two decode steps: the step runs beside it (the prefill compute-bound, the
step reading weights), and the prompt's request joins the batch once the call's completion event is
done, a step or two later than when it joined at once.

Measured (H100, 2026-12-06e, ``next_calls.sh 18``, one round, side by side): frames/s +7.6 % at c=64
(3,662 -> 3,942) and +10.2 % at c=128 (4,461 -> 4,915), the hour's three A sides within 1.2 / 1.6 %;
first audio p50 +29 ms (88 -> 117 at c=64), p99 161 -> 177 ms at c=64 and 175 -> 287 at c=128; the
listener's gaps 36 -> 17 % of requests at c=64. On by default on CUDA since (``auto``).

Ordering: the side stream first waits for everything already queued on the engine's stream, so a
freed slot's last decode writes and its release are done before a new prompt fills it; decode steps
launched after the call never touch its slots (the request joins only once the call is done), and
the padded rows of both write the shared scratch slot, whose contents nobody reads. On the CPU a
call's work is done when it returns: the deferral alone runs there (``on``), which is what the CPU
tests check; ``auto`` leaves it off there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ttsfleet.switches import ProcessSwitch, one_of

PREFILL_STREAM_ENV = "TTSFLEET_PREFILL_STREAM"
#: ``auto`` (the default): on where the engine runs on a CUDA device (a CPU has no second stream)
PREFILL_STREAM_SWITCH: ProcessSwitch[str] = ProcessSwitch(
    PREFILL_STREAM_ENV, "auto", one_of(PREFILL_STREAM_ENV, ("auto", "off", "on"), "auto"))


PREFILL_JOIN_ENV = "TTSFLEET_PREFILL_JOIN"
#: When a side call's requests join the decode batch: ``done`` (the default) once the call's event
#: reports done, polled each iteration; ``next-step`` at the next iteration whatever the call's state,
#: the engine's stream made to wait for the call's event on the GPU (no host wait) before the step
#: that decodes them. Why: on an H100 the side stream cost first audio +29 ms at p50 (2026-12-06e,
#: two decode steps: the call is rarely done when the next step is launched, since the pipelined
#: loop launches it as soon as the step before last is read back); a decode step starts ~12-20 ms
#: after the one the call runs beside, a one-prompt call takes ~7-11 ms, so the wait is rarely felt.
#: Off until measured (``benchmarks/inference_h200/next_calls.sh 21``).
PREFILL_JOIN_SWITCH: ProcessSwitch[str] = ProcessSwitch(
    PREFILL_JOIN_ENV, "done", one_of(PREFILL_JOIN_ENV, ("done", "next-step"), "done"))


def side_stream_wanted(device_type: str) -> bool:
    """What the process switch says for an engine on ``device_type``."""
    mode = PREFILL_STREAM_SWITCH.get()
    return mode == "on" or (mode == "auto" and device_type == "cuda")


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
        #: join a call's requests at the next iteration (:data:`PREFILL_JOIN_SWITCH`)
        self.joins_next_step = PREFILL_JOIN_SWITCH.get() == "next-step"

    @staticmethod
    def order_after(done: Any) -> None:
        """Make the current (engine's) stream wait on the GPU for a call's completion ``done``, so work
        queued from now on reads what the call wrote; the host does not wait."""
        if isinstance(done, Done):
            return
        import torch

        torch.cuda.current_stream().wait_event(done)

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
