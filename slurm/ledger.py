"""The fill agent's shard ledger: which shards of a dataset were handed to Slurm, as a JSON file.

The queue alone cannot say this (finished jobs leave squeue after MinJobAge and there is no
sacct without slurmdbd), so the agent writes every submission here, atomically, *before* calling
sbatch ("submitting") and again with the job id after. A shard in the ledger is never submitted
again, whatever happens to its job: a requeued job keeps its id and resumes from its checkpoint.
Only a submission that Slurm provably refused is removed again.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ttsfleet.errors import UserError


@dataclass
class ShardEntry:
    state: str  # "submitting" | "submitted" | "unconfirmed"
    gpu_class: str
    at: float
    job_id: str | None = None


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
        if raw.get("dataset") != dataset or raw.get("shard_count") != shard_count:
            raise UserError(f"ledger {p} belongs to dataset {raw.get('dataset')!r} with "
                            f"{raw.get('shard_count')} shards, not {dataset!r} with {shard_count}: "
                            "use another --state file")
        shards = {int(k): ShardEntry(**v) for k, v in raw.get("shards", {}).items()}
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
