"""Packaging: components import as ttsfleet.<component>, the stdlib's operator stays itself, and a
non-editable install works from outside the repository."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMPONENTS = {"operator", "inference", "kernels", "fill_jobs", "slurm"}


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_every_package_folder_is_listed():
    tool = _pyproject()["tool"]["setuptools"]
    listed = set(tool["packages"])
    mapping = tool["package-dir"]
    found = set()
    for dotted, folder in mapping.items():
        base = ROOT / folder
        for init in base.rglob("__init__.py"):
            rel = init.parent.relative_to(base)
            if "__pycache__" in rel.parts:
                continue
            found.add(".".join([dotted, *rel.parts]))
    assert found <= listed, f"folders with __init__.py missing from pyproject: {sorted(found - listed)}"
    assert {f"ttsfleet.{c}" for c in COMPONENTS} <= listed


def test_bare_operator_is_the_stdlib_even_from_the_repo_root():
    out = subprocess.run([sys.executable, "-c", "import operator; print(operator.__file__)"],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    assert Path(out).parent != ROOT / "operator" and "site-packages" not in out
    assert Path(out).name == "operator.py"


@pytest.mark.slow
def test_non_editable_install_imports_from_outside_the_repo(tmp_path):
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(wheels)], check=True, capture_output=True, timeout=300)
    (wheel,) = wheels.glob("ttsfleet-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for comp in COMPONENTS:
        assert f"ttsfleet/{comp}/__init__.py" in names
    assert not any(n.startswith("operator/") for n in names), "bare operator package shipped"
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target),
                    str(wheel)], check=True, capture_output=True, timeout=300)
    # -S: no .pth processing, so the editable install of this checkout cannot leak in; the
    # dependencies come from the real site-packages appended after the installed wheel.
    path = f"{target}:{sysconfig.get_paths()['purelib']}"
    code = ("import operator, ttsfleet, ttsfleet.operator, ttsfleet.fill_jobs, ttsfleet.slurm, "
            "ttsfleet.inference, ttsfleet.kernels, ttsfleet.policy, ttsfleet.sim.engine\n"
            "from ttsfleet.catalog import GpuCatalog\n"
            "assert GpuCatalog.default().get('h200').serving.cuda_graph_max_bs == 128\n"
            "assert hasattr(operator, 'itemgetter')\n"
            "print(ttsfleet.operator.__file__)")
    out = subprocess.run([sys.executable, "-S", "-c", code], cwd=tmp_path, capture_output=True, text=True,
                         env={"PYTHONPATH": path, "PATH": "/usr/bin:/bin"}, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().startswith(str(target))


def test_cli_startup_imports_no_heavy_component_dependencies():
    """`pip install .` (no extras) must be enough for `ttsfleet simulate`: the CLI may not import
    torch, kopf, fastapi, silero or the Grafana SDK until a command that needs them runs."""
    code = ("import sys, ttsfleet.cli\n"
            "heavy = {'torch', 'kopf', 'kubernetes', 'fastapi', 'uvicorn', 'silero_vad', 'soundfile',\n"
            "         'grafana_foundation_sdk', 'helm_python', 'triton', 'pyloudnorm', 'scipy'}\n"
            "print(sorted(heavy & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=ROOT).stdout.strip()
    assert out == "[]", f"imported at CLI startup: {out}"


#: The dev entry points that run the local stand-ins (they import them inside the command).
DEVTOOLS_USERS = {"slurm/cli.py", "ttsfleet/observability/render.py", "ttsfleet/cli.py"}


def test_no_production_path_imports_the_devtools():
    """The operator, the agent, the server, the fill jobs and the core never import the test
    harness; only the commands that run it (local-cluster, dashboards render, demo) do."""
    import re

    users = set()
    for folder in ("ttsfleet", *COMPONENTS):
        for path in (ROOT / folder).rglob("*.py"):
            if re.search(r"^\s*(from|import) ttsfleet\.devtools", path.read_text(), re.M):
                users.add(str(path.relative_to(ROOT)))
    assert users <= DEVTOOLS_USERS, sorted(users - DEVTOOLS_USERS)
    devtools = {p.stem for p in (ROOT / "devtools").glob("*.py")}
    assert {"localkube", "fakekubelet", "localcluster", "promserver", "ports", "wait"} <= devtools
    for folder, old in (("operator", "localkube"), ("operator", "fakekubelet"), ("slurm", "localcluster"),
                        ("ttsfleet/observability", "promserver")):
        assert not (ROOT / folder / f"{old}.py").exists(), f"{folder}/{old}.py is harness: devtools/"


def _pin(requirements: list[str], name: str) -> str:
    """The ``==`` version pinned for ``name`` in a list of requirement strings."""
    (found,) = [r for r in requirements if re.match(rf"^{name}\s*==", r)]
    return re.match(rf"^{name}\s*==\s*([^;\s]+)", found).group(1)


def test_ci_installs_torch_once_with_the_triton_it_requires():
    """scripts/test.sh installs torch and ``.[all]`` in one pip run, and the test extra pins the
    very triton that torch pins: two runs, or a triton of another torch, made pip replace the
    multi-GB torch it had just installed. Any other pip run installs one pinned package with
    ``--no-deps`` (a data wheel: it cannot move torch)."""
    script = (ROOT / "scripts" / "test.sh").read_text()
    (torch_pin,) = re.findall(r'^TORCH_PIN="torch==([0-9.]+)"$', script, re.M)
    installs = [line for line in script.splitlines() if re.search(r"pip install", line)
                and not line.lstrip().startswith(("#", "echo"))]
    main = [line for line in installs if "--no-deps" not in line]
    assert len(main) == 1, installs
    assert '"$TORCH_PIN"' in main[0] and '".[all]"' in main[0], main[0]
    for line in installs:
        if line is not main[0]:
            assert "torch" not in line and re.search(r'--no-deps "[\w.-]+==[\w.]+"$', line), line
    triton_pin = _pin(_pyproject()["project"]["optional-dependencies"]["test"], "triton")
    try:
        installed = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("torch is not installed")
    if installed.split("+")[0] != torch_pin:
        pytest.skip(f"torch {installed} is installed, not the pinned {torch_pin}")
    wanted = [r for r in importlib.metadata.requires("torch") or [] if r.startswith("triton")]
    if wanted:  # the CUDA build requires a triton; the CPU build requires none
        assert _pin(wanted, "triton") == triton_pin, (wanted, triton_pin)
