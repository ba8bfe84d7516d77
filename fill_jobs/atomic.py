"""Crash-safe file writes: write a hidden temp file, fsync it, rename it over the target.

A reader (or a restarted job) sees either the old file or the complete new one, never a torn
write, whatever instant the process is killed at. Directory entries are fsynced too so a commit
survives a node crash, not only a process kill.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

TMP_SUFFIX = ".tmp"


def temp_path_for(target: Path) -> Path:
    """The hidden temp name a write to ``target`` goes through (unique per process)."""
    return target.with_name(f".{target.name}.{os.getpid()}{TMP_SUFFIX}")


def fsync_file(path: Path) -> None:
    """Make a file's data durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Make renames inside ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_bytes_atomic(target: Path, data: bytes, *, sync_dir: bool = True) -> None:
    """Atomically replace ``target`` with ``data`` (temp file, fsync, rename, dir fsync)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path_for(target)
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, target)
    if sync_dir:
        fsync_dir(target.parent)


def write_json_atomic(target: Path, obj: Any, *, sync_dir: bool = True) -> None:
    """Atomically write ``obj`` as indented, key-sorted JSON."""
    text = json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    write_bytes_atomic(target, text.encode("utf-8"), sync_dir=sync_dir)


def remove_stale_temps(directory: Path, prefix: str) -> int:
    """Delete leftover temp files of earlier (killed) writes whose names start with ``.prefix``."""
    removed = 0
    if not directory.is_dir():
        return 0
    for p in directory.glob(f".{prefix}*{TMP_SUFFIX}"):
        p.unlink(missing_ok=True)
        removed += 1
    return removed
