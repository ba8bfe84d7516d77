"""The fill door's checkpoint, crossed: what a real fill job leaves behind, read by both schedulers.

A real ``ttsfleet fill run``, started with the operator's fill pod argv and env, is stopped by
SIGTERM after a checkpoint and then run to the end. After each run the checkpoint it wrote is
read three ways through the contract's one layout and one reader — from disk where the Slurm agent
looks (:meth:`FillShardSpec.shard_state`, ``shard_complete``), and from the pod's termination
message the kubelet would hand the operator (``fillview.pod_shard_state``) — and both adapters
price the stopped shard's lost work with the same :func:`~ttsfleet.contracts.fill.work_at_risk`.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf
from ttsfleet.devtools.ports import free_port
from ttsfleet.operator import fillview as fv
from ttsfleet.operator.models import FillJobSpec
from ttsfleet.slurm import agent
from ttsfleet.slurm.backend import JobInfo
from ttsfleet.slurm.sbatch import FillShardSpec

from ttsfleet.catalog import GpuCatalog
from ttsfleet.contracts import fill as contract
from ttsfleet.contracts.exits import PREEMPTED_REQUEUE

CAT = GpuCatalog.default()
SHARDS = 2


def corpus(directory: Path, n: int = 6) -> Path:
    """``n`` one-second tones (decode and hash need audio, not speech)."""
    (directory / "wav").mkdir(parents=True)
    rows = []
    for i in range(n):
        tone = 0.3 * np.sin(2 * np.pi * (220 + 40 * i) * np.arange(16000) / 16000)
        sf.write(directory / "wav" / f"t{i}.wav", tone.astype("float32"), 16000)
        rows.append({"id": f"t{i}", "audio": f"wav/t{i}.wav", "text": f"tone {i}"})
    manifest = directory / "manifest.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return manifest


def iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


class ShardPod:
    """Shard 0's fill pod as the operator builds it, run here as a process the way a kubelet would:
    its command and args, its env, the termination message file bind-mounted at ``state_file``."""

    def __init__(self, tmp: Path) -> None:
        spec = FillJobSpec.model_validate({
            "image": "x", "manifest": str(corpus(tmp / "data")), "output": str(tmp / "out"),
            "shards": SHARDS, "gpuClasses": ["h200"], "stages": ["decode", "hash"],
            "checkpointVolume": {"claimName": "ckpt", "mountPath": str(tmp / "ckpt")}},
            context={"catalog": CAT})
        self.spec = spec
        pod = fv.fill_pod("clean", "ns1", spec, 0, "h200", "clean-0-0", CAT)
        (self.container,) = pod["spec"]["containers"]
        self.state_file = tmp / "termination-log"
        env = {e["name"]: e["value"] for e in self.container["env"]}
        assert env[contract.STATE_FILE_ENV] == self.container["terminationMessagePath"]
        self.env = {**os.environ, **env, contract.STATE_FILE_ENV: str(self.state_file),
                    contract.METRICS_PORT_ENV: str(free_port())}
        # The FillJob's checkpoint directory as any reader names it: one folder per FillJob on its
        # volume, every shard's file in it (not where the argv says: that is the side under test).
        self.checkpoint_dir = tmp / "ckpt" / "clean"

    def start(self, *extra: str) -> subprocess.Popen[str]:
        assert self.container["command"] == ["ttsfleet", "fill", "run"]
        self.started = math.floor(time.time())
        return subprocess.Popen([sys.executable, "-m", "ttsfleet.cli", *self.container["command"][1:],
                                 *self.container["args"], *extra], env=self.env, text=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def ended(self, code: int) -> dict[str, Any]:
        """The pod as the API server would show it after the container exited with ``code``."""
        self.finished = math.ceil(time.time())
        return {"metadata": {"name": "clean-0-0", "labels": {fv.L_SHARD: "0"}},
                "status": {"phase": "Succeeded" if code == 0 else "Failed", "startTime": iso(self.started),
                           "containerStatuses": [{"state": {"terminated": {
                               "exitCode": code, "startedAt": iso(self.started),
                               "finishedAt": iso(self.finished), "message": self.state_file.read_text()}}}]}}


def slurm_view(checkpoint_root: Path) -> FillShardSpec:
    """The Slurm agent's description of the same shards, over the same checkpoint directory."""
    return FillShardSpec(manifest="/unused.jsonl", output_root="/unused",
                         checkpoint_root=str(checkpoint_root), shard_count=SHARDS, gpu_class="h200",
                         log_dir="/unused")


def wait_for_checkpoint(proc: subprocess.Popen[str], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    assert proc.stderr is not None
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        if json.loads(line).get("event") == "checkpoint":
            return
    pytest.fail("the fill job wrote no checkpoint")


def test_a_checkpoint_the_job_wrote_reads_the_same_for_the_operator_and_the_agent(tmp_path: Path) -> None:
    pod = ShardPod(tmp_path)
    slurm = slurm_view(pod.checkpoint_dir)

    # 1. Preempted after a checkpoint: exit 99, the checkpoint says how far it got.
    proc = pod.start("--item-delay-seconds", "0.4", "--checkpoint-every-items", "1")
    wait_for_checkpoint(proc)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == PREEMPTED_REQUEUE
    proc.stderr.close()
    stopped = pod.ended(PREEMPTED_REQUEUE)
    on_disk = contract.shard_state(pod.checkpoint_dir, 0, SHARDS)
    assert on_disk is not None and not on_disk.complete and 1 <= on_disk.items_done < on_disk.items_total
    assert fv.pod_shard_state(stopped) == on_disk  # the operator, from the termination message
    assert slurm.shard_state(0) == on_disk  # the Slurm agent, from the shared filesystem
    assert not agent.shard_complete(slurm, 0)
    job = JobInfo(job_id="7", name=slurm.job_name(0), partition="fill", state="RUNNING", gpus=1,
                  comment=slurm.comment(0), start_time=pod.started)
    at_risk = contract.work_at_risk(pod.finished, pod.started, on_disk.last_checkpoint_at)
    assert fv.seconds_since_checkpoint(stopped, time.time(), 60) == at_risk
    assert agent.checkpoint_age(slurm, pod.finished)(job) == at_risk
    assert fv.account({}, [stopped], pod.spec, time.time()).preemptions == 1

    # 2. Resumed to the end: both read "complete".
    proc = pod.start()
    assert proc.wait(timeout=120) == 0, proc.stderr.read()
    proc.stderr.close()
    done = pod.ended(0)
    assert fv.pod_shard_state(done) == contract.shard_state(pod.checkpoint_dir, 0, SHARDS)
    assert fv.pod_shard_state(done).complete and agent.shard_complete(slurm, 0)
    assert not agent.shard_complete(slurm, 1)  # the other shard never ran
    assert fv.account({}, [done], pod.spec, time.time()).done == {0}
