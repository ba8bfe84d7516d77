"""Fill shard sbatch scripts: options, shard identity and the signal-forwarding wrapper."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
from ttsfleet.slurm.backend import JobInfo
from ttsfleet.slurm.sbatch import FillShardSpec, fill_submit_request, render_fill_script, shard_of

from ttsfleet.contracts.exits import PREEMPTED_REQUEUE

pytestmark = pytest.mark.slurm


def spec(tmp_path: Path, manifest: Path | None = None, **kw) -> FillShardSpec:
    return FillShardSpec(manifest=str(manifest or tmp_path / "en-v2.jsonl"),
                         output_root=str(tmp_path / "out"),
                         checkpoint_root=str(tmp_path / "ckpt"), shard_count=4, gpu_class="rtx5090",
                         log_dir=str(tmp_path / "logs"), grace_period_s=45, **kw)


def sbatch_options(script: str) -> list[str]:
    return [line.removeprefix("#SBATCH ").strip() for line in script.splitlines()
            if line.startswith("#SBATCH")]


def test_single_shard_script(tmp_path: Path) -> None:
    s = spec(tmp_path, stages="decode,hash")
    script = render_fill_script(s, 2)
    opts = sbatch_options(script)
    for want in ("--requeue", "--signal=B:USR1@45", "--open-mode=append", "--gres=gpu:rtx5090:1",
                 "--partition=fill", "--comment=ttsfleet-fill:en-v2:2/4"):
        assert want in opts
    assert not any(o.startswith("--array") for o in opts)
    assert "SHARD_INDEX=${SLURM_ARRAY_TASK_ID:-2}" in script
    assert "--stages decode,hash" in script
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    req = fill_submit_request(s, 2)
    assert (req.gres, req.signal, req.requeue, req.partition) == ("gpu:rtx5090:1", "B:USR1@45", True, "fill")
    assert req.name in script and req.comment in script


def test_array_script_and_shard_identity(tmp_path: Path) -> None:
    s = spec(tmp_path)
    script = render_fill_script(s, array="0-3%2")
    assert "--array=0-3%2" in sbatch_options(script)
    req = fill_submit_request(s, array="0-3%2")
    assert req.array == "0-3%2" and req.comment == "ttsfleet-fill:en-v2:0-3/4"
    job = JobInfo("7", req.name, "fill", "RUNNING", comment=req.comment, array_job_id="7", array_task_id=3)
    ref = shard_of(job)
    assert ref is not None and (ref.dataset, ref.indices, ref.count) == ("en-v2", (3,), 4)
    assert shard_of(JobInfo("8", "x", "fill", "RUNNING", comment="something else")) is None
    with pytest.raises(ValueError):
        render_fill_script(s)


@pytest.mark.audio
def test_wrapper_forwards_usr1_and_passes_exit_99(tmp_path: Path) -> None:
    """Run the rendered script with bash (as slurmd would) and send USR1 to the batch shell only."""
    from ttsfleet.fill_jobs.corpus import make_corpus

    manifest = make_corpus(tmp_path / "corpus", 12, seed=3)
    s = spec(tmp_path, manifest, stages="decode,hash", item_delay_s=0.3, checkpoint_every_items=1)
    s = FillShardSpec(**{**s.__dict__, "shard_count": 1})
    script = tmp_path / "job.sh"
    script.write_text(render_fill_script(s, 0))
    proc = subprocess.Popen(["bash", str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    ckpt = s.checkpoint_file(0)
    end = time.monotonic() + 60
    while not (ckpt.exists() and json.loads(ckpt.read_text()).get("items_done", 0) >= 1):
        assert time.monotonic() < end and proc.poll() is None, "fill job made no checkpoint"
        time.sleep(0.1)
    proc.send_signal(signal.SIGUSR1)  # the batch shell only, like --signal=B:USR1
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == PREEMPTED_REQUEUE, out
    state = json.loads(ckpt.read_text())
    assert 1 <= state["items_done"] < 12
    assert f"exit={PREEMPTED_REQUEUE}" in out


@pytest.mark.audio
@pytest.mark.parametrize("after_s", [0.3, 0.8])
def test_wrapper_requeues_a_warning_at_any_instant(tmp_path: Path, after_s: float) -> None:
    """USR1 before the fill job runs or before it installed its handler still ends in exit 99."""
    from ttsfleet.fill_jobs.corpus import make_corpus

    manifest = make_corpus(tmp_path / "corpus", 2, seed=4)
    s = spec(tmp_path, manifest, stages="decode,hash", item_delay_s=1.0)
    script = tmp_path / "job.sh"
    script.write_text(render_fill_script(FillShardSpec(**{**s.__dict__, "shard_count": 1}), 0))
    proc = subprocess.Popen(["bash", str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    time.sleep(after_s)  # bash sets its traps at once; python needs longer to install its handlers
    proc.send_signal(signal.SIGUSR1)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == PREEMPTED_REQUEUE, out
