"""A random-weight preset's text through Qwen's BPE (``--preset-text qwen-bpe``;
``inference.tokenizer.QwenTextTokenizer``), S2 Pro's own text vocabulary, beside the byte-level
default.

What each test pins down, and how it can fail:
* the same prompt format (specials at the preset's ids, the same decoded text) at the real model's
  length: the served benchmark's 290-character text is 355 tokens as bytes and under a third of
  that through the BPE (a tokenizer that fell back to bytes, or dropped text, fails here);
* Qwen's ranks are what they claim: a token decodes to the bytes it encodes, every text id sits below
  the preset's specials (151,643 ranks under S2 Pro's first special id), and the BPE merges
  (a space-led word is one token);
* a preset whose vocabulary cannot hold the ranks, an unknown choice, and a missing ranks file are
  one-line errors (``UserError``), not tracebacks; the server's config checks the choice at start.
Needs Qwen's ranks (``pip install --no-deps dashscope``: scripts/test.sh installs it).
"""

from __future__ import annotations

import pytest
from ttsfleet.inference.model_config import preset
from ttsfleet.inference.prompt import build_prompt
from ttsfleet.inference.tokenizer import QwenTextTokenizer, load_tokenizer, qwen_ranks_path

from ttsfleet.errors import UserError

TEXT = ("The quick brown fox jumps over the lazy dog, " * 7)[:290]  # the served benchmark's text


@pytest.fixture(scope="module")
def qwen() -> QwenTextTokenizer:
    try:
        qwen_ranks_path()
    except UserError as exc:
        pytest.skip(str(exc))
    tok = load_tokenizer("s2-pro", "qwen-bpe")
    assert isinstance(tok, QwenTextTokenizer)
    return tok


def test_the_same_prompt_at_the_real_models_length(qwen: QwenTextTokenizer) -> None:
    config = preset("s2-pro")
    as_bytes = build_prompt(load_tokenizer("s2-pro"), config, TEXT)
    as_bpe = build_prompt(qwen, config, TEXT)
    assert as_bytes.shape[-1] == 355 and as_bpe.shape[-1] * 3 < as_bytes.shape[-1], as_bpe.shape
    assert qwen.decode(as_bpe[0].tolist()) == load_tokenizer("s2-pro").decode(as_bytes[0].tolist())
    ids = as_bpe[0].tolist()
    assert ids[0] == config.im_start_id and ids[-1] == qwen.voice_id == config.voice_id
    assert config.im_end_id in ids


def test_qwens_ranks_sit_below_the_presets_specials_and_merge(qwen: QwenTextTokenizer) -> None:
    assert qwen.n_ranks == 151_643 < preset("s2-pro").semantic_begin_id
    words = qwen.encode(" quick brown")
    assert len(words) == 2 and all(i < qwen.n_ranks for i in words)
    assert qwen.decode(words) == " quick brown"
    text = "Grüße, 東京! 12:30"
    assert qwen.decode(qwen.encode(text)) == text


def test_bad_choices_are_one_line_errors(qwen: QwenTextTokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(UserError, match="preset text 'words' is not one of bytes, qwen-bpe"):
        load_tokenizer("s2-pro", "words")
    with pytest.raises(UserError, match="preset 'tiny-fp8' has 500 text ids, fewer than Qwen's BPE's 151643"):
        load_tokenizer("tiny-fp8", "qwen-bpe")  # its 584-id vocabulary
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(UserError, match="pip install --no-deps dashscope"):
        load_tokenizer("s2-pro", "qwen-bpe")


def test_the_server_config_checks_the_choice_at_start() -> None:
    from ttsfleet.inference.serve_config import ServeConfig

    assert ServeConfig.from_env({}).preset_text == "bytes"
    assert ServeConfig.from_env({"TTSFLEET_PRESET_TEXT": " QWEN-BPE "}).preset_text == "qwen-bpe"
    with pytest.raises(UserError, match=r"preset text 'x' \(--preset-text / TTSFLEET_PRESET_TEXT\)"):
        ServeConfig.from_env({}, preset_text="x")
