"""The per-shard checkpoint: the single record of what is committed.

``CKPT/shard-IIII-of-NNNN.json`` (the layout of :func:`ttsfleet.contracts.fill.checkpoint_file`;
schedulers read it with :func:`ttsfleet.contracts.fill.shard_state`) says how many of the
shard's items (in shard order) and how many output part files are committed, plus counters for
``ttsfleet fill status``. It is replaced atomically (:mod:`ttsfleet.fill_jobs.atomic`) after the
part file it names is durable, so after a kill at any instant the checkpoint and the output
agree; anything newer than the checkpoint is an orphan that the restart removes. Each shard has
its own file and lock, so shards of one job share the directory.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from ttsfleet.fill_jobs.atomic import remove_stale_temps, write_json_atomic

from ttsfleet.contracts.fill import state_of
from ttsfleet.errors import UserError, validation_text

State = Literal["running", "stopped", "complete"]


class ShardCheckpoint(BaseModel):
    """Progress of one shard."""

    model_config = ConfigDict(extra="ignore")

    version: int = 1
    job: str
    manifest: str
    manifest_sha256: str
    shard_index: int
    shard_count: int
    stages: list[str]
    config_digest: str
    items_total: int
    items_done: int = 0
    parts: int = 0
    state: State = "running"
    accepted: int = 0
    rejected: dict[str, int] = Field(default_factory=dict)
    audio_seconds: float = 0.0
    runs: int = 0
    preemptions_survived: int = 0
    orderly_stops: int = 0
    hard_restarts: int = 0
    last_stop_signal: str | None = None
    active_seconds: float = 0.0
    commit_seconds: float = 0.0  # part of active_seconds spent committing (the checkpoint overhead)
    created_at: float = Field(default_factory=time.time)
    last_checkpoint_at: float = Field(default_factory=time.time)
    checkpoints_written: int = 0

    @property
    def shard(self) -> str:
        return f"{self.shard_index}/{self.shard_count}"

    @property
    def rate_items_per_second(self) -> float | None:
        return self.items_done / self.active_seconds if self.active_seconds > 0 else None

    @property
    def eta_seconds(self) -> float | None:
        rate = self.rate_items_per_second
        if self.state == "complete":
            return 0.0
        return (self.items_total - self.items_done) / rate if rate else None


def load_checkpoint(path: Path) -> ShardCheckpoint | None:
    if not path.exists():
        return None
    try:
        return ShardCheckpoint.model_validate(json.loads(path.read_text(encoding="utf-8")))
    except ValidationError as exc:
        raise UserError(f"checkpoint {path} is not a ttsfleet checkpoint ({validation_text(exc, 1)}); "
                        "remove it to start the shard over") from None
    except (OSError, ValueError) as exc:  # ValueError: not JSON, not UTF-8 (a torn or foreign file)
        raise UserError(f"checkpoint {path} is unreadable ({type(exc).__name__}: "
                        f"{str(exc).splitlines()[0] if str(exc) else 'empty'}); remove it to start "
                        "the shard over") from None


def save_checkpoint(path: Path, ckpt: ShardCheckpoint, state_file: Path | None = None) -> None:
    """Write the checkpoint atomically; then, with ``state_file``, its shard state there too."""
    ckpt.last_checkpoint_at = time.time()
    ckpt.checkpoints_written += 1
    doc = ckpt.model_dump(mode="json")
    write_json_atomic(path, doc)
    if state_file is not None:
        publish_state(state_file, doc)


def publish_state(state_file: Path, doc: dict) -> None:
    """Rewrite ``state_file`` in place with the compact shard state (on Kubernetes the container's
    termination message file: a bind mount, so it cannot be replaced by a rename). Best effort: the
    checkpoint on disk stays the record; a scheduler without the message estimates instead."""
    state = state_of(doc)
    if state is None:
        return
    with contextlib.suppress(OSError):
        state_file.write_text(state.to_json(), encoding="utf-8")


def load_all(directory: Path) -> list[ShardCheckpoint]:
    """Every shard checkpoint in ``directory`` (every shard of a job shares it), in shard order."""
    if not directory.is_dir():
        raise UserError(f"checkpoint directory {directory} does not exist")
    found = [c for p in sorted(directory.glob("shard-*-of-*.json")) if (c := load_checkpoint(p))]
    return sorted(found, key=lambda c: (c.shard_count, c.shard_index))


class ShardLock:
    """An exclusive ``flock`` on ``CKPT/<shard>.lock``: one process per shard at a time.

    The kernel drops the lock when its holder dies (even by SIGKILL), so a restarted job gets it
    at once; a second live process for the same shard waits ``timeout`` seconds, then gives up.
    """

    def __init__(self, directory: Path, shard_name: str, timeout: float = 30.0) -> None:
        self.path = directory / f"{shard_name}.lock"
        self.timeout = timeout
        self._fd: int | None = None

    def __enter__(self) -> ShardLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(self._fd)
                    raise UserError(f"another process holds {self.path}; is this shard already "
                                    "running?") from None
                time.sleep(0.1)
        remove_stale_temps(self.path.parent, self.path.stem)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
