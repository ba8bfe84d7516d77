"""``ttsfleet.switches.ProcessSwitch``: one ``TTSFLEET_*`` variable read once at first use, and the
registry the server's start check iterates.

What each test pins down, and how it can fail:
* the environment is read at the first ``get``, not when the switch is made (a module imported
  before a test or a launcher sets the variable still sees it), and parsed once (the hot path
  re-parsing, or a CUDA graph's value changing under it, shows as a second parse);
* ``set`` parses and replaces, a bad value leaves the current one; ``reset`` reads the environment
  again; a bad environment value raises the parse's one-line message at every ``get``;
* the registry: the model's switches with their defaults and messages, and every module of the
  source tree that defines a switch is one the server's start check imports (a new switch in a
  module the check does not import would otherwise go unchecked).
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from ttsfleet import switches
from ttsfleet.switches import ProcessSwitch, registered

ROOT = Path(__file__).resolve().parents[2]
ENV = "TTSFLEET_TEST_SWITCH"
MODEL_SWITCHES = {  # variable: (default, the parsed default, a bad value, its whole message)
    "TTSFLEET_PROMPT_GQA": ("native", "native", "fast",
                            "TTSFLEET_PROMPT_GQA='fast': expected one of expand, native"),
    "TTSFLEET_TOPK_SELECT": ("kernel", "kernel", "heap",
                             "TTSFLEET_TOPK_SELECT='heap': expected one of torch, kernel"),
    "TTSFLEET_ATTN_SPLITS": ("auto", "auto", "64",
                             "TTSFLEET_ATTN_SPLITS='64': expected off, auto or a count 1..16"),
    "TTSFLEET_ATTN_TILE": ("4x64", (4, 64), "16x16",
                           "TTSFLEET_ATTN_TILE='16x16': expected one of 4x64, 4x32, 8x64, 8x32"),
    "TTSFLEET_GEMM_PREFETCH": ("2", 2, "all",
                               "TTSFLEET_GEMM_PREFETCH='all': expected off, auto or a count 1..64"),
    "TTSFLEET_ATTN_PREFETCH": ("off", "off", "0",
                               "TTSFLEET_ATTN_PREFETCH='0': expected off, auto or a count 1..64"),
    "TTSFLEET_ROPE_ATTENTION": ("separate", "separate", "both",
                                "TTSFLEET_ROPE_ATTENTION='both': expected one of separate, fused"),
    "TTSFLEET_MLP_LAUNCH": ("two", "two", "three",
                            "TTSFLEET_MLP_LAUNCH='three': expected one of two, one"),
    "TTSFLEET_FAST_ATTN_LAUNCH": ("separate", "separate", "fused",
                                  "TTSFLEET_FAST_ATTN_LAUNCH='fused': expected one of separate, one"),
    "TTSFLEET_CUBLAS_SCALES": ("copy", "copy", "inline",
                               "TTSFLEET_CUBLAS_SCALES='inline': expected one of copy, direct"),
    "TTSFLEET_DECODE_GEMM": ("fp8", "fp8", "w8a8",
                             "TTSFLEET_DECODE_GEMM='w8a8': expected one of fp8, a16, deepgemm"),
    "TTSFLEET_DEEPGEMM_ROWS": ("1-128", (1, 128), "64-16",
                               "TTSFLEET_DEEPGEMM_ROWS='64-16': expected LO-HI rows, 1 <= LO <= HI <= 128 "
                               "(e.g. 16-128)"),
    "TTSFLEET_DEEPGEMM_SHAPES": ("all", None, "6144by2560",
                                 "TTSFLEET_DEEPGEMM_SHAPES='6144by2560': expected all or weight shapes NxK, "
                                 "comma-separated (e.g. 6144x2560,2560x4096)"),
    "TTSFLEET_DEEPGEMM_SMS": ("all", "all", "0",
                              "TTSFLEET_DEEPGEMM_SMS='0': expected all or a count 1..1024"),
    "TTSFLEET_HEAD_GEMM": ("bf16", "bf16", "fp8",
                           "TTSFLEET_HEAD_GEMM='fp8': expected one of float32, bf16"),
    "TTSFLEET_CODEC_UNITS": ("fused", "fused", "triton",
                             "TTSFLEET_CODEC_UNITS='triton': expected one of cudnn, fused"),
    "TTSFLEET_CODEC_WINDOW_ATTENTION": ("efficient", "efficient", "flex",
                                        "TTSFLEET_CODEC_WINDOW_ATTENTION='flex': expected one of auto, "
                                        "cudnn, efficient, flash, math"),
    "TTSFLEET_CHUNK_RAMP": ("on", "on", "yes",
                            "TTSFLEET_CHUNK_RAMP='yes': expected one of on, off, repeat-first"),
    "TTSFLEET_CODEC_SM_PERCENT": ("off", "off", "101",
                                  "TTSFLEET_CODEC_SM_PERCENT='101': expected off or a count 1..100"),
    "TTSFLEET_PREFILL_WHOLE_GRAPHS": ("off", "off", "yes",
                                      "TTSFLEET_PREFILL_WHOLE_GRAPHS='yes': expected one of off, on"),
    "TTSFLEET_CODEC_MPS_PRIORITY": (
        "normal", "normal", "high",
        "TTSFLEET_CODEC_MPS_PRIORITY='high': expected one of normal, below-normal"),
    "TTSFLEET_PREFILL_STREAM": ("auto", "auto", "yes",
                                "TTSFLEET_PREFILL_STREAM='yes': expected one of auto, off, on"),
    "TTSFLEET_ENGINE_CHECKS": ("off", False, "yes",
                               "TTSFLEET_ENGINE_CHECKS='yes': expected one of off, on"),
    "TTSFLEET_PDL": ("on", True, "no", "TTSFLEET_PDL='no': expected one of on, off"),
    "TTSFLEET_PREFILL_JOIN": ("done", "done", "now",
                              "TTSFLEET_PREFILL_JOIN='now': expected one of done, next-step"),
    "TTSFLEET_MIXED_STEPS": ("on", True, "yes", "TTSFLEET_MIXED_STEPS='yes': expected one of off, on"),
    "TTSFLEET_MIXED_GRAPH": ("pass", "pass", "whole",
                             "TTSFLEET_MIXED_GRAPH='whole': expected one of pass, step"),
    "TTSFLEET_EVENT_LOOP": ("auto", "auto", "trio",
                            "TTSFLEET_EVENT_LOOP='trio': expected one of auto, uvloop, asyncio"),
    "TTSFLEET_HTTP_PARSER": ("auto", "auto", "picohttp",
                             "TTSFLEET_HTTP_PARSER='picohttp': expected one of auto, httptools, h11"),
}


@pytest.fixture
def own_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Switches made by a test register in a copy, so the server's check never sees them."""
    monkeypatch.setattr(switches, "_REGISTRY", dict(switches._REGISTRY))
    monkeypatch.delenv(ENV, raising=False)


def _counted(calls: list[str]):  # noqa: ANN202
    def parse(value: str) -> int:
        calls.append(value)
        if not value.strip().isdigit():
            raise ValueError(f"{ENV}={value!r}: expected a count")
        return int(value)

    return parse


def test_the_environment_is_read_at_first_use_and_parsed_once(own_registry, monkeypatch) -> None:  # noqa: ANN001
    calls: list[str] = []
    switch = ProcessSwitch(ENV, "3", _counted(calls))
    assert calls == []  # made, not read
    monkeypatch.setenv(ENV, "7")
    assert switch.get() == 7 and switch.get() == 7
    assert calls == ["7"]
    monkeypatch.setenv(ENV, "9")
    assert switch.get() == 7  # read once: a later change of the variable is not seen


def test_unset_is_the_default(own_registry) -> None:  # noqa: ANN001
    calls: list[str] = []
    switch = ProcessSwitch(ENV, "3", _counted(calls))
    assert switch.get() == 3 and calls == ["3"]
    assert (switch.env, switch.default) == (ENV, "3")


def test_set_and_reset(own_registry, monkeypatch) -> None:  # noqa: ANN001
    calls: list[str] = []
    switch = ProcessSwitch(ENV, "3", _counted(calls))
    switch.set(" 5 ")
    assert switch.get() == 5 and calls == [" 5 "]  # set parses; get does not read the environment
    with pytest.raises(ValueError, match=rf"^{ENV}='many': expected a count$"):
        switch.set("many")
    assert switch.get() == 5  # a refused value leaves the current one
    monkeypatch.setenv(ENV, "8")
    switch.reset()
    assert switch.get() == 8  # back to the environment at the next use
    monkeypatch.delenv(ENV)
    switch.reset()
    assert switch.get() == 3  # and to the default where it is unset


def test_a_bad_environment_value_is_the_parse_message_at_every_use(own_registry, monkeypatch) -> None:  # noqa: ANN001
    switch = ProcessSwitch(ENV, "3", _counted([]))
    monkeypatch.setenv(ENV, "lots")
    for _ in range(2):  # nothing cached: the next use fails the same way
        with pytest.raises(ValueError, match=rf"^{ENV}='lots': expected a count$"):
            switch.get()
    switch.set("2")
    assert switch.get() == 2


def test_made_switches_register_by_name(own_registry) -> None:  # noqa: ANN001
    first = ProcessSwitch(ENV, "3", int)
    assert first in registered()
    again = ProcessSwitch(ENV, "4", int)  # a module re-imported: its new object is the one read
    assert again in registered() and first not in registered()
    names = [s.env for s in registered()]
    assert names == sorted(names)


def test_the_model_switches_are_registered_with_their_defaults_and_messages() -> None:
    from ttsfleet.inference import (
        codec_batch,  # noqa: F401 - registers TTSFLEET_CODEC_UNITS
        engine_checks,  # noqa: F401 - registers TTSFLEET_ENGINE_CHECKS
        mixed_graphs,  # noqa: F401 - registers TTSFLEET_MIXED_GRAPH
        mixed_step,  # noqa: F401 - registers TTSFLEET_MIXED_STEPS
        model_layers,
        mps,  # noqa: F401 - registers TTSFLEET_CODEC_SM_PERCENT, TTSFLEET_CODEC_MPS_PRIORITY
        prefill_graphs,  # noqa: F401 - registers TTSFLEET_PREFILL_WHOLE_GRAPHS
        prefill_stream,  # noqa: F401 - registers TTSFLEET_PREFILL_STREAM, TTSFLEET_PREFILL_JOIN
        server_loop,  # noqa: F401 - registers TTSFLEET_EVENT_LOOP, TTSFLEET_HTTP_PARSER
    )
    from ttsfleet.kernels import decode

    by_name = {s.env: s for s in registered()}
    assert set(MODEL_SWITCHES) <= set(by_name)
    for name, (default, parsed, bad, message) in MODEL_SWITCHES.items():
        switch = by_name[name]
        assert switch.default == default and switch.parse(default) == parsed
        with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
            switch.parse(bad)
    # the module-level names callers use are the switches' own methods
    assert decode.topk_select == decode.TOPK_SELECT_SWITCH.get
    assert decode.set_attn_splits == decode.ATTN_SPLITS_SWITCH.set
    assert decode.attn_tile == decode.ATTN_TILE_SWITCH.get
    assert decode.set_gemm_prefetch == decode.GEMM_PREFETCH_SWITCH.set
    assert decode.attn_prefetch == decode.ATTN_PREFETCH_SWITCH.get
    assert decode.set_rope_attention == decode.ROPE_ATTENTION_SWITCH.set
    assert decode.mlp_launch == decode.MLP_LAUNCH_SWITCH.get
    assert decode.set_fast_attn_launch == decode.FAST_ATTN_LAUNCH_SWITCH.set
    assert decode.decode_gemm == decode.DECODE_GEMM_SWITCH.get
    assert model_layers.set_prompt_gqa == model_layers.PROMPT_GQA_SWITCH.set
    assert model_layers.head_gemm == model_layers.HEAD_GEMM_SWITCH.get


def _modules_defining_a_switch() -> set[str]:
    """``ttsfleet.*`` modules of the source tree whose code makes a ProcessSwitch."""
    package_dir = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    found = set()
    for dotted, folder in package_dir.items():
        for path in (ROOT / folder).rglob("*.py"):
            rel = path.relative_to(ROOT / folder)
            if "__pycache__" in rel.parts or path == ROOT / "ttsfleet" / "switches.py":
                continue
            if re.search(r"=\s*ProcessSwitch\(", path.read_text()):
                found.add(".".join([dotted, *rel.with_suffix("").parts]))
    return found


def test_the_server_check_imports_every_module_that_defines_a_switch() -> None:
    from ttsfleet.inference.serve_config import SWITCH_MODULES

    assert _modules_defining_a_switch() == set(SWITCH_MODULES)
    # and in a fresh process the start check alone registers exactly the model's switches
    code = ("from ttsfleet.inference.serve_config import _check_process_switches\n"
            "from ttsfleet.switches import registered\n"
            "_check_process_switches({})\n"
            "print(' '.join(s.env for s in registered()))")
    out = subprocess.run([sys.executable, "-P", "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True, timeout=300).stdout.split()
    assert out == sorted(MODEL_SWITCHES)
