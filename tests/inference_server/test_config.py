"""Serving configuration: defaults < TTSFLEET_* environment (what the operator sets) < CLI flags."""

from __future__ import annotations

import pytest
from ttsfleet.inference.server import ENV, ServeConfig

from ttsfleet.catalog import GpuCatalog, cuda_graph_max_bs
from ttsfleet.errors import UserError


def test_operator_environment_is_read():
    env = {ENV["port"]: "8000", ENV["gpu_class"]: "h200", ENV["max_running_requests"]: "48",
           ENV["quantization"]: "auto", ENV["checkpoint"]: "tiny", ENV["model_name"]: "voice-a",
           ENV["drain_timeout_s"]: "25", ENV["api_keys"]: "k1, k2,,", ENV["cuda_graph_max_bs"]: "48"}
    cfg = ServeConfig.from_env(env)
    assert cfg.port == 8000 and cfg.max_running_requests == 48 and cfg.model_name == "voice-a"
    assert cfg.quantization == GpuCatalog.default().get("h200").quantization == "bsgemm_fp8"
    assert cfg.cuda_graph_max_bs == cuda_graph_max_bs(48) == 48
    assert cfg.max_queue == 4 * 48 and cfg.drain_timeout_s == 25.0 and cfg.api_keys == ("k1", "k2")


def test_flags_override_env_and_catalog_defaults():
    env = {ENV["gpu_class"]: "rtx5090", ENV["max_running_requests"]: "8"}
    cfg = ServeConfig.from_env(env, max_running_requests=100, quantization="none")
    assert cfg.max_running_requests == 100 and cfg.cuda_graph_max_bs == 100 and cfg.quantization == "bf16"
    cat = ServeConfig.from_env({ENV["gpu_class"]: "rtx5090"})
    rtx = GpuCatalog.default().get("rtx5090")
    assert cat.max_running_requests == rtx.serving.max_running_requests
    assert cat.quantization == "mxfp8" and cat.cuda_graph_max_bs == rtx.serving.cuda_graph_max_bs
    assert ServeConfig.from_env({}).port == 8000 and ServeConfig.from_env({}).checkpoint == "tiny"


def test_prefill_chunk_tokens_from_env_and_flag():
    assert ENV["prefill_chunk_tokens"] == "TTSFLEET_PREFILL_CHUNK_TOKENS"
    assert ServeConfig.from_env({}).prefill_chunk_tokens == 256
    env = {ENV["prefill_chunk_tokens"]: "64"}
    assert ServeConfig.from_env(env).prefill_chunk_tokens == 64
    assert ServeConfig.from_env(env, prefill_chunk_tokens=0).prefill_chunk_tokens == 0  # 0 = no chunking


def test_codec_compile_is_off_unless_asked():
    """Off by default (not yet measured on a GPU); a torch.compile mode from the env or a flag."""
    assert ENV["codec_compile"] == "TTSFLEET_CODEC_COMPILE"
    assert ServeConfig.from_env({}).codec_compile == "off"
    env = {ENV["codec_compile"]: " Default "}
    assert ServeConfig.from_env(env).codec_compile == "default"
    flag = ServeConfig.from_env(env, codec_compile="max-autotune-no-cudagraphs")
    assert flag.codec_compile == "max-autotune-no-cudagraphs"
    assert ServeConfig.from_env(env, codec_compile="off").codec_compile == "off"
    with pytest.raises(UserError, match="TTSFLEET_CODEC_COMPILE"):
        ServeConfig.from_env({}, codec_compile="max-autotune")  # captures CUDA graphs of its own


def test_the_gather_window_comes_from_the_class_unless_asked(tmp_path):
    """0 on the CPU and without a class; the class's catalog value on its GPU (0 for every built-in
    class until a served run measures a window); the env or the flag overrides it; a bad value is one
    line naming the variable."""
    from ttsfleet.catalog import GpuCatalog, ServingDefaults

    assert ServeConfig.from_env({}).codec_gather_ms == 0.0
    catalog = GpuCatalog.default()
    assert {catalog.get(n).serving.codec_gather_ms for n in catalog.names()} == {0.0}
    assert ServeConfig.from_env({}, gpu_class="h200", device="cuda").codec_gather_ms == 0.0
    site = tmp_path / "site.yaml"
    site.write_text("classes:\n  h200:\n    serving:\n      codec_gather_ms: 80\n")
    on_gpu = {"gpu_class": "h200", "device": "cuda", "catalog": str(site)}
    assert ServeConfig.from_env({}, **on_gpu).codec_gather_ms == 80.0
    assert ServeConfig.from_env({}, **{**on_gpu, "device": "cpu"}).codec_gather_ms == 0.0
    env = {"TTSFLEET_CODEC_GATHER_MS": "25"}
    assert ServeConfig.from_env(env, **on_gpu).codec_gather_ms == 25.0
    assert ServeConfig.from_env(env, codec_gather_ms=5.0).codec_gather_ms == 5.0
    with pytest.raises(UserError, match="TTSFLEET_CODEC_GATHER_MS"):
        ServeConfig.from_env({"TTSFLEET_CODEC_GATHER_MS": "soon"})
    with pytest.raises(ValueError, match="codec_gather_ms"):
        ServingDefaults(codec_gather_ms=-1.0)


def test_codec_layout_comes_from_the_class_unless_asked_and_reaches_the_decoder_plan():
    """The GPU class's layout on its GPU (the H200's measured channels-last), NCL on the CPU and
    without a class; the env or the flag overrides it, and the engine's decoder plan (what the codec
    thread and the codec process both build from) carries it."""
    from ttsfleet.inference.codec import load_codec
    from ttsfleet.inference.engine import Engine, EngineConfig
    from ttsfleet.inference.loader import load_model

    from ttsfleet.catalog import GpuCatalog

    assert ENV["codec_layout"] == "TTSFLEET_CODEC_LAYOUT"
    assert ServeConfig.from_env({}).codec_layout == "ncl"
    h200 = GpuCatalog.default().get("h200").serving.codec_layout
    assert h200 == "channels-last"
    assert ServeConfig.from_env({}, gpu_class="h200", device="cuda").codec_layout == h200
    assert ServeConfig.from_env({}, gpu_class="h200", device="cpu").codec_layout == "ncl"
    assert ServeConfig.from_env({}, gpu_class="rtx5090", device="cuda").codec_layout == "ncl"
    assert ServeConfig.from_env({}, gpu_class="h200", device="cuda", codec_layout="ncl").codec_layout == "ncl"
    env = {ENV["codec_layout"]: " Channels-Last "}
    assert ServeConfig.from_env(env).codec_layout == "channels-last"
    assert ServeConfig.from_env(env, codec_layout="ncl").codec_layout == "ncl"
    with pytest.raises(UserError, match="TTSFLEET_CODEC_LAYOUT"):
        ServeConfig.from_env({}, codec_layout="nhwc")
    model, codec = load_model("tiny", device="cpu"), load_codec("tiny", device="cpu")
    for on in (False, True):
        engine = Engine(model, codec, EngineConfig(max_running_requests=2, codec_channels_last=on))
        assert engine._decoder_plan().channels_last is on


def test_gc_freeze_is_on_unless_asked_and_a_yes_no_switch_takes_no_typo():
    """On by default; the env's yes/no words or the flag turn it off; a word that is neither (which used
    to read as off for every yes/no switch) is one line naming the variable."""
    assert ENV["gc_freeze"] == "TTSFLEET_GC_FREEZE"
    assert ServeConfig.from_env({}).gc_freeze is True
    for off in ("0", " Off ", "false", "NO"):
        assert ServeConfig.from_env({ENV["gc_freeze"]: off}).gc_freeze is False
    for on in ("1", "on", "True", "yes"):
        assert ServeConfig.from_env({ENV["gc_freeze"]: on}).gc_freeze is True
    assert ServeConfig.from_env({ENV["gc_freeze"]: "0"}, gc_freeze=True).gc_freeze is True
    assert ServeConfig.from_env({}, gc_freeze=False).gc_freeze is False
    words = (r"^TTSFLEET_GC_FREEZE: 'maybe' is not one of 1, true, yes, on \(on\) "
             r"or 0, false, no, off \(off\)$")
    with pytest.raises(UserError, match=words):
        ServeConfig.from_env({ENV["gc_freeze"]: "maybe"})
    with pytest.raises(UserError, match="^TTSFLEET_PREFIX_REUSE: 'nah'"):
        ServeConfig.from_env({ENV["prefix_reuse"]: "nah"})
    with pytest.raises(UserError, match="^TTSFLEET_CODEC_PROCESS: '2'"):  # a switch the catalog fills
        ServeConfig.from_env({ENV["codec_process"]: "2"})


@pytest.mark.parametrize("env", [
    {ENV["codec_layout"]: "nhwc"},
    {ENV["max_running_requests"]: "-3"},
    {ENV["max_running_requests"]: "4", ENV["cuda_graph_max_bs"]: "8"},
    {ENV["port"]: "http"},
    {ENV["gpu_class"]: "a100-imaginary"},
    {ENV["quantization"]: "fp4"},
    {ENV["device"]: "tpu"},
    {ENV["drain_grace_s"]: "soon"},
    {ENV["prefill_chunk_tokens"]: "-1"},
    {ENV["codec_compile"]: "reduce-overhead"},
    {ENV["gc_freeze"]: "maybe"},
    {ENV["cuda_graphs"]: "nope"},
    {"TTSFLEET_PROMPT_GQA": "fast"},  # process switches read deep in the model: checked at start
    {"TTSFLEET_TOPK_SELECT": "heap"},
    {"TTSFLEET_ATTN_SPLITS": "64"},
    {"TTSFLEET_ATTN_TILE": "16x16"},
])
def test_bad_configuration_is_a_user_error(env):
    with pytest.raises(UserError):
        ServeConfig.from_env(env)


def test_model_process_switches_accept_their_modes():
    ServeConfig.from_env({"TTSFLEET_PROMPT_GQA": "native", "TTSFLEET_TOPK_SELECT": " Kernel "})
    ServeConfig.from_env({"TTSFLEET_PROMPT_GQA": "expand", "TTSFLEET_TOPK_SELECT": ""})
    for splits in ("off", " Auto ", "4", ""):
        ServeConfig.from_env({"TTSFLEET_ATTN_SPLITS": splits})
    for tile in ("4x64", "8X32", ""):
        ServeConfig.from_env({"TTSFLEET_ATTN_TILE": tile})


def test_safe_defaults():
    """Loopback unless told (a pod passes TTSFLEET_HOST=0.0.0.0); OpenAI's 4,096-character input."""
    cfg = ServeConfig.from_env({})
    assert cfg.host == "127.0.0.1" and cfg.api_keys == () and cfg.max_text_chars == 4096
    assert ServeConfig.from_env({ENV["host"]: "0.0.0.0"}).host == "0.0.0.0"
    assert ServeConfig.from_env({ENV["host"]: "0.0.0.0"}, host="127.0.0.1").host == "127.0.0.1"


def test_env_names_and_quantization_come_from_the_contracts():
    from ttsfleet import quantization
    from ttsfleet.contracts import serving as serving_env

    assert ENV is serving_env.SERVER_ENV  # one place for the names: the operator imports the same
    assert ServeConfig.from_env({serving_env.QUANTIZATION: "none"}).quantization == quantization.BF16
    assert ServeConfig.from_env({serving_env.QUANTIZATION: " MXFP8 "}).quantization == "mxfp8"
    for scheme in quantization.CHOICES:
        assert ServeConfig.from_env({}, quantization=scheme).quantization == scheme
