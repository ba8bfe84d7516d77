"""``ttsfleet fill status``: progress of each shard, read from the checkpoint directory only."""

from __future__ import annotations

import time
from pathlib import Path

from ttsfleet.fill_jobs.checkpoint import load_all


def status_report(directory: Path) -> dict:
    """Machine-readable progress: per shard and in total."""
    shards = []
    now = time.time()
    for c in load_all(directory):
        rate = c.rate_items_per_second
        shards.append({
            "shard": c.shard, "index": c.shard_index, "count": c.shard_count, "job": c.job,
            "state": c.state, "items_done": c.items_done, "items_total": c.items_total,
            "accepted": c.accepted, "rejected": c.rejected,
            "preemptions_survived": c.preemptions_survived, "orderly_stops": c.orderly_stops,
            "hard_restarts": c.hard_restarts, "runs": c.runs,
            "last_checkpoint_time": c.last_checkpoint_at,
            "seconds_since_checkpoint": round(now - c.last_checkpoint_at, 3),
            "rate_items_per_second": round(rate, 4) if rate else None,
            "eta_seconds": round(c.eta_seconds, 1) if c.eta_seconds is not None else None,
            "audio_seconds": c.audio_seconds,
            "checkpoint_overhead": round(c.commit_seconds / c.active_seconds, 4)
            if c.active_seconds > 0 else None,
        })
    done = sum(s["items_done"] for s in shards)
    total = sum(s["items_total"] for s in shards)
    return {"checkpoint": str(directory), "shards": shards, "items_done": done, "items_total": total,
            "complete": bool(shards) and all(s["state"] == "complete" for s in shards),
            "preemptions_survived": sum(s["preemptions_survived"] for s in shards)}


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m{seconds % 60:02d}s"


def print_table(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"fill job {report['checkpoint']}")
    for col in ("shard", "state", "done", "accepted", "rejected", "items/s", "ETA", "preemptions",
                "last checkpoint"):
        table.add_column(col)
    for s in report["shards"]:
        table.add_row(s["shard"], s["state"], f"{s['items_done']}/{s['items_total']}",
                      str(s["accepted"]), str(sum(s["rejected"].values())),
                      f"{s['rate_items_per_second']:.2f}" if s["rate_items_per_second"] else "-",
                      _duration(s["eta_seconds"]), str(s["preemptions_survived"]),
                      f"{_duration(s['seconds_since_checkpoint'])} ago")
    console = Console()
    console.print(table)
    console.print(f"total {report['items_done']}/{report['items_total']} items, "
                  f"{'complete' if report['complete'] else 'in progress'}")
