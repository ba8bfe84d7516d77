"""DualAR model configuration: one flat dataclass for both released checkpoint layouts.

S2 Pro (``fish_qwen3_omni``) nests the slow model in ``text_config`` and the fast model in
``audio_decoder_config``; S1 (``dual_ar``) is flat with ``fast_*`` fields. Both are flattened into
:class:`DualARConfig` so the model code never branches on the file format, only on the two
numerics that differ (codebook-sum scaling and the pre/post-norm slow→fast hand-off).
Presets: ``tiny`` (same layout as S2, the golden fixture's sizes, for CPU tests), ``tiny-fp8`` (tiny
widened to 256 for the FP8 gate), ``s2-pro`` and ``s1-mini`` (real shapes for GPU benchmarks with
random weights).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ttsfleet.errors import UserError

LAYOUT_S2 = "fish_qwen3_omni"
LAYOUT_S1 = "dual_ar"


@dataclass(frozen=True)
class DualARConfig:
    """Sizes and token ids of a DualAR model (slow transformer + fast codebook transformer)."""

    layout: str  # LAYOUT_S2 or LAYOUT_S1: which checkpoint key layout / numerics
    vocab_size: int
    n_layer: int
    n_head: int
    n_local_heads: int
    head_dim: int
    dim: int
    intermediate_size: int
    rope_base: float
    norm_eps: float
    max_seq_len: int
    tie_word_embeddings: bool
    attention_qk_norm: bool
    codebook_size: int
    num_codebooks: int
    n_fast_layer: int
    fast_dim: int
    fast_n_head: int
    fast_n_local_heads: int
    fast_head_dim: int
    fast_intermediate_size: int
    fast_attention_qk_norm: bool
    fast_rope_base: float
    fast_norm_eps: float
    semantic_begin_id: int
    semantic_end_id: int
    im_end_id: int
    im_start_id: int | None = None
    voice_id: int | None = None
    scale_codebook_embeddings: bool = False  # S2: slow input at audio positions / sqrt(ncb + 1)
    fast_input_post_norm: bool = False  # S2: fast model gets the slow hidden state after the norm

    @property
    def num_semantic(self) -> int:
        return self.semantic_end_id - self.semantic_begin_id + 1

    @property
    def has_fast_project_in(self) -> bool:
        return self.fast_dim != self.dim

    def replace(self, **changes: Any) -> DualARConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _get(d: dict[str, Any], key: str, default: Any = None, *, where: str) -> Any:
    if key in d:
        return d[key]
    if default is None:
        raise UserError(f"config.json ({where}) lacks required field {key!r}")
    return default


def config_from_s2(data: dict[str, Any]) -> DualARConfig:
    """Flatten an S2 Pro ``fish_qwen3_omni`` config.json (``text_config`` + ``audio_decoder_config``)."""
    t = data.get("text_config")
    a = data.get("audio_decoder_config")
    if not isinstance(t, dict) or not isinstance(a, dict):
        raise UserError("S2 config.json needs 'text_config' and 'audio_decoder_config' objects")
    n_head = _get(t, "n_head", where="text_config")
    head_dim = t.get("head_dim") or _get(t, "dim", where="text_config") // n_head
    dim = _get(t, "dim", where="text_config")
    fast_dim = a.get("dim", dim)
    fast_n_head = a.get("n_head", n_head)
    return DualARConfig(
        layout=LAYOUT_S2,
        vocab_size=_get(t, "vocab_size", where="text_config"),
        n_layer=_get(t, "n_layer", where="text_config"),
        n_head=n_head,
        n_local_heads=t.get("n_local_heads", -1) if t.get("n_local_heads", -1) > 0 else n_head,
        head_dim=head_dim,
        dim=dim,
        intermediate_size=_get(t, "intermediate_size", where="text_config"),
        rope_base=float(t.get("rope_base", 1e6)),
        norm_eps=float(t.get("norm_eps", 1e-6)),
        max_seq_len=int(t.get("max_seq_len", 32768)),
        tie_word_embeddings=bool(t.get("tie_word_embeddings", True)),
        attention_qk_norm=bool(t.get("attention_qk_norm", True)),
        codebook_size=_get(a, "vocab_size", where="audio_decoder_config"),
        num_codebooks=_get(a, "num_codebooks", where="audio_decoder_config"),
        n_fast_layer=_get(a, "n_layer", where="audio_decoder_config"),
        fast_dim=fast_dim,
        fast_n_head=fast_n_head,
        fast_n_local_heads=a.get("n_local_heads", -1) if a.get("n_local_heads", -1) > 0 else fast_n_head,
        fast_head_dim=a.get("head_dim") or fast_dim // fast_n_head,
        fast_intermediate_size=a.get("intermediate_size", t.get("intermediate_size")),
        fast_attention_qk_norm=bool(a.get("attention_qk_norm", False)),
        fast_rope_base=float(a.get("rope_base", t.get("rope_base", 1e6))),
        fast_norm_eps=float(a.get("norm_eps", t.get("norm_eps", 1e-6))),
        semantic_begin_id=_get(data, "semantic_start_token_id", where="top level"),
        semantic_end_id=_get(data, "semantic_end_token_id", where="top level"),
        im_end_id=_get(data, "eos_token_id", where="top level"),
        im_start_id=data.get("im_start_token_id"),
        voice_id=data.get("voice_token_id"),
        scale_codebook_embeddings=True,
        fast_input_post_norm=True,
    )


# S1 checkpoints do not carry token ids in config.json: they come from the tokenizer. These are the
# released Qwen3-vocabulary ids (the tokenizer, when present, overrides them in the loader).
_S1_DEFAULT_IDS = {"semantic_begin_id": 151678, "semantic_end_id": 155773, "im_end_id": 151645}


def config_from_s1(data: dict[str, Any]) -> DualARConfig:
    """Read an S1 ``dual_ar`` flat config.json (``fast_*`` fields default to the slow ones)."""
    n_head = _get(data, "n_head", where="dual_ar")
    dim = _get(data, "dim", where="dual_ar")
    head_dim = data.get("head_dim") or dim // n_head
    n_local = data.get("n_local_heads", -1)
    n_local = n_local if n_local and n_local > 0 else n_head
    inter = _get(data, "intermediate_size", where="dual_ar")
    qk = bool(data.get("attention_qk_norm", False))
    fqk = data.get("fast_attention_qk_norm")
    return DualARConfig(
        layout=LAYOUT_S1,
        vocab_size=_get(data, "vocab_size", where="dual_ar"),
        n_layer=_get(data, "n_layer", where="dual_ar"),
        n_head=n_head,
        n_local_heads=n_local,
        head_dim=head_dim,
        dim=dim,
        intermediate_size=inter,
        rope_base=float(data.get("rope_base", 10000)),
        norm_eps=float(data.get("norm_eps", 1e-5)),
        max_seq_len=int(data.get("max_seq_len", 2048)),
        tie_word_embeddings=bool(data.get("tie_word_embeddings", True)),
        attention_qk_norm=qk,
        codebook_size=_get(data, "codebook_size", where="dual_ar"),
        num_codebooks=_get(data, "num_codebooks", where="dual_ar"),
        n_fast_layer=_get(data, "n_fast_layer", where="dual_ar"),
        fast_dim=data.get("fast_dim") or dim,
        fast_n_head=data.get("fast_n_head") or n_head,
        fast_n_local_heads=data.get("fast_n_local_heads") or n_local,
        fast_head_dim=data.get("fast_head_dim") or head_dim,
        fast_intermediate_size=data.get("fast_intermediate_size") or inter,
        fast_attention_qk_norm=qk if fqk is None else bool(fqk),
        fast_rope_base=float(data.get("rope_base", 10000)),
        fast_norm_eps=float(data.get("norm_eps", 1e-5)),
        semantic_begin_id=int(data.get("semantic_begin_id", _S1_DEFAULT_IDS["semantic_begin_id"])),
        semantic_end_id=int(data.get("semantic_end_id", _S1_DEFAULT_IDS["semantic_end_id"])),
        im_end_id=int(data.get("im_end_id", _S1_DEFAULT_IDS["im_end_id"])),
        scale_codebook_embeddings=False,
        fast_input_post_norm=False,
    )


def config_from_dict(data: dict[str, Any]) -> DualARConfig:
    kind = data.get("model_type")
    if kind == LAYOUT_S2:
        return config_from_s2(data)
    if kind == LAYOUT_S1:
        return config_from_s1(data)
    raise UserError(f"unsupported model_type {kind!r} in config.json "
                    f"(expected {LAYOUT_S2!r} or {LAYOUT_S1!r})")


def config_from_file(path: str | Path) -> DualARConfig:
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"no config.json at {path}") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"{path} is not valid JSON: {exc}") from None
    return config_from_dict(data)


def _s2_pro() -> DualARConfig:
    return config_from_s2({
        "semantic_start_token_id": 151678, "semantic_end_token_id": 155773, "eos_token_id": 151645,
        "im_start_token_id": 151644, "voice_token_id": 151673,
        "text_config": {
            "vocab_size": 155776, "n_layer": 36, "n_head": 32, "n_local_heads": 8, "head_dim": 128,
            "dim": 2560, "intermediate_size": 9728, "rope_base": 1_000_000, "norm_eps": 1e-6,
            "max_seq_len": 32768, "tie_word_embeddings": True, "attention_qk_norm": True,
        },
        "audio_decoder_config": {
            "vocab_size": 4096, "num_codebooks": 10, "n_layer": 4, "dim": 2560, "n_head": 32,
            "n_local_heads": 8, "head_dim": 128, "intermediate_size": 9728, "attention_qk_norm": False,
        },
    })


def _s1_mini() -> DualARConfig:
    # Qwen3-0.6B-shaped backbone (28 × 1024). A real checkpoint always reads its own config.json.
    return config_from_s1({
        "model_type": "dual_ar", "vocab_size": 155776, "n_layer": 28, "n_head": 16, "n_local_heads": 8,
        "head_dim": 128, "dim": 1024, "intermediate_size": 3072, "rope_base": 1_000_000,
        "norm_eps": 1e-6, "max_seq_len": 8192, "tie_word_embeddings": True, "attention_qk_norm": True,
        "codebook_size": 4096, "num_codebooks": 10, "n_fast_layer": 4,
    })


def _tiny() -> DualARConfig:
    # Exactly the golden fixture's S2-layout sizes, so random "tiny" weights and the fixture share
    # one shape; the tiny tokenizer (tokenizer.py) uses these ids.
    return config_from_s2({
        "semantic_start_token_id": 500, "semantic_end_token_id": 563, "eos_token_id": 11,
        "im_start_token_id": 10, "voice_token_id": 12,
        "text_config": {
            "vocab_size": 584, "n_layer": 2, "n_head": 4, "n_local_heads": 2, "head_dim": 16, "dim": 64,
            "intermediate_size": 160, "rope_base": 1_000_000, "norm_eps": 1e-6, "max_seq_len": 512,
            "tie_word_embeddings": True, "attention_qk_norm": True,
        },
        "audio_decoder_config": {
            "vocab_size": 64, "num_codebooks": 10, "n_layer": 2, "dim": 64, "n_head": 4,
            "n_local_heads": 2, "head_dim": 16, "intermediate_size": 128, "attention_qk_norm": False,
        },
    })


def _tiny_fp8() -> DualARConfig:
    # The FP8 gate's model: tiny's layout widened to 128-multiples so every weight spans whole
    # 128x128 FP8 blocks (tiny's K=64 would only exercise one partial block).
    return _tiny().replace(dim=256, n_head=4, n_local_heads=2, head_dim=64, intermediate_size=512,
                           fast_dim=256, fast_n_head=4, fast_n_local_heads=2, fast_head_dim=64,
                           fast_intermediate_size=512)


PRESETS = {"tiny": _tiny, "tiny-fp8": _tiny_fp8, "s2-pro": _s2_pro, "s2-pro-gate": _s2_pro,
           "s1-mini": _s1_mini}


def preset(name: str) -> DualARConfig:
    try:
        return PRESETS[name]()
    except KeyError:
        raise UserError(f"unknown model preset {name!r} (known: {', '.join(PRESETS)})") from None
