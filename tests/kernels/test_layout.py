"""CPU tests of the quantized layouts, the quantizers and the safetensors round trip."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from ttsfleet.kernels import QuantizedWeight, quantize_activation, quantize_weight  # noqa: E402
from ttsfleet.kernels.layout import scale_shape  # noqa: E402
from ttsfleet.kernels.reference import (  # noqa: E402
    dequantize_activation,
    dequantize_weight,
    ue8m0_from_amax,
    ue8m0_to_float,
)
from ttsfleet.kernels.testing import randn, rel_err  # noqa: E402

SHAPES = [(256, 384), (200, 300), (7, 33), (130, 129)]


@pytest.mark.parametrize("n,k", SHAPES)
def test_bsgemm_weight_layout(gen, n, k):
    w = randn(gen, n, k, scale=0.05)
    qw = quantize_weight(w, "bsgemm_fp8")
    assert qw.qweight.dtype == torch.float8_e4m3fn and tuple(qw.qweight.shape) == (n, k)
    assert tuple(qw.scale.shape) == (-(-n // 128), -(-k // 128)) and qw.scale.dtype == torch.float32
    assert qw.scale.is_contiguous() and qw.scale_strides == (qw.scale.shape[1], 1)
    # each block's largest code is exactly 448 (its amax maps to the top of the FP8 range)
    q = qw.qweight.float()
    for i in range(qw.scale.shape[0]):
        for j in range(qw.scale.shape[1]):
            blk = q[128 * i:128 * i + 128, 128 * j:128 * j + 128]
            assert blk.abs().max() == 448.0
            assert torch.isclose(qw.scale[i, j], w[128 * i:128 * i + 128, 128 * j:128 * j + 128].abs().max()
                                 / 448, rtol=1e-6)
    assert 5e-3 < rel_err(dequantize_weight(qw), w) < 5e-2


@pytest.mark.parametrize("n,k", SHAPES)
def test_mxfp8_weight_layout(gen, n, k):
    w = randn(gen, n, k, scale=3.0)
    qw = quantize_weight(w, "mxfp8")
    assert tuple(qw.scale.shape) == (n, -(-k // 32)) and qw.scale.dtype == torch.uint8
    e = qw.scale.int()
    assert int(e.min()) >= 1 and int(e.max()) <= 254
    assert qw.qweight.float().abs().max() <= 448
    # the UE8M0 multiplier is the smallest power of two that keeps the group's amax within 448
    s = ue8m0_to_float(e)
    amax = torch.nn.functional.pad(w.abs(), (0, (-k) % 32)).view(n, -1, 32).amax(2)
    assert (amax / s <= 448).all() and (amax / (s / 2) > 448).all()
    assert 5e-3 < rel_err(dequantize_weight(qw), w) < 6e-2


def test_ue8m0_is_exact_at_powers_of_two():
    j = torch.arange(-20, 20, dtype=torch.float32)
    amax = 448 * torch.pow(2.0, j)
    assert torch.equal(ue8m0_from_amax(amax), (127 + j).int())
    bumped = torch.nextafter(amax, torch.full_like(amax, float("inf")))
    assert torch.equal(ue8m0_from_amax(bumped), (128 + j).int())
    assert int(ue8m0_from_amax(torch.zeros(1))) == 1  # all-zero group: smallest normal scale


@pytest.mark.parametrize("block", [128, 32])
@pytest.mark.parametrize("m,k", [(1, 256), (5, 300), (33, 64)])
def test_quantize_activation(gen, block, m, k):
    x = randn(gen, m, k, dtype=torch.bfloat16)
    xq, xs = quantize_activation(x, block)
    assert xq.dtype == torch.float8_e4m3fn and tuple(xq.shape) == (m, k)
    assert tuple(xs.shape) == (m, -(-k // block)) and xs.is_contiguous()
    assert xs.dtype == (torch.float32 if block == 128 else torch.uint8)
    err = rel_err(dequantize_activation(xq, xs), x.float())
    assert 1e-3 < err < 6e-2
    with pytest.raises(ValueError):
        quantize_activation(x, 64)


@pytest.mark.parametrize("scheme", ["bsgemm_fp8", "mxfp8"])
def test_safetensors_round_trip(gen, tmp_path, scheme):
    st = pytest.importorskip("safetensors.torch")
    w = randn(gen, 300, 260, dtype=torch.bfloat16)
    qw = quantize_weight(w, scheme)
    path = tmp_path / "w.safetensors"
    st.save_file({**qw.to_state_dict("mlp.down."), "other": torch.ones(3)}, str(path))
    back = QuantizedWeight.from_state_dict(st.load_file(str(path)), "mlp.down.")
    assert back.scheme == scheme and back.shape == (300, 260)
    assert torch.equal(back.qweight.view(torch.uint8), qw.qweight.view(torch.uint8))
    assert torch.equal(back.scale, qw.scale) and back.scale.dtype == qw.scale.dtype


def test_state_dict_rejects_unknown_layout(gen):
    sd = quantize_weight(randn(gen, 128, 128), "bsgemm_fp8").to_state_dict()
    sd["qmeta"] = torch.tensor([99, 1, 128, 128])
    with pytest.raises(ValueError, match="layout"):
        QuantizedWeight.from_state_dict(sd)
    with pytest.raises(ValueError, match="lacks"):
        QuantizedWeight.from_state_dict({})


@pytest.mark.parametrize("scheme", ["bsgemm_fp8", "mxfp8"])
def test_layout_rejects_transposed_or_wrong_dtype_scale(gen, scheme):
    qw = quantize_weight(randn(gen, 256, 512), scheme)
    with pytest.raises(ValueError, match="logically"):
        QuantizedWeight(qw.qweight, qw.scale.t().contiguous(), scheme, qw.shape)
    with pytest.raises(ValueError, match="must be"):
        QuantizedWeight(qw.qweight, qw.scale.to(torch.float16), scheme, qw.shape)
    with pytest.raises(ValueError, match="qweight"):
        QuantizedWeight(qw.qweight.float(), qw.scale, scheme, qw.shape)
    with pytest.raises(ValueError, match="unknown"):
        scale_shape("int4", 1, 1)
