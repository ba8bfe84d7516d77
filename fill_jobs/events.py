"""Structured logs and the terminal progress bar of a running fill job.

On a terminal the job shows a rich progress bar and short readable lines; otherwise (a pod, a
Slurm job) every event is one JSON object per line on stderr (``ts``, ``event``, ``job`` and the
event's fields), which log shippers parse without configuration.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any


class EventLog:
    """Emits job events as JSON lines, or as text plus a progress bar on a terminal."""

    def __init__(self, job: str, interactive: bool | None = None) -> None:
        self.job = job
        self.interactive = sys.stderr.isatty() if interactive is None else interactive
        self._progress = None
        self._task = None
        if self.interactive:
            from rich.console import Console

            self._console = Console(stderr=True)

    def emit(self, event: str, **fields: Any) -> None:
        if self.interactive:
            detail = " ".join(f"{k}={v}" for k, v in fields.items() if v is not None)
            self._console.print(f"[bold]{event}[/bold] {detail}", highlight=False)
            return
        rec = {"ts": round(time.time(), 3), "event": event, "job": self.job, **fields}
        sys.stderr.write(json.dumps(rec, default=str) + "\n")
        sys.stderr.flush()

    def start_progress(self, total: int, done: int) -> None:
        if not self.interactive:
            return
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self._progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                                  MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn(),
                                  console=self._console, transient=False)
        self._progress.start()
        self._task = self._progress.add_task(self.job, total=total, completed=done)

    def advance(self, n: int = 1) -> None:
        if self._progress is not None:
            self._progress.advance(self._task, n)

    def stop_progress(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
