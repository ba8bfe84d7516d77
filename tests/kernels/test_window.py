"""CPU tests of prev_tokens_shift_: semantics over many steps, and loud rejection of bad input."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from ttsfleet.kernels import prev_tokens_shift_  # noqa: E402


def _rand_int(gen, *shape):
    return torch.randint(-(2**31), 2**31 - 1, shape, generator=gen, dtype=torch.int64).to(torch.int32)


@pytest.mark.parametrize("bs,w,cw", [(1, 1, 1), (3, 4, 10), (8, 16, 9)])
def test_shift_matches_a_python_deque(gen, bs, w, cw):
    prev = _rand_int(gen, bs, w, cw)
    expect = [[list(map(tuple, prev[b].tolist()))] for b in range(bs)]
    window = [list(e[0]) for e in expect]
    ptr = prev.data_ptr()
    for _ in range(w + 3):
        nxt = _rand_int(gen, bs, cw)
        prev_tokens_shift_(prev, nxt)
        for b in range(bs):
            window[b] = window[b][1:] + [tuple(nxt[b].tolist())]
        assert [list(map(tuple, prev[b].tolist())) for b in range(bs)] == window
    assert prev.data_ptr() == ptr  # in place


def test_shift_rejects_bad_input(gen):
    prev = _rand_int(gen, 2, 4, 3)
    nxt = _rand_int(gen, 2, 3)
    before = prev.clone()
    bad = [
        (prev.long(), nxt, "int32"),
        (prev, nxt.long(), "int32"),
        (prev[0], nxt, r"\[bs, W, cw\]"),
        (prev, nxt[:1], "next_tokens"),
        (prev, _rand_int(gen, 2, 4), "next_tokens"),
        (prev.transpose(1, 2).contiguous().transpose(1, 2), nxt, "contiguous"),
        (prev, _rand_int(gen, 3, 2).t(), "contiguous"),
        (prev, prev[:, 0], "alias"),
        (prev.float(), nxt, "int32"),
    ]
    for p, n, msg in bad:
        with pytest.raises(ValueError, match=msg):
            prev_tokens_shift_(p, n)
    assert torch.equal(prev, before)  # nothing written on a rejected call
