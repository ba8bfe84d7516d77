"""The restricted main-token head: its rows are exactly the allowed LM-head rows, and decoding with it
gives the same tokens as the whole-vocabulary head with the disallowed ids masked out.

Each check can fail: a shifted / permuted index map or head is caught by the row check, a head whose
logits differ from the full-vocab ones by the frame comparison (greedy and a seeded sampling run).
"""

from __future__ import annotations

import pytest
import torch
from ttsfleet.inference.loader import load_model
from ttsfleet.inference.prompt import build_prompt
from ttsfleet.inference.sampling import SamplingBatch, SamplingParams, _filtered_probs
from ttsfleet.kernels import prev_tokens_shift_

MODELS = {
    "tiny": {},
    "tiny-fp8": {"dtype": torch.bfloat16, "quantize": "bsgemm_fp8"},
}


def _allowed_ids(cfg) -> list[int]:
    """The documented row order: semantic codes 0 .. num_semantic-1, then <|im_end|>."""
    return list(range(cfg.semantic_begin_id, cfg.semantic_end_id + 1)) + [cfg.im_end_id]


def _check_main_head(model) -> None:
    cfg = model.config
    full = model.embeddings.weight if model.output is None else model.output.weight
    assert model.main_head_ids.tolist() == _allowed_ids(cfg)
    assert model.main_head.shape == (cfg.num_semantic + 1, cfg.dim)
    assert model.main_head.dtype == torch.float32 and model.main_head.is_contiguous()
    assert torch.equal(model.main_head, full.float()[_allowed_ids(cfg)])


@pytest.mark.parametrize("name", list(MODELS))
def test_main_head_rows_are_the_allowed_rows(name: str) -> None:
    _check_main_head(load_model(name, **MODELS[name]))


@pytest.mark.parametrize("name", ["s2-tiny", "s1-tiny"])  # tied embedding / untied output weight
def test_main_head_rows_of_checkpoints(name: str, golden, golden_dir) -> None:
    g = golden(name)
    _check_main_head(load_model(golden_dir / name, config_overrides={"im_end_id": g["im_end_id"]}))


def test_a_broken_index_map_or_head_is_caught() -> None:
    model = load_model("tiny")
    ids, head = model.main_head_ids.clone(), model.main_head.clone()
    n = model.config.num_semantic
    broken = [
        ("ids off by one", ids + 1, head),
        ("end row first", torch.cat([ids[-1:], ids[:-1]]), torch.cat([head[-1:], head[:-1]])),
        ("two rows swapped", ids, head[torch.tensor([1, 0, *range(2, n + 1)])]),
    ]
    for label, bad_ids, bad_head in broken:
        model.main_head_ids, model.main_head = bad_ids, bad_head
        with pytest.raises(AssertionError):
            _check_main_head(model)
            pytest.fail(f"{label} was not caught")
    model.main_head_ids, model.main_head = ids, head
    _check_main_head(model)


def _prompt(tok, cfg) -> torch.Tensor:
    gen = torch.Generator().manual_seed(3)
    ref = torch.randint(0, cfg.codebook_size, (cfg.num_codebooks, 6), generator=gen)
    return build_prompt(tok, cfg, "Restricted heads speak the same.", references=[(ref, "a reference")])


def _decode(model, prompt: torch.Tensor, params: list[SamplingParams],
            steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row decodes ``prompt`` in its own slot -> (prefill logits, frames ``[bs, steps, 1 + ncb]``)."""
    bs = len(params)
    cache = model.new_cache(bs + 1, 256)
    slots = torch.arange(1, bs + 1)
    for s in slots.tolist():
        model.prefill(cache, s, prompt)
    logits = cache.pending_logits[slots].clone()
    batch = SamplingBatch.from_params(params)
    window = torch.full((bs, 8, model.config.num_codebooks), -1, dtype=torch.int32)
    frames = []
    for _ in range(steps):
        f = model.decode_step(cache, slots, batch, window)
        prev_tokens_shift_(window, f[:, 1:].to(torch.int32).contiguous())
        frames.append(f)
    return logits, torch.stack(frames, 1)


@pytest.mark.parametrize("name", list(MODELS))
def test_restricted_head_decode_equals_full_vocab_masked_decode(name: str, tiny_tok) -> None:
    model = load_model(name, **MODELS[name])
    cfg = model.config
    prompt = _prompt(tiny_tok, cfg)
    params = [SamplingParams(temperature=0.0),
              SamplingParams(temperature=1.5, top_p=1.0, top_k=0, seed=11),
              SamplingParams(temperature=0.9, top_p=0.9, top_k=40, repetition_penalty=1.2, seed=12)]
    assert model.restrict_main_head
    logits, frames = _decode(model, prompt, params, steps=8)
    model.restrict_main_head = False  # reference: whole-vocab logits, allowed columns
    ref_logits, ref_frames = _decode(model, prompt, params, steps=8)
    model.restrict_main_head = True
    torch.testing.assert_close(logits, ref_logits, atol=1e-5, rtol=1e-5)
    assert torch.equal(frames, ref_frames)
    assert not torch.equal(frames[1], frames[0])  # the seeded row really sampled
    main, cb0 = frames[..., 0], frames[..., 1]  # token ids mapped back independently of main_head_ids
    assert torch.equal(main, torch.where(main == cfg.im_end_id, main, cb0 + cfg.semantic_begin_id))
    assert ((main >= cfg.semantic_begin_id) & (main <= cfg.semantic_end_id) | (main == cfg.im_end_id)).all()


@pytest.mark.parametrize("name", list(MODELS))
def test_restricted_logits_give_the_masked_full_vocab_distribution(name: str, tiny_tok) -> None:
    """Dropping the masked (-inf) columns changes no probability, and greedy picks the same token."""
    model = load_model(name, **MODELS[name])
    cfg = model.config
    prompt = _prompt(tiny_tok, cfg)
    # S2 layout with fast_dim == dim hands the normed hidden state to the fast model: take the float32
    # whole-vocab logits from it (forward_slow's own logits are bf16 for a bf16 model)
    assert cfg.fast_input_post_norm and model.fast_project_in is None and model.output is None
    normed = model.forward_slow(prompt[None])[1][:, -1]
    full = normed.float() @ model.embeddings.weight.float().T  # [1, vocab]
    ids = model.main_head_ids
    masked = torch.full_like(full, float("-inf"))
    masked[:, ids] = full[:, ids]
    cache = model.new_cache(1, 256)
    model.prefill(cache, 0, prompt)
    restricted = cache.pending_logits[:1]
    assert int(ids[restricted.argmax(-1)]) == int(masked.argmax(-1))
    for t, p, k in [(1.0, 1.0, 0), (0.7, 0.8, 30), (1.3, 0.95, 0)]:
        args = (torch.tensor([t]), torch.tensor([p]), torch.tensor([k]))
        pf, pr = _filtered_probs(masked, *args), _filtered_probs(restricted, *args)
        assert float(pf.sum()) == pytest.approx(1.0, abs=1e-5)
        assert float(pf.sum() - pf[:, ids].sum()) == 0.0
        torch.testing.assert_close(pf[:, ids], pr, atol=1e-5, rtol=1e-4)
