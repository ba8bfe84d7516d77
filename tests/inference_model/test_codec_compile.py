"""The compiled batched codec decode (``slot_decoder(compile_mode=...)``, issue #25) decodes the eager
decoder's audio, serves every stream / frame count from a few compiles, and falls back to eager.

On CPU the tests compile with Dynamo's ``eager`` / ``aot_eager`` backends: Dynamo's tracing of the
slot state (reads by row, in-place row writes) and, with ``aot_eager``, the functionalized state
mutations Inductor receives, without Inductor's code generation (minutes on a CPU: the tiny codec
took 123 s on this 2-core machine, 2026-12-03). The Inductor-compiled decoder is the GPU test's.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend
from ttsfleet.inference.codec import COMPILE_MODES, load_codec


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Dynamo caches compiled code on the function's code object, shared by every decoder of the
    process; each test starts and leaves the cache empty (its recompile limit counts all entries)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture(scope="module")
def codec():
    torch.set_num_threads(1)
    return load_codec("tiny")


def _codes(n: int, t: int, ncb: int, gen: torch.Generator) -> torch.Tensor:
    return torch.randint(0, 16, (n, ncb, t), generator=gen)


def test_compiled_slot_decoder_decodes_the_eager_audio(codec) -> None:
    """Consecutive pushes of several streams, state carried between them and a stream restarted in a
    reused slot: the compiled decoder's audio equals the eager decoder's. ``aot_eager`` runs the
    functionalized graph Inductor would get (the state's row writes become graph outputs copied back),
    so a lost or misordered state update shows here. One compile for all of it."""
    counter = CompileCounterWithBackend("aot_eager")
    compiled = codec.slot_decoder(6, compile_mode="default", compile_backend=counter)
    eager = codec.slot_decoder(6)
    assert compiled.compiled is not None and compiled.compile_error is None
    # the warm-up call on a scratch row created the state and left the real slots at zero
    assert compiled.state.store and all(not t[:6].any() for t in compiled.state.store.values())
    gen = torch.Generator().manual_seed(7)
    slots = [0, 2, 3, 5]
    for step in range(5):
        if step == 3:  # slot 2's stream ends; a new one starts there
            compiled.reset(2)
            eager.reset(2)
        codes = _codes(len(slots), 3, codec.num_codebooks, gen)
        a, b = compiled.push(slots, codes), eager.push(slots, codes)
        assert a.shape == (4, 3 * codec.frame_length)
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    for key, t in compiled.state.store.items():  # the carried state itself, not just the audio
        torch.testing.assert_close(t[:6], eager.state.store[key][:6], atol=1e-6, rtol=0)
    assert counter.frame_count == 1


def test_other_stream_and_frame_counts_reuse_the_compile(codec) -> None:
    """Symbolic shapes: after the first push, other numbers of streams and frames run the same
    compiled code — sizes equal at the first trace (2 streams x 2 frames) included, which duck
    shaping would have tied together, and one stream, padded to two rows; one frame is a size
    Dynamo specializes, one compile more (so a server's ~40 captured shapes cost two compiles).
    Audio as the eager decoder's."""
    counter = CompileCounterWithBackend("eager")
    compiled = codec.slot_decoder(8, compile_mode="default", compile_backend=counter)
    eager = codec.slot_decoder(9)  # slot 8: the spare row a one-stream reference push runs beside
    gen = torch.Generator().manual_seed(3)

    def check(slots: list[int], t: int) -> None:
        codes = _codes(len(slots), t, codec.num_codebooks, gen)
        out = compiled.push(slots, codes)
        assert out.shape == (len(slots), t * codec.frame_length)
        if len(slots) == 1:  # the compiled push ran two rows: the reference too (same batch numerics)
            spare = torch.zeros_like(codes)
            want = eager.push([*slots, 8], torch.cat([codes, spare]))[:1]
        else:
            want = eager.push(slots, codes)
        torch.testing.assert_close(out, want, atol=1e-6, rtol=0)

    for slots, t in [([0, 1], 2), ([2, 3, 4], 4), ([4, 0], 3), ([1, 2, 3, 4, 5, 6, 7], 3), ([7, 0, 3], 8),
                     ([5], 2)]:
        check(slots, t)
    assert counter.frame_count == 1, "a new stream / frame count recompiled"
    for slots in ([6, 1], [3]):  # one frame: specialized, once for every stream count
        check(slots, 1)
    assert counter.frame_count == 2 and compiled.compiled is not None


def test_a_failing_compile_leaves_a_working_eager_decoder(codec, caplog) -> None:
    """A backend that cannot be set up, or one that fails at the first call (as Inductor would on a
    machine without a compiler): one warning, then eager decoding of the same push and every later
    one; the failed compile touched no state."""
    with pytest.raises(ValueError, match="compile mode"):
        codec.slot_decoder(4, compile_mode="reduce-overhead")  # its own CUDA graphs: not allowed
    assert "reduce-overhead" not in COMPILE_MODES and "default" in COMPILE_MODES
    gen = torch.Generator().manual_seed(5)
    codes = [_codes(2, 2, codec.num_codebooks, gen) for _ in range(3)]
    plain = codec.slot_decoder(4)
    want = [plain.push([1, 3], c) for c in codes]

    def warnings() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == "ttsfleet.inference.codec"]

    with caplog.at_level(logging.WARNING, logger="ttsfleet.inference.codec"):
        unknown = codec.slot_decoder(4, compile_mode="default", compile_backend="no-such-backend")
    assert unknown.compiled is None and "no-such-backend" in unknown.compile_error
    assert len(warnings()) == 1 and "decoding eagerly" in warnings()[0]
    for c, w in zip(codes, want, strict=True):
        torch.testing.assert_close(unknown.push([1, 3], c), w, atol=0, rtol=0)

    calls = []

    def broken(gm, example_inputs):
        calls.append(1)
        raise RuntimeError("no C++ compiler here")

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ttsfleet.inference.codec"):
        failing = codec.slot_decoder(4, compile_mode="default", compile_backend=broken)
        assert failing.compiled is not None  # set up; it fails when first called
        out = [failing.push([1, 3], c) for c in codes]
    assert len(calls) == 1 and failing.compiled is None
    assert "no C++ compiler here" in failing.compile_error
    assert len(warnings()) == 1 and "no C++ compiler here" in warnings()[0]
    for o, w in zip(out, want, strict=True):
        torch.testing.assert_close(o, w, atol=0, rtol=0)


def test_compiling_without_graphs_compiles_every_shape_class_up_front(codec) -> None:
    """``capture`` on a compiled decoder without CUDA graphs (CPU) compiles the one-frame and the
    several-frames classes on scratch rows, so no request waits for a compile; the real slots stay
    untouched."""
    counter = CompileCounterWithBackend("eager")
    dec = codec.slot_decoder(3, compile_mode="default", compile_backend=counter)
    assert dec.capture((1, 2, 4)) == 0 and counter.frame_count == 2  # 1 frame, 2+ frames
    assert all(not t.any() for t in dec.state.store.values())  # scratch rows reset too
    gen = torch.Generator().manual_seed(1)
    for slots, t in (([0], 1), ([2, 1], 1), ([0, 1, 2], 4), ([1], 2)):
        dec.push(slots, _codes(len(slots), t, codec.num_codebooks, gen))
    assert counter.frame_count == 2


def test_a_compiled_served_decoder_keeps_cudnns_units(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--codec-compile``: Inductor fuses the units' elementwise work over cuDNN's convs (the form
    measured) whatever ``TTSFLEET_CODEC_UNITS`` says; without it the switch decides."""
    from ttsfleet.inference.codec_batch import CODEC_UNITS_SWITCH, residual_units

    monkeypatch.setattr(CODEC_UNITS_SWITCH, "_value", "fused")
    assert residual_units(None) == "fused" and residual_units("default") == "cudnn"
    monkeypatch.setattr(CODEC_UNITS_SWITCH, "_value", "cudnn")
    assert residual_units(None) == "cudnn"


@pytest.mark.gpu
def test_inductor_compiled_graphs_match_eager_bf16() -> None:
    """On a GPU: the serving configuration with the compile on (bf16, fused Snake, bucketed CUDA
    graphs capturing Inductor's kernels) against the eager bf16 decoder and float32, over consecutive
    pushes of several stream and frame counts and a restarted stream.

    Tolerance: bf16 rounding, not equality. Inductor computes each fused chain in float32 and rounds
    once where eager bf16 rounds after every op, so the two differ by bf16 noise compounded through
    the random residual stacks (the tiny codec's bf16 audio is 19.1 dB SNR from float32, test_codec.py).
    Stated: compiled audio at least as close to float32 as eager bf16's, less 1 dB, and above 13 dB
    SNR against eager bf16 (a lost state update drops it to ~0 dB). One Inductor compile of the tiny
    codec (every push has 2+ frames; the one stream is padded to two rows)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    fast = load_codec("tiny", device="cuda", fast=True)
    compiled = fast.slot_decoder(6, graphs=True, compile_mode="default")
    eager = fast.slot_decoder(6)
    ref_codec = load_codec("tiny", device="cuda")
    ref = {s: ref_codec.stream_decoder() for s in range(6)}
    gen = torch.Generator().manual_seed(9)
    got: dict[int, list[np.ndarray]] = {s: [] for s in range(6)}
    want: dict[int, list[np.ndarray]] = {s: [] for s in range(6)}
    f32: dict[int, list[np.ndarray]] = {s: [] for s in range(6)}
    for step, (slots, t) in enumerate([([0, 3, 5], 2), ([1, 2, 3, 4, 5], 4), ([0, 3, 5], 2), ([2], 4),
                                       ([0, 1, 2, 3, 4, 5], 4), ([0, 3, 5], 2)]):
        if step == 3:
            compiled.reset(2)
            eager.reset(2)
            ref[2] = ref_codec.stream_decoder()
            for d in (got, want, f32):
                d[2].clear()
        codes = _codes(len(slots), t, fast.num_codebooks, gen)
        a = compiled.push(slots, codes).float().cpu().numpy()
        b = eager.push(slots, codes).float().cpu().numpy()
        assert np.isfinite(a).all()
        for i, s in enumerate(slots):
            got[s].append(a[i])
            want[s].append(b[i])
            f32[s].append(ref[s].push(codes[i]))
    assert compiled.compiled is not None, compiled.compile_error
    assert compiled.captured >= 3 and all(g is not None for g in compiled.graphs.values())

    def snr(x: np.ndarray, r: np.ndarray) -> float:
        r64 = r.astype(np.float64)
        return float(10 * np.log10((r64 ** 2).sum() / ((x - r64) ** 2).sum()))

    cat = {name: np.concatenate([np.concatenate(d[s]) for s in range(6) if d[s]])
           for name, d in (("compiled", got), ("eager", want), ("f32", f32))}
    vs_eager, eager_f32 = snr(cat["compiled"], cat["eager"]), snr(cat["eager"], cat["f32"])
    compiled_f32 = snr(cat["compiled"], cat["f32"])
    assert vs_eager > 13, (vs_eager, compiled_f32, eager_f32)
    assert compiled_f32 >= eager_f32 - 1, (vs_eager, compiled_f32, eager_f32)
