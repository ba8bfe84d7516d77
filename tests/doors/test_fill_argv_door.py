"""The fill door's command line, crossed: every way a fill job is started parses with ``fill run``.

The operator's fill pod (command, args and env as written), the Slurm agent's sbatch script for one
shard and for a job array, and both hand-run examples: each argv goes through the real ``ttsfleet
fill run`` parser and means what the adapter meant (shard, directories, checkpoint interval,
metrics port, state file). The Slurm scripts are run by bash with a stand-in fill command that
records the argv it got, so shell quoting and variable expansion are part of what is tested.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.resources import files
from pathlib import Path

import pytest
from ttsfleet.operator import fillview as fv
from ttsfleet.operator.models import FillJobSpec
from ttsfleet.slurm.sbatch import FillShardSpec, render_fill_script

from tests.doors.cli import parse
from ttsfleet.catalog import GpuCatalog
from ttsfleet.contracts import fill as contract

CAT = GpuCatalog.default()
RUN = ["fill", "run"]


def filljob_spec(**over: object) -> FillJobSpec:
    raw = {"image": "ghcr.io/ttsfleet/fill:test", "manifest": "/data/manifest with space.jsonl",
           "output": "/data/out", "shards": 6, "gpuClasses": ["h200"], "stages": ["vad", "loudness"],
           "checkpointVolume": {"claimName": "ckpt", "mountPath": "/checkpoints"},
           "policy": {"checkpointIntervalS": 45}, **over}
    return FillJobSpec.model_validate(raw, context={"catalog": CAT})


def test_the_operators_fill_pod_parses_as_it_meant(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = filljob_spec()
    pod = fv.fill_pod("clean", "ns1", spec, 3, "h200", "clean-3-0", CAT)
    (c,) = pod["spec"]["containers"]
    assert c["command"] == ["ttsfleet", *RUN]
    env = {e["name"]: e["value"] for e in c["env"]}
    p = parse(RUN, c["args"], env, monkeypatch)
    assert (p["input"], p["output"]) == (Path(spec.manifest), Path(spec.output))
    assert p["checkpoint"] == Path(fv.checkpoint_dir(spec, "clean")) == Path("/checkpoints/clean")
    assert (p["shard"], p["stages"], p["checkpoint_every_seconds"]) == ("3/6", "vad,loudness", 45.0)
    assert p["metrics_port"] == c["ports"][0]["containerPort"] == contract.METRICS_PORT
    assert p["job_name"] == "clean-3"
    assert p["state_file"] == Path(c["terminationMessagePath"])


RECORDER = "import json, os, sys\nopen(os.environ['ARGV_TO'], 'w').write(json.dumps(sys.argv[1:]))\n"


def run_script(script: Path, tmp_path: Path, env: dict[str, str]) -> list[str]:
    """Run a wrapper with bash; the argv its fill command got, from ``run`` on."""
    out = tmp_path / "argv.json"
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "ARGV_TO": str(out), **env})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    argv = json.loads(out.read_text())
    return argv[argv.index("run") + 1:]


@pytest.fixture
def recorder(tmp_path: Path) -> str:
    path = tmp_path / "record_argv.py"
    path.write_text(RECORDER)
    return f"{sys.executable} {path}"


@pytest.mark.parametrize("array", [False, True], ids=["one-shard", "job-array"])
def test_the_agents_sbatch_script_parses_as_it_meant(array: bool, recorder: str, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    spec = FillShardSpec(manifest=str(tmp_path / "my data.jsonl"), output_root=str(tmp_path / "out"),
                         checkpoint_root=str(tmp_path / "ckpt"), shard_count=4, gpu_class="h200",
                         log_dir=str(tmp_path), stages="decode,hash", checkpoint_every_s=45.0,
                         checkpoint_every_items=7, item_delay_s=0.25, fill_command=recorder)
    script = tmp_path / "job.sbatch"
    script.write_text(render_fill_script(spec, array="0-3") if array else render_fill_script(spec, index=2))
    argv = run_script(script, tmp_path, {"SLURM_ARRAY_TASK_ID": "1"} if array else {})
    p = parse(RUN, argv, {}, monkeypatch)
    assert (p["input"], p["output"], p["checkpoint"]) == (
        Path(spec.manifest), Path(spec.output_root), Path(spec.checkpoint_root))
    assert p["shard"] == ("1/4" if array else "2/4")
    assert (p["stages"], p["checkpoint_every_seconds"], p["checkpoint_every_items"],
            p["item_delay_seconds"]) == ("decode,hash", 45.0, 7, 0.25)


def test_the_hand_run_examples_parse(recorder: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import yaml

    shipped = files("ttsfleet.fill_jobs")
    script = tmp_path / "slurm-fill.sh"
    script.write_text(shipped.joinpath("slurm-fill.sh").read_text())
    argv = run_script(script, tmp_path, {"MANIFEST": "/d/m.jsonl", "OUT": "/d/out", "CKPT": "/d/ckpt",
                                         "TTSFLEET": recorder, "FILL_ARGS": "--stages decode,hash"})
    p = parse(RUN, argv, {}, monkeypatch)
    assert (p["input"], p["checkpoint"], p["stages"]) == (Path("/d/m.jsonl"), Path("/d/ckpt"), "decode,hash")
    doc = yaml.safe_load(shipped.joinpath("k8s-indexed-job.yaml").read_text())
    (c,) = doc["spec"]["template"]["spec"]["containers"]
    assert c["command"] == ["ttsfleet", *RUN]
    p = parse(RUN, c["args"], {e["name"]: e["value"] for e in c["env"]}, monkeypatch)
    assert p["metrics_port"] == c["ports"][0]["containerPort"]
