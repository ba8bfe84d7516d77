"""Shards whose job dies without a stop signal are found and finished, on a real cluster.

SIGKILL (what the OOM killer sends: exit 137), a full disk (the fill job exits 2 with one line)
and a checkpoint it cannot read all leave the job FAILED, never requeued. The agent must notice
the shard is neither live nor complete, resubmit it (after a backoff, within a retry budget),
and the resubmitted job must resume from the checkpoint so that the output equals an
uninterrupted run. A shard that keeps failing is given up on and shows as stalled.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from ttsfleet.devtools.localcluster import LocalCluster
from ttsfleet.devtools.wait import wait_for
from ttsfleet.slurm.agent import FillAgent
from ttsfleet.slurm.cli_backend import CliBackend
from ttsfleet.slurm.ledger import Ledger, RetryPolicy
from ttsfleet.slurm.sbatch import FillShardSpec

from ttsfleet.config import FillPolicyConfig
from ttsfleet.metrics import make_collectors

from .conftest import GRACE_PERIOD_S, job_by_id
from .fillhelpers import audio_bytes, fill_pids, items_done, output_rows, uninterrupted_run

pytestmark = [pytest.mark.slurm, pytest.mark.audio]


def make_spec(corpus: Path, tmp_path: Path, shards: int, delay: float | None, out: Path | None = None,
              **kw) -> FillShardSpec:
    spec = FillShardSpec(manifest=str(corpus), output_root=str(out or tmp_path / "out"),
                         checkpoint_root=str(tmp_path / "ckpt"), shard_count=shards, gpu_class="h200",
                         log_dir=str(tmp_path / "logs"), grace_period_s=GRACE_PERIOD_S, stages="decode,hash",
                         item_delay_s=delay, checkpoint_every_items=1, dataset=tmp_path.name, **kw)
    for d in (spec.log_dir, spec.output_root, spec.checkpoint_root):
        Path(d).mkdir(parents=True, exist_ok=True)
    return spec


def make_agent(backend, spec: FillShardSpec, tmp_path: Path, retries: int, backoff: float):
    collectors = make_collectors("slurm")
    policy = FillPolicyConfig(grace_period_s=GRACE_PERIOD_S)
    agent = FillAgent(backend, spec, policy, tmp_path / "ledger.json",
                      collectors=collectors, retry=RetryPolicy(max_retries=retries, backoff_s=backoff))
    return agent, collectors


def gauge(collectors, name: str, spec: FillShardSpec) -> float:
    return collectors.registry.get_sample_value(f"ttsfleet_{name}", {"dataset": spec.name})


def run_until_complete(agent: FillAgent, timeout: float) -> list:
    reports = []

    def done():
        reports.append(agent.run_once())
        return reports[-1].complete == agent.spec.shard_count

    wait_for(done, timeout, "every shard complete", step=0.5)
    return reports


def test_sigkilled_shard_is_resubmitted_and_output_matches(slurm: LocalCluster, corpus: Path,
                                                           tmp_path: Path) -> None:
    """The OOM killer's SIGKILL: exit 137, FAILED. Before: 'nothing to do' for ever."""
    baseline = uninterrupted_run(corpus, tmp_path / "base-out", tmp_path / "base-ckpt", shards=2)
    backend = CliBackend(str(slurm.conf_path))
    spec = make_spec(corpus, tmp_path, shards=2, delay=0.2)  # 16 items a shard: killed after 2 of them
    agent, collectors = make_agent(backend, spec, tmp_path, retries=2, backoff=1.0)
    first = agent.run_once()
    assert sorted(s[0] for s in first.submitted) == [0, 1]
    job0 = next(j for s, _, j in first.submitted if s == 0)
    wait_for(lambda: items_done(spec, 0) >= 2 and fill_pids(spec, 0), 60, "shard 0 checkpointing")
    for pid in fill_pids(spec, 0):
        os.kill(pid, signal.SIGKILL)  # what the OOM killer does: no signal handler runs
    wait_for(lambda: job_by_id(backend.jobs(), job0).state == "FAILED", 30, "job of shard 0 FAILED")
    assert job_by_id(backend.jobs(), job0).exit_code == 137

    seen = agent.run_once()
    ((shard, what),) = seen.failed
    assert shard == 0 and f"job {job0} FAILED exit 137" in what and "resubmitting" in what
    assert seen.stalled == [0] and gauge(collectors, "slurm_fill_shards_stalled", spec) == 1
    time.sleep(1.1)  # the backoff
    again = agent.run_once()
    assert [s[0] for s in again.submitted] == [0] and again.submitted[0][2] != job0
    assert again.stalled == [] and gauge(collectors, "slurm_fill_shards_stalled", spec) == 0

    run_until_complete(agent, 120)
    assert sorted(output_rows(Path(spec.output_root))) == sorted(baseline)
    assert audio_bytes(Path(spec.output_root)) == audio_bytes(tmp_path / "base-out")
    ledger = Ledger.load(tmp_path / "ledger.json", spec.name, 2)
    assert ledger.shards[0].failures == 1 and ledger.shards[0].state == "complete"
    assert collectors.registry.get_sample_value("ttsfleet_slurm_fill_shard_retries_total",
                                                {"dataset": spec.name}) == 1


def _tmpfs(path: Path, size_kb: int, remount: bool = False) -> bool:
    opts = f"{'remount,' if remount else ''}size={size_kb}k"
    return subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)],
                          capture_output=True).returncode == 0


def test_full_disk_fails_one_line_then_resumes_once_space_is_free(slurm: LocalCluster, corpus: Path,
                                                                  tmp_path: Path) -> None:
    base = tmp_path / "base-out"
    baseline = uninterrupted_run(corpus, base, tmp_path / "base-ckpt", shards=1)
    need_kb = sum(p.stat().st_size for p in base.rglob("*") if p.is_file()) // 1024
    out = tmp_path / "small-disk"
    out.mkdir()
    if shutil.which("mount") is None or not _tmpfs(out, max(need_kb // 2, 64)):
        pytest.skip("cannot mount a small tmpfs here (needs root in a mount namespace)")
    try:
        backend = CliBackend(str(slurm.conf_path))
        spec = make_spec(corpus, tmp_path, shards=1, delay=None, out=out)
        agent, collectors = make_agent(backend, spec, tmp_path, retries=3, backoff=0.0)
        (job,) = [j for _, _, j in agent.run_once().submitted]
        wait_for(lambda: job_by_id(backend.jobs(), job).state == "FAILED", 90, "the full disk to fail it")
        log = next(Path(spec.log_dir).glob(f"*-{job}.out")).read_text()
        errors = [line for line in log.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "No space left on device" in errors[0], log
        assert "Traceback" not in log and job_by_id(backend.jobs(), job).exit_code == 2
        assert items_done(spec, 0) > 0  # what it committed before the disk filled is kept
        assert _tmpfs(out, need_kb * 4 + 1024, remount=True)  # the operator frees space
        reports = run_until_complete(agent, 120)
        assert any(r.failed for r in reports) and reports[-1].stalled == []
        assert output_rows(out) == baseline
        assert audio_bytes(out) == audio_bytes(base)
    finally:
        subprocess.run(["umount", "-l", str(out)], capture_output=True)


def test_garbage_checkpoint_uses_up_the_retries_and_stays_stalled(slurm: LocalCluster, corpus: Path,
                                                                 tmp_path: Path) -> None:
    backend = CliBackend(str(slurm.conf_path))
    spec = make_spec(corpus, tmp_path, shards=1, delay=None)
    spec.checkpoint_file(0).write_bytes(b"\x00\xffnot a checkpoint\x00")
    agent, collectors = make_agent(backend, spec, tmp_path, retries=1, backoff=0.0)
    jobs = [j for _, _, j in agent.run_once().submitted]

    def ended(job_id):
        return lambda: not job_by_id(backend.jobs(), job_id).live

    wait_for(ended(jobs[0]), 60, "the first job to end")
    retried = agent.run_once()
    assert [s for s, _ in retried.failed] == [0] and len(retried.submitted) == 1
    wait_for(ended(retried.submitted[0][2]), 60, "the retry to end")
    final = agent.run_once()
    assert final.submitted == [] and final.stalled == [0] and final.given_up == [0]
    assert "out of retries" in final.failed[0][1]
    assert gauge(collectors, "slurm_fill_shards_stalled", spec) == 1
    assert gauge(collectors, "slurm_fill_shards_given_up", spec) == 1
    assert agent.run_once().submitted == []  # given up: no more submissions
    for job in (jobs[0], retried.submitted[0][2]):
        j = job_by_id(backend.jobs(), job)
        assert j.state == "FAILED" and j.exit_code == 2
        log = next(Path(spec.log_dir).glob(f"*-{job}.out")).read_text()
        assert "is unreadable" in log and "Traceback" not in log
    assert json.loads(json.dumps(final.lines()))  # the report renders
