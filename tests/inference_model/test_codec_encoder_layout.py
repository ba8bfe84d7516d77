"""The codec encoder's channels-last conv stack and fused Snakes (issue #25, the fill job's encode).

Channels-last (:meth:`Codec.use_encoder_channels_last`) runs the same convs as 2-D convs of height 1
on NHWC tensors: the same arithmetic in another order (oneDNN / cuDNN pick other kernels), so the
latent is compared within a tolerance and the codes by their agreement, not bit for bit. Measured
here (tiny codec, CPU, float32): latent max |diff| about 3e-5 against a max |latent| of about 5
(6e-6 relative), every code equal. The tolerances below (1e-4 relative; 99 % of codes) leave room
for other CPUs' kernels while still failing on a wrong layout (a transposed or mis-strided tensor
changes the latent by O(1)).

Fused Snakes with the conv bias fused into them (:attr:`Snake.fuse_bias`) compute ``Snake(conv(x) +
b)`` in one pass instead of the expression after a biased conv: float32 rounding differences only.
The tiny checkpoint's conv biases are zero, so the tests give the encoder's random ones.
"""

from __future__ import annotations

import pytest
import torch
from ttsfleet.inference import codec_layers
from ttsfleet.inference.codec import load_codec
from ttsfleet.kernels import dispatch

REL = 1e-4  # latent tolerance, relative to its largest magnitude
CODES = 0.99  # share of codes that must agree across layouts / kernels


def _audio(batch: int = 2, frames: int = 6, seed: int = 0) -> torch.Tensor:
    """Harmonics with an envelope (never zeros: they hide bugs), ``frames`` codec frames long."""
    g = torch.Generator().manual_seed(seed)
    n = frames * 2048
    t = torch.arange(n) / 44100
    rows = []
    for b in range(batch):
        f0 = 110 + 30 * b
        x = sum(torch.sin(2 * torch.pi * k * f0 * t) / k for k in range(1, 6))
        env = 0.5 + 0.5 * torch.sin(2 * torch.pi * 3 * t)
        rows.append(0.2 * x * env + 0.01 * torch.randn(n, generator=g))
    return torch.stack(rows)[:, None, :]


def _random_conv_biases(module: torch.nn.Module) -> None:
    """Zero biases would hide a dropped or doubled one (the fused-bias path)."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, codec_layers.CausalConv):
                m.conv.bias.copy_(0.2 * torch.randn(m.conv.bias.shape, generator=g))


def _encode(codec, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # noqa: ANN001
    with torch.inference_mode():
        z = codec.encoder(x)
        return z, codec.quantizer.encode(z)


def _close(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / a.abs().max())


def test_channels_last_encoder_matches_ncl_and_runs_nhwc_convs(monkeypatch: pytest.MonkeyPatch) -> None:
    codec = load_codec("tiny")
    x = _audio()
    z_ncl, codes_ncl = _encode(codec, x)
    seen: list[tuple[int, bool]] = []
    orig = codec_layers.CausalConv._conv

    def spy(self, t, with_bias=True):  # noqa: ANN001, ANN202
        seen.append((t.dim(), t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last)))
        return orig(self, t, with_bias)

    monkeypatch.setattr(codec_layers.CausalConv, "_conv", spy)
    codec.use_encoder_channels_last()
    assert codec.encoder.channels_last and not codec.decoder.channels_last  # the decoder keeps its own
    assert all(m.weight_4d is not None for m in codec.encoder.modules()
               if isinstance(m, codec_layers.CausalConv))
    z_cl, codes_cl = _encode(codec, x)
    n_encoder_convs = sum(isinstance(m, codec_layers.CausalConv) for m in codec.encoder.modules())
    # every encoder conv ran 4-D on NHWC memory; the quantizer's downsampling convs after it, 3-D
    assert seen[:n_encoder_convs] == [(4, True)] * n_encoder_convs
    assert all(d == 3 for d, _ in seen[n_encoder_convs:]) and len(seen) > n_encoder_convs
    assert z_cl.shape == z_ncl.shape and z_cl.is_contiguous()
    assert _close(z_ncl, z_cl) < REL
    assert (codes_cl == codes_ncl).float().mean() >= CODES
    # and back: NCL again gives NCL's latent exactly (the switch leaves nothing behind)
    codec.use_encoder_channels_last(False)
    monkeypatch.setattr(codec_layers.CausalConv, "_conv", orig)
    assert torch.equal(_encode(codec, x)[0], z_ncl)
    assert all(m.weight_4d is None for m in codec.encoder.modules() if isinstance(m, codec_layers.CausalConv))


def test_one_clip_encode_follows_the_encoder_layout() -> None:
    """``Codec.encode`` (the server's reference audio) goes through the same switch."""
    codec = load_codec("tiny")
    wave = _audio(1, 5)[0, 0].numpy()
    ref = codec.encode(wave, 44100)
    codec.use_encoder_channels_last()
    got = codec.encode(wave, 44100)
    assert got.shape == ref.shape and (got == ref).float().mean() >= CODES


def test_window_transformer_takes_channels_last_through_views() -> None:
    codec = load_codec("tiny")
    wt = codec.encoder.block[4].block[-1]
    assert isinstance(wt, codec_layers.WindowTransformer)
    x = torch.randn(2, 128, 37, generator=torch.Generator().manual_seed(2))
    x4 = x.unsqueeze(2).contiguous(memory_format=torch.channels_last)
    with torch.inference_mode():
        y3, y4 = wt(x), wt(x4)
    assert y4.shape == (2, 128, 1, 37) and y4.is_contiguous(memory_format=torch.channels_last)
    assert _close(y3, y4.squeeze(2)) < 1e-5  # a dense vs a transposed [B, T, C]: matmul rounding only


@pytest.mark.parametrize("channels_last", [False, True], ids=["ncl", "channels_last"])
def test_fused_snake_encoder_matches_the_expression(kernels: str, channels_last: bool,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    assert dispatch.plan("cpu").backend == ("triton" if kernels == "interpret" else "reference")
    codec = load_codec("tiny")
    _random_conv_biases(codec.encoder)
    codec.use_encoder_channels_last(channels_last)
    x = _audio(2, 4)
    z_ref, codes_ref = _encode(codec, x)
    calls: list[bool] = []
    from ttsfleet.kernels import snake as snake_mod

    orig = snake_mod.snake

    def spy(x, alpha, out=None, bias=None):  # noqa: ANN001, ANN202
        calls.append(bias is not None)
        return orig(x, alpha, out=out, bias=bias)

    monkeypatch.setattr(snake_mod, "snake", spy)
    codec.use_fused_kernels()
    z, codes = _encode(codec, x)
    n_snakes = sum(isinstance(m, codec_layers.Snake) for m in codec.encoder.modules())
    assert len(calls) == n_snakes  # every encoder Snake through the fused function
    assert sum(calls) == 4 * 3  # the bias of each residual unit's k=7 conv (4 blocks x 3 units)
    assert _close(z_ref, z) < REL
    assert (codes == codes_ref).float().mean() >= CODES
