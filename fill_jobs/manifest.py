"""The input manifest (JSONL) and its deterministic sharding.

One JSON object per line: ``audio`` (a path relative to the manifest, an absolute path, or a
``file://`` / ``http(s)://`` URI), ``text`` (the transcript), optional ``speaker``, ``language``
and ``id``. Common spellings from other toolkits are accepted (``audio_filepath``/``path`` for
audio, ``transcript`` for text). Blank lines are skipped; any other malformed line stops the job
with a :class:`~ttsfleet.errors.UserError` naming the line, before any work is done.

Shard ``I/N`` holds the items whose position ``p`` (0-based, blank lines not counted) satisfies
``p % N == I``: deterministic, balanced, and independent of how often the job restarts.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError, field_validator

from ttsfleet.contracts.fill import SHARD_ENV, SHARDS_ENV, shard_name
from ttsfleet.errors import UserError

ID_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,128}$")


class ManifestItem(BaseModel):
    """One manifest line, validated."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    audio: str = Field(validation_alias=AliasChoices("audio", "audio_filepath", "audio_path", "path",
                                                     "uri"), min_length=1)
    text: str = Field(validation_alias=AliasChoices("text", "transcript"))
    speaker: str | None = None
    language: str | None = None
    id: str | None = None

    @field_validator("id")
    @classmethod
    def _id_is_a_safe_file_name(cls, v: str | None) -> str | None:
        if v is not None and not ID_PATTERN.match(v):
            raise ValueError("id must be 1-128 characters of letters, digits, '_' or '-'")
        return v

    @field_validator("speaker", "language", mode="before")
    @classmethod
    def _stringify(cls, v: object) -> object:
        return str(v) if isinstance(v, int | float) else v


@dataclass(frozen=True)
class Entry:
    """A manifest item with its position in the manifest and the key its outputs are named by."""

    position: int
    line: int
    key: str
    item: ManifestItem


@dataclass(frozen=True)
class Manifest:
    path: Path
    entries: tuple[Entry, ...]
    sha256: str

    def resolve(self, audio: str) -> str:
        """An item's audio as a local path (relative paths are relative to the manifest) or URL."""
        if audio.startswith(("http://", "https://")):
            return audio
        if audio.startswith("file://"):
            audio = audio[len("file://"):]
        p = Path(audio)
        return str(p if p.is_absolute() else self.path.parent / p)


def load_manifest(path: Path) -> Manifest:
    """Read and validate a whole manifest; raises :class:`UserError` naming the first bad line."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise UserError(f"cannot read manifest {path}: {exc.strerror or exc}") from None
    entries: list[Entry] = []
    seen: dict[str, int] = {}
    for lineno, line in enumerate(raw.decode("utf-8", errors="replace").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserError(f"{path} line {lineno}: not valid JSON ({exc.msg})") from None
        if not isinstance(obj, dict):
            raise UserError(f"{path} line {lineno}: expected a JSON object, got {type(obj).__name__}")
        try:
            item = ManifestItem.model_validate(obj)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(x) for x in first["loc"]) or "line"
            missing = first["type"] == "missing"
            msg = f"missing field {where!r}" if missing else f"{where}: {first['msg']}"
            raise UserError(f"{path} line {lineno}: {msg}") from None
        position = len(entries)
        key = item.id or f"item-{position:08d}"
        if key in seen:
            raise UserError(f"{path} line {lineno}: duplicate id {key!r} (first on line {seen[key]})")
        seen[key] = lineno
        entries.append(Entry(position, lineno, key, item))
    return Manifest(path, tuple(entries), hashlib.sha256(raw).hexdigest())


@dataclass(frozen=True)
class ShardSpec:
    """Shard ``index`` of ``count``."""

    index: int = 0
    count: int = 1

    @property
    def name(self) -> str:
        return shard_name(self.index, self.count)

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def select(self, entries: tuple[Entry, ...]) -> list[Entry]:
        return [e for e in entries if e.position % self.count == self.index]


def parse_shard(text: str) -> ShardSpec:
    """Parse ``I/N`` (0 <= I < N)."""
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text or "")
    if not m:
        raise UserError(f"--shard must look like I/N (e.g. 0/4), got {text!r}")
    index, count = int(m.group(1)), int(m.group(2))
    if count < 1 or not 0 <= index < count:
        raise UserError(f"--shard {text}: need 0 <= I < N")
    return ShardSpec(index, count)


def shard_from_environment(env: dict[str, str] | None = None) -> ShardSpec | None:
    """The shard a scheduler assigned, when ``--shard`` is absent.

    * ``TTSFLEET_FILL_SHARD=I/N`` wins;
    * Slurm array jobs: ``SLURM_ARRAY_TASK_ID`` relative to ``SLURM_ARRAY_TASK_MIN`` of
      ``SLURM_ARRAY_TASK_COUNT`` tasks (arrays must be contiguous: ``--array=0-7``);
    * Kubernetes indexed Jobs: ``JOB_COMPLETION_INDEX`` of ``TTSFLEET_FILL_SHARDS`` (Kubernetes does
      not tell a pod the completion count, so the Job template sets it).
    """
    env = dict(os.environ) if env is None else env
    if env.get(SHARD_ENV):
        return parse_shard(env[SHARD_ENV])
    if env.get("SLURM_ARRAY_TASK_ID") and env.get("SLURM_ARRAY_TASK_COUNT"):
        base = int(env.get("SLURM_ARRAY_TASK_MIN", "0"))
        return parse_shard(f"{int(env['SLURM_ARRAY_TASK_ID']) - base}/{env['SLURM_ARRAY_TASK_COUNT']}")
    if env.get("JOB_COMPLETION_INDEX"):
        if not env.get(SHARDS_ENV):
            raise UserError(f"JOB_COMPLETION_INDEX is set but {SHARDS_ENV} (the completion "
                            "count) is not; set it in the Job template or pass --shard I/N")
        return parse_shard(f"{env['JOB_COMPLETION_INDEX']}/{env[SHARDS_ENV]}")
    return None
