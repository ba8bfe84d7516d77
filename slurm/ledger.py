"""The fill agent's shard ledger: which shards of a dataset were handed to Slurm, as a JSON file.

The queue alone cannot say this (finished jobs leave squeue after MinJobAge and there is no
sacct without slurmdbd), so the agent writes every submission here, atomically, *before* calling
sbatch ("submitting") and again with the job id after. A shard in the ledger is not submitted
again while its job lives: a requeued job keeps its id and resumes from its checkpoint. Only a
submission that Slurm provably refused is removed again.

A job can also die without a stop signal (SIGKILL, the OOM killer, a full disk, a checkpoint it
cannot read): Slurm records it FAILED and never requeues it. The agent then marks the shard
``failed`` with what it knows of the failure and resubmits it after a backoff, at most
``max_retries`` times (:class:`RetryPolicy`); the resubmitted job resumes from the shard's last
checkpoint. A shard that used up its retries stays ``failed`` (stalled) until someone looks: the
agent exports the count as ``ttsfleet_slurm_fill_shards_stalled``.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from ttsfleet.errors import UserError

#: Ledger states. ``submitting``/``unconfirmed``: a submission whose outcome is not yet known;
#: ``submitted``: a job id Slurm holds; ``failed``: the last job ended without finishing the
#: shard; ``complete``: the shard's checkpoint says complete.
STATES = ("submitting", "submitted", "unconfirmed", "failed", "complete")


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how soon a shard whose job failed is submitted again."""

    max_retries: int = 3
    backoff_s: float = 30.0  # first retry; doubles per failure
    max_backoff_s: float = 900.0

    def __post_init__(self) -> None:
        if self.max_retries < 0 or self.backoff_s < 0 or self.max_backoff_s < self.backoff_s:
            raise UserError("retry policy: max_retries >= 0 and 0 <= backoff <= max backoff")

    def delay(self, failures: int) -> float:
        """Seconds to wait after the ``failures``-th failure (1-based) before resubmitting."""
        return min(self.backoff_s * 2 ** max(failures - 1, 0), self.max_backoff_s)

    def exhausted(self, failures: int) -> bool:
        return failures > self.max_retries


@dataclass
class ShardEntry:
    state: str  # one of STATES
    gpu_class: str
    at: float
    job_id: str | None = None
    failures: int = 0  # jobs of this shard that ended without finishing it
    last_failure: str | None = None  # e.g. "job 12 FAILED exit 137 (SIGKILL/OOM?)"
    retry_at: float | None = None  # not resubmitted before this time


@dataclass
class Ledger:
    path: Path
    dataset: str
    shard_count: int
    shards: dict[int, ShardEntry] = field(default_factory=dict)
    signalled: dict[str, float] = field(default_factory=dict)  # job id -> when the agent evicted it

    @classmethod
    def load(cls, path: str | Path, dataset: str, shard_count: int) -> Ledger:
        p = Path(path)
        if not p.exists():
            return cls(p, dataset, shard_count)
        try:
            raw = json.loads(p.read_text())
        except (OSError, ValueError) as exc:
            raise UserError(f"fill agent ledger {p} is unreadable: {exc}") from None
        if not isinstance(raw, dict):
            raise UserError(f"fill agent ledger {p} is not a JSON object: use another --state file")
        if raw.get("dataset") != dataset or raw.get("shard_count") != shard_count:
            raise UserError(f"ledger {p} belongs to dataset {raw.get('dataset')!r} with "
                            f"{raw.get('shard_count')} shards, not {dataset!r} with {shard_count}: "
                            "use another --state file")
        known = {f.name for f in fields(ShardEntry)}
        try:
            shards = {int(k): ShardEntry(**{a: b for a, b in v.items() if a in known})
                      for k, v in raw.get("shards", {}).items()}
        except (TypeError, ValueError, AttributeError) as exc:
            raise UserError(f"fill agent ledger {p} is malformed: {exc}") from None
        return cls(p, dataset, shard_count, shards, dict(raw.get("signalled", {})))

    def save(self) -> None:
        data = {"dataset": self.dataset, "shard_count": self.shard_count,
                "shards": {str(k): asdict(v) for k, v in sorted(self.shards.items())},
                "signalled": self.signalled}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=self.path.name, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def untaken(self, also_taken: set[int]) -> list[int]:
        return [i for i in range(self.shard_count) if i not in self.shards and i not in also_taken]

    def retry_due(self, now: float, retry: RetryPolicy) -> list[int]:
        """Failed shards whose backoff has passed and whose retries are not used up."""
        return [i for i, e in sorted(self.shards.items())
                if e.state == "failed" and not retry.exhausted(e.failures)
                and (e.retry_at or 0.0) <= now]

    def stalled(self) -> list[int]:
        """Shards whose last job failed and that no job carries now."""
        return [i for i, e in sorted(self.shards.items()) if e.state == "failed"]
