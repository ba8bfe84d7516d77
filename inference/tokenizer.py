"""Text tokenizers for DualAR prompts: HF ``tokenizer.json`` (S2), ``tokenizer.tiktoken`` (S1), tiny.

Why one small interface: the prompt builder only needs ``encode`` with special tokens recognised
inside the text (``<|im_start|>``, ``<|speaker:0|>``, ...) and the ids of a few specials.

The ``tiny`` tokenizer is byte-level and deterministic, and fits the tiny model's 584-id vocab:
specials at 0..16 (``<|im_start|>`` 10, ``<|im_end|>`` 11, ``<|voice|>`` 12), ``<|speaker:N|>`` at
20+N (N < 8), UTF-8 bytes at 100..355, ``<|semantic:i|>`` at 500+i (i < 64).
"""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Protocol

from ttsfleet.contracts.serving import PRESET_TEXTS
from ttsfleet.errors import UserError

IM_START, IM_END, VOICE = "<|im_start|>", "<|im_end|>", "<|voice|>"
_FISH_PATTERN = "|".join([
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)", r"\p{P}", r"[^\r\n\p{L}\p{N}]?\p{L}+", r"\p{N}",
    r" ?[^\s\p{L}\p{N}]+[\r\n]*", r"\s*[\r\n]+", r"\s+(?!\S)", r"\s+",
])
_FISH_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|pad|>", IM_START, IM_END, "<|phoneme_start|>",
                  "<|phoneme_end|>", "<|tool_call_start|>", "<|tool_call_end|>", "<|text|>", VOICE,
                  "<|interleave|>"]


class Tokenizer(Protocol):
    im_start_id: int
    im_end_id: int
    voice_id: int
    semantic_begin_id: int
    semantic_end_id: int

    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: list[int]) -> str: ...
    def token_id(self, token: str) -> int: ...


class _Base:
    def _init_ids(self) -> None:
        self.im_start_id = self.token_id(IM_START)
        self.im_end_id = self.token_id(IM_END)
        self.voice_id = self.token_id(VOICE)
        self.semantic_begin_id = self.token_id("<|semantic:0|>")
        n = 0
        while self._has(f"<|semantic:{n + 1}|>"):
            n += 1
        self.semantic_end_id = self.semantic_begin_id + n

    def _has(self, token: str) -> bool:
        try:
            self.token_id(token)
            return True
        except KeyError:
            return False

    def token_id(self, token: str) -> int:
        raise NotImplementedError


class TinyTokenizer(_Base):
    """Byte-level tokenizer for the ``tiny`` model (see module docstring for the id layout)."""

    BYTE_OFFSET = 100
    SEMANTIC_BEGIN = 500
    NUM_SEMANTIC = 64

    def __init__(self, im_start: int = 10, im_end: int = 11, voice: int = 12,
                 semantic_begin: int = SEMANTIC_BEGIN, num_semantic: int = NUM_SEMANTIC) -> None:
        self.specials = {"<|begin_of_text|>": 0, "<|end_of_text|>": 1, "<|pad|>": 2, IM_START: im_start,
                         IM_END: im_end, VOICE: voice, "<|text|>": 13, "<|interleave|>": 14,
                         "<|phoneme_start|>": 15, "<|phoneme_end|>": 16}
        self.specials.update({f"<|speaker:{i}|>": 20 + i for i in range(8)})
        self.specials.update({f"<|semantic:{i}|>": semantic_begin + i for i in range(num_semantic)})
        self._inv = {v: k for k, v in self.specials.items()}
        self._split = re.compile("(" + "|".join(re.escape(s) for s in self.specials) + ")")
        self._init_ids()

    def token_id(self, token: str) -> int:
        return self.specials[token]

    def encode(self, text: str) -> list[int]:
        out: list[int] = []
        for part in self._split.split(text):
            if part in self.specials:
                out.append(self.specials[part])
            elif part:
                out.extend(self._encode_text(part))
        return out

    def _encode_text(self, text: str) -> list[int]:
        """Text between specials: one id per UTF-8 byte."""
        return [self.BYTE_OFFSET + b for b in text.encode("utf-8")]

    def decode(self, ids: list[int]) -> str:
        buf = bytearray()
        text = []
        for i in ids:
            if self.BYTE_OFFSET <= i < self.BYTE_OFFSET + 256:
                buf.append(i - self.BYTE_OFFSET)
                continue
            text.append(buf.decode("utf-8", errors="replace"))
            buf.clear()
            text.append(self._inv.get(i, ""))
        text.append(buf.decode("utf-8", errors="replace"))
        return "".join(text)


class HFTokenizer(_Base):
    """``tokenizer.json`` through the HF ``tokenizers`` library (S2 Pro)."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer as _Tok

        self._tok = _Tok.from_file(str(path))
        self._init_ids()

    def token_id(self, token: str) -> int:
        i = self._tok.token_to_id(token)
        if i is None:
            raise KeyError(token)
        return i

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=False)


class TiktokenTokenizer(_Base):
    """``tokenizer.tiktoken`` (S1): BPE ranks, then the Fish special tokens appended after them.

    A ``special_tokens.json`` beside the file, when present, gives the special ids explicitly.
    """

    def __init__(self, path: Path, num_semantic: int = 4096) -> None:
        import tiktoken

        ranks: dict[bytes, int] = {}
        for line in path.read_text().splitlines():
            if line.strip():
                tok, rank = line.split()
                ranks[base64.b64decode(tok)] = int(rank)
        side = path.parent / "special_tokens.json"
        if side.exists():
            specials = {str(k): int(v) for k, v in json.loads(side.read_text()).items()}
        else:
            names = _FISH_SPECIALS + [f"<|semantic:{i}|>" for i in range(num_semantic)]
            specials = {n: len(ranks) + i for i, n in enumerate(names)}
        self.specials = specials
        self._enc = tiktoken.Encoding(name=path.stem, pat_str=_FISH_PATTERN, mergeable_ranks=ranks,
                                      special_tokens=specials)
        self._init_ids()

    def token_id(self, token: str) -> int:
        return self.specials[token]

    def encode(self, text: str) -> list[int]:
        return self._enc.encode(text, allowed_special="all", disallowed_special=())

    def decode(self, ids: list[int]) -> str:
        return self._enc.decode(ids)


#: Qwen's pre-tokenizer split (the regex of Qwen's byte-level BPE, whose 151,643 ranks are S2 Pro's
#: text vocabulary, ids 0 .. 151,642).
QWEN_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def qwen_ranks_path() -> Path:
    """Qwen's BPE ranks (``qwen.tiktoken``) as Alibaba's ``dashscope`` package ships them (found without
    importing the package); a :class:`UserError` naming the install where it is absent."""
    import importlib.util

    spec = importlib.util.find_spec("dashscope")
    roots = [] if spec is None else list(spec.submodule_search_locations or [])
    for root in roots:
        path = Path(root) / "resources" / "qwen.tiktoken"
        if path.is_file():
            return path
    raise UserError("the qwen-bpe preset text needs Qwen's BPE ranks: pip install --no-deps dashscope "
                    "(it ships resources/qwen.tiktoken)")


class QwenTextTokenizer(TinyTokenizer):
    """A random-weight preset's tokenizer whose text goes through Qwen's BPE (S2 Pro's text vocabulary)
    instead of one token per byte: the specials keep the preset's layout (:func:`preset_tokenizer`),
    so prompts have the real format *and* the real model's length. Why: byte-level text made the
    served benchmark's 290-character prompt 355 tokens where S2 Pro's tokenizer gives about 90, so
    prefill weighed ~4x what it does in service. Decoding maps ids below the ranks' count to text,
    others through the specials (the few specials the preset places among the ranks, e.g.
    ``<|speaker:N|>`` at 20 + N, decode as text: random weights never emit them)."""

    def __init__(self, ranks_file: Path, **preset_ids: int) -> None:
        import tiktoken

        super().__init__(**preset_ids)
        ranks = {base64.b64decode(tok): int(rank) for tok, rank in
                 (line.split() for line in ranks_file.read_bytes().splitlines() if line.strip())}
        self._bpe = tiktoken.Encoding(name="qwen-bpe", pat_str=QWEN_PATTERN, mergeable_ranks=ranks,
                                      special_tokens={})
        self.n_ranks = len(ranks)

    def _encode_text(self, text: str) -> list[int]:
        """Text between specials: Qwen's BPE."""
        return self._bpe.encode_ordinary(text)

    def decode(self, ids: list[int]) -> str:
        text, run = [], []
        for i in [*ids, -1]:
            if 0 <= i < self.n_ranks:
                run.append(i)
                continue
            text.append(self._bpe.decode(run))
            run = []
            text.append(self._inv.get(i, ""))
        return "".join(text)


def preset_tokenizer(name: str, text: str = "bytes") -> TinyTokenizer:
    """The tokenizer of a random-weight model preset (``s2-pro``, ...): tiny's layout with the preset's
    ``<|im_start|>`` / ``<|im_end|>`` / ``<|voice|>`` / semantic ids, so a served preset (a benchmark
    at the real shape) builds prompts of the real format; the text itself is bytes, or (``text=
    "qwen-bpe"``, :class:`QwenTextTokenizer`) Qwen's BPE where the preset's vocabulary holds it."""
    from .model_config import preset

    c = preset(name)
    ids = dict(im_start=10 if c.im_start_id is None else c.im_start_id, im_end=c.im_end_id,
               voice=12 if c.voice_id is None else c.voice_id, semantic_begin=c.semantic_begin_id,
               num_semantic=c.num_semantic)
    if text == "bytes":
        return TinyTokenizer(**ids)
    if text != "qwen-bpe":
        raise UserError(f"preset text {text!r} is not one of {', '.join(PRESET_TEXTS)}")
    ranks = qwen_ranks_path()
    tok = QwenTextTokenizer(ranks, **ids)
    if tok.n_ranks > c.semantic_begin_id:  # the ranks must sit below the preset's own ids
        raise UserError(f"preset {name!r} has {c.semantic_begin_id} text ids, fewer than Qwen's BPE's "
                        f"{tok.n_ranks}: use the bytes preset text")
    return tok


def load_tokenizer(name_or_dir: str | Path, preset_text: str = "bytes") -> Tokenizer:
    """``"tiny"``, another random-weight model preset (:func:`preset_tokenizer`, its text as
    ``preset_text`` says) or a checkpoint directory holding ``tokenizer.json`` or ``tokenizer.tiktoken``."""
    from .model_config import PRESETS

    if str(name_or_dir) == "tiny":
        return TinyTokenizer()
    if str(name_or_dir) in PRESETS and not Path(name_or_dir).exists():
        return preset_tokenizer(str(name_or_dir), preset_text)
    d = Path(name_or_dir)
    if d.is_file():
        d = d.parent
    try:
        if (d / "tokenizer.json").exists():
            return HFTokenizer(d / "tokenizer.json")
        if (d / "tokenizer.tiktoken").exists():
            return TiktokenTokenizer(d / "tokenizer.tiktoken")
    except KeyError as exc:
        raise UserError(f"tokenizer in {d} lacks the special token {exc}") from None
    raise UserError(f"no tokenizer.json or tokenizer.tiktoken in {d}")
