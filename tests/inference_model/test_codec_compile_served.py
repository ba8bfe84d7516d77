"""The codec process's compiled decoder, built as a server builds it (``build_slot_decoder`` with
``--codec-compile``: bf16 weights with the fused Snake as ``CodecSource(fast=True)`` loads them,
channels-last convs, cuDNN's residual units), on the CPU: how many compiles its graph captures cost,
what the compiles trace as symbols, and what the log says while they run.

Dynamo's ``eager`` backend stands in for Inductor (the tracing, guards and compile count are
Dynamo's; Inductor's code generation would take minutes here). The CPU takes no CUDA graphs, so the
captures' decode calls are replayed: ``_CodecGraph.capture`` runs the decode three times on a
shape's scratch rows (two warm-ups, then the captured call), every stream bucket x frame count, in
the order ``capture`` takes them. What the CPU cannot show (CUDA's SDPA and conv lowerings) is the
GPU test's (test_codec_compile.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend
from ttsfleet.inference.codec import MIN_COMPILED_ROWS, load_codec
from ttsfleet.inference.codec_batch import build_slot_decoder
from ttsfleet.inference.codec_layers import cached_conv_weights
from ttsfleet.inference.codec_process import DecoderPlan

FRAMES = (1, 2, 4, 8)


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def lines(self, level: int = logging.INFO) -> list[str]:
        return [r.getMessage() for r in self.records if r.levelno == level]


@dataclass
class Served:
    decoder: object
    counter: CompileCounterWithBackend
    log: _Records
    after_build: int  # compiles when build_slot_decoder returned


@pytest.fixture(scope="module")
def served():
    """One served build (8 stream slots: buckets 2, 4, 8 once one stream is padded to two rows),
    then the capture set's decode calls and pushes of 1, 2, 3 and 8 streams x 1, 2, 4, 8 frames."""
    torch._dynamo.reset()
    torch.set_num_threads(1)
    codec = load_codec("tiny", fast=True)
    plan = DecoderPlan(slots=8, max_seq_len=1024, graphs=True, graph_max_batch=8, compile_mode="default",
                       max_frames=8, channels_last=True)
    counter = CompileCounterWithBackend("eager")
    slot_decoder = codec.slot_decoder
    codec.slot_decoder = lambda *args, **kwargs: slot_decoder(*args, compile_backend=counter, **kwargs)
    records = _Records()
    logger = logging.getLogger("ttsfleet.inference")
    logger.addHandler(records)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    try:
        dec = build_slot_decoder(codec, plan)
        after_build = counter.frame_count
        ncb = codec.num_codebooks
        with torch.inference_mode():
            for t in FRAMES:  # _CodecGraph.capture's calls, shape by shape as capture() takes them
                for b in dec.buckets:
                    rows = torch.arange(dec.slots, dec.slots + b)
                    codes = torch.zeros(b, ncb, t, dtype=torch.long)
                    for _ in range(3):
                        dec._decode(rows.clone(), codes)
        gen = torch.Generator().manual_seed(4)
        for t in FRAMES:
            for n in (1, 2, 3, 8):
                out = dec.push(list(range(n)), torch.randint(0, 16, (n, ncb, t), generator=gen))
                assert out.shape == (n, t * codec.frame_length)
        yield Served(dec, counter, records, after_build)
    finally:
        logger.removeHandler(records)
        logger.setLevel(old_level)
        torch._dynamo.reset()


def test_the_served_capture_set_compiles_twice(served) -> None:
    """Every (streams, frames) shape the server captures, and pushes of 1, 2, 3 and 8 streams, run
    on two compiles: one-frame pushes and multi-frame pushes (one stream padded to two rows), both
    made by the build, before any capture."""
    assert served.decoder.compiled is not None, served.decoder.compile_error
    assert served.decoder.buckets == [MIN_COMPILED_ROWS, 4, 8]
    assert served.after_build == 2
    assert served.counter.frame_count == 2, "a capture-set shape or push recompiled"
    assert served.decoder.compiles == 2


def test_only_the_pushs_sizes_are_traced_as_symbols(served) -> None:
    """The compiled graphs take symbolic sizes from the push's codes and rows alone. The convs'
    cached channels-last weights are plain tensor attributes, which ``dynamic=True`` traced as
    symbols (about twice the tracing time) until ``_compile`` marked them static with the state."""
    cached = list(cached_conv_weights(served.decoder.codec))
    assert cached, "the channels-last decoder caches its 4-D weights"
    for gm in served.counter.graphs:
        symbolic = []
        for node in gm.graph.find_nodes(op="placeholder"):
            val = node.meta.get("example_value")
            if isinstance(val, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in val.shape):
                symbolic.append(node.name)
        assert sorted(symbolic) == ["l_codes_", "l_rows_"], symbolic


def test_the_log_says_what_the_compiles_cost(served) -> None:
    """Before the captures: compile on and two compiles expected; then one line per compile naming
    its shape class and seconds; at the end the count. No warning (no recompile of a class)."""
    lines = served.log.lines()
    start = [i for i, m in enumerate(lines) if m.startswith("codec decode compile on")]
    done = [i for i, m in enumerate(lines) if m.startswith("codec decode compile ") and " took " in m]
    assert len(start) == 1 and "2 compiles expected" in lines[start[0]], lines
    assert len(done) == 2 and start[0] < done[0], lines
    assert "compile 1 (one-frame pushes, at 2 streams x 1 frames) took" in lines[done[0]]
    assert "compile 2 (multi-frame pushes, at 2 streams x 2 frames) took" in lines[done[1]]
    assert any(m.startswith("codec decode compiled (default): on, 2 compiles") for m in lines), lines
    assert not served.log.lines(logging.WARNING)


def test_a_second_compile_of_a_class_is_a_warning(caplog) -> None:
    """A recompile of a shape class already compiled (a guard the design does not expect failed)
    logs a warning that says how to find the guard."""
    dec = load_codec("tiny").slot_decoder(2)
    with caplog.at_level(logging.INFO, logger="ttsfleet.inference.codec"):
        dec._log_compile(2, 4, 1.5)
        dec._log_compile(4, 8, 2.0)
    (first, second) = caplog.records
    assert first.levelno == logging.INFO and "compile 1 (multi-frame pushes" in first.getMessage()
    assert second.levelno == logging.WARNING and "TORCH_LOGS=recompiles" in second.getMessage()
    assert dec.compiles == 2
