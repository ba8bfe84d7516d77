"""``ttsfleet fill merge``: one manifest for a whole job, with duplicates found across shards.

Each shard finds duplicates among its own items only (shards run in parallel and never wait for
each other). Merging reads every finished shard's manifest, orders the rows by manifest position,
and runs the same first-occurrence rule (:class:`~ttsfleet.fill_jobs.dedup.DedupIndex`) over all
accepted rows: a later duplicate of an item from another shard becomes
``rejected``/``duplicate`` (or ``near_duplicate``) exactly as if one shard had seen both. The
result, ``manifest.jsonl`` and ``summary.json``, is written atomically; shard files and audio stay
as they are (the audio of items rejected by the merge is left unreferenced and listed in the
summary).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import numpy as np
from ttsfleet.fill_jobs import reasons
from ttsfleet.fill_jobs.atomic import write_bytes_atomic, write_json_atomic
from ttsfleet.fill_jobs.dedup import DedupIndex
from ttsfleet.fill_jobs.outputs import row_line
from ttsfleet.fill_jobs.settings import CleaningConfig

from ttsfleet.errors import UserError

_SHARD_FILE = re.compile(r"^manifest\.shard-(\d{4})-of-(\d{4})\.jsonl$")


def shard_manifests(output: Path) -> list[Path]:
    """The finished shard manifests of one job; raises if shards are missing or mixed."""
    found = {}
    for p in output.glob("manifest.shard-*.jsonl"):
        m = _SHARD_FILE.match(p.name)
        if m:
            found[(int(m.group(1)), int(m.group(2)))] = p
    counts = {n for _, n in found}
    if not found:
        raise UserError(f"no finished shard manifests in {output}")
    if len(counts) != 1:
        raise UserError(f"{output} mixes shard counts {sorted(counts)}")
    (n,) = counts
    missing = [i for i in range(n) if (i, n) not in found]
    if missing:
        raise UserError(f"shards {missing} of {n} are not finished yet (no manifest in {output})")
    return [found[(i, n)] for i in range(n)]


def _mark(row: dict, reason: str, first: str, detail: str) -> list[str]:
    dropped = [o["audio"] for o in row["outputs"]]
    row.update(status="rejected", reason=reason, detail=detail, duplicate_of=first, outputs=[])
    return dropped


def merge(output: Path, config: CleaningConfig | None = None) -> dict:
    """Write ``manifest.jsonl`` and ``summary.json`` for all shards; returns the summary."""
    config = config or CleaningConfig()
    rows = [json.loads(line) for p in shard_manifests(output)
            for line in p.read_text(encoding="utf-8").splitlines() if line]
    rows.sort(key=lambda r: r["position"])
    positions = [r["position"] for r in rows]
    if positions != list(range(len(rows))):
        raise UserError(f"shard manifests in {output} do not cover the manifest exactly once")
    index = DedupIndex(config.near_duplicate_max_distance, config.near_duplicate_duration_tolerance)
    unreferenced: list[str] = []
    merged_away = 0
    for row in rows:
        if row["status"] != "accepted":
            continue
        m = row.get("metrics") or {}
        first = index.exact(m["content_hash"]) if m.get("content_hash") else None
        if first is not None:
            unreferenced += _mark(row, reasons.DUPLICATE, first, f"same audio as {first}")
            merged_away += 1
            continue
        if m.get("fingerprint"):
            fp = np.frombuffer(bytes.fromhex(m["fingerprint"]), np.uint8)
            first = index.near(fp, float(m.get("fingerprint_seconds") or 0.0))
            if first is not None:
                unreferenced += _mark(row, reasons.NEAR_DUPLICATE, first, f"sounds like {first}")
                merged_away += 1
                continue
        index.add_row(row)
    write_bytes_atomic(output / "manifest.jsonl", "".join(row_line(r) for r in rows).encode("utf-8"))
    rejected = Counter(r["reason"] for r in rows if r["status"] != "accepted")
    out_seconds = sum(o["seconds"] for r in rows for o in r["outputs"])
    summary = {"items": len(rows), "accepted": sum(r["status"] == "accepted" for r in rows),
               "rejected": dict(sorted(rejected.items())), "shards": len(shard_manifests(output)),
               "duplicates_across_shards": merged_away, "unreferenced_audio": sorted(unreferenced),
               "output_audio_hours": round(out_seconds / 3600, 4)}
    write_json_atomic(output / "summary.json", summary)
    return summary
