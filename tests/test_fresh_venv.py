"""A newcomer's first five minutes: the README's set-up commands, run from the root of a clean clone
in a fresh venv.

The repository root holds the ``operator/`` component folder, which shadows the standard library's
``operator`` whenever the working directory is on ``sys.path`` — ``python3 -m pip`` / ``python3 -m
pytest`` from the root then die at start-up. The documented commands are therefore the plain ``pip``
and ``ttsfleet`` scripts (never affected) and ``python3 -P -m ...`` (``scripts/test.sh`` also exports
``PYTHONSAFEPATH=1``). This test runs them, and shows the unsafe form really fails.
"""

from __future__ import annotations

import os
import re
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def _run(argv: list[str], cwd: Path, env: dict[str, str], timeout: float = 120
         ) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, f"{proc.args}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs git and a git checkout")
    dest = tmp_path_factory.mktemp("newcomer") / "ttsfleet"
    _ok(subprocess.run(["git", "clone", "--quiet", str(ROOT), str(dest)], capture_output=True, text=True,
                       timeout=120))
    return dest


def _clean_env(venv: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTHON", "VIRTUAL_ENV", "PIP_")) and not k.startswith("TTSFLEET_")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(venv)
    return env


def _venv(where: Path, system_site: bool) -> Path:
    argv = [sys.executable, "-m", "venv", *(["--system-site-packages"] if system_site else []), str(where)]
    _ok(subprocess.run(argv, cwd=where.parent, capture_output=True, text=True, timeout=120))
    return where


def test_unsafe_form_really_fails_and_safe_path_fixes_it(clone, tmp_path):
    """In a bare venv, ``python3 -m pip`` from the root imports the component folder as ``operator``."""
    venv = _venv(tmp_path / "bare", system_site=False)
    env = _clean_env(venv)
    broken = _run([str(venv / "bin" / "python3"), "-m", "pip", "--version"], clone, env)
    assert broken.returncode != 0 and "operator" in broken.stderr, broken.stderr[-2000:]
    py = str(venv / "bin" / "python3")
    _ok(_run([py, "-P", "-m", "pip", "--version"], clone, env))
    _ok(_run([py, "-m", "pip", "--version"], clone, {**env, "PYTHONSAFEPATH": "1"}))


def test_readme_setup_commands_in_a_fresh_venv(clone, tmp_path):
    venv = _venv(tmp_path / "venv", system_site=True)
    # The packages this interpreter already has (CI: the system python, what --system-site-packages
    # means there; locally perhaps a venv) stay visible, so nothing heavy is downloaded again.
    py = str(venv / "bin" / "python3")
    where_pure = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    purelib = Path(_ok(_run([py, "-c", where_pure], tmp_path, os.environ.copy())).stdout.strip())
    visible = [p for p in [*site.getsitepackages(), site.getusersitepackages(), *sys.path]
               if p.endswith(("site-packages", "dist-packages")) and Path(p).is_dir()]
    (purelib / "_parent_site.pth").write_text("\n".join(dict.fromkeys(visible)) + "\n")
    env = _clean_env(venv)
    readme = (clone / "README.md").read_text()
    assert "pip install . && ttsfleet simulate" in readme
    test_sh = (clone / "scripts" / "test.sh").read_text()
    assert "export PYTHONSAFEPATH=1" in test_sh
    commands = [ln for ln in test_sh.splitlines() if not ln.lstrip().startswith("#")]
    assert not [ln for ln in commands if "python3 -m " in ln], "scripts/test.sh runs python3 -m without -P"

    # README: `pip install . && ttsfleet simulate` (a short trace)
    _ok(_run([str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", "."], clone, env,
             180))
    sim = _ok(_run([str(venv / "bin" / "ttsfleet"), "simulate", "--days", "0.1", "--runs", "policy",
                    "--json"], clone, env))
    assert '"utilization' in sim.stdout or "utilization" in sim.stdout

    # README: scripts/test.sh — its pip and pytest invocations, as the script runs them
    env_sh = {**env, "PYTHONSAFEPATH": "1"}
    _ok(_run([py, "-P", "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps", "-e", "."],
             clone, env_sh, 180))
    probe = "import ttsfleet.inference, operator; print(ttsfleet.inference.__file__, operator.eq)"
    where = _ok(_run([py, "-P", "-c", probe], clone, env_sh)).stdout
    assert str(clone) in where and "built-in" in where  # the clone's code, the stdlib's operator
    out = _ok(_run([py, "-P", "-m", "pytest", "-q", "-p", "no:cacheprovider",
                    "tests/inference_server/test_config.py"], clone, env_sh, 180)).stdout
    assert re.search(r"\d+ passed", out), out[-1000:]
