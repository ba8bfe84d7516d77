"""A fill job on one GPU: how busy it keeps the GPU (NVML), how fast it cleans, how fast it leaves.

``run`` builds a speech corpus from a few seed utterances (espeak-ng recordings carried to the
machine: each item joins 2-4 random seeds with pauses, gain and a little noise, so no two items
are duplicates), then runs ``ttsfleet fill run`` as a real subprocess for each phase:

* ``default+codec`` — the default cleaning stages plus codec tokenization (the S2-size
  random-weight codec), CPU worker pool feeding the GPU;
* ``light+codec`` (``decode,hash,codec``) — the light CPU stages plus the codec (how busy the
  GPU gets when the CPU side is cheap).

Through each phase a thread samples NVML every 0.2 s (GPU utilization and memory used). After
``--seconds`` of work the job gets SIGTERM; the script times SIGTERM → GPU memory back to the
idle level → process exit. Numbers over the steady window (first to last checkpoint before the
SIGTERM, start-up excluded): NVML utilization mean/median, the codec stage's CUDA-event time /
wall time, items/s, audio-hours per hour. Writes ``fill_gpu.json``; ``report`` turns it into a
RESULTS.md section and a PNG of NVML utilization over time.

    python benchmarks/fill_jobs/bench_fill_gpu.py run --seeds DIR --out DIR [--seconds 90]
    python benchmarks/fill_jobs/bench_fill_gpu.py report fill_gpu.json [--no-record]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "RESULTS.md"
PRECISION_TEXT = {"float32": "fp32 (no TF32)", "tf32": "codecPrecision tf32 (TF32 in the encoder's trunk)",
                  "bf16": "codecPrecision bf16 (the encoder's trunk in bf16)"}
PHASES = {"default+codec": "decode,hash,vad,quality,dedup,loudness,codec",
          "light+codec": "decode,hash,codec"}


# --- corpus -----------------------------------------------------------------------------------
def _seeds(seed_dir: Path) -> list[tuple[np.ndarray, int, str]]:
    import soundfile as sf

    rows = [json.loads(line) for line in (seed_dir / "manifest.jsonl").read_text().splitlines() if line]
    out = []
    for r in rows:
        x, rate = sf.read(seed_dir / r["audio"], dtype="float32")
        out.append((x, rate, r["text"]))
    return out


def _make_items(args: tuple[Path, Path, int, int]) -> list[dict]:
    import soundfile as sf

    seed_dir, out_dir, start, count = args
    seeds = _seeds(seed_dir)
    rate = seeds[0][1]
    rows = []
    for i in range(start, start + count):
        rng = np.random.default_rng(i)
        picks = rng.choice(len(seeds), size=int(rng.integers(2, 5)), replace=False)
        parts, texts = [np.zeros(int(0.3 * rate), np.float32)], []
        for p in picks:
            x, _, text = seeds[p]
            parts += [x * np.float32(10 ** (rng.uniform(-6, 3) / 20)),
                      np.zeros(int(rng.uniform(0.15, 0.5) * rate), np.float32)]
            texts.append(text)
        y = np.concatenate(parts)
        y = y + (10 ** (-55 / 20) * rng.standard_normal(len(y))).astype(np.float32)
        name = f"audio/{i % 100:02d}/item-{i:06d}.flac"
        (out_dir / name).parent.mkdir(parents=True, exist_ok=True)
        sf.write(out_dir / name, np.clip(y, -1, 1), rate, subtype="PCM_16")
        rows.append({"id": f"item-{i:06d}", "audio": name, "text": " ".join(texts),
                     "seconds": round(len(y) / rate, 3)})
    return rows


def make_corpus(seed_dir: Path, out_dir: Path, items: int, procs: int) -> tuple[Path, float]:
    out_dir.mkdir(parents=True, exist_ok=True)
    chunk = -(-items // procs)
    jobs = [(seed_dir, out_dir, s, min(chunk, items - s)) for s in range(0, items, chunk)]
    with ProcessPoolExecutor(procs) as pool:
        rows = [r for part in pool.map(_make_items, jobs) for r in part]
    manifest = out_dir / "manifest.jsonl"
    manifest.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "seconds"}) + "\n"
                                for r in rows))
    return manifest, sum(r["seconds"] for r in rows)


# --- sampling ---------------------------------------------------------------------------------
class NvmlSampler(threading.Thread):
    """GPU utilization (%) and memory used (MiB) every ``period`` seconds, with wall timestamps."""

    def __init__(self, period: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.period = period
        self.samples: list[tuple[float, int, float]] = []
        self._halt = threading.Event()
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nvml, self.handle = pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)
            self.source = "pynvml"
        except Exception:  # noqa: BLE001 - fall back to the nvidia-smi binary (same NVML counters)
            self.nvml, self.source = None, "nvidia-smi"

    def read(self) -> tuple[float, int, float]:
        if self.nvml is None:
            if shutil.which("nvidia-smi") is None:  # a smoke run on a machine without a GPU
                return time.time(), 0, 0.0
            out = subprocess.run(["nvidia-smi", "--query-gpu=utilization.gpu,memory.used",
                                  "--format=csv,noheader,nounits", "-i", "0"],
                                 capture_output=True, text=True).stdout.split(",")
            return time.time(), int(out[0]), float(out[1])
        u = self.nvml.nvmlDeviceGetUtilizationRates(self.handle)
        m = self.nvml.nvmlDeviceGetMemoryInfo(self.handle)
        return time.time(), int(u.gpu), m.used / 2**20

    def run(self) -> None:
        while not self._halt.wait(self.period):
            self.samples.append(self.read())

    def stop(self) -> None:
        self._halt.set()
        self.join()


def _read_events(proc: subprocess.Popen, events: list[dict]) -> None:
    for line in proc.stderr:
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            rec = {"event": "text", "line": line.rstrip()[:300]}
        rec["recv"] = time.time()
        events.append(rec)


def _first(events: list[dict], name: str) -> dict | None:
    return next((e for e in events if e.get("event") == name), None)


def run_phase(name: str, stages: str, manifest: Path, work: Path, config: Path, seconds: float) -> dict:
    sampler = NvmlSampler()
    idle_mib = sampler.read()[2]
    sampler.start()
    cmd = [sys.executable, "-P", "-m", "ttsfleet.cli", "fill", "run", "--input", str(manifest),
           "--output", str(work / name / "out"), "--checkpoint", str(work / name / "ckpt"),
           "--stages", stages, "--config", str(config), "--checkpoint-every-items", "256",
           "--checkpoint-every-seconds", "10"]
    t_start = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    events: list[dict] = []
    reader = threading.Thread(target=_read_events, args=(proc, events), daemon=True)
    reader.start()
    while _first(events, "started") is None and proc.poll() is None and time.time() - t_start < 180:
        time.sleep(0.1)
    t_started = time.time()
    while proc.poll() is None and time.time() - t_started < seconds:
        time.sleep(0.1)
    t_term = time.time()
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=120)
    t_exit = time.time()
    t_end = time.time() + 15
    while time.time() < t_end:
        time.sleep(0.2)
        if sampler.samples and sampler.samples[-1][0] > t_exit and sampler.samples[-1][2] <= idle_mib + 256:
            break
    sampler.stop()
    reader.join(timeout=5)
    freed = next((t for t, _, mib in sampler.samples if t > t_term and mib <= idle_mib + 256), None)
    return {"phase": name, "stages": stages, "exit_code": code, "idle_mib": idle_mib,
            "t_start": t_start, "t_started": t_started, "t_term": t_term, "t_exit": t_exit,
            "sigterm_to_exit_s": round(t_exit - t_term, 3),
            "sigterm_to_memory_freed_s": round(freed - t_term, 3) if freed else None,
            "samples": sampler.samples, "events": events, "cmd": cmd, "nvml_source": sampler.source}


# --- summary ----------------------------------------------------------------------------------
def summarize(ph: dict) -> dict:
    ckpts = [e for e in ph["events"] if e.get("event") == "checkpoint" and e["recv"] <= ph["t_term"]]
    out = {k: ph[k] for k in ("phase", "stages", "exit_code", "sigterm_to_exit_s",
                              "sigterm_to_memory_freed_s")}
    started = _first(ph["events"], "started") or {}
    out["workers"] = started.get("workers")
    out["peak_gpu_mib"] = round(max((m for _, _, m in ph["samples"]), default=0.0) - ph["idle_mib"])
    out["window"] = "first to last checkpoint before SIGTERM"
    if len(ckpts) < 2:  # too slow for two checkpoints: from the start to the commit at the stop
        stop = [e for e in ph["events"] if e.get("event") == "checkpoint" and e["recv"] > ph["t_term"]]
        if not ckpts + stop:
            out["error"] = "no checkpoint at all"
            return out
        ckpts = [{"recv": ph["t_started"], "items_done": 0, "audio_seconds": 0.0,
                  "gpu_seconds": 0.0}, (ckpts + stop)[-1]]
        out["window"] = "started to the commit at the stop (fewer than 2 checkpoints before it)"
    a, b = ckpts[0], ckpts[-1]
    dt = b["recv"] - a["recv"]
    util = [u for t, u, _ in ph["samples"] if a["recv"] <= t <= b["recv"]]
    whole = [u for t, u, _ in ph["samples"] if ph["t_started"] <= t <= ph["t_term"]]
    out.update({
        "window_s": round(dt, 1), "items": b["items_done"] - a["items_done"],
        "items_per_s": round((b["items_done"] - a["items_done"]) / dt, 2),
        "audio_hours_per_hour": round((b["audio_seconds"] - a["audio_seconds"]) / dt, 1),
        "nvml_util_mean": round(statistics.fmean(util), 1) if util else None,
        "nvml_util_median": statistics.median(util) if util else None,
        "nvml_util_p10": float(np.percentile(util, 10)) if util else None,
        "nvml_samples": len(util),
        "nvml_util_mean_started_to_sigterm": round(statistics.fmean(whole), 1) if whole else None,
        "codec_gpu_time_over_wall": (round((b["gpu_seconds"] - a["gpu_seconds"]) / dt, 3)
                                     if b.get("gpu_seconds") is not None else None),
    })
    return out


def codec_probe(codec: str, batch_seconds: float, seconds: float, precision: str = "float32") -> dict:
    """The codec stage alone on the GPU (no CPU side): synthetic 10 s clips, encoded for
    ``seconds``; says what the GPU could do if the CPU workers were infinitely fast."""
    from ttsfleet.fill_jobs.tokenize import BatchEncoder

    t_load = time.time()
    enc = BatchEncoder(codec, 24000, "cuda", batch_seconds, precision)
    rng = np.random.default_rng(0)
    clips = [(0.1 * rng.standard_normal(240000 + 997 * i)).astype(np.float32) for i in range(32)]
    enc.encode(clips[:4])  # warm-up
    load_s = time.time() - t_load
    sampler = NvmlSampler()
    sampler.start()
    t0, done, gpu0 = time.time(), 0.0, enc.gpu_seconds
    while time.time() - t0 < seconds:
        enc.encode(clips)
        done += sum(len(c) for c in clips) / 24000
    wall = time.time() - t0
    sampler.stop()
    util = [u for _, u, _ in sampler.samples]
    import torch

    return {"load_and_warmup_s": round(load_s, 1), "wall_s": round(wall, 1),
            "audio_seconds_per_s": round(done / wall, 1),
            "gpu_time_over_wall": round((enc.gpu_seconds - gpu0) / wall, 3),
            "nvml_util_mean": round(statistics.fmean(util), 1) if util else None,
            "max_memory_allocated_gib": round(torch.cuda.max_memory_allocated() / 2**30, 1)}


def machine() -> str:
    gpu = "no GPU"
    if shutil.which("nvidia-smi"):
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True).stdout.strip()
    import torch

    return f"{gpu}; {os.cpu_count()} CPUs; torch {torch.__version__}; {platform.release()}"


def cmd_run(a: argparse.Namespace) -> None:
    work = Path(a.out)
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    manifest, corpus_s = make_corpus(Path(a.seeds), work / "corpus", a.items, os.cpu_count() or 4)
    print(f"corpus: {a.items} items, {corpus_s / 3600:.2f} h of audio in {time.time() - t0:.0f} s",
          flush=True)
    config = work / "clean.yaml"
    config.write_text(f"codec: {a.codec}\nbatchItems: {a.batch_items}\ncodecBatchSeconds: "
                      f"{a.batch_seconds}\ncodecPrecision: {a.codec_precision}\n")
    result = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": machine(),
              "codec": a.codec, "batch_items": a.batch_items, "codec_batch_seconds": a.batch_seconds,
              "codec_precision": a.codec_precision,
              "corpus_items": a.items, "corpus_hours": round(corpus_s / 3600, 3),
              "espeak_ng_on_machine": subprocess.run(["sh", "-c", "command -v espeak-ng"],
                                                     capture_output=True).returncode == 0,
              "phases": []}
    seconds = [float(x) for x in a.seconds.split(",")]
    if a.probe_seconds > 0:
        result["codec_probe"] = codec_probe(a.codec, a.batch_seconds, a.probe_seconds, a.codec_precision)
        print("codec alone:", json.dumps(result["codec_probe"]), flush=True)
        import torch

        torch.cuda.empty_cache()
    for i, name in enumerate(a.phases.split(",")):
        ph = run_phase(name, PHASES[name], manifest, work, config, seconds[min(i, len(seconds) - 1)])
        s = summarize(ph)
        print(json.dumps(s), flush=True)
        text = [e["line"] for e in ph["events"] if e.get("event") == "text"]
        result["phases"].append({"summary": s, "raw": {k: ph[k] for k in ph if k != "events"},
                                 "events": [e for e in ph["events"] if e.get("event") != "text"][-400:],
                                 "log_tail": text[-20:]})
        (work / "fill_gpu.json").write_text(json.dumps(result))  # after each phase: a timeout keeps it
    print(table(result))


# --- report -----------------------------------------------------------------------------------
def table(result: dict) -> str:
    lines = ["| phase | workers | NVML util mean (median, p10) | codec GPU time / wall | items/s | "
             "audio-h/h | peak GPU MiB | SIGTERM → memory freed | SIGTERM → exit (code) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for p in result["phases"]:
        s = p["summary"]
        if "error" in s:
            lines.append(f"| {s['phase']} | {s.get('workers')} | {s['error']} | | | | | | |")
            continue
        lines.append(f"| {s['phase']} | {s['workers']} | {s['nvml_util_mean']} % ({s['nvml_util_median']}, "
                     f"{s['nvml_util_p10']}) | {s['codec_gpu_time_over_wall']} | {s['items_per_s']} | "
                     f"{s['audio_hours_per_hour']} | {s['peak_gpu_mib']} | "
                     f"{s['sigterm_to_memory_freed_s']} s | {s['sigterm_to_exit_s']} s ({s['exit_code']}) |")
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(result["phases"]), 1, figsize=(10, 3.2 * len(result["phases"])),
                             squeeze=False)
    for ax, p in zip(axes[:, 0], result["phases"], strict=True):
        raw = p["raw"]
        t = np.array([s[0] for s in raw["samples"]]) - raw["t_start"]
        ax.plot(t, [s[1] for s in raw["samples"]], lw=0.8, label="NVML GPU utilization %")
        ax2 = ax.twinx()
        ax2.plot(t, [s[2] / 1024 for s in raw["samples"]], color="tab:gray", lw=0.8, label="memory used GiB")
        ax2.set_ylabel("GiB")
        for key, lab, col in (("t_started", "started", "tab:green"), ("t_term", "SIGTERM", "tab:red"),
                              ("t_exit", "exit", "k")):
            ax.axvline(raw[key] - raw["t_start"], color=col, ls="--", lw=0.8, label=lab)
        s = p["summary"]
        ax.set_title(f"{s['phase']}: NVML mean {s.get('nvml_util_mean')} % over the steady window")
        ax.set_ylim(0, 105)
        ax.set_xlabel("seconds since the job was started")
        ax.legend(loc="lower left", fontsize=8)
    fig.suptitle(f"ttsfleet fill on {result['machine'].split(';')[0]} ({result['date']})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def cmd_report(a: argparse.Namespace) -> None:
    result = json.loads(Path(a.json).read_text())
    png = HERE / "fill_gpu_nvml_2026-12-01.png"
    plot(result, png)
    text = (f"\n## GPU fill job {result['date']} — {result['machine']}\n\n"
            f"`bench_fill_gpu.py` (raw: `fill_gpu_2026-12-01.json`, plot: `{png.name}`). Corpus: "
            f"{result['corpus_items']} items ({result['corpus_hours']} h) joined from espeak-ng "
            f"seed utterances; codec `{result['codec']}` (random weights, S2 sizes), groups of "
            f"{result['batch_items']} items, ≤ {result['codec_batch_seconds']} s padded audio per "
            f"forward, {PRECISION_TEXT[result.get('codec_precision', 'float32')]}. Steady window = "
            "first to last checkpoint before SIGTERM. NVML "
            "utilization = share of time a kernel ran (nvmlDeviceGetUtilizationRates, every 0.2 s); "
            "codec GPU time = CUDA-event time of the encode batches.\n\n" + table(result) + "\n")
    probe = result.get("codec_probe")
    if probe:
        text += (f"\nThe codec stage alone (no CPU side, synthetic 10 s clips, {probe['wall_s']} s): "
                 f"{probe['audio_seconds_per_s']} audio-s/s, NVML {probe['nvml_util_mean']} %, GPU time / "
                 f"wall {probe['gpu_time_over_wall']}, peak allocated {probe['max_memory_allocated_gib']} "
                 "GiB. The job's NVML figure is the codec's own: the job runs at the GPU's pace, not the "
                 "CPU workers'.\n")
    print(text)
    if not a.no_record:
        with RESULTS.open("a", encoding="utf-8") as fh:
            fh.write(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--seeds", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--items", type=int, default=6000)
    r.add_argument("--seconds", default="75,40", help="work per phase before the SIGTERM")
    r.add_argument("--phases", default="default+codec,light+codec")
    r.add_argument("--codec", default="s2-pro")
    r.add_argument("--probe-seconds", type=float, default=12.0,
                   help="the codec stage alone on the GPU first (0: skip)")
    r.add_argument("--batch-items", type=int, default=32)
    r.add_argument("--batch-seconds", type=float, default=240.0)
    r.add_argument("--codec-precision", default="float32", choices=("float32", "tf32", "bf16"),
                   help="the config's codecPrecision (job and probe)")
    p = sub.add_parser("report")
    p.add_argument("json")
    p.add_argument("--no-record", action="store_true")
    a = ap.parse_args()
    cmd_run(a) if a.cmd == "run" else cmd_report(a)


if __name__ == "__main__":
    main()
