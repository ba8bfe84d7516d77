"""The local cluster bring-up: the config it runs is the one a site adopts, and stop() leaves nothing."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from ttsfleet.devtools.localcluster import LocalCluster, LocalClusterSpec, _pid_alive
from ttsfleet.devtools.wait import wait_for
from ttsfleet.slurm.validate import validate_file

from ttsfleet.catalog import GpuCatalog

from .conftest import _skip_reason

pytestmark = pytest.mark.slurm


def test_session_cluster_config_passes_the_validator(slurm: LocalCluster) -> None:
    assert validate_file(str(slurm.conf_path), GpuCatalog.default()) == []


def test_jobs_see_their_fake_gpus(slurm: LocalCluster, tmp_path: Path) -> None:
    out = tmp_path / "gpus.out"
    subprocess.run(["sbatch", "-p", "train", "--gres=gpu:h200:2", "-o", str(out), "--wrap",
                    "echo CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"], env=slurm.env(), check=True,
                   capture_output=True)
    wait_for(lambda: out.exists() and "CUDA_VISIBLE_DEVICES=" in out.read_text(), 30, "the job's output")
    assert out.read_text().strip() == "CUDA_VISIBLE_DEVICES=0,1"


def test_second_cluster_coexists_and_stops_completely(cluster: LocalCluster, tmp_path: Path) -> None:
    if _skip_reason():
        pytest.skip(_skip_reason())
    other = LocalCluster(tmp_path / "c2", LocalClusterSpec(gpus_per_node=2, gpu_class="rtx5090"))
    try:
        other.start()
        assert other.ctld_port != 0 and other.conf_path != cluster.conf_path
        pidfiles = [other.run / "slurmctld.pid", other.run / "slurmd-n1.pid", other.munge_dir / "munged.pid"]
        pids = [int(p.read_text()) for p in pidfiles]
        assert all(_pid_alive(p) for p in pids)
        sinfo = subprocess.run(["sinfo", "-h", "-o", "%G"], env=other.env(), capture_output=True, text=True)
        assert "gpu:rtx5090:2" in sinfo.stdout
    finally:
        other.stop()
    assert not any(_pid_alive(p) for p in pids)
    assert not any(p.exists() for p in pidfiles)
    # the session cluster is untouched
    assert _pid_alive(int((cluster.run / "slurmctld.pid").read_text()))
    assert os.path.exists(cluster.munge_socket)
