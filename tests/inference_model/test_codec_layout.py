"""The channels-last codec decoder (issue #25) decodes the NCL decoder's audio, one-shot and streamed
through slots, keeps the checkpoint's parameters, and really runs its convs channels-last.

Tolerance: float32 on CPU, the two layouts run the same arithmetic through different oneDNN
kernels (different summation orders): 1.6e-5 apart at most on the tiny codec against audio peaks
near 0.8 (measured 2026-12-04); the tests allow 1e-4.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from ttsfleet.inference import codec_layers
from ttsfleet.inference.codec import default_channels_last, load_codec

from tests.scripts import load_script

ATOL = 1e-4


@pytest.fixture(scope="module")
def ref_codec(golden_dir):
    return load_codec(golden_dir / "codec-tiny" / "codec.pth", channels_last=False)


@pytest.fixture(scope="module")
def cl_codec(golden_dir):
    return load_codec(golden_dir / "codec-tiny" / "codec.pth", channels_last=True)


@pytest.fixture
def conv_layouts(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Records the layout of every decoder-side conv input: "ncl", "channels_last" or "other"."""
    seen: list[str] = []

    def kind(x: torch.Tensor) -> str:
        if x.dim() == 3:
            return "ncl"
        ok = x.dim() == 4 and x.shape[2] == 1 and x.is_contiguous(memory_format=torch.channels_last)
        return "channels_last" if ok else "other"

    for cls, name in ((codec_layers.CausalConv, "_conv"), (codec_layers.CausalTransConv, "_conv_t")):
        orig = getattr(cls, name)

        def wrapped(self, x, *args, _orig=orig):  # noqa: ANN001, ANN202 (args: CausalConv's with_bias)
            seen.append(kind(x))
            return _orig(self, x, *args)

        monkeypatch.setattr(cls, name, wrapped)
    return seen


def _codes(seed: int, t: int, n: int = 10) -> torch.Tensor:
    return torch.randint(0, 16, (n, t), generator=torch.Generator().manual_seed(seed))


def test_default_layout_is_ncl_until_the_served_path_measures_channels_last() -> None:
    assert not default_channels_last(torch.device("cuda")) and not default_channels_last(torch.device("cpu"))
    assert not load_codec("tiny").decoder.channels_last
    assert load_codec("tiny", channels_last=True).decoder.channels_last


def test_channels_last_one_shot_decode_equals_ncl(ref_codec, cl_codec, golden, conv_layouts) -> None:
    codes = torch.tensor(golden("codec-tiny")["decode"]["codes"])
    want = ref_codec.decode(codes)
    n_ncl = len(conv_layouts)
    got = cl_codec.decode(codes)
    decoder_convs = conv_layouts[n_ncl:]
    assert got.shape == want.shape and np.abs(want).max() > 0.05
    np.testing.assert_allclose(got, want, atol=ATOL, rtol=0)
    # the quantizer's few convs stay NCL; every decoder conv runs channels-last (21 in the tiny codec)
    n_decoder = sum(isinstance(m, (codec_layers.CausalConv, codec_layers.CausalTransConv))
                    for m in cl_codec.decoder.modules())
    assert decoder_convs.count("channels_last") == n_decoder and "other" not in decoder_convs
    # and still the golden reference's audio
    d, tol = golden("codec-tiny")["decode"], golden("codec-tiny")["tolerance"]
    np.testing.assert_allclose(got[:512], d["audio_head"], atol=tol["abs"], rtol=tol["rel"])


def test_channels_last_streaming_equals_one_shot(cl_codec, ref_codec) -> None:
    codes = _codes(1, 11)
    whole = ref_codec.decode(codes)
    for cuts in ([1, 2, 3, 4, 5], [3, 7]):
        s = cl_codec.stream_decoder()
        bounds = [0, *cuts, codes.shape[1]]
        out = np.concatenate([s.push(codes[:, a:b]) for a, b in zip(bounds, bounds[1:], strict=False)])
        np.testing.assert_allclose(out, whole, atol=ATOL, rtol=0)


def test_channels_last_slot_decoder_equals_ncl_slot_decoder(ref_codec) -> None:
    """Batched streaming through SlotState, state carried over pushes and a slot restarted: the
    channels-last decoder's audio is the NCL decoder's, and their stream states agree (the state is
    stored layout-free, 3-D)."""
    ncl = ref_codec.slot_decoder(5, channels_last=False)
    cl = ref_codec.slot_decoder(5, channels_last=True)
    assert cl.channels_last and not ncl.channels_last
    g = torch.Generator().manual_seed(4)
    for step, (slots, t) in enumerate([([0, 2], 1), ([0, 2, 3], 4), ([1, 2, 4], 2), ([0, 2, 3], 3),
                                       ([4], 1)]):
        if step == 3:
            ncl.reset(2)
            cl.reset(2)
        codes = torch.randint(0, 16, (len(slots), ref_codec.num_codebooks, t), generator=g)
        a, b = cl.push(slots, codes), ncl.push(slots, codes)
        assert a.shape == (len(slots), t * ref_codec.frame_length) and b.abs().max() > 0.01
        torch.testing.assert_close(a, b, atol=ATOL, rtol=0)
    assert cl.state.store.keys() == ncl.state.store.keys()
    for key, t in cl.state.store.items():
        assert t.shape == ncl.state.store[key].shape
        torch.testing.assert_close(t, ncl.state.store[key], atol=ATOL, rtol=0)


def test_a_stream_may_change_layout_midway(ref_codec) -> None:
    """The stream state is layout-free: switching the layout between pushes continues the stream."""
    codes = _codes(2, 6)
    whole = ref_codec.decode(codes)
    st: dict = {}
    chunks = []
    with torch.inference_mode():
        for i, cl in enumerate((True, False, True)):
            c = codes[None, :, 2 * i: 2 * i + 2]
            z = ref_codec.quantizer.decode(c, st)
            chunks.append(ref_codec.decoder(z, st, channels_last=cl)[0, 0].numpy())
    np.testing.assert_allclose(np.concatenate(chunks), whole, atol=ATOL, rtol=0)


def test_state_dict_is_unchanged(ref_codec, cl_codec, golden_dir) -> None:
    """The checkpoint's keys, conv1d shapes and values; the 4-D weights are caches beside them."""
    a, b = ref_codec.state_dict(), cl_codec.state_dict()
    assert a.keys() == b.keys() and not any("4d" in k for k in b)
    for k in a:
        assert a[k].shape == b[k].shape and b[k].is_contiguous(), k
        assert torch.equal(a[k], b[k]), k
    conv = cl_codec.decoder.model[0]
    assert conv.conv.weight.dim() == 3 and conv.weight_4d.shape == (*conv.conv.weight.shape[:2], 1, 7)
    assert conv.weight_4d.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(conv.weight_4d.squeeze(2), conv.conv.weight, atol=0, rtol=0)
    # a checkpoint saved from the channels-last codec loads into a fresh one
    fresh = load_codec(golden_dir / "codec-tiny" / "codec.pth", channels_last=False)
    fresh.load_state_dict(b, strict=True)


def test_uncached_channels_last_weights_still_decode(ref_codec) -> None:
    """A decoder run channels-last without the cached 4-D weights (e.g. moved since) views the 3-D
    weight at call time: slower on a GPU, same numbers."""
    codec = load_codec("tiny", channels_last=False)
    codes = _codes(5, 3)
    want = codec.decode(codes)
    codec.decoder.channels_last = True  # no cache built
    assert codec.decoder.model[0].weight_4d is None
    np.testing.assert_allclose(codec.decode(codes), want, atol=ATOL, rtol=0)


@pytest.mark.parametrize("four_d", [False, True])
def test_snake_out_writes_into_a_buffer_view(four_d: bool) -> None:
    """Snake's ``out=`` (the conv buffer's tail) gives the plain expression's numbers, in place."""
    g = torch.Generator().manual_seed(0)
    m = codec_layers.Snake(6)
    m.alpha.data = torch.rand(1, 6, 1, generator=g) + 0.2
    x = torch.randn(2, 6, 9, generator=g)
    want = x + (m.alpha + 1e-9).reciprocal() * torch.sin(m.alpha * x).pow(2)
    if four_d:
        x = x.unsqueeze(2).contiguous(memory_format=torch.channels_last)
        buf = torch.zeros(2, 6, 1, 12).contiguous(memory_format=torch.channels_last)
    else:
        buf = torch.zeros(2, 6, 12)
    with torch.no_grad():
        got = m(x, None, out=buf[..., 3:])
    assert got.data_ptr() == buf[..., 3:].data_ptr() and not buf[..., :3].any()
    torch.testing.assert_close(buf[..., 3:].reshape(2, 6, 9), want, atol=1e-6, rtol=0)


def test_causal_conv_history_buffer_matches_padding() -> None:
    """The ``[history | new]`` buffer of a stride-1 conv equals the reference's zero padding one-shot
    and ``torch.cat`` with the carried history when streaming, in both layouts."""
    g = torch.Generator().manual_seed(1)
    conv = codec_layers.CausalConv(4, 5, 7, dilation=3)
    conv.conv.weight.data = torch.randn(5, 4, 7, generator=g)
    x = torch.randn(2, 4, 30, generator=g)
    with torch.no_grad():
        want = F.conv1d(F.pad(x, (conv.pad, 0)), conv.conv.weight, conv.conv.bias, dilation=3)
        codec_layers.cache_channels_last(conv)
        for four_d in (False, True):
            xi = x.unsqueeze(2).contiguous(memory_format=torch.channels_last) if four_d else x
            st: dict = {}
            one = conv(xi)
            streamed = torch.cat([conv(xi[..., :11], st), conv(xi[..., 11:], st)], dim=-1)
            assert one.dim() == xi.dim() and st[conv].shape == (2, 4, conv.pad)
            for y in (one, streamed):
                torch.testing.assert_close(y.reshape(want.shape), want, atol=1e-5, rtol=0)


def test_layout_benchmark_smoke(tmp_path) -> None:
    """The device benchmark's CPU path runs end to end on the tiny codec and writes its report."""
    codec_layout = load_script("benchmarks/inference_h200/codec_layout.py")
    out = tmp_path / "layout.json"
    report = codec_layout.main([str(out), "--device", "cpu", "--tiny", "--reps", "2", "--shapes", "1x1,2x2"])
    saved = json.loads(out.read_text())
    assert [(r["streams"], r["frames"]) for r in saved["rows"]] == [(1, 1), (2, 2)]
    assert report["rows"][0]["timed"] == "push_ms" and saved["codec"] == "tiny"
    assert all(r["max_abs_err"] < ATOL and r["snr_db"] > 60 for r in saved["rows"])
    ref = saved["float32_reference"]
    assert ref["shape"] == [1, 1] and ref["channels_last_vs_float32"]["max_abs"] < ATOL


@pytest.mark.gpu
def test_channels_last_graphs_on_gpu_equal_ncl() -> None:
    """On a GPU, bf16 + fused Snake (Triton, its channels-last kernel writing into conv buffers) +
    CUDA graphs: the channels-last decoder's audio is the NCL decoder's within bf16 rounding."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    codec = load_codec("tiny", device="cuda", fast=True, channels_last=True)
    assert codec.decoder.channels_last
    ncl = codec.slot_decoder(8, graphs=True, channels_last=False)
    cl = codec.slot_decoder(8, graphs=True, channels_last=True)
    g = torch.Generator().manual_seed(6)
    for slots, t in [([0, 1, 2], 2), ([0, 1, 2], 4), ([3], 1), ([0, 1, 2, 3, 4, 5, 6, 7], 4)]:
        codes = torch.randint(0, 16, (len(slots), codec.num_codebooks, t), generator=g)
        a, b = cl.push(slots, codes).float(), ncl.push(slots, codes).float()
        err = (a - b).abs().max().item() / b.abs().max().item()
        assert err < 0.05, err
    assert cl.captured >= 3 and all(v is not None for v in cl.graphs.values())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_snake_channels_last_and_out_on_gpu(dtype: torch.dtype) -> None:
    """The Triton Snake on channels-last ``[B, C, 1, T]`` input, alone and into a ``[history | new]``
    buffer's tail (batch rows with gaps), and on NCL input into a buffer tail: the expression's
    numbers, the layout kept, the buffer's head untouched."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from ttsfleet.kernels.snake import snake, snake_ref

    g = torch.Generator(device="cuda").manual_seed(0)
    b, c, t, pad = 3, 40, 777, 54
    x3 = torch.randn(b, c, t, device="cuda", generator=g).to(dtype) * 3
    alpha = torch.rand(1, c, 1, device="cuda", generator=g) + 0.2
    want = snake_ref(x3.double(), alpha.double())
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    x4 = x3.unsqueeze(2).contiguous(memory_format=torch.channels_last)
    y4 = snake(x4, alpha)
    assert y4.shape == x4.shape and y4.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(y4.squeeze(2).double(), want, atol=tol * 10, rtol=tol)
    for buf in (torch.full((b, c, 1, pad + t), 7.0, device="cuda", dtype=dtype).contiguous(
            memory_format=torch.channels_last), torch.full((b, c, pad + t), 7.0, device="cuda", dtype=dtype)):
        x = x4 if buf.dim() == 4 else x3
        snake(x, alpha, out=buf[..., pad:])
        assert bool((buf[..., :pad] == 7).all())
        torch.testing.assert_close(buf[..., pad:].reshape(b, c, t).double(), want, atol=tol * 10, rtol=tol)


def test_compiled_channels_last_decoder_traces_whole(ref_codec) -> None:
    """``torch.compile`` (``aot_eager``: Dynamo's trace and the functionalized state updates Inductor
    would get) of the channels-last decode: one graph, no breaks (Snake writes into conv buffers
    with ``copy_`` when traced), the NCL decoder's audio."""
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    try:
        counter = CompileCounterWithBackend("aot_eager")
        compiled = ref_codec.slot_decoder(4, compile_mode="default", compile_backend=counter,
                                          channels_last=True)
        ncl = ref_codec.slot_decoder(4, channels_last=False)
        g = torch.Generator().manual_seed(8)
        for _ in range(2):
            codes = torch.randint(0, 16, (3, ref_codec.num_codebooks, 2), generator=g)
            torch.testing.assert_close(compiled.push([0, 1, 3], codes), ncl.push([0, 1, 3], codes),
                                       atol=ATOL, rtol=0)
        assert compiled.compiled is not None and counter.frame_count == 1
    finally:
        torch._dynamo.reset()


def test_window_attention_backend_knob_keeps_the_audio() -> None:
    """``WindowTransformer.slot_sdpa`` (benchmarks' side by side of SDPA backends): the math backend
    decodes the default's audio; a name torch lacks is one readable error."""
    from ttsfleet.inference import codec_layers

    c = load_codec("tiny")
    codes = torch.randint(0, 16, (3, c.num_codebooks, 4), generator=torch.Generator().manual_seed(2))
    outs = {}
    try:
        for backend in (None, "math"):
            codec_layers.WindowTransformer.slot_sdpa = backend
            dec = c.slot_decoder(3)
            outs[backend] = torch.cat([dec.push([0, 1, 2], codes[:, :, i:i + 2]) for i in (0, 2)], dim=1)
        codec_layers.WindowTransformer.slot_sdpa = "fastest"
        with pytest.raises(ValueError, match="window attention backend 'fastest': expected one of cudnn"):
            c.slot_decoder(3).push([0], codes[:1, :, :1])
    finally:
        codec_layers.WindowTransformer.slot_sdpa = None
    assert outs[None].abs().max() > 0.01
    torch.testing.assert_close(outs["math"], outs[None], atol=1e-4, rtol=0)  # float32, another sum order
