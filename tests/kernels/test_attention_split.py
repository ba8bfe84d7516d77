"""Split-KV decode attention (``kernels/triton_attention_split.py``, issue #26), on CPU through
Triton's interpreter (on a GPU, the compiled kernels).

What each test pins down, and how it can fail:
* the split kernels equal the one-pass reference over the same keys for every share count, with
  lengths that leave shares empty (1 key, fewer keys than one block, a length ending mid-block, the
  whole cache), through the slot indirection and with one length for every row (the frame cache);
  a share that dropped or doubled its keys, or a merge that mis-weighted a share, moves the output;
* the FP8 cache (codes + exponents) and the FP8-code output the O GEMM reads agree with the
  one-pass kernel's (codes bit for bit where the values agree);
* the split count: from shapes and the switch only, never above the cache's key blocks, 1 where
  the rows fill the GPU, and ``decode_attention`` routes through the split kernels when it is > 1;
* the switch: auto by default (one share where the rows fill a wave), bad values refused with one
  line naming the choices (at server start).

Tolerance: float32 on CPU, the split changes only the order of the float32 sums: 1e-5. (The
interpreter is on where there is no GPU: ``tests/conftest.py`` sets ``TRITON_INTERPRET`` first.)
"""

from __future__ import annotations

import pytest
import torch
from ttsfleet.kernels import decode
from ttsfleet.kernels.decode import (
    MAX_SPLITS,
    attention_splits,
    auto_splits,
    decode_attention,
    decode_attention_ref,
    parse_attn_splits,
    parse_attn_tile,
)

DEV = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE = torch.bfloat16 if DEV == "cuda" else torch.float32
ATOL = 2e-2 if DEV == "cuda" else 1e-5


def _inputs(cache_len: int = 200, d: int = 64, kv: int = 2, g: int = 4):  # noqa: ANN202
    gen = torch.Generator().manual_seed(0)
    kc = torch.randn(4, cache_len, kv, d, generator=gen).to(DEV, DTYPE)
    vc = torch.randn(4, cache_len, kv, d, generator=gen).to(DEV, DTYPE)
    q = (2 * torch.randn(4, kv * g, d, generator=gen)).to(DEV, DTYPE)
    slots = torch.tensor([3, 0, 2, 1], device=DEV)
    lengths = torch.tensor([1, 37, 130, cache_len], device=DEV)
    return q, kc, vc, slots, lengths


def _split(q, kc, vc, slots, lengths, splits, *extra):  # noqa: ANN001, ANN002, ANN202
    from ttsfleet.kernels.triton_attention_split import decode_attention_split

    return decode_attention_split(q, kc, vc, slots, lengths, splits, *extra)


@pytest.mark.parametrize("splits", [2, 3, 5])
def test_split_attention_equals_the_reference(kernels_on, splits: int) -> None:  # noqa: ANN001
    q, kc, vc, slots, lengths = _inputs()
    want = decode_attention_ref(q, kc, vc, slots, lengths)
    got = _split(q, kc, vc, slots, lengths, splits)
    torch.testing.assert_close(got.float(), want.float(), atol=ATOL, rtol=0)


def test_split_attention_with_rows_as_slots_and_one_length(kernels_on) -> None:  # noqa: ANN001
    """The fast model's frame-local cache: row b is slot b, one length for all rows, 16-key blocks."""
    q, kc, vc, _, _ = _inputs(cache_len=12)
    one = torch.tensor([7], device=DEV)
    want = decode_attention_ref(q, kc, vc, torch.arange(4, device=DEV), one.expand(4))
    torch.testing.assert_close(_split(q, kc, vc, None, one, 2).float(), want.float(), atol=ATOL, rtol=0)


@pytest.mark.parametrize("group", [32, 128])  # mxfp8's 1x32 UE8M0 and bsgemm's 1x128 float32 scales
def test_split_attention_over_an_fp8_cache_and_into_fp8_codes(kernels_on, group: int) -> None:  # noqa: ANN001
    from ttsfleet.kernels.reference import quantize_kv_ref
    from ttsfleet.kernels.triton_attention import decode_attention_triton

    q, kc, vc, slots, lengths = _inputs(d=128)
    (kq, ke), (vq, ve) = quantize_kv_ref(kc.float().cpu()), quantize_kv_ref(vc.float().cpu())
    kq, ke, vq, ve = (t.to(DEV) for t in (kq, ke, vq, ve))
    want = decode_attention_ref(q, kq, vq, slots, lengths, ke, ve)
    got = _split(q, kq, vq, slots, lengths, 4, 0, ke, ve)
    torch.testing.assert_close(got.float(), want.float(), atol=ATOL, rtol=0)
    one_pass = decode_attention_triton(q, kq, vq, slots, lengths, group, ke, ve)
    split = _split(q, kq, vq, slots, lengths, 4, group, ke, ve)
    assert split[0].shape == one_pass[0].shape and split[1].shape == one_pass[1].shape
    scales_agree = torch.isclose(split[1].float(), one_pass[1].float(), rtol=1e-4, atol=0)
    same = scales_agree.float().mean().item()  # the same block scales (powers of two for mxfp8)
    assert same > 0.95, f"only {same:.0%} of the output's block scales agree with the one-pass kernel's"


def test_decode_attention_takes_the_split_kernels_when_the_switch_says(kernels_on, monkeypatch) -> None:  # noqa: ANN001
    from ttsfleet.kernels import triton_attention_split

    calls: list[int] = []
    real = triton_attention_split.decode_attention_split

    def counting(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        calls.append(args[5])
        return real(*args, **kwargs)

    monkeypatch.setattr(triton_attention_split, "decode_attention_split", counting)
    q, kc, vc, slots, lengths = _inputs()
    plain = decode_attention(q, kc, vc, slots, lengths)
    assert calls == []  # the default (auto): 200 positions are under 4 key blocks, one share
    decode.set_attn_splits("3")
    torch.testing.assert_close(decode_attention(q, kc, vc, slots, lengths), plain, atol=ATOL, rtol=0)
    assert calls == [3]


def test_the_split_count_comes_from_shapes_and_the_switch() -> None:
    q = torch.zeros(1, 32, 128)
    cache = torch.zeros(1, 4096, 8, 128)
    try:
        decode.set_attn_splits("off")
        assert attention_splits(q, cache) == 1
        decode.set_attn_splits("auto")  # 1 row x 8 heads on 132 SMs: 33 wanted, capped
        assert attention_splits(q, cache) == MAX_SPLITS
        assert attention_splits(torch.zeros(64, 32, 128), cache) == 1  # 512 programs fill the GPU
        assert attention_splits(q, torch.zeros(1, 10, 8, 128)) == 1  # the frame cache: one block
        decode.set_attn_splits("12")
        assert attention_splits(q, cache) == 12
        assert attention_splits(q, torch.zeros(1, 100, 8, 128)) == 2  # never above its key blocks
    finally:
        decode.set_attn_splits("")


def test_auto_splits_fills_two_waves_of_whole_key_blocks() -> None:
    assert auto_splits(rows=1, kv_heads=8, cache_len=4096, sms=132) == 16
    assert auto_splits(rows=8, kv_heads=8, cache_len=4096, sms=132) == 5  # 64 programs -> ceil(264 / 64)
    assert auto_splits(rows=1, kv_heads=8, cache_len=580, sms=132) == 2  # 9 blocks of 64: 4 per share
    assert auto_splits(rows=16, kv_heads=8, cache_len=4096, sms=132) == 3  # 128 programs: under a wave
    assert auto_splits(rows=32, kv_heads=8, cache_len=4096, sms=132) == 1  # 256 fill a wave (2: 1.06x slower)
    assert auto_splits(rows=33, kv_heads=8, cache_len=4096, sms=132) == 1
    assert auto_splits(rows=1, kv_heads=8, cache_len=100, sms=132) == 1


@pytest.mark.parametrize("bad", ["0", "17", "two", "-1", "1.5"])
def test_bad_switch_values_are_refused_naming_the_choices(bad: str) -> None:
    with pytest.raises(ValueError, match="TTSFLEET_ATTN_SPLITS.*off, auto or a count 1..16"):
        parse_attn_splits(bad)
    assert parse_attn_splits(" Auto ") == "auto" and parse_attn_splits("") == "auto"
    assert parse_attn_splits("4") == 4


@pytest.mark.parametrize("splits", [1, 3])
def test_the_8x32_tile_computes_the_same_attention(kernels_on, splits: int) -> None:  # noqa: ANN001
    """32-key blocks (and 8 warps on a GPU) in both kernels: shares stay whole blocks of the new size."""
    q, kc, vc, slots, lengths = _inputs()
    want = decode_attention_ref(q, kc, vc, slots, lengths)
    decode.set_attn_tile("8x32")
    decode.set_attn_splits(str(splits))
    assert decode.attention_block_n(kc.shape[1]) == 32 and decode.attention_block_n(10) == 16
    got = decode_attention(q, kc, vc, slots, lengths)
    torch.testing.assert_close(got.float(), want.float(), atol=ATOL, rtol=0)


def test_tile_names_parse_or_are_refused() -> None:
    assert parse_attn_tile(" 8X32 ") == (8, 32) and parse_attn_tile("") == (4, 64)
    with pytest.raises(ValueError, match="TTSFLEET_ATTN_TILE.*4x64, 4x32, 8x64, 8x32"):
        parse_attn_tile("16x16")
