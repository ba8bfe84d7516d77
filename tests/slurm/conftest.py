"""Fixtures for the Slurm tests: one real local cluster per session, backends, a speech corpus.

The cluster (munged, slurmctld, one slurmd with 4 fake h200 GPUs, slurmrestd when installed,
MariaDB + slurmdbd for sacct when installed)
lives under a pytest temp dir on free ports; its daemons are stopped at session end by a
finalizer and, should the run die, by the cluster's atexit hook. Each test that uses the cluster
starts and ends with an empty queue.

``TTSFLEET_SLURM_PREFIX=/opt/slurm-25.11`` runs the whole session against that Slurm installation
instead (its commands first on ``PATH``): how the pyslurm backend's tests run for real, since
PyPI's pyslurm needs Slurm 25.11 (see slurm/README.md, "pyslurm backend").
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from ttsfleet.devtools.localcluster import (
    SLURM_PREFIX_ENV,
    LocalCluster,
    LocalClusterSpec,
    missing_binaries,
    restd_supported,
    slurm_path,
)
from ttsfleet.slurm.backend import JobInfo
from ttsfleet.slurm.cli_backend import CliBackend

GRACE_PERIOD_S = 5
CRED_EXPIRE_S = 5


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "the local Slurm cluster needs root"
    missing = missing_binaries()
    if missing:
        return f"Slurm/munge not installed (missing {', '.join(missing)})"
    return None


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    restd = not missing_binaries(restd=True) and restd_supported()
    dbd = not missing_binaries(dbd=True)  # accounting (sacct) where slurmdbd + MariaDB are installed
    spec = LocalClusterSpec(nodes=1, cpus_per_node=8, gpus_per_node=4, gpu_class="h200",
                            grace_period_s=GRACE_PERIOD_S, kill_wait_s=2, cred_expire_s=CRED_EXPIRE_S,
                            restd=restd, dbd=dbd)
    c = LocalCluster(tmp_path_factory.mktemp("slurm-cluster"), spec)
    with pytest.MonkeyPatch.context() as mp:
        if os.environ.get(SLURM_PREFIX_ENV):  # the tests' own Slurm commands come from there too
            mp.setenv("PATH", slurm_path())
        try:
            c.start()
        except Exception:
            c.stop()
            raise
        yield c
        c.stop()


def slurm_version(cluster: LocalCluster) -> str:
    """The cluster's Slurm release (``25.11.7``), from ``scontrol --version``."""
    out = subprocess.run(["scontrol", "--version"], env=cluster.env(), capture_output=True, text=True,
                         check=True).stdout
    return out.split()[-1]


@pytest.fixture
def slurm(cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalCluster]:
    """The session cluster with an empty queue before and after the test; SLURM_CONF set."""
    monkeypatch.setenv("SLURM_CONF", str(cluster.conf_path))
    cluster.cancel_all_jobs()
    yield cluster
    cluster.cancel_all_jobs()


@pytest.fixture
def cli_backend(slurm: LocalCluster) -> CliBackend:
    return CliBackend(str(slurm.conf_path))


def squeue_truth(cluster: LocalCluster) -> list[dict[str, str]]:
    """Jobs straight from ``squeue`` text output (independent of the backends under test)."""
    out = subprocess.run(["squeue", "-h", "-a", "-t", "all", "-o", "%i|%P|%T|%b|%r"], env=cluster.env(),
                         capture_output=True, text=True, check=True).stdout
    keys = ("id", "partition", "state", "tres", "reason")
    return [dict(zip(keys, line.split("|"), strict=True)) for line in out.splitlines() if line.strip()]


def job_by_id(jobs: list[JobInfo], job_id: str) -> JobInfo | None:
    return next((j for j in jobs if j.job_id == job_id), None)


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 32-item espeak-ng speech manifest (the fill jobs' real input)."""
    if shutil.which("espeak-ng") is None:
        pytest.skip("needs espeak-ng")
    from ttsfleet.fill_jobs.corpus import make_corpus

    return make_corpus(tmp_path_factory.mktemp("corpus"), 32, seed=7)
