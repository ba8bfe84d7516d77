"""Load DualAR models, codecs and tokenizers from presets or released checkpoint directories.

Why strict: a checkpoint whose keys or shapes do not match the config would otherwise load
partially (the reference uses ``strict=False``) and produce noise. Here any mismatch fails with one
message listing every missing, unexpected and mis-shaped key. Both published layouts are read:
S2 Pro sharded safetensors (``model.safetensors.index.json`` > ``model.safetensors``) with
``text_model.model.*`` / ``audio_decoder.*`` keys, and S1's flat ``model.pth``.
FP8 (``quantize``) happens once here, after the weights are in place.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from ttsfleet.kernels import dispatch

from ttsfleet.catalog import DeviceDispatch, GpuCatalog
from ttsfleet.errors import UserError
from ttsfleet.quantization import QuantScheme, is_fp8, parse_quantization

from .codec import load_codec
from .model import DualARModel
from .model_config import LAYOUT_S2, DualARConfig, config_from_file, preset
from .tokenizer import load_tokenizer

__all__ = ["load_model", "load_codec", "load_tokenizer", "load_state_dict_file", "map_checkpoint_keys",
           "CheckpointMismatch", "resolve_quantization", "quantization_for_capability", "device_dispatch"]


class CheckpointMismatch(UserError):
    """The checkpoint's tensors do not match the model its config.json describes."""


def device_dispatch(capability: tuple[int, int] | None, catalog: GpuCatalog) -> DeviceDispatch:
    """What a device of ``capability`` (``None``: CPU) runs, as the run's catalog says: the
    scheme ``auto`` means and the kernel backend. No table here: a GPU class is a catalog entry."""
    return catalog.dispatch_for_device(capability)


def quantization_for_capability(quantize: str, capability: tuple[int, int] | None,
                                catalog: GpuCatalog) -> QuantScheme:
    """The scheme to run: ``quantize`` itself, or for ``auto`` the device's (:func:`device_dispatch`)."""
    requested = parse_quantization(quantize, what="quantize")
    if requested != "auto":
        return requested
    return device_dispatch(capability, catalog).quantization


def resolve_quantization(quantize: str, device: torch.device, catalog: GpuCatalog) -> QuantScheme:
    """``quantize`` for ``device``: ``auto`` follows the catalog's class for the device's compute
    capability (bsgemm_fp8 on sm_90a, mxfp8 on sm_120a, ...), bf16 on CPU or unknown devices."""
    capability = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
    return quantization_for_capability(quantize, capability, catalog)


# ----------------------------------------------------------------------------- checkpoint files
def _load_safetensors(files: list[Path]) -> dict[str, Tensor]:
    from safetensors.torch import load_file

    out: dict[str, Tensor] = {}
    for f in files:
        out.update(load_file(str(f), device="cpu"))
    return out


def load_state_dict_file(ckpt_dir: Path) -> dict[str, Tensor]:
    """Read the weights of ``ckpt_dir`` with the reference precedence: index.json > safetensors > pth."""
    index = ckpt_dir / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = sorted({ckpt_dir / name for name in weight_map.values()})
        missing = [str(f.name) for f in files if not f.exists()]
        if missing:
            raise UserError(f"{index} lists shards that do not exist: {', '.join(missing)}")
        return _load_safetensors(files)
    single = ckpt_dir / "model.safetensors"
    if single.exists():
        return _load_safetensors([single])
    pth = ckpt_dir / "model.pth"
    if pth.exists():
        sd: Any = torch.load(pth, map_location="cpu", weights_only=True, mmap=True)
        if isinstance(sd, dict) and "state_dict" in sd:
            sd = sd["state_dict"]
        if sd and all(k.startswith("model.") for k in sd):
            sd = {k[len("model."):]: v for k, v in sd.items()}
        return dict(sd)
    raise UserError(f"no weights in {ckpt_dir} (expected model.safetensors.index.json, "
                    "model.safetensors or model.pth)")


_S2_RENAMES = (
    ("text_model.model.", ""),
    ("audio_decoder.codebook_embeddings.", "codebook_embeddings."),
    ("audio_decoder.embeddings.", "fast_embeddings."),
    ("audio_decoder.layers.", "fast_layers."),
    ("audio_decoder.norm.", "fast_norm."),
    ("audio_decoder.output.", "fast_output."),
    ("audio_decoder.fast_project_in.", "fast_project_in."),
    ("audio_decoder.project_in.", "fast_project_in."),
)


def map_checkpoint_keys(sd: dict[str, Tensor], config: DualARConfig) -> dict[str, Tensor]:
    """Rename a checkpoint's keys to the model's (S1 flat) parameter names."""
    if config.layout != LAYOUT_S2:
        return {k: v for k, v in sd.items() if not k.startswith("audio_projector.")}
    out = {}
    for k, v in sd.items():
        for old, new in _S2_RENAMES:
            if k.startswith(old):
                k = new + k[len(old):]
                break
        out[k] = v
    return out


def _check_keys(model: DualARModel, sd: dict[str, Tensor], source: str) -> None:
    expected = {k: tuple(p.shape) for k, p in model.named_parameters()}
    missing = sorted(set(expected) - set(sd))
    unexpected = sorted(set(sd) - set(expected))
    misshaped = sorted(f"{k} (checkpoint {list(sd[k].shape)}, model {list(expected[k])})"
                       for k in set(expected) & set(sd) if tuple(sd[k].shape) != expected[k])
    if missing or unexpected or misshaped:
        parts = [f"checkpoint {source} does not match its config.json:"]
        for label, keys in (("missing", missing), ("unexpected", unexpected), ("mis-shaped", misshaped)):
            if keys:
                more = " ..." if len(keys) > 40 else ""
                parts.append(f"  {label} ({len(keys)}): " + ", ".join(keys[:40]) + more)
        raise CheckpointMismatch("\n".join(parts))


# ----------------------------------------------------------------------------- random presets
# Random weights give undecided logits: among 64 random logits the top-2 gap of some decision out of
# fifty is as small as bf16 rounding of the residual stream, so even two bf16 CPU builds can disagree.
# A trained model decides with wide margins; ``tiny-fp8`` imitates one (see _make_confident_) and halves
# the residual-branch outputs (wo, w2). Measured on its gate prompt: smallest top-2 gap ~9 logits, FP8
# vs bf16 logit difference <= 1.5, f32 vs bf16 <= 0.3 (a random tiny: gaps down to ~0.06).
# ``s2-pro-gate`` is the same imitation at S2 Pro's shape, for the FP8 = bf16 gate on the GPU.
PRESET_RESIDUAL_SCALE = {"tiny-fp8": 0.5, "s2-pro-gate": 0.5}
CONFIDENT_PRESETS = {"tiny-fp8", "s2-pro-gate"}


def _make_confident_(model: DualARModel, seed: int) -> None:
    """Give a random S2-layout model wide greedy margins, like a trained one.

    The fast embedding of code j is the slow embedding of semantic token j, the fast head is a fixed
    permutation of those rows (code k+1 follows from code k by a wide margin), and ``<|voice|>`` embeds
    like semantic token 7, so the first frame after any prompt is decided by a wide margin too. The
    tied slow head already prefers the semantic token whose embedding dominates the input.
    """
    c = model.config
    if c.fast_dim != c.dim or c.voice_id is None:
        raise ValueError("confident init needs fast_dim == dim and a voice token id")
    gen = torch.Generator(device=model.device).manual_seed(seed + 1)
    with torch.no_grad():
        sem = model.embeddings.weight[c.semantic_begin_id:c.semantic_begin_id + c.codebook_size]
        model.fast_embeddings.weight.copy_(sem)
        perm = torch.randperm(c.codebook_size, generator=gen, device=model.device)
        model.fast_output.weight.copy_(sem[perm] / c.fast_dim ** 0.5)
        model.embeddings.weight[c.voice_id] = model.embeddings.weight[c.semantic_begin_id + 7]


def _init_random_(model: DualARModel, seed: int, residual_scale: float = 1.0) -> None:
    """Deterministic weights: N(0, 1) embeddings, N(0, 1/fan_in) projections, unit norms."""
    dev = model.device
    gen = torch.Generator(device=dev).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name.endswith(".bias"):
                p.zero_()
            elif p.dim() == 2 and "embeddings" in name:
                p.normal_(0.0, 1.0, generator=gen)
            elif p.dim() == 2:
                std = (3.0 if name.startswith("fast_output") else 1.0) / p.shape[1] ** 0.5
                if name.endswith(("wo.weight", "w2.weight")):
                    std *= residual_scale
                p.normal_(0.0, std, generator=gen)
            else:
                p.normal_(0.0, 0.02, generator=gen)


#: Presets up to about this many parameters are built on their device directly (a default init of
#: this many is well under a second on a CPU); larger ones on the meta device, allocated once.
DIRECT_BUILD_MAX_PARAMS = 50_000_000


def _rough_params(c: DualARConfig) -> int:
    """About how many parameters ``c`` has (embeddings and each layer's attention and MLP)."""
    slow = c.n_layer * (c.dim * (c.n_head + 2 * c.n_local_heads) * c.head_dim * 2
                        + 3 * c.dim * c.intermediate_size)
    fast = c.n_fast_layer * (c.fast_dim * (c.fast_n_head + 2 * c.fast_n_local_heads) * c.fast_head_dim * 2
                             + 3 * c.fast_dim * c.fast_intermediate_size)
    return slow + fast + c.vocab_size * c.dim + c.codebook_size * (c.num_codebooks * c.dim + c.fast_dim)


def _build(config: DualARConfig, device: torch.device, dtype: torch.dtype) -> DualARModel:
    """The model with parameters to be drawn (every one is: :func:`_init_random_`) and its buffers.

    A small preset (the tiny models) is built on its device: on the meta device every tensor op of
    the constructor runs through torch's Python references, whose first call imports
    ``torch._dynamo``: about 1 s of every start-up of a server that never compiles anything."""
    if _rough_params(config) <= DIRECT_BUILD_MAX_PARAMS:
        with torch.device(device):
            model = DualARModel(config).to(dtype)
    else:
        with torch.device("meta"):
            model = DualARModel(config)
        model = model.to_empty(device=device).to(dtype)
    _reset_buffers(model)  # the RoPE tables in bf16 whatever ``dtype`` is
    return model


def _reset_buffers(model: DualARModel) -> None:
    from .model_layers import rope_table

    c, dev = model.config, model.device
    model.rope = rope_table(c.max_seq_len, c.head_dim, c.rope_base).to(dev)
    model.fast_rope = rope_table(c.num_codebooks, c.fast_head_dim, c.fast_rope_base).to(dev)


def _tokenizer_ids(config: DualARConfig, ckpt_dir: Path) -> DualARConfig:
    """S1 configs carry no token ids: take them from the checkpoint's tokenizer when it has one."""
    if config.layout == LAYOUT_S2:
        return config
    try:
        tok = load_tokenizer(ckpt_dir)
    except UserError:
        return config
    return config.replace(semantic_begin_id=tok.semantic_begin_id, semantic_end_id=tok.semantic_end_id,
                          im_end_id=tok.im_end_id)


def _finish_config(config: DualARConfig, max_seq_len: int | None,
                   overrides: dict[str, Any] | None) -> DualARConfig:
    if max_seq_len:
        config = config.replace(max_seq_len=max_seq_len)
    if overrides:
        unknown = sorted(set(overrides) - set(config.to_dict()))
        if unknown:
            raise UserError(f"unknown config field(s) {unknown}")
        config = config.replace(**overrides)
    for field in ("semantic_begin_id", "semantic_end_id", "im_end_id"):
        if not 0 <= getattr(config, field) < config.vocab_size:
            raise UserError(f"{field}={getattr(config, field)} is outside the vocab ({config.vocab_size}); "
                            "put the tokenizer beside the checkpoint or pass config_overrides")
    if config.semantic_end_id < config.semantic_begin_id:
        raise UserError("semantic_end_id < semantic_begin_id")
    return config


def load_model(name_or_path: str | Path, device: str | torch.device = "cpu",
               dtype: torch.dtype = torch.float32, quantize: str = "bf16", seed: int = 0,
               max_seq_len: int | None = None,
               config_overrides: dict[str, Any] | None = None,
               catalog: GpuCatalog | None = None) -> DualARModel:
    """A ready model: preset (``tiny`` / ``tiny-fp8`` / ``s2-pro`` / ``s1-mini``, random weights) or a
    checkpoint dir.

    ``max_seq_len`` optionally lowers the RoPE table / cache limit (e.g. 4096 instead of 32768).
    ``config_overrides`` replaces config fields (e.g. ``{"im_end_id": 11}`` for an S1 directory
    without a tokenizer, whose config.json carries no token ids). ``quantize``: a scheme of
    :mod:`ttsfleet.quantization` or ``auto`` (resolved through ``catalog``, the run's GPU catalog).
    A ``catalog`` given here also becomes the kernel dispatch's (:func:`ttsfleet.kernels.dispatch.
    use_catalog`), so the scheme and the backend come from the same file. ``None``: the kernel
    dispatch's run catalog (the built-in one unless the entry point set another).
    """
    device = torch.device(device)
    if catalog is None:
        catalog = dispatch.run_catalog()
    else:
        dispatch.use_catalog(catalog)
    scheme = resolve_quantization(quantize, device, catalog)
    name = str(name_or_path)
    path = Path(name)
    if not path.exists() and "/" not in name:
        config = _finish_config(preset(name), max_seq_len, config_overrides)
        model = _build(config, device, dtype)
        _init_random_(model, seed, PRESET_RESIDUAL_SCALE.get(name, 1.0))
        if name in CONFIDENT_PRESETS:
            _make_confident_(model, seed)
    else:
        if not path.is_dir():
            raise UserError(f"checkpoint directory {path} does not exist")
        config = _finish_config(_tokenizer_ids(config_from_file(path), path), max_seq_len, config_overrides)
        sd = map_checkpoint_keys(load_state_dict_file(path), config)
        with torch.device("meta"):
            model = DualARModel(config)
        _check_keys(model, sd, str(path))
        sd = {k: v.to(device=device, dtype=dtype) for k, v in sd.items()}
        model.load_state_dict(sd, strict=True, assign=True)
        _reset_buffers(model)
    model.finalize()
    if is_fp8(scheme):  # bf16: the weights stay as loaded
        model.quantize_(scheme)
    return model.eval().requires_grad_(False)
