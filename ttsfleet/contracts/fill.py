"""The fill door: how a scheduler starts a fill job, and what the job leaves behind for it.

Two adapters run fill jobs — the operator (one pod per shard) and the Slurm agent (one sbatch job
per shard) — and both hand-run examples (``fill_jobs/slurm-fill.sh``, ``fill_jobs/
k8s-indexed-job.yaml``) are rendered from the same facts:

* the job's command line after ``ttsfleet fill run``: :func:`fill_argv`;
* the variables the job reads (:data:`JOB_ENV`, :data:`METRICS_PORT_ENV`, :data:`SHARD_ENV`,
  :data:`SHARDS_ENV`, :data:`STATE_FILE_ENV`) and its metrics port :data:`METRICS_PORT`;
* the defaults both sides start from: :data:`GRACE_PERIOD_S` (stop signal to kill),
  :data:`CHECKPOINT_INTERVAL_S` and :data:`CHECKPOINT_EVERY_ITEMS`;
* one checkpoint layout: shard ``I`` of ``N`` writes :func:`checkpoint_file` under the directory
  given as ``--checkpoint``, and every reader (the Slurm agent on the shared filesystem, the
  operator through the pod's termination message, ``ttsfleet fill status``) reads it with
  :func:`shard_state` / :func:`parse_shard_state`;
* the work a stop would lose, :func:`work_at_risk`: the one function the operator, the Slurm agent,
  the simulator and the job's own gauge call.

The exit codes live next door in :mod:`ttsfleet.contracts.exits`. ``tests/doors/`` crosses this
door from both sides: each adapter's argv through the real ``fill run`` parser, and a checkpoint a
real job wrote read back by the operator's and the agent's code.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# --- what the job reads from its environment -------------------------------------------------------
#: The ``fill_job`` label of the job's metrics (default: output directory + shard).
JOB_ENV = "TTSFLEET_FILL_JOB"
#: Serve Prometheus metrics on this port.
METRICS_PORT_ENV = "TTSFLEET_FILL_METRICS_PORT"
#: ``I/N``: the shard, when ``--shard`` is not given.
SHARD_ENV = "TTSFLEET_FILL_SHARD"
#: The shard count of a Kubernetes indexed Job (the pod only knows ``JOB_COMPLETION_INDEX``).
SHARDS_ENV = "TTSFLEET_FILL_SHARDS"
#: A file the job rewrites with its shard state after every checkpoint: on Kubernetes the pod's
#: termination message file, so the kubelet hands the last checkpoint to the operator in the pod
#: status, whatever way the container ended.
STATE_FILE_ENV = "TTSFLEET_FILL_STATE_FILE"
#: The Kubernetes default ``terminationMessagePath`` (what the operator points STATE_FILE_ENV at).
TERMINATION_LOG = "/dev/termination-log"

#: The port a fill job's metrics listen on in a pod.
METRICS_PORT = 9400

# --- defaults both sides start from ---------------------------------------------------------------
#: Seconds between the stop signal and the kill: the fill pod's terminationGracePeriodSeconds, the
#: Slurm fill partition's GraceTime and the sbatch ``--signal`` lead. The job checkpoints within
#: about a second of the signal (measured: ``benchmarks/fill_jobs/RESULTS.md``).
GRACE_PERIOD_S = 30
#: Seconds between checkpoints: ``fill run --checkpoint-every-seconds`` and the policy's
#: ``checkpoint_interval_s``.
CHECKPOINT_INTERVAL_S = 60.0
#: Items between checkpoints (whichever of the two comes first).
CHECKPOINT_EVERY_ITEMS = 100


def fill_argv(*, manifest: str, output: str, checkpoint: str, shard: str | None = None,
              stages: str | None = None, checkpoint_every_s: float | None = None,
              checkpoint_every_items: int | None = None, item_delay_s: float | None = None) -> list[str]:
    """The arguments after ``ttsfleet fill run`` for one shard.

    ``shard`` is ``I/N`` (or a shell expression that expands to it); ``None`` leaves it to the
    environment (:data:`SHARD_ENV`, Slurm array or indexed-Job variables). Values are returned as
    given, so a caller may pass shell expressions and quote the rest itself.
    """
    argv = ["--input", manifest, "--output", output, "--checkpoint", checkpoint]
    if shard is not None:
        argv += ["--shard", shard]
    if stages:
        argv += ["--stages", stages]
    if checkpoint_every_s is not None:
        argv += ["--checkpoint-every-seconds", f"{checkpoint_every_s:g}"]
    if checkpoint_every_items is not None:
        argv += ["--checkpoint-every-items", str(checkpoint_every_items)]
    if item_delay_s is not None:
        argv += ["--item-delay-seconds", f"{item_delay_s:g}"]
    return argv


# --- the checkpoint layout -------------------------------------------------------------------------
def shard_name(index: int, count: int) -> str:
    """``shard-0003-of-0008``: a shard's name in file names (its checkpoint, lock, output part)."""
    return f"shard-{index:04d}-of-{count:04d}"


def checkpoint_file(directory: str | Path, index: int, count: int) -> Path:
    """Where shard ``index`` of ``count`` keeps its checkpoint under the job's ``--checkpoint``
    directory. Every shard of a job shares the directory (one file and one lock each)."""
    return Path(directory) / f"{shard_name(index, count)}.json"


@dataclass(frozen=True)
class ShardState:
    """What a scheduler needs from a shard's checkpoint: how far it got and when it last committed."""

    shard_index: int
    shard_count: int
    state: str  # "running" | "stopped" | "complete"
    items_done: int
    items_total: int
    last_checkpoint_at: float  # Unix seconds

    @property
    def complete(self) -> bool:
        return self.state == "complete"

    def to_json(self) -> str:
        """The compact form the job writes to :data:`STATE_FILE_ENV` (a subset of the checkpoint's
        keys, so :func:`parse_shard_state` reads both)."""
        return json.dumps({k: getattr(self, k) for k in _STATE_KEYS}, separators=(",", ":"))


_STATE_KEYS = ("shard_index", "shard_count", "state", "items_done", "items_total", "last_checkpoint_at")


def state_of(doc: Mapping[str, Any]) -> ShardState | None:
    """The :class:`ShardState` of a checkpoint document (the full checkpoint or the compact form);
    None when it is not one."""
    try:
        return ShardState(int(doc["shard_index"]), int(doc["shard_count"]), str(doc["state"]),
                          int(doc["items_done"]), int(doc["items_total"]), float(doc["last_checkpoint_at"]))
    except (KeyError, TypeError, ValueError):
        return None


def parse_shard_state(text: str | None) -> ShardState | None:
    """A shard state from checkpoint text (a file, a termination message); None when it is none."""
    try:
        doc = json.loads(text or "")
    except ValueError:
        return None
    return state_of(doc) if isinstance(doc, dict) else None


def shard_state(directory: str | Path, index: int, count: int) -> ShardState | None:
    """Shard ``index`` of ``count``'s state from its checkpoint file; None while it has none (not
    started yet, or unreadable: a reader never fails on a job's file)."""
    try:
        text = checkpoint_file(directory, index, count).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    return parse_shard_state(text)


# --- work at risk ------------------------------------------------------------------------------------
def work_at_risk(now: float, started_at: float | None, last_checkpoint_at: float | None = None,
                 interval_s: float | None = None) -> float:
    """Seconds of work a stop at ``now`` would lose: since the later of this run's start and its last
    checkpoint. A checkpoint older than the start belongs to an earlier run (the resumed work since
    the start is at risk). Without a known checkpoint, a job that checkpoints every ``interval_s``
    since it started is assumed (``None``: it never did). Not started: nothing to lose.

    Pure, so the policy's victims (least work at risk first) are the same whichever adapter
    observed them.
    """
    if started_at is None:
        return 0.0 if last_checkpoint_at is None else max(now - last_checkpoint_at, 0.0)
    ran = max(now - started_at, 0.0)
    if last_checkpoint_at is not None and last_checkpoint_at >= started_at:
        return min(max(now - last_checkpoint_at, 0.0), ran)
    if last_checkpoint_at is None and interval_s:
        return ran % interval_s
    return ran
