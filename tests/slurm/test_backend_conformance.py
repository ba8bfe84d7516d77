"""The same conformance tests for every Slurm backend, against the real local cluster.

Backends: Slurm's commands with JSON output, the same with ``scontrol -o`` text output (what
Slurm versions without ``--json`` get), slurmrestd over its unix socket, and pyslurm (the C API;
skipped where pyslurm cannot be imported: PyPI's pyslurm builds only against Slurm 25.11).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from ttsfleet.slurm.backend import (
    SlurmBackend,
    SlurmUnavailable,
    SubmitRejected,
    SubmitRequest,
    pending_training_gpus,
)
from ttsfleet.slurm.cli_backend import CliBackend
from ttsfleet.slurm.localcluster import LocalCluster, free_port
from ttsfleet.slurm.rest_backend import RestBackend

from .conftest import GRACE_TIME_S, job_by_id, squeue_truth, wait_for

pytestmark = pytest.mark.slurm

BACKENDS = ["cli-json", "cli-text", "rest", "pyslurm"]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, slurm: LocalCluster) -> Iterator[SlurmBackend]:
    if request.param == "pyslurm":
        from ttsfleet.slurm.pyslurm_backend import PyslurmBackend

        try:
            b = PyslurmBackend(str(slurm.conf_path))
        except SlurmUnavailable as exc:
            pytest.skip(str(exc))
        yield b
        return
    if request.param == "rest":
        if not slurm.spec.restd:
            pytest.skip("slurmrestd not installed")
        b = RestBackend(f"unix:{slurm.restd_socket}")
        yield b
        b.close()
        return
    yield CliBackend(str(slurm.conf_path), json_output=request.param == "cli-json")


def script(body: str) -> str:
    return f"#!/bin/bash\n{body}\n"


def request_for(tmp_path: Path, name: str, partition: str, gpus: int, body: str = "sleep 60",
                **kw) -> SubmitRequest:
    return SubmitRequest(script=script(body), name=name, partition=partition, gres=f"gpu:h200:{gpus}",
                         output=str(tmp_path / f"{name}-%j.out"), workdir=str(tmp_path), **kw)


def test_partitions_and_nodes(backend: SlurmBackend, slurm: LocalCluster) -> None:
    backend.ping()
    parts = {p.name: p for p in backend.partitions()}
    assert set(parts) == {"train", "fill"}
    assert parts["train"].priority_tier > parts["fill"].priority_tier
    assert parts["fill"].preempt_mode == "REQUEUE" and parts["fill"].grace_time_s == GRACE_TIME_S
    assert parts["train"].preempt_mode == "OFF"
    assert parts["fill"].nodes == tuple(slurm.node_names)
    (node,) = backend.nodes()
    assert node.gpus == {"h200": 4} and node.available
    assert set(node.partitions) == {"train", "fill"}


def test_submit_list_signal_cancel(backend: SlurmBackend, slurm: LocalCluster, tmp_path: Path) -> None:
    marker, ready = tmp_path / "usr1", tmp_path / "ready"
    body = f"trap 'echo got >> {marker}' USR1\ntouch {ready}\nwhile true; do sleep 0.1; done"
    req = request_for(tmp_path, "conf-fill", "fill", 1, body, comment="ttsfleet-fill:ds:0/1",
                      signal="B:USR1@5")
    job_id = backend.submit(req)
    assert job_id.isdigit()
    job = wait_for(lambda: (j := job_by_id(backend.jobs(), job_id)) and j.state == "RUNNING" and j,
                   30, "the job to run")
    assert (job.partition, job.name, job.gpus, job.gpu_class) == ("fill", "conf-fill", 1, "h200")
    assert job.comment == "ttsfleet-fill:ds:0/1" and job.nodes == "n1" and job.restart_count == 0
    truth = {t["id"]: t for t in squeue_truth(slurm)}
    assert truth[job_id]["state"] == "RUNNING" and truth[job_id]["partition"] == "fill"
    (node,) = backend.nodes()
    if node.gpus_used is not None:
        assert node.gpus_used == {"h200": 1}
    wait_for(ready.exists, 30, "the batch script to install its trap")
    backend.cancel(job_id, signal="USR1", batch_only=True)
    wait_for(lambda: marker.exists() and "got" in marker.read_text(), 15, "USR1 in the batch shell")
    assert job_by_id(backend.jobs(), job_id).state == "RUNNING"  # a signal is not a cancel
    backend.cancel(job_id)
    wait_for(lambda: not job_by_id(backend.jobs(), job_id).active, 30, "the job to end")


def test_pending_training_demand(backend: SlurmBackend, tmp_path: Path) -> None:
    running = backend.submit(request_for(tmp_path, "train-a", "train", 3))
    wait_for(lambda: (j := job_by_id(backend.jobs(), running)) and j.state == "RUNNING", 30, "train-a")
    waiting = backend.submit(request_for(tmp_path, "train-b", "train", 2))
    job = wait_for(lambda: (j := job_by_id(backend.jobs(), waiting)) and j.waiting and j, 30, "train-b")
    time.sleep(0.5)  # one more scheduling pass: still waiting, for resources
    assert job_by_id(backend.jobs(), waiting).state == "PENDING"
    assert pending_training_gpus(backend.jobs(), "fill") == {"h200": 2}
    assert job.gpus == 2


def test_rejected_submission_surfaces_slurm_message(backend: SlurmBackend, tmp_path: Path) -> None:
    before = {j.job_id for j in backend.jobs()}
    with pytest.raises(SubmitRejected, match="(?i)invalid partition"):
        backend.submit(request_for(tmp_path, "bad", "no-such-partition", 1))
    with pytest.raises(SubmitRejected, match="(?i)(requested node configuration|gres)"):
        backend.submit(request_for(tmp_path, "too-big", "fill", 64))
    # Slurm may keep a FAILED record (BadConstraints) of a refused job, but nothing waits or runs
    assert not [j for j in backend.jobs() if j.job_id not in before and (j.active or j.waiting)]


def test_unreachable_slurm(slurm: LocalCluster, tmp_path: Path) -> None:
    dead = tmp_path / "slurm.conf"
    text = slurm.conf_path.read_text()
    dead.write_text("\n".join(f"SlurmctldPort={free_port()}" if line.startswith("SlurmctldPort=") else line
                              for line in text.splitlines()) + "\n")
    with pytest.raises(SlurmUnavailable, match="not responding"):
        CliBackend(str(dead)).ping()
    missing = tmp_path / "no.sock"
    with RestBackend(f"unix:{missing}") as rest, pytest.raises(SlurmUnavailable, match="unreachable"):
        rest.jobs()
    assert not os.path.exists(missing)
