"""Atomic writes, the shard lock, the checkpoint round trip and the cleaning config file."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from ttsfleet.fill_jobs.atomic import write_bytes_atomic
from ttsfleet.fill_jobs.checkpoint import (
    ShardCheckpoint,
    ShardLock,
    load_all,
    load_checkpoint,
    save_checkpoint,
)
from ttsfleet.fill_jobs.settings import CleaningConfig, load_config

from ttsfleet.errors import UserError


def test_atomic_write_replaces_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "f.json"
    write_bytes_atomic(target, b"one")
    write_bytes_atomic(target, b"two")
    assert target.read_bytes() == b"two"
    assert [p.name for p in target.parent.iterdir()] == ["f.json"]


def test_checkpoint_round_trip_and_status_fields(tmp_path: Path) -> None:
    ckpt = ShardCheckpoint(job="j", manifest="m", manifest_sha256="x", shard_index=1, shard_count=4,
                           stages=["decode"], config_digest="d", items_total=10, items_done=4,
                           active_seconds=2.0)
    path = tmp_path / "shard-0001-of-0004.json"
    save_checkpoint(path, ckpt)
    back = load_checkpoint(path)
    assert back is not None and back.items_done == 4 and back.checkpoints_written == 1
    assert back.rate_items_per_second == 2.0 and back.eta_seconds == 3.0
    assert [c.shard for c in load_all(tmp_path)] == ["1/4"]
    path.write_text("{ torn")
    with pytest.raises(UserError, match="unreadable"):
        load_checkpoint(path)


def test_shard_lock_excludes_a_second_process(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path;"
         "from ttsfleet.fill_jobs.checkpoint import ShardLock;"
         "lock = ShardLock(Path(sys.argv[1]), 'shard-0000-of-0001').__enter__();"
         "print('locked', flush=True); time.sleep(30)", str(tmp_path)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        t0 = time.monotonic()
        with pytest.raises(UserError, match="already running"), ShardLock(tmp_path, "shard-0000-of-0001",
                                                                          timeout=0.5):
            pass
        assert time.monotonic() - t0 >= 0.5
    finally:
        holder.kill()
        holder.wait()
    with ShardLock(tmp_path, "shard-0000-of-0001", timeout=5):  # released when its holder died
        pass


def test_config_file_camel_case_and_errors(tmp_path: Path) -> None:
    good = tmp_path / "clean.yaml"
    good.write_text("minSnrDb: 20\ntargetLufs: -18\nmax_segment_seconds: 10\n")
    cfg = load_config(good)
    assert (cfg.min_snr_db, cfg.target_lufs, cfg.max_segment_seconds) == (20, -18, 10)
    assert cfg.digest() != CleaningConfig().digest()
    assert CleaningConfig(feature_device="cpu").digest() == CleaningConfig().digest()
    bad = tmp_path / "bad.yaml"
    bad.write_text("minSnr: 20\n")
    with pytest.raises(UserError, match="minSnr"):
        load_config(bad)
