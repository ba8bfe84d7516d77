"""Chunked prefill: a prompt fed to a slot in pieces leaves the slot exactly as a one-shot prefill does."""

from __future__ import annotations

import pytest
import torch
from ttsfleet.inference.loader import load_model
from ttsfleet.inference.prompt import build_prompt
from ttsfleet.inference.sampling import SamplingBatch, SamplingParams

#: Uneven chunkings; the last part is whatever is left of the prompt.
CHUNKINGS = [(1,), (3, 5, 1), (7,), (2, 1, 4, 6), (13,)]


def _chunked(model, cache, slot: int, prompt: torch.Tensor, sizes: tuple[int, ...], explicit: bool) -> int:
    """Prefill ``prompt`` into ``slot`` as chunks of ``sizes`` (+ the rest); returns the number of calls."""
    pos, calls = 0, 0
    t = prompt.shape[1]
    for n in [*sizes, t]:
        n = min(n, t - pos)
        if n <= 0:
            break
        start = pos if explicit else None
        model.prefill(cache, slot, prompt[:, pos:pos + n], start=start)
        pos += n
        calls += 1
        assert cache.length(slot) == pos
    assert pos == t
    return calls


def _greedy(model, cache, slot: int, n: int) -> list[list[int]]:
    greedy = SamplingBatch.from_params([SamplingParams(temperature=0.0)])
    return [model.decode_step(cache, torch.tensor([slot]), greedy)[0].tolist() for _ in range(n)]


def _check_same_as_one_shot(model, prompt: torch.Tensor, frames: int) -> list[list[int]]:
    s = min(256, model.config.max_seq_len)
    one = model.new_cache(2, s)
    model.prefill(one, 1, prompt)
    t = prompt.shape[1]
    expected = _greedy(model, one, 1, frames)
    one = model.new_cache(2, s)
    model.prefill(one, 1, prompt)
    for i, sizes in enumerate(CHUNKINGS):
        cache = model.new_cache(3, s)
        # the neighbouring slot holds another prompt: chunks must only read their own slot
        model.prefill(cache, 0, prompt.flip(1))
        calls = _chunked(model, cache, 2, prompt, sizes, explicit=bool(i % 2))
        assert calls >= min(len(sizes), t)
        torch.testing.assert_close(cache.pending_logits[2], one.pending_logits[1], atol=2e-5, rtol=1e-5)
        torch.testing.assert_close(cache.pending_hidden[2], one.pending_hidden[1], atol=2e-5, rtol=1e-5)
        torch.testing.assert_close(cache.k[:, 2, :t], one.k[:, 1, :t], atol=2e-5, rtol=1e-5)
        torch.testing.assert_close(cache.v[:, 2, :t], one.v[:, 1, :t], atol=2e-5, rtol=1e-5)
        assert int(cache.steps[2]) == 0
        assert _greedy(model, cache, 2, frames) == expected, sizes
    return expected


def test_chunked_prefill_matches_one_shot_tiny(tiny_model, tiny_tok) -> None:
    cfg = tiny_model.config
    assert tiny_model.dtype == torch.float32
    gen = torch.Generator().manual_seed(3)
    codes = torch.randint(0, cfg.codebook_size, (cfg.num_codebooks, 12), generator=gen)
    prompt = build_prompt(tiny_tok, cfg, "A longer sentence to chunk.", references=[(codes, "a reference")])
    assert prompt.shape[1] > 40
    _check_same_as_one_shot(tiny_model, prompt, frames=6)


@pytest.mark.parametrize("name", ["s2-tiny", "s1-tiny"])
def test_chunked_prefill_matches_golden(name: str, golden, golden_dir) -> None:
    g = golden(name)
    model = load_model(golden_dir / name, config_overrides={"im_end_id": g["im_end_id"]})
    assert model.dtype == torch.float32
    prompt = torch.tensor(g["prompt"])
    frames = _check_same_as_one_shot(model, prompt, frames=len(g.get("greedy_frames", [0] * 8)))
    if "greedy_frames" in g:
        assert frames == g["greedy_frames"]
    # and the chunked slot still matches the reference's own last logits
    c = model.config
    cache = model.new_cache(1, 64)
    _chunked(model, cache, 0, prompt, (4, 3, 2), explicit=False)
    full = torch.tensor(g["prefill_last_logits"])
    allowed = torch.cat([full[c.semantic_begin_id:c.semantic_end_id + 1], full[c.im_end_id:c.im_end_id + 1]])
    torch.testing.assert_close(cache.pending_logits[0], allowed, atol=g["tolerance"]["abs"],
                               rtol=g["tolerance"]["rel"])


def test_chunked_prefill_in_a_decoding_batch(tiny_model, tiny_tok) -> None:
    """Chunks of one slot interleaved with decode steps of another leave both as if run alone."""
    m, cfg = tiny_model, tiny_model.config
    short = build_prompt(tiny_tok, cfg, "short")
    long = build_prompt(tiny_tok, cfg, "a much longer request that arrives later " * 2)
    greedy = SamplingBatch.from_params([SamplingParams(temperature=0.0)])
    alone = m.new_cache(2, 256)
    m.prefill(alone, 0, short)
    m.prefill(alone, 1, long)
    starts = range(0, long.shape[1], 17)
    assert len(starts) >= 3
    exp_short = [m.decode_step(alone, torch.tensor([0]), greedy)[0].tolist() for _ in starts]
    exp_long = [m.decode_step(alone, torch.tensor([1]), greedy)[0].tolist() for _ in range(4)]
    cache = m.new_cache(2, 256)
    m.prefill(cache, 0, short)
    got_short = []
    for pos in starts:
        m.prefill(cache, 1, long[:, pos:pos + 17])
        got_short.append(m.decode_step(cache, torch.tensor([0]), greedy)[0].tolist())
    got_long = [m.decode_step(cache, torch.tensor([1]), greedy)[0].tolist() for _ in range(4)]
    assert got_short == exp_short and got_long == exp_long


def test_prefill_start_restarts_and_rejects_holes_and_overflow(tiny_model, tiny_tok) -> None:
    m, cfg = tiny_model, tiny_model.config
    p = build_prompt(tiny_tok, cfg, "hello there")
    t = p.shape[1]
    ref = m.new_cache(1, 256)
    m.prefill(ref, 0, p)
    cache = m.new_cache(1, 256)
    m.prefill(cache, 0, p[:, :5])
    m.prefill(cache, 0, p.flip(1))  # continues after the first 5 tokens
    assert cache.length(0) == 5 + t
    m.prefill(cache, 0, p, start=0)  # start=0: a one-shot prefill again
    assert cache.length(0) == t
    torch.testing.assert_close(cache.pending_logits[0], ref.pending_logits[0], atol=0, rtol=0)
    with pytest.raises(ValueError, match="start"):
        m.prefill(cache, 0, p[:, :2], start=t + 1)  # would leave a hole
    with pytest.raises(ValueError, match="start"):
        m.prefill(cache, 0, p[:, :2], start=-1)
    small = m.new_cache(1, 32)
    m.prefill(small, 0, torch.zeros(11, 20, dtype=torch.long))
    with pytest.raises(ValueError, match="overflow"):
        m.prefill(small, 0, torch.zeros(11, 13, dtype=torch.long))  # 20 + 13 > 32
    with pytest.raises(ValueError, match="overflow"):
        m.prefill(small, 0, torch.zeros(11, 12, dtype=torch.long))  # 32: no room for a decoded frame
    with pytest.raises(ValueError, match="overflow"):
        m.prefill(small, 0, torch.zeros(11, 40, dtype=torch.long), start=0)
    assert small.length(0) == 20  # a rejected chunk changes nothing
    m.prefill(small, 0, torch.zeros(11, 11, dtype=torch.long), start=0)  # fits from 0
    m.prefill(small, 0, torch.zeros(11, 20, dtype=torch.long))
    assert small.length(0) == 31
    with pytest.raises(ValueError):
        m.prefill(small, 0, torch.zeros(11, 0, dtype=torch.long))
    with pytest.raises(ValueError):
        m.prefill(small, 1, torch.zeros(11, 2, dtype=torch.long))


def _batched_vs_alone(m, prompts: list[torch.Tensor], split: int, frames: int = 4) -> None:
    """Prefill ``prompts`` one by one, then all in one ``prefill_batch`` (the last one continuing after
    ``split`` tokens prefilled earlier, the first into a slot that held another prompt): the same
    logits, hidden state, K/V and greedy frames per slot."""
    from ttsfleet.inference.model import PrefillPiece

    n = len(prompts)
    alone = m.new_cache(n + 1, 256)
    for i, p in enumerate(prompts):
        m.prefill(alone, i + 1, p)
    greedy = SamplingBatch.from_params([SamplingParams(temperature=0.0)] * n, m.device)
    slots = torch.arange(1, n + 1, device=m.device)
    batch = m.new_cache(n + 1, 256)
    m.prefill(batch, 1, prompts[-1].flip(1))  # stale content: start=0 must overwrite it
    if split:
        m.prefill(batch, n, prompts[-1][:, :split])
    pieces = [PrefillPiece(i + 1, p, 0) for i, p in enumerate(prompts[:-1])]
    pieces.append(PrefillPiece(n, prompts[-1][:, split:], split))
    m.prefill_batch(batch, pieces)
    for i, p in enumerate(prompts):
        s, t = i + 1, p.shape[1]
        assert batch.length(s) == t and int(batch.steps[s]) == 0
        torch.testing.assert_close(batch.pending_logits[s], alone.pending_logits[s], atol=5e-5, rtol=1e-5)
        torch.testing.assert_close(batch.pending_hidden[s], alone.pending_hidden[s], atol=5e-5, rtol=1e-5)
        torch.testing.assert_close(batch.k[:, s, :t], alone.k[:, s, :t], atol=5e-5, rtol=1e-5)
        torch.testing.assert_close(batch.v[:, s, :t], alone.v[:, s, :t], atol=5e-5, rtol=1e-5)
    for _ in range(frames):
        assert m.decode_step(batch, slots, greedy).tolist() == m.decode_step(alone, slots, greedy).tolist()


def _mixed_prompts(tok, cfg) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(4)
    codes = torch.randint(0, cfg.codebook_size, (cfg.num_codebooks, 9), generator=gen)
    return [build_prompt(tok, cfg, "short"), build_prompt(tok, cfg, "a longer prompt " * 3),
            build_prompt(tok, cfg, "x"), build_prompt(tok, cfg, "voiced", references=[(codes, "ref text")])]


@pytest.mark.parametrize("split", [7, 0])  # 0: every piece starts its slot (the causal fast path)
def test_batched_prefill_equals_per_request_prefill(tiny_model, tiny_tok, split: int) -> None:
    _batched_vs_alone(tiny_model, _mixed_prompts(tiny_tok, tiny_model.config), split=split)


@pytest.mark.parametrize("start", [0, 6])  # a fresh piece, and one continuing after cached positions
def test_a_one_piece_batch_equals_the_plain_prefill(tiny_model, tiny_tok, start: int) -> None:
    """A batch of one piece (most calls of a busy server) reads its slot's cache as a view instead of
    regrouping rows: the slot ends as the plain prefill leaves it."""
    from ttsfleet.inference.model import PrefillPiece

    m = tiny_model
    p = build_prompt(tiny_tok, m.config, "a longer prompt " * 3)
    alone, batch = m.new_cache(3, 256), m.new_cache(3, 256)
    m.prefill(alone, 2, p)
    m.prefill(batch, 1, p.flip(1))  # another slot's content must not leak in
    if start:
        m.prefill(batch, 2, p[:, :start])
    m.prefill_batch(batch, [PrefillPiece(2, p[:, start:], start)])
    t = p.shape[1]
    assert batch.length(2) == t
    torch.testing.assert_close(batch.pending_logits[2], alone.pending_logits[2], atol=5e-5, rtol=1e-5)
    torch.testing.assert_close(batch.pending_hidden[2], alone.pending_hidden[2], atol=5e-5, rtol=1e-5)
    torch.testing.assert_close(batch.k[:, 2, :t], alone.k[:, 2, :t], atol=5e-5, rtol=1e-5)


def test_batched_prefill_fused_path_equals_per_request(tiny_tok) -> None:
    """The fused kernels (Triton's interpreter on CPU, compiled on CUDA) through the batched layout."""
    import os

    pytest.importorskip("triton")
    from ttsfleet.kernels import dispatch

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    if dev == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs TRITON_INTERPRET=1 before triton is imported (set by test_fused_decode)")
    dispatch.configure("interpret" if dev == "cpu" else "auto")
    try:
        # 4 codebooks instead of tiny's 10: the same prefill layout and kernels, fewer interpreted
        # fast-model launches in the decoded frame
        m = load_model("tiny", device=dev, config_overrides={"num_codebooks": 4})
        from ttsfleet.inference.fused import fused_enabled

        assert fused_enabled(m.main_head)
        prompts = _mixed_prompts(tiny_tok, m.config)
        # two pieces cover the layout: a fresh one into a slot with stale content, and one continuing
        # after 5 tokens prefilled earlier (the interpreter runs every launch in Python: keep it short,
        # the prompts' first 23 and 30 of their 66 and 70 tokens; 48 batched rows, still several tiles)
        _batched_vs_alone(m, [prompts[2][:, :23].to(dev), prompts[0][:, :30].to(dev)], split=5, frames=1)
    finally:
        dispatch.configure()  # back to what TTSFLEET_KERNELS says


def test_batched_prefill_rejects_bad_pieces(tiny_model, tiny_tok) -> None:
    from ttsfleet.inference.model import PrefillPiece

    m = tiny_model
    p = build_prompt(tiny_tok, m.config, "hello")
    cache = m.new_cache(2, 64)
    with pytest.raises(ValueError, match="distinct"):
        m.prefill_batch(cache, [PrefillPiece(0, p, 0), PrefillPiece(0, p, 0)])
    with pytest.raises(ValueError, match="overflow"):
        too_long = torch.zeros(11, 70, dtype=torch.long)
        m.prefill_batch(cache, [PrefillPiece(0, p, 0), PrefillPiece(1, too_long, 0)])
    assert cache.length(0) == 0 and cache.length(1) == 0  # a rejected batch changes nothing


def test_the_varlen_layout_of_a_mixed_batch():
    """Two pieces, one fresh (slot 3, positions 0-1) and one continuing (slot 5, positions 4-6): rows,
    the padded grid, each piece's last row and which cached keys each query sees."""
    from ttsfleet.inference.model import _VarlenLayout

    lay = _VarlenLayout.build([3, 5], [(0, 2), (4, 7)], torch.device("cpu"))
    assert lay.pos.tolist() == [0, 1, 4, 5, 6] and lay.row_slots.tolist() == [3, 3, 5, 5, 5]
    assert lay.slots.tolist() == [3, 5] and lay.starts.tolist() == [0, 4] and lay.ends.tolist() == [2, 7]
    assert lay.grid.tolist() == [0, 1, 3, 4, 5] and lay.last.tolist() == [1, 4]
    assert (lay.max_len, lay.max_end, lay.fresh, lay.lone_slot) == (3, 7, False, None)
    assert lay.mask.shape == (2, 1, 3, 7) and lay.mask.dtype == torch.bool
    assert lay.mask[0, 0].sum(dim=1).tolist() == [1, 2, 3]  # query i of a fresh piece: keys 0..i
    assert lay.mask[1, 0].sum(dim=1).tolist() == [5, 6, 7]  # after 4 cached positions: keys 0..4+i
    assert all(t.dtype == torch.int64 for t in (lay.pos, lay.row_slots, lay.slots, lay.grid, lay.last))
    one = _VarlenLayout.build([2], [(0, 4)], torch.device("cpu"))
    assert one.fresh and one.lone_slot == 2 and one.grid.tolist() == [0, 1, 2, 3]
