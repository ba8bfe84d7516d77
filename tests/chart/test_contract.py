"""The chart and the images drive the real `ttsfleet` command line: the operator container's
rendered command and the Dockerfiles' entry points are parsed by the actual CLI (the operator's
event loop itself is replaced by a recorder)."""

from __future__ import annotations

import json
import re

import pytest


@pytest.fixture()
def recorded_serve(monkeypatch):
    import ttsfleet.operator.main as operator_main

    calls: list[dict] = []

    async def fake_serve(**kwargs):
        calls.append(kwargs)

    monkeypatch.setattr(operator_main, "serve", fake_serve)
    return calls


def run_cli(argv: list[str]) -> int:
    from ttsfleet.cli import main

    return main(argv)


def container(docs, lib) -> dict:
    (c,) = lib.one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    return c


def test_rendered_operator_command_is_accepted_by_the_cli(render_docs, lib, recorded_serve):
    for values, namespaces in (({}, []), (lib.FULL_VALUES, ["tts-prod", "tts-staging"])):
        c = container(render_docs(values), lib)
        assert c["command"] == ["ttsfleet"]
        assert run_cli(c["args"]) == 0
        call = recorded_serve.pop()
        assert call["metrics_port"] == lib.deep_merge({"operator": {"metricsPort": 8080}},
                                                      values)["operator"]["metricsPort"]
        assert call["health_port"] == 8081
        assert list(call["namespaces"]) == namespaces


def test_prometheus_url_env_is_the_one_the_operator_reads(render_docs, lib):
    from ttsfleet.operator.runtime import ENV_PROMETHEUS_URL

    env = {e["name"] for e in container(render_docs(lib.FULL_VALUES), lib)["env"]}
    assert ENV_PROMETHEUS_URL in env


def test_operator_image_default_command_is_accepted(lib, recorded_serve):
    text = (lib.DOCKER_DIR / "operator.Dockerfile").read_text()
    entry = json.loads(re.search(r"^ENTRYPOINT (\[.*\])$", text, re.M).group(1))
    cmd = json.loads(re.search(r"^CMD (\[.*\])$", text, re.M).group(1))
    assert entry[0] == "ttsfleet"
    assert run_cli(entry[1:] + cmd) == 0
    assert recorded_serve[-1]["metrics_port"] == 8080 and recorded_serve[-1]["health_port"] == 8081


@pytest.mark.parametrize("name", ["inference.Dockerfile", "fill.Dockerfile"])
def test_image_entry_points_exist(lib, name, capsys):
    text = (lib.DOCKER_DIR / name).read_text()
    entry = json.loads(re.search(r"^ENTRYPOINT (\[.*\])$", text, re.M).group(1))
    assert entry[0] == "ttsfleet"
    assert run_cli(entry[1:] + ["--help"]) == 0
    assert "Usage" in capsys.readouterr().out


def test_operator_port_matches_the_podmonitor_and_priority_classes_match_the_operator(render_docs, lib):
    from ttsfleet.operator import desired, fillview

    from ttsfleet.contracts.serving import INFERENCE_PORT

    assert desired.INFERENCE_PORT == INFERENCE_PORT
    docs = render_docs(lib.FULL_VALUES)
    pm = lib.one(docs, "PodMonitor")
    labels = desired.pool_labels("x", _pool())
    assert pm["spec"]["selector"]["matchLabels"].items() <= labels.items()
    pcs = {d["metadata"]["name"] for d in lib.by_kind(docs, "PriorityClass")}
    assert {desired.INFERENCE_PRIORITY_CLASS, fillview.FILL_PRIORITY_CLASS,
            fillview.TRAINING_PRIORITY_CLASS} == pcs


def _pool():
    from ttsfleet.operator.models import TTSPool

    from ttsfleet.catalog import GpuCatalog

    return TTSPool.model_validate({"gpuClass": "h200"}, context={"catalog": GpuCatalog.default()})


BLOCKER = """
import importlib.abc, sys
BLOCKED = set(sys.argv[1].split(","))
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (not in this image)")
sys.meta_path.insert(0, Block())
from ttsfleet.cli import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.parametrize("name, extra", [("operator.Dockerfile", "operator"),
                                         ("inference.Dockerfile", "inference"),
                                         ("fill.Dockerfile", "fill")])
def test_entry_point_runs_with_only_its_own_extra(lib, name, extra):
    """Each image installs one extra; its build step `<entry point> --help` must not need the
    other extras' packages (kopf in the fill image, torch in the operator image, ...)."""
    import subprocess
    import sys
    import tomllib

    extras = tomllib.loads((lib.REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]

    def modules(group: str) -> set[str]:
        return {re.split(r"[<>=\[; ]", req)[0].lower().replace("-", "_") for req in extras[group]}

    blocked = (modules("fill") | modules("inference") | modules("operator")) - modules(extra)
    if extra != "inference":
        blocked.add("triton")
    text = (lib.DOCKER_DIR / name).read_text()
    entry = json.loads(re.search(r"^ENTRYPOINT (\[.*\])$", text, re.M).group(1))
    proc = subprocess.run([sys.executable, "-c", BLOCKER, ",".join(sorted(blocked)), *entry[1:], "--help"],
                          capture_output=True, text=True, timeout=120, cwd=lib.REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Usage" in proc.stdout
