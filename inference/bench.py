"""``ttsfleet bench serve``: a closed-loop load generator for a running TTS server.

Why closed loop: the autoscaler and the capacity curves in the GPU catalog are stated per
concurrency (requests decoding at once), so each level keeps exactly ``c`` streaming requests in
flight and measures aggregate frames/s, per-request frames/s and time to first audio. The JSON
carries ``points`` in the shape ``GpuCatalog.with_measured_file`` reads, so a run on a GPU can
replace a class's seed curve directly.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np


@dataclass
class BenchConfig:
    url: str
    levels: list[int]
    requests: int = 0
    text: str = "The quick brown fox jumps over the lazy dog."
    max_new_tokens: int = 128
    fmt: str = "pcm"
    api_key: str | None = None
    timeout_s: float = 300.0
    seed: int = 1
    #: Runs of every level; the level reports the median frames/s and the spread (the gate's noise).
    repeats: int = 1
    #: Request i asks for ``max_new_tokens * (1 + frames_spread * u_i)`` frames, u_i uniform in [-1, 1].
    frames_spread: float = 0.0

    def frames_of(self, i: int) -> int:
        if self.frames_spread <= 0:
            return self.max_new_tokens
        import random

        u = random.Random(self.seed * 7919 + i).uniform(-1.0, 1.0)
        return max(1, int(round(self.max_new_tokens * (1 + self.frames_spread * u))))


@dataclass
class Sample:
    ok: bool
    status: int
    ttfa_s: float
    duration_s: float
    frames: float
    audio_s: float = 0.0  # seconds of audio the request delivered


@dataclass
class Level:
    """One concurrency level: frames/s is the median over ``repeats`` runs (``runs_frames_per_s``);
    latencies are percentiles over every request of every run. ``frames_per_s_spread`` is the runs'
    (max - min) / median, what :func:`ttsfleet.inference.bench_engine.regressions` derives its
    tolerance from. Real-time factor per request = its wall time / the audio it got (< 1: faster than
    real time)."""

    concurrency: int
    requests: int
    errors: int
    wall_s: float
    frames_per_s: float
    per_request_frames_per_s: float
    ttfa_p50_s: float
    ttfa_p99_s: float
    duration_p50_s: float
    statuses: dict[str, int] = field(default_factory=dict)
    rtf_p50: float = float("nan")
    rtf_p99: float = float("nan")
    repeats: int = 1
    runs_frames_per_s: list[float] = field(default_factory=list)
    frames_per_s_spread: float = 0.0


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) if xs else float("nan")


async def _one(client: Any, cfg: BenchConfig, i: int) -> Sample:
    headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
    body = {"text": cfg.text, "format": cfg.fmt, "streaming": True, "max_new_tokens": cfg.frames_of(i),
            "seed": cfg.seed + i, "latency": "low"}
    t0 = time.perf_counter()
    first = None
    nbytes = 0
    try:
        async with client.stream("POST", f"{cfg.url}/v1/tts", json=body, headers=headers) as resp:
            if resp.status_code != 200:
                await resp.aread()
                return Sample(False, resp.status_code, 0.0, time.perf_counter() - t0, 0.0)
            fps = float(resp.headers.get("x-frames-per-second", "0") or 0)
            rate = int(resp.headers.get("x-sample-rate", "44100"))
            async for chunk in resp.aiter_bytes():
                if chunk and first is None:
                    first = time.perf_counter()
                nbytes += len(chunk)
    except Exception:
        return Sample(False, 0, 0.0, time.perf_counter() - t0, 0.0)
    end = time.perf_counter()
    seconds = (nbytes / 2 / rate) if cfg.fmt == "pcm" else 0.0
    return Sample(True, 200, (first or end) - t0, end - t0, seconds * fps, seconds)


async def _run_level(cfg: BenchConfig, c: int, n: int) -> tuple[list[Sample], float]:
    import httpx

    limits = httpx.Limits(max_connections=c + 4, max_keepalive_connections=c + 4)
    samples: list[Sample] = []
    counter = iter(range(n))
    async with httpx.AsyncClient(timeout=cfg.timeout_s, limits=limits) as client:
        async def worker() -> None:
            for i in counter:
                samples.append(await _one(client, cfg, i))

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(c)))
        wall = time.perf_counter() - t0
    return samples, wall


def _level(cfg: BenchConfig, c: int, n: int) -> Level:
    runs = [asyncio.run(_run_level(cfg, c, n)) for _ in range(max(cfg.repeats, 1))]
    return summarize_runs(c, n, [(samples, wall, None) for samples, wall in runs])


def summarize_level(c: int, n: int, samples: list[Sample], wall: float, frames: float | None = None) -> Level:
    """One run's report from its samples; ``frames`` defaults to the successful samples' frames."""
    return summarize_runs(c, n, [(samples, wall, frames)])


def summarize_runs(c: int, n: int, runs: list[tuple[list[Sample], float, float | None]]) -> Level:
    """A level's report from ``repeats`` runs ``(samples, wall, frames or None)`` of ``n`` requests each."""
    fps = []
    for samples, wall, frames in runs:
        got = sum(s.frames for s in samples if s.ok) if frames is None else frames
        fps.append(got / wall if wall > 0 else 0.0)
    every = [s for samples, _, _ in runs for s in samples]
    ok = [s for s in every if s.ok]
    statuses: dict[str, int] = {}
    for s in every:
        statuses[str(s.status)] = statuses.get(str(s.status), 0) + 1
    med = float(np.median(fps))
    rtf = [s.duration_s / s.audio_s for s in ok if s.audio_s > 0]
    return Level(
        concurrency=c, requests=n, errors=len(every) - len(ok),
        wall_s=float(np.median([w for _, w, _ in runs])),
        frames_per_s=med,
        per_request_frames_per_s=float(np.mean([s.frames / s.duration_s for s in ok if s.duration_s > 0]))
        if ok else 0.0,
        ttfa_p50_s=_pct([s.ttfa_s for s in ok], 50), ttfa_p99_s=_pct([s.ttfa_s for s in ok], 99),
        duration_p50_s=_pct([s.duration_s for s in ok], 50), statuses=statuses,
        rtf_p50=_pct(rtf, 50), rtf_p99=_pct(rtf, 99), repeats=len(runs),
        runs_frames_per_s=[round(f, 3) for f in fps],
        frames_per_s_spread=(max(fps) - min(fps)) / med if med > 0 else 0.0)


def machine() -> dict[str, Any]:
    info = {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
            "processor": platform.processor() or platform.machine(),
            "load_average_1m": round(os.getloadavg()[0], 2)}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu_model"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return info


def run_bench(cfg: BenchConfig) -> dict[str, Any]:
    """Run every level in turn against ``cfg.url``; returns the report as a dict."""
    import httpx

    try:
        ready = httpx.get(f"{cfg.url}/readyz", timeout=10)
    except httpx.HTTPError as exc:
        from ttsfleet.errors import UserError

        raise UserError(f"cannot reach {cfg.url}: {exc}") from None
    from ttsfleet.metrics import spec

    build: dict[str, str] = {}
    build_series = spec("inference_build").exposed_names[0] + "{"
    try:
        for line in httpx.get(f"{cfg.url}/metrics", timeout=10).text.splitlines():
            if line.startswith(build_series):
                inner = line[line.index("{") + 1:line.rindex("}")]
                build = dict(kv.split("=", 1) for kv in inner.split('",') if "=" in kv)
                build = {k: v.strip('"') for k, v in build.items()}
    except httpx.HTTPError:
        pass
    asyncio.run(_run_level(cfg, 1, 1))  # one unmeasured request: connections, server-side first calls
    levels = []
    for c in cfg.levels:
        n = cfg.requests or max(2 * c, 4)
        levels.append(_level(cfg, c, n))
    base = levels[0].frames_per_s
    report = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "server": {"url": cfg.url, "ready_at_start": ready.status_code == 200, "build": build},
        "config": {k: v for k, v in asdict(cfg).items() if k != "api_key"},
        "levels": [asdict(lv) for lv in levels],
        "scaling": (levels[-1].frames_per_s / base) if base > 0 else None,
        "points": [{"concurrency": lv.concurrency, "frames_per_s": round(lv.frames_per_s, 3),
                    "ttfa_s": round(lv.ttfa_p50_s, 5)} for lv in levels
                   if lv.frames_per_s > 0 and lv.ttfa_p50_s > 0],
        "source": f"ttsfleet bench serve {cfg.url}" + (
            f" (model {build['model']}, {build.get('quantization', '?')} on {build.get('device', '?')})"
            if build.get("model") else ""),
    }
    return report


def print_table(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=report["source"])
    for col in ("c", "requests", "errors", "frames/s", "spread", "per-req frames/s", "TTFA p50 ms",
                "TTFA p99 ms", "RTF p50", "duration p50 s"):
        t.add_column(col, justify="right")
    for lv in report["levels"]:
        t.add_row(str(lv["concurrency"]), f"{lv['requests']}x{lv.get('repeats', 1)}", str(lv["errors"]),
                  f"{lv['frames_per_s']:.1f}", f"{lv.get('frames_per_s_spread', 0.0):.1%}",
                  f"{lv['per_request_frames_per_s']:.1f}", f"{lv['ttfa_p50_s'] * 1000:.0f}",
                  f"{lv['ttfa_p99_s'] * 1000:.0f}", f"{lv.get('rtf_p50', float('nan')):.3f}",
                  f"{lv['duration_p50_s']:.2f}")
    console = Console(width=max(Console().width, 130))  # the table's columns, even in a pipe
    console.print(t)
    if report["scaling"] is not None:
        lv = report["levels"]
        console.print(f"scaling c={lv[0]['concurrency']}→{lv[-1]['concurrency']}: {report['scaling']:.2f}x")


def write_outputs(report: dict[str, Any], out: Path) -> list[Path]:
    """Write ``bench.json`` and ``bench.png`` (frames/s and TTFA against concurrency) into ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    jpath, ppath = out / "bench.json", out / "bench.png"
    jpath.write_text(json.dumps(report, indent=2) + "\n")
    lv = report["levels"]
    cs = [x["concurrency"] for x in lv]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    panels = (
        ("throughput", "frames/s", (("aggregate", "frames_per_s", 1), ("per request",
                                                                       "per_request_frames_per_s", 1))),
        ("time to first audio", "time to first audio (ms)", (("p50", "ttfa_p50_s", 1000),
                                                             ("p99", "ttfa_p99_s", 1000))),
    )
    for ax, (title, ylabel, lines) in zip(axes, panels, strict=True):
        for (label, key, scale), style in zip(lines, ("o-", "s--"), strict=True):
            ax.plot(cs, [x[key] * scale for x in lv], style, label=label)
        ax.set_xscale("log", base=2)
        ax.set_xticks(cs, [str(c) for c in cs])
        ax.set_xlabel("concurrency")
        ax.set_ylabel(ylabel)
        ax.legend()
        ax.set_title(title)
    where = report.get("device") or report["machine"].get("cpu_model", report["machine"]["processor"])
    fig.suptitle(f"{report['source']} — {report['date']} — {where}", fontsize=8)
    fig.tight_layout()
    fig.savefig(ppath, dpi=100)
    plt.close(fig)
    return [jpath, ppath]
