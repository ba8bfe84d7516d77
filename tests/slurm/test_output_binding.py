"""Two fill jobs pointed at one ``--output`` on a real cluster: the second is refused, never mixed.

Before, job B silently overwrote job A's shard manifests (exit 0), A's rerun said
``already_complete`` over B's rows, and run concurrently A crashed leaving only B's rows. Now the
output directory is bound to the job that first wrote it (manifest, shard count, stages, config):
another job gets one line and exit 2 before it writes anything, and two processes of one shard
are kept apart by a lock in the output directory itself.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import pytest
from ttsfleet.devtools.localcluster import LocalCluster
from ttsfleet.devtools.wait import wait_for
from ttsfleet.slurm.cli_backend import CliBackend
from ttsfleet.slurm.sbatch import FillShardSpec, fill_submit_request

from .conftest import GRACE_PERIOD_S, job_by_id
from .fillhelpers import fill_pids, output_rows

pytestmark = [pytest.mark.slurm, pytest.mark.audio]


def spec_for(corpus: Path, tmp_path: Path, name: str, shards: int, out: Path, delay=None) -> FillShardSpec:
    spec = FillShardSpec(manifest=str(corpus), output_root=str(out),
                         checkpoint_root=str(tmp_path / f"ckpt-{name}"),
                         shard_count=shards, gpu_class="h200", log_dir=str(tmp_path / f"logs-{name}"),
                         grace_period_s=GRACE_PERIOD_S, stages="decode,hash", item_delay_s=delay,
                         checkpoint_every_items=1, dataset=f"{tmp_path.name}-{name}")
    for d in (spec.log_dir, spec.checkpoint_root):
        Path(d).mkdir(parents=True, exist_ok=True)
    return spec


def finished(backend: CliBackend, job_id: str, timeout: float = 90):
    return wait_for(lambda: (j := job_by_id(backend.jobs(), job_id)) and not j.live and j, timeout,
                    f"job {job_id} to end")


def log_of(spec: FillShardSpec, job_id: str) -> str:
    return next(Path(spec.log_dir).glob(f"*-{job_id}.out")).read_text()


def snapshot(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file() and ".locks" not in p.parts}


def test_a_second_job_on_one_output_is_refused_in_one_line(slurm: LocalCluster, corpus: Path,
                                                           tmp_path: Path) -> None:
    backend = CliBackend(str(slurm.conf_path))
    out = tmp_path / "out"
    a = spec_for(corpus, tmp_path, "a", 2, out)
    ids = [backend.submit(fill_submit_request(a, i)) for i in range(2)]
    assert all(finished(backend, i).state == "COMPLETED" for i in ids)
    rows_a, files_a = output_rows(out), snapshot(out)
    assert len(rows_a) == 32

    b = spec_for(corpus, tmp_path, "b", 3, out)  # another shard count: other rows under the same names
    job_b = backend.submit(fill_submit_request(b, 0))
    jb = finished(backend, job_b)
    assert (jb.state, jb.exit_code) == ("FAILED", 2)
    errors = [line for line in log_of(b, job_b).splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "belongs to another fill job" in errors[0], log_of(b, job_b)
    assert "the shard count differs (2 there, 3 here)" in errors[0]
    assert "Traceback" not in log_of(b, job_b)
    assert snapshot(out) == files_a  # nothing of A was touched

    again = backend.submit(fill_submit_request(a, 1))  # A's rerun is still A's no-op
    assert finished(backend, again).state == "COMPLETED"
    assert "already_complete" in log_of(a, again) and output_rows(out) == rows_a


def test_concurrent_jobs_on_one_output_are_kept_apart(slurm: LocalCluster, corpus: Path,
                                                      tmp_path: Path) -> None:
    backend = CliBackend(str(slurm.conf_path))
    out = tmp_path / "out"
    # one shard twice at once (separate checkpoint directories) and a different job at once.
    # The first job must still hold the shard while the twin waits for its lock (5 s; a twin that
    # starts after it finished finds the shard complete and exits 0): it is paused (SIGSTOP) once
    # it has started, however late the twin starts under load, and resumed once both were refused
    # (before: 32 items x 0.6 s, since a twin under load once started after 32 x 0.2 s had passed).
    first = spec_for(corpus, tmp_path, "first", 1, out, delay=0.2)
    twin = spec_for(corpus, tmp_path, "twin", 1, out, delay=0.2)
    other = spec_for(corpus, tmp_path, "other", 4, out, delay=0.2)
    j1 = backend.submit(fill_submit_request(first, 0))
    wait_for(lambda: (Path(first.checkpoint_root) / "shard-0000-of-0001.json").exists(), 60, "first to start")
    paused = wait_for(lambda: fill_pids(first, 0), 30, "the first job's fill process")
    for pid in paused:
        os.kill(pid, signal.SIGSTOP)
    try:
        assert job_by_id(backend.jobs(), j1).state == "RUNNING"  # paused while it holds the shard
        j2 = backend.submit(fill_submit_request(twin, 0))
        j3 = backend.submit(fill_submit_request(other, 0))
        r2, r3 = finished(backend, j2), finished(backend, j3)
    finally:
        for pid in paused:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    assert (r2.state, r2.exit_code) == ("FAILED", 2) and "another process holds" in log_of(twin, j2)
    assert (r3.state, r3.exit_code) == ("FAILED", 2) and "belongs to another fill job" in log_of(other, j3)
    assert finished(backend, j1, 120).state == "COMPLETED"
    rows = output_rows(out)
    assert len(rows) == len({r[0] for r in rows}) == 32
    assert list(out.glob("manifest.shard-*.jsonl")) == [out / "manifest.shard-0000-of-0001.jsonl"]
