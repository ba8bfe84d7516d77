"""The conv-bias fusion of the codec decoder (issue #25): a causal conv feeding a fused Snake runs
without its bias and the Snake kernel adds it (``Snake(conv_nobias(x) + b)``). With it on or off
the tiny codec decodes the same audio, one-shot, streamed and through SlotState, in both layouts,
through the torch reference and through the Triton kernel (interpreter on CPU); the parameters are
untouched. The tiny checkpoint's conv biases are zero, so the tests give them random values.

Tolerance: float32 on CPU, the bias added inside oneDNN's conv or after it differs by rounding only
(1e-5 allowed, against audio peaks near 0.8).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ttsfleet.inference import codec_layers
from ttsfleet.inference.codec import load_codec

ATOL = 1e-5


@pytest.fixture(params=[False, True], ids=["ncl", "channels_last"])
def codec(request: pytest.FixtureRequest, golden_dir):
    c = load_codec(golden_dir / "codec-tiny" / "codec.pth", channels_last=request.param)
    c.use_fused_kernels()
    _random_conv_biases(c)
    return c


def _random_conv_biases(c) -> None:  # noqa: ANN001
    """The tiny checkpoint's conv biases are all zero: a dropped or doubled bias would go unseen."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for m in c.decoder.modules():
            if isinstance(m, codec_layers.CausalConv):
                b = m.conv.bias
                b.copy_(0.2 * torch.randn(b.shape, generator=g).to(b.dtype))


def _codes(seed: int, t: int, n: int = 10) -> torch.Tensor:
    return torch.randint(0, 16, (n, t), generator=torch.Generator().manual_seed(seed))


def _count_biasless_convs(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    seen: list[bool] = []
    orig = codec_layers.CausalConv._conv

    def wrapped(self, x, with_bias=True):  # noqa: ANN001, ANN202
        seen.append(with_bias)
        return orig(self, x, with_bias)

    monkeypatch.setattr(codec_layers.CausalConv, "_conv", wrapped)
    return seen


def test_fused_bias_decodes_the_unfused_audio(codec, kernels, monkeypatch) -> None:
    codes = _codes(3, 9)
    sd = {k: v.clone() for k, v in codec.state_dict().items()}
    codec_layers.set_fuse_bias(codec, False)
    off = codec.decode(codes)
    seen = _count_biasless_convs(monkeypatch)
    codec_layers.set_fuse_bias(codec, True)
    on = codec.decode(codes)
    # the 7-tap conv of every ResidualUnit (3 per decoder block) ran without its bias
    n_units = sum(isinstance(m, codec_layers.ResidualUnit) for m in codec.decoder.modules())
    assert n_units > 0 and seen.count(False) == n_units
    assert np.abs(off).max() > 0.01
    np.testing.assert_allclose(on, off, atol=ATOL, rtol=0)
    # parameters (biases included) unchanged, none added or removed
    after = codec.state_dict()
    assert after.keys() == sd.keys() and all(torch.equal(after[k], sd[k]) for k in sd)


def test_fused_bias_streaming_equals_one_shot(codec, kernels) -> None:
    codes = _codes(4, 7)
    codec_layers.set_fuse_bias(codec, False)
    whole = codec.decode(codes)
    codec_layers.set_fuse_bias(codec, True)
    s = codec.stream_decoder()
    bounds = [0, 1, 3, 7]
    out = np.concatenate([s.push(codes[:, a:b]) for a, b in zip(bounds, bounds[1:], strict=False)])
    np.testing.assert_allclose(out, whole, atol=ATOL, rtol=0)


def test_fused_bias_slot_decoder_equals_unfused(codec, kernels) -> None:
    """Batched streaming through SlotState, state carried over pushes and a slot restarted."""
    g = torch.Generator().manual_seed(5)
    steps = [([0, 2], 1), ([0, 2, 3], 3), ([1, 2], 2)]
    pushes = [(slots, torch.randint(0, 16, (len(slots), codec.num_codebooks, t), generator=g))
              for slots, t in steps]
    outs = {}
    for on in (False, True):
        codec_layers.set_fuse_bias(codec, on)
        dec = codec.slot_decoder(4)
        outs[on] = [dec.push(slots, c) for slots, c in pushes]
    for a, b in zip(outs[True], outs[False], strict=True):
        assert b.abs().max() > 0.01
        torch.testing.assert_close(a, b, atol=ATOL, rtol=0)


def test_only_fused_snakes_take_the_bias(golden_dir, monkeypatch) -> None:
    """Unfused Snakes (the torch expression) leave the bias to the conv: nothing to save there."""
    c = load_codec(golden_dir / "codec-tiny" / "codec.pth", channels_last=False)
    seen = _count_biasless_convs(monkeypatch)
    c.decode(_codes(1, 2))
    assert seen and all(seen)


def test_a_fast_codec_fuses_the_bias_by_default(golden_dir, monkeypatch) -> None:
    """Measured faster on an H200 (2026-12-04), so on unless a caller turns it off."""
    c = load_codec(golden_dir / "codec-tiny" / "codec.pth", channels_last=False)
    c.use_fused_kernels()
    snakes = [m for m in c.decoder.modules() if isinstance(m, codec_layers.Snake)]
    assert snakes and all(m.takes_bias() for m in snakes)
    codec_layers.set_fuse_bias(c, False)
    assert not any(m.takes_bias() for m in snakes)
