"""Strided bf16 convs of the codec on the CPU are right on every CPU (``CausalConv._conv``): on CPUs
with AMX, oneDNN's bf16 brgemm convolutions gave wrong numbers for the encoders' stride-4 kernel-8
downsampling (73-84 % off float32; pytorch/pytorch#169688), so those convs run torch's own kernels.
On a CPU without AMX the test passes either way; on one with AMX it fails without the guard."""

from __future__ import annotations

import pytest
import torch
from ttsfleet.inference.codec_layers import CausalConv, cache_channels_last


@pytest.mark.parametrize("stride,kernel", [(2, 4), (4, 8), (8, 16), (3, 6)])
@pytest.mark.parametrize("channels_last", [False, True])
def test_strided_bf16_conv_matches_float32(stride: int, kernel: int, channels_last: bool) -> None:
    torch.manual_seed(stride)
    conv = CausalConv(16, 32, kernel, stride=stride)
    x = torch.randn(2, 16, 64 * stride)
    if channels_last:
        cache_channels_last(conv)
        x = x.unsqueeze(2).contiguous(memory_format=torch.channels_last)
    onednn = torch.backends.mkldnn.enabled
    with torch.inference_mode():
        ref = conv(x)
        conv16 = conv.to(torch.bfloat16)
        if channels_last:
            cache_channels_last(conv16)
        got = conv16(x.to(torch.bfloat16)).float()
    assert torch.backends.mkldnn.enabled == onednn  # the guard put oneDNN back
    rel = float((got - ref).norm() / ref.norm())
    assert rel < 0.02, f"bf16 stride {stride} conv is {rel:.1%} off float32"
