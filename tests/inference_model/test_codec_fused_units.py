"""The codec decoder's residual units through the fused conv kernels (issue #25,
``TTSFLEET_CODEC_UNITS=fused``): Triton implicit-GEMM convs with the second Snake and the residual add
in their epilogues. The tiny codec, channels-last, decodes the same audio one-shot, streamed and
through SlotState as with cuDNN-style convs and separate passes, through Triton's interpreter on the
CPU (on a GPU: the Triton kernels). Where Triton does not run (the torch reference) or the decoder is
NCL, the units keep the unfused path.

Tolerance: float32, the fused path sums the 7 taps in another order and applies Snake to the float32
accumulator; 1e-5 against audio peaks near 0.8 (as the bias fusion's tests).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ttsfleet.inference import codec_layers
from ttsfleet.inference.codec import load_codec
from ttsfleet.kernels import codec_conv

ATOL = 1e-5


@pytest.fixture
def codec(golden_dir, monkeypatch):
    # the tiny codec's pushes have a few hundred rows: below the serving limit, so lifted here
    monkeypatch.setattr(codec_layers.ResidualUnit, "fused_min_rows", 0)
    c = load_codec(golden_dir / "codec-tiny" / "codec.pth", channels_last=True)
    c.use_fused_kernels()
    _random_biases(c.decoder, torch.Generator().manual_seed(0))
    return c


def _random_biases(module: torch.nn.Module, g: torch.Generator) -> None:
    """Every causal conv's bias under ``module`` drawn from ``g``: the tiny checkpoint's conv biases
    are zero, so a lost bias would go unseen."""
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, codec_layers.CausalConv):
                m.conv.bias.copy_(0.2 * torch.randn(m.conv.bias.shape, generator=g))


def _count_fused_convs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    seen: list[str] = []
    orig = codec_conv.conv_rows

    def wrapped(x, weight, bias, out=None, dilation=1, alpha=None, residual=None, tile=None):  # noqa: ANN001, ANN202
        seen.append("snake" if alpha is not None else "residual" if residual is not None else "plain")
        return orig(x, weight, bias, out, dilation, alpha, residual, tile)

    monkeypatch.setattr(codec_conv, "conv_rows", wrapped)
    return seen


def _codes(seed: int, t: int, n: int = 10) -> torch.Tensor:
    return torch.randint(0, 16, (n, t), generator=torch.Generator().manual_seed(seed))


def _units(c) -> list[codec_layers.ResidualUnit]:  # noqa: ANN001
    return [m for m in c.decoder.modules() if isinstance(m, codec_layers.ResidualUnit)]


def test_fused_units_decode_the_unfused_audio(codec, kernels, monkeypatch) -> None:
    codes = _codes(3, 4)
    off = codec.decode(codes)
    seen = _count_fused_convs(monkeypatch)
    codec.use_fused_units()
    on = codec.decode(codes)
    n_units = len(_units(codec))
    if kernels == "interpret":  # both convs of every unit ran fused, one with each epilogue
        assert n_units > 0 and seen.count("snake") == n_units and seen.count("residual") == n_units
    else:  # the torch reference backend: the units keep their unfused path
        assert seen == []
    assert np.abs(off).max() > 0.01
    np.testing.assert_allclose(on, off, atol=ATOL, rtol=0)


def test_fused_units_streaming_equals_one_shot(codec, kernels) -> None:
    codes = _codes(4, 4)
    whole = codec.decode(codes)
    codec.use_fused_units()
    s = codec.stream_decoder()
    bounds = [0, 1, 2, 4]
    out = np.concatenate([s.push(codes[:, a:b]) for a, b in zip(bounds, bounds[1:], strict=False)])
    np.testing.assert_allclose(out, whole, atol=ATOL, rtol=0)


def test_fused_units_slot_decoder_equals_unfused(codec, kernels) -> None:
    """Batched streaming through SlotState: history carried over pushes, a slot joining later."""
    g = torch.Generator().manual_seed(5)
    steps = [([0, 2], 1), ([0, 2, 3], 2), ([1, 2], 1)]
    pushes = [(slots, torch.randint(0, 16, (len(slots), codec.num_codebooks, t), generator=g))
              for slots, t in steps]
    outs = {}
    for on in (False, True):
        codec.use_fused_units(on)
        dec = codec.slot_decoder(4)
        outs[on] = [dec.push(slots, c) for slots, c in pushes]
    for a, b in zip(outs[True], outs[False], strict=True):
        assert b.abs().max() > 0.01
        torch.testing.assert_close(a, b, atol=ATOL, rtol=0)


def test_an_ncl_decoder_keeps_its_units_unfused(golden_dir, monkeypatch) -> None:
    """The kernels address channels-last rows; an NCL decoder's units run as before."""
    from ttsfleet.kernels import dispatch

    monkeypatch.setattr(codec_layers.ResidualUnit, "fused_min_rows", 0)
    c = load_codec(golden_dir / "codec-tiny" / "codec.pth", channels_last=False)
    c.use_fused_units()
    seen = _count_fused_convs(monkeypatch)
    monkeypatch.setattr(dispatch, "use_triton", lambda x: True)
    c.decode(_codes(1, 3))
    assert all(u.fused_convs for u in _units(c)) and seen == []


def test_only_narrow_units_with_many_rows_run_fused(monkeypatch) -> None:
    """The limits measured on the H100 (wide units are cuDNN's, short pushes too)."""
    from ttsfleet.kernels import dispatch

    monkeypatch.setattr(dispatch, "use_triton", lambda x: True)
    unit = codec_layers.ResidualUnit(8, 1)
    codec_layers.set_fused_units(unit)
    limit = codec_layers.ResidualUnit.fused_min_rows

    def rows(b: int, c: int, t: int) -> torch.Tensor:
        return torch.empty(b, c, 1, t).contiguous(memory_format=torch.channels_last)

    assert unit.takes_fused(rows(4, 96, limit // 4))
    assert not unit.takes_fused(rows(4, 96, limit // 4 - 1))  # too few rows
    assert not unit.takes_fused(rows(4, 384, limit))  # too wide: cuDNN's
    assert not unit.takes_fused(torch.empty(4, 96, limit))  # NCL
    unit.fused_convs = False
    assert not unit.takes_fused(rows(4, 96, limit))


def test_fused_units_off_drops_the_cached_weights(codec) -> None:
    codec.use_fused_units()
    convs = [m for u in _units(codec) for m in u.block if isinstance(m, codec_layers.CausalConv)]
    assert convs and all(m.weight_rows is not None for m in convs)
    w = convs[0].conv.weight
    assert torch.equal(convs[0].weight_rows, w.permute(2, 1, 0))
    codec.use_fused_units(False)
    assert all(m.weight_rows is None and not u.fused_convs for u in _units(codec) for m in u.block
               if isinstance(m, codec_layers.CausalConv))


def _snr_db(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float(10 * torch.log10((ref.double() ** 2).sum() / ((x.double() - ref.double()) ** 2).sum()))


@pytest.mark.gpu
def test_fused_units_on_a_gpu_replay_the_cudnn_audio(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU, the Triton kernels themselves: float32 (IEEE dots; cuDNN without TF32) equal to
    rounding through CUDA-graph replays of streaming pushes; bf16 (the serving codec) no further from
    the float32 audio than cuDNN's bf16 convs are."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    from ttsfleet.kernels import dispatch

    if not dispatch.plan("cuda").fused:
        pytest.skip("the catalog does not run the Triton kernels on this GPU")
    monkeypatch.setattr(codec_layers.ResidualUnit, "fused_min_rows", 0)
    g = torch.Generator().manual_seed(7)
    pushes = [(slots, torch.randint(0, 16, (len(slots), 10, t), generator=g))
              for slots, t in [([0, 2], 1), ([0, 1, 2, 3], 4), ([1, 3], 2), ([0, 1, 2, 3], 4)]]
    audio = {}
    for name, fast in (("f32", False), ("bf16", True)):
        c = load_codec("tiny", device="cuda", fast=fast, channels_last=True)
        for on in (False, True):
            c.use_fused_units(on)
            dec = c.slot_decoder(4, graphs=True)
            audio[name, on] = torch.cat([dec.push(s, codes).float().cpu().flatten() for s, codes in pushes])
    torch.testing.assert_close(audio["f32", True], audio["f32", False], atol=5e-5, rtol=0)
    assert audio["f32", False].abs().max() > 0.01
    ref = audio["f32", False]
    fused, cudnn = _snr_db(audio["bf16", True], ref), _snr_db(audio["bf16", False], ref)
    assert fused > cudnn - 1.0, (fused, cudnn)


def test_fused_encoder_units_encode_the_unfused_latent(golden_dir, kernels, monkeypatch) -> None:
    """The fill job's encode (``Codec.use_encoder_fused_units``): the channels-last encoder's latent
    with every residual unit fused equals the unfused one; the decoder's units are not switched."""
    monkeypatch.setattr(codec_layers.ResidualUnit, "fused_min_rows", 0)
    c = load_codec(golden_dir / "codec-tiny" / "codec.pth")
    c.use_encoder_channels_last()
    c.use_fused_kernels()
    g = torch.Generator().manual_seed(1)
    _random_biases(c.encoder, g)
    x = 0.3 * torch.randn(2, 1, 2 * c.frame_length, generator=g)  # 2 frames: every unit, fewer tiles
    with torch.inference_mode():
        off = c.encoder(x)
        seen = _count_fused_convs(monkeypatch)
        c.use_encoder_fused_units()
        on = c.encoder(x)
    units = [m for m in c.encoder.modules() if isinstance(m, codec_layers.ResidualUnit)]
    assert units and all(u.fused_convs for u in units) and not any(u.fused_convs for u in _units(c))
    if kernels == "interpret":
        assert seen.count("snake") == seen.count("residual") == len(units)
    else:
        assert seen == []
    assert off.abs().max() > 0.01
    torch.testing.assert_close(on, off, atol=ATOL * float(off.abs().max()), rtol=0)
