"""The worker pool and the batch-stage thread: order, bounds, and nothing outliving a stop."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import pytest
from ttsfleet.fill_jobs.batching import GroupRunner


class SlowStage:
    """Marks each result and takes ``secs`` per group."""

    def __init__(self, secs: float) -> None:
        self.secs = secs
        self.seen: list[int] = []

    def process(self, results: list) -> None:
        time.sleep(self.secs)
        self.seen.append(results[0].position)
        for r in results:
            r.row["done"] = True


class Result:
    def __init__(self, position: int) -> None:
        self.position = position
        self.row: dict = {}
        self.stage_seconds: dict = {}


def test_group_runner_keeps_order_and_abandons_unstarted_groups_on_stop() -> None:
    stop = threading.Event()
    stage = SlowStage(0.3)
    runner = GroupRunner([("slow", stage)], depth=3, should_stop=stop.is_set)
    groups = [[Result(i)] for i in range(4)]
    for g in groups:
        runner.submit(g)
    time.sleep(0.1)  # group 0 is in progress, 1-3 wait
    stop.set()
    kept = list(runner.drain())
    runner.close()
    assert [g[0].position for g in kept] == [0] and kept[0][0].row == {"done": True}
    assert stage.seen == [0]  # the waiting groups never ran (they are redone after the restart)
    assert "slow" in kept[0][0].stage_seconds


def test_group_runner_hands_a_stage_error_to_the_job() -> None:
    class Broken:
        def process(self, results: list) -> None:
            raise RuntimeError("CUDA out of memory (test)")

    runner = GroupRunner([("broken", Broken())])
    runner.submit([Result(0)])
    with pytest.raises(RuntimeError, match="out of memory"):
        list(runner.drain())
    runner.close()


def _children(pid: int) -> set[int]:
    out = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.add(int(stat.parent.name))
    return out


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.audio
def test_workers_die_with_a_sigkilled_job(cli, clean_corpus, dirs, tmp_path: Path) -> None:
    """A worker that outlived its job would hold the shard lock against the restart."""
    config = tmp_path / "clean.yaml"
    config.write_text("workers: 2\n")
    args = ("--stages", "decode,hash", "--config", str(config), "--item-delay-seconds", "0.5")
    proc = cli.start(clean_corpus, dirs, *args)
    cli.wait_for_event(proc, "started")
    workers = _children(proc.pid)
    assert len(workers) >= 2
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    proc.stderr.close()
    proc.stdout.close()
    deadline = time.monotonic() + 10
    while any(_alive(w) for w in workers):
        assert time.monotonic() < deadline, "workers outlived the SIGKILLed job"
        time.sleep(0.1)
    final = cli.run(clean_corpus, dirs, "--stages", "decode,hash", "--config", str(config))
    assert final.returncode == 0, final.stderr
