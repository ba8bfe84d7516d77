"""Decode attention over the slot cache: indirection through slots, per-slot lengths, GQA grouping."""

from __future__ import annotations

import pytest
import torch
from ttsfleet.kernels.decode import decode_attention, decode_attention_ref


def _naive(q, kc, vc, slots, lengths):
    out = []
    for b in range(q.shape[0]):
        n, s = int(lengths[b]), int(slots[b])
        k, v = kc[s, :n].float(), vc[s, :n].float()  # [n, KV, D]
        g = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
        att = torch.softmax(torch.einsum("hd,nhd->hn", q[b].float(), k) / q.shape[-1] ** 0.5, -1)
        out.append(torch.einsum("hn,nhd->hd", att, v))
    return torch.stack(out)


def _inputs(device: str, dtype: torch.dtype, d: int = 64):
    gen = torch.Generator().manual_seed(0)
    kc = torch.randn(5, 300, 2, d, generator=gen).to(device, dtype)
    vc = torch.randn(5, 300, 2, d, generator=gen).to(device, dtype)
    q = torch.randn(3, 8, d, generator=gen).to(device, dtype)
    return q, kc, vc, torch.tensor([4, 0, 2], device=device), torch.tensor([1, 300, 77], device=device)


def test_reference_matches_naive() -> None:
    q, kc, vc, slots, lengths = _inputs("cpu", torch.float32)
    expected = _naive(q, kc, vc, slots, lengths)
    got = decode_attention_ref(q, kc, vc, slots, lengths)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(decode_attention(q, kc, vc, slots, lengths), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("d", [16, 64, 128])
def test_triton_kernel_matches_naive(d: int) -> None:
    q, kc, vc, slots, lengths = _inputs("cuda", torch.bfloat16, d)
    torch.testing.assert_close(decode_attention(q, kc, vc, slots, lengths).float(),
                               _naive(q, kc, vc, slots, lengths), atol=2e-2, rtol=2e-2)
