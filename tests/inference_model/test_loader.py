"""Checkpoint loading: both layouts, sharded safetensors, strict key checks, presets, tokenizers."""

from __future__ import annotations

import base64
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from ttsfleet.inference.loader import CheckpointMismatch, load_model, load_tokenizer, resolve_quantization

from ttsfleet.catalog import GpuCatalog
from ttsfleet.errors import UserError


def _copy(src, dst):
    shutil.copytree(src, dst)
    for p in dst.iterdir():
        p.chmod(0o644)
    return dst


def test_sharded_s2_checkpoint_loads_like_single_file(golden_dir, golden, tmp_path) -> None:
    src = golden_dir / "s2-tiny"
    sd = load_file(str(src / "model.safetensors"))
    keys = sorted(sd)
    d = tmp_path / "sharded"
    d.mkdir()
    (d / "config.json").write_bytes((src / "config.json").read_bytes())
    shards = {"model-00001-of-00002.safetensors": keys[::2], "model-00002-of-00002.safetensors": keys[1::2]}
    for name, ks in shards.items():
        save_file({k: sd[k] for k in ks}, str(d / name))
    index = {"metadata": {}, "weight_map": {k: n for n, ks in shards.items() for k in ks}}
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    prompt = torch.tensor(golden("s2-tiny")["prompt"])[None]
    a = load_model(src).forward_slow(prompt)[0]
    b = load_model(d).forward_slow(prompt)[0]
    torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_mismatched_s2_checkpoint_lists_every_problem(golden_dir, tmp_path) -> None:
    d = _copy(golden_dir / "s2-tiny", tmp_path / "bad")
    sd = load_file(str(d / "model.safetensors"))
    sd.pop("text_model.model.layers.1.ffn_norm.weight")
    sd["text_model.model.layers.0.attention.wo.weight"] = torch.zeros(64, 60)
    sd["audio_decoder.bogus.weight"] = torch.zeros(3)
    save_file(sd, str(d / "model.safetensors"))
    with pytest.raises(CheckpointMismatch) as err:
        load_model(d)
    msg = str(err.value)
    assert "missing (1): layers.1.ffn_norm.weight" in msg
    assert "unexpected (1): audio_decoder.bogus.weight" in msg
    assert "layers.0.attention.wo.weight (checkpoint [64, 60], model [64, 64])" in msg


def test_s1_config_mismatch_is_reported(golden_dir, tmp_path) -> None:
    d = _copy(golden_dir / "s1-tiny", tmp_path / "s1")
    cfg = json.loads((d / "config.json").read_text())
    cfg["fast_dim"] = 64  # the checkpoint has a fast_project_in to 48
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointMismatch, match="unexpected.*fast_project_in.bias"):
        load_model(d, config_overrides={"im_end_id": 11})


def test_s1_without_token_ids_fails_readably(golden_dir) -> None:
    with pytest.raises(UserError, match="im_end_id=151645 is outside the vocab"):
        load_model(golden_dir / "s1-tiny")


def test_missing_dir_and_unknown_preset() -> None:
    with pytest.raises(UserError, match="unknown model preset"):
        load_model("no-such-preset")
    with pytest.raises(UserError, match="does not exist"):
        load_model("/nonexistent/ckpt")
    with pytest.raises(UserError, match="unknown quantize"):
        load_model("tiny", quantize="int4")


def test_tiny_preset_is_deterministic_and_seeded() -> None:
    a, b, c = load_model("tiny"), load_model("tiny"), load_model("tiny", seed=1)
    torch.testing.assert_close(a.embeddings.weight, b.embeddings.weight, atol=0, rtol=0)
    assert not torch.equal(a.embeddings.weight, c.embeddings.weight)
    cfg = a.config
    ids = (cfg.num_codebooks, cfg.codebook_size, cfg.semantic_begin_id, cfg.semantic_end_id, cfg.im_end_id)
    assert ids == (10, 64, 500, 563, 11)


def test_auto_quantization_is_bf16_on_cpu() -> None:
    cat = GpuCatalog.default()
    assert resolve_quantization("auto", torch.device("cpu"), cat) == "bf16"
    assert resolve_quantization("none", torch.device("cpu"), cat) == "bf16"  # alias, read only
    assert resolve_quantization("mxfp8", torch.device("cpu"), cat) == "mxfp8"


def test_hf_tokenizer_json(tmp_path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {chr(c): i for i, c in enumerate(range(32, 127))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="?"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    specials = ["<|im_start|>", "<|im_end|>", "<|voice|>", "<|speaker:0|>"]
    specials += [f"<|semantic:{i}|>" for i in range(4)]
    tok.add_special_tokens(specials)
    tok.save(str(tmp_path / "tokenizer.json"))
    t = load_tokenizer(tmp_path)
    n = len(vocab)
    assert (t.im_start_id, t.im_end_id, t.voice_id) == (n, n + 1, n + 2)
    assert (t.semantic_begin_id, t.semantic_end_id) == (n + 4, n + 7)
    assert t.encode("<|im_start|>hi<|im_end|>") == [n, vocab["h"], vocab["i"], n + 1]


def test_tiktoken_tokenizer(tmp_path) -> None:
    lines = [f"{base64.b64encode(bytes([b])).decode()} {b}" for b in range(256)]
    lines.append(f"{base64.b64encode(b'he').decode()} 256")
    (tmp_path / "tokenizer.tiktoken").write_text("\n".join(lines) + "\n")
    t = load_tokenizer(tmp_path)
    base = 257  # specials follow the BPE ranks in the Fish order
    assert (t.im_start_id, t.im_end_id, t.voice_id) == (base + 3, base + 4, base + 10)
    assert (t.semantic_begin_id, t.semantic_end_id) == (base + 12, base + 12 + 4095)
    assert t.encode("<|im_start|>hex") == [base + 3, 256, ord("x")]
    assert t.decode(t.encode("hello")) == "hello"


def test_tiny_tokenizer(tiny_tok) -> None:
    ids = tiny_tok.encode("<|im_start|>hé<|semantic:3|><|im_end|>")
    assert ids == [10, 100 + ord("h"), 100 + 0xC3, 100 + 0xA9, 503, 11]
    assert tiny_tok.decode(ids) == "<|im_start|>hé<|semantic:3|><|im_end|>"
    assert max(tiny_tok.encode("any text ☃ at all")) < 584
    with pytest.raises(UserError):
        load_tokenizer("/nonexistent")


@pytest.mark.parametrize("name", ["tiny", "tiny-fp8"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_small_preset_built_on_its_device_equals_the_meta_build(name: str, dtype: torch.dtype) -> None:
    """The tiny presets skip the meta device (whose Python references import ``torch._dynamo``, ~1 s
    of a server's start-up); drawn from the same seed they are the meta-built model, parameter for
    parameter and buffer for buffer (the RoPE tables stay bf16)."""
    from ttsfleet.inference import loader
    from ttsfleet.inference.model import DualARModel
    from ttsfleet.inference.model_config import preset

    config = preset(name)
    assert loader._rough_params(config) <= loader.DIRECT_BUILD_MAX_PARAMS
    assert loader._rough_params(preset("s1-mini")) > loader.DIRECT_BUILD_MAX_PARAMS
    direct = loader._build(config, torch.device("cpu"), dtype)
    with torch.device("meta"):
        meta = DualARModel(config)
    meta = meta.to_empty(device="cpu").to(dtype)
    loader._reset_buffers(meta)
    tensors = []
    for m in (direct, meta):
        loader._init_random_(m, 0, loader.PRESET_RESIDUAL_SCALE.get(name, 1.0))
        tensors.append({**dict(m.named_parameters()), **dict(m.named_buffers())})
    assert tensors[0].keys() == tensors[1].keys() and tensors[0]["rope"].dtype == torch.bfloat16
    for k, v in tensors[0].items():
        assert v.dtype == tensors[1][k].dtype and torch.equal(v, tensors[1][k]), k
