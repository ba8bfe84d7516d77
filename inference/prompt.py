"""Build the DualAR prompt grid ``[1 + num_codebooks, T]`` in the S2 chat format.

Why a grid: row 0 holds token ids; at reference-audio positions row 0 is the semantic token of
codebook 0 and rows 1..n hold that frame's codes (the slow model sums their embeddings); text
positions carry zeros there. Layout (one block per reference; none → the short system text)::

    <|im_start|>system\\nconvert the provided text to speech reference to the following:\\n\\n
    Text:\\n<|speaker:0|>{ref text}\\n\\nSpeech:\\n{reference codes}<|im_end|>\\n
    <|im_start|>user\\n{text}<|im_end|>\\n<|im_start|>assistant\\n<|voice|>
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from .model_config import DualARConfig
from .tokenizer import Tokenizer

SYSTEM_WITH_REF = "convert the provided text to speech reference to the following:"
SYSTEM_PLAIN = "convert the provided text to speech"


def _text(tok: Tokenizer, text: str, ncb: int) -> Tensor:
    ids = torch.tensor(tok.encode(text), dtype=torch.long)
    grid = torch.zeros(1 + ncb, ids.numel(), dtype=torch.long)
    grid[0] = ids
    return grid


def _codes(codes: Tensor, config: DualARConfig) -> Tensor:
    codes = torch.as_tensor(codes).to(torch.long).cpu()
    n = config.num_codebooks
    if codes.dim() != 2 or codes.shape[0] != n:
        raise ValueError(f"reference codes must be [{n}, T], got {tuple(codes.shape)}")
    if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= config.codebook_size):
        raise ValueError(f"reference codes must lie in [0, {config.codebook_size})")
    if codes.numel() and int(codes[0].max()) >= config.num_semantic:
        raise ValueError(f"codebook-0 codes must be < {config.num_semantic} semantic tokens")
    grid = torch.zeros(1 + n, codes.shape[1], dtype=torch.long)
    grid[0] = codes[0] + config.semantic_begin_id
    grid[1:] = codes
    return grid


def prompt_head(tok: Tokenizer, config: DualARConfig,
                references: Sequence[tuple[Tensor, str]]) -> Tensor | None:
    """The part of every prompt in these voices that comes before anything request-specific: the
    system text and each reference's transcript and codes (None without references: the plain system
    text is a few tokens, not worth keeping). :func:`build_prompt` starts with exactly these columns,
    also when more references (a previous segment's codes) follow, so its K/V can be prefilled once
    and reused (:mod:`ttsfleet.inference.prefix`). Each part is tokenized on its own, so cutting the
    prompt at a part boundary changes no token."""
    if not references:
        return None
    n = config.num_codebooks
    parts = [_text(tok, f"<|im_start|>system\n{SYSTEM_WITH_REF}", n)]
    for codes, ref_text in references:
        parts.append(_text(tok, f"\n\nText:\n<|speaker:0|>{ref_text}\n\nSpeech:\n", n))
        parts.append(_codes(codes, config))
    return torch.cat(parts, dim=1)


def build_prompt(tok: Tokenizer, config: DualARConfig, text: str,
                 references: Sequence[tuple[Tensor, str]] = ()) -> Tensor:
    """``LongTensor[1 + num_codebooks, T]`` for ``text`` in the voice of ``(codes, transcript)`` refs."""
    n = config.num_codebooks
    head = prompt_head(tok, config, references)
    if head is not None:
        parts = [head, _text(tok, "<|im_end|>\n", n)]
    else:
        parts = [_text(tok, f"<|im_start|>system\n{SYSTEM_PLAIN}<|im_end|>\n", n)]
    parts.append(_text(tok, f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n<|voice|>", n))
    return torch.cat(parts, dim=1)
