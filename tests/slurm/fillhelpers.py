"""Shared helpers of the fill-on-Slurm tests: a baseline run, output rows, the fill processes."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ttsfleet.slurm.sbatch import FillShardSpec

STAGES = "decode,hash"


def output_rows(out_dir: Path) -> list[tuple]:
    """Every committed row of every shard manifest, reduced to what must match a clean run."""
    rows = []
    for path in sorted(out_dir.glob("manifest.shard-*.jsonl")):
        for line in path.read_text().splitlines():
            r = json.loads(line)
            rows.append((r["id"], r["status"], r["metrics"].get("content_hash"),
                         tuple(round(o["seconds"], 3) for o in r.get("outputs") or ())))
    return rows


def audio_bytes(out_dir: Path) -> dict[str, bytes]:
    """Every output audio file, by path relative to the output directory."""
    return {str(p.relative_to(out_dir)): p.read_bytes() for p in sorted((out_dir / "audio").rglob("*"))
            if p.is_file() and not p.name.startswith(".")}


def uninterrupted_run(manifest: Path, out: Path, ckpt: Path, shards: int = 1) -> list[tuple]:
    """The whole manifest in this process, shard after shard (no Slurm, no interruption)."""
    from ttsfleet.cli import main

    for i in range(shards):
        args = ["fill", "run", "--input", str(manifest), "--output", str(out), "--checkpoint",
                str(ckpt), "--stages", STAGES, "--shard", f"{i}/{shards}"]
        assert main(args) == 0
    return output_rows(out)


def items_done(spec: FillShardSpec, index: int) -> int:
    try:
        return json.loads(spec.checkpoint_file(index).read_text()).get("items_done", 0)
    except (OSError, ValueError):
        return 0


def fill_pids(spec: FillShardSpec, index: int) -> list[int]:
    """PIDs of the Python fill processes working on shard ``index`` of ``spec`` (not the wrapper).

    Found by their command line, which names this test's own checkpoint directory.
    """
    want = ["--checkpoint", spec.checkpoint_root, "--shard", f"{index}/{spec.shard_count}"]
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        args = [a.decode(errors="replace") for a in argv if a]
        if not args or "python" not in os.path.basename(args[0]):
            continue
        if all(any(args[k:k + 2] == want[j:j + 2] for k in range(len(args))) for j in (0, 2)):
            pids.append(int(d.name))
    return pids
