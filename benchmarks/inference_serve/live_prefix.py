"""Real-time mode measured: first audio of live sessions in a cloned voice, with the voice head
prefilled at open (``--prefix-reuse``) and without (``--no-prefix-reuse``), side by side.

Two ``ttsfleet serve`` processes, one per side, same checkpoint and flags otherwise. Each session is
the official fish-audio-sdk's ``stream_websocket`` in a stored voice (``reference_id``: espeak-ng
speech of ``--ref-seconds`` and its transcript, added once per server through
``/v1/references/add``, as a voice agent uses a voice it has set up); the text generator waits
``--pause-ms`` after the session opens (a voice agent's LLM producing its first sentence) and then
yields two sentences. First audio
is measured at the client, from the moment the generator hands over the first text to the first
audio chunk received: what a listener waits. Sessions run ``--concurrency`` at a time; the sides
alternate round by round (``--rounds``), so a noisy machine hits both alike. Prints a table of
medians, p90 and the per-round ratio spread; writes every session to ``OUT/live_prefix.json``.

    python -P benchmarks/inference_serve/live_prefix.py OUT [--checkpoint tiny --device cpu]
    python3 -m benchmarks.inference_serve.live_prefix OUT --checkpoint s2-pro --device cuda  # device
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np

TEXT = ("Thanks for calling, I can help you with your booking right away today. ",
        "Let me pull up the reservation details for the name you gave me.")
TRANSCRIPT = ("The quick brown fox jumps over the lazy dog while the river runs quietly past the old mill "
              "and the forecast says rain later in the evening.")


def reference_wav(seconds: float) -> bytes:
    """Real speech from espeak-ng, repeated to about ``seconds`` (the reference voice)."""
    if not shutil.which("espeak-ng"):
        sys.exit("espeak-ng is needed for the reference voice")
    import io

    import soundfile as sf

    one = subprocess.run(["espeak-ng", "--stdout", TRANSCRIPT], capture_output=True, check=True).stdout
    wave, sr = sf.read(io.BytesIO(one), dtype="float32")
    wave = np.tile(wave, max(1, round(seconds * sr / wave.size)))
    buf = io.BytesIO()
    sf.write(buf, wave, sr, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def start_server(flags: list[str], log: Path) -> tuple[subprocess.Popen, str]:
    from ttsfleet.devtools.ports import free_port

    port = free_port()
    safe = ["-P"] if sys.flags.safe_path else []  # as this script runs: -P here, `python3 -m` on the device
    cmd = [sys.executable, *safe, "-m", "ttsfleet.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
           "--log-level", "warning", *flags]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TTSFLEET_")}
    proc = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"server {flags} exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    sys.exit(f"server {flags} not ready")


VOICE_ID = "live-prefix-bench"


def add_voice(url: str, voice: bytes) -> None:
    with httpx.Client(base_url=url, timeout=300) as c:
        r = c.post("/v1/references/add", files={"audio": ("voice.wav", voice, "audio/wav")},
                   data={"id": VOICE_ID, "text": TRANSCRIPT})
        r.raise_for_status()


def reused_tokens(samples: list[Any]) -> float:
    """The server's ``inference_prefill_tokens_reused`` counter in its /metrics ``samples``."""
    from ttsfleet.metrics import spec

    name = spec("inference_prefill_tokens_reused").exposed_names[0]
    return sum(s.value for s in samples if s.name == name)


def one_session(url: str, pause_s: float, seed: int, frames: int = 0) -> dict[str, Any]:
    """One live session; first audio from the first text handed over to the first chunk received.
    ``frames``: the session's ``max_new_tokens`` per segment (0: the server's cap)."""
    import fishaudio

    handed: list[float] = []

    def text():
        time.sleep(pause_s)
        handed.append(time.perf_counter())
        yield TEXT[0]
        yield TEXT[1]

    limit = {"max_new_tokens": frames} if frames else {}
    first, size = None, 0
    start = time.perf_counter()
    with fishaudio.FishAudio(api_key="x", base_url=url) as fish:
        for chunk in fish.tts.stream_websocket(text(), format="pcm", reference_id=VOICE_ID,
                                               config=fishaudio.TTSConfig(temperature=0.7, top_p=0.7,
                                                                          **limit)):
            if first is None and chunk:
                first = time.perf_counter()
            size += len(chunk)
    return {"ttfa_s": None if first is None else first - handed[0], "wall_s": time.perf_counter() - start,
            "audio_bytes": size, "seed": seed}


def run_round(url: str, args: argparse.Namespace, seed: int) -> list[dict[str, Any]]:
    """``args.sessions`` sessions, ``args.concurrency`` at a time; the first ``concurrency`` of them
    open together (the first wave), each later one as an earlier one ends (steady state). Session
    lengths spread by ``--frames-spread`` (:func:`~ttsfleet.inference.bench.spread_frames`)."""
    from ttsfleet.inference.bench import spread_frames

    with ThreadPoolExecutor(args.concurrency) as pool:
        futures = [pool.submit(one_session, url, args.pause_ms / 1000, seed + i,
                               spread_frames(args.frames, args.frames_spread, seed, i) if args.frames else 0)
                   for i in range(args.sessions)]
        return [{**f.result(), "first_wave": i < args.concurrency} for i, f in enumerate(futures)]


def summarize(rows: list[dict[str, Any]]) -> dict[str, float]:
    """First audio over all sessions, and over the steady ones alone (after the first wave, which
    opens ``concurrency`` sessions at one instant: a burst no steady load has)."""
    out: dict[str, float] = {"failed": sum(r["ttfa_s"] is None or not r["audio_bytes"] for r in rows)}
    for name, pick in (("", rows), ("steady_", [r for r in rows if not r.get("first_wave", True)])):
        t = [r["ttfa_s"] * 1000 for r in pick if r["ttfa_s"] is not None]
        out[f"{name}n"] = len(t)
        for q in (50, 90, 99):
            out[f"{name}ttfa_p{q}_ms"] = float(np.percentile(t, q)) if t else float("nan")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--checkpoint", default="tiny")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--serve-args", default="--max-new-tokens 48", help="more `ttsfleet serve` flags")
    ap.add_argument("--ref-seconds", type=float, default=10.0)
    ap.add_argument("--pause-ms", type=float, default=300.0)
    ap.add_argument("--sessions", type=int, default=8, help="sessions per side per round")
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--frames", type=int, default=0,
                    help="frames per segment each session asks for (max_new_tokens; 0: the server's cap)")
    ap.add_argument("--frames-spread", type=float, default=0.0,
                    help="session i asks for frames x (1 + spread x u_i), u_i uniform in [-1, 1]: "
                         "sessions of one length stay in waves that open together")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sides", default="reuse,whole",
                    help="which servers: reuse (--prefix-reuse, the default), whole (--no-prefix-reuse)")
    ap.add_argument("--reference-wav", type=Path,
                    help="the reference voice from this WAV (made beforehand with --write-reference where "
                         "espeak-ng exists: the GPU machine has none) instead of espeak-ng now")
    ap.add_argument("--write-reference", action="store_true",
                    help="write the espeak-ng reference voice to --reference-wav and exit")
    args = ap.parse_args()
    if args.frames < 0 or not 0 <= args.frames_spread < 1:
        ap.error(f"--frames {args.frames} --frames-spread {args.frames_spread}: frames >= 0, 0 <= spread < 1")
    if args.write_reference:
        if args.reference_wav is None:
            sys.exit("--write-reference needs --reference-wav PATH")
        args.reference_wav.write_bytes(reference_wav(args.ref_seconds))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    voice = args.reference_wav.read_bytes() if args.reference_wav else reference_wav(args.ref_seconds)
    base = ["--checkpoint", args.checkpoint, "--device", args.device, *args.serve_args.split()]
    sides = {k: f for k, f in {"reuse": ["--prefix-reuse"], "whole": ["--no-prefix-reuse"]}.items()
             if k in args.sides.split(",")}
    if not sides:
        sys.exit(f"--sides {args.sides!r}: expected reuse, whole or both")
    servers = {k: start_server([*base, *f, "--references-dir", str(args.out / f"refs-{k}")],
                               args.out / f"server-{k}.log") for k, f in sides.items()}
    for _, url in servers.values():
        add_voice(url, voice)
    rows: dict[str, list[dict[str, Any]]] = {k: [] for k in sides}
    ratios = []
    try:
        from tqdm import tqdm
        from ttsfleet.inference.bench import (
            codec_totals,
            codec_use,
            readings_of,
            server_samples,
            stage_means_ms,
        )

        walls = dict.fromkeys(sides, 0.0)  # each side's sessions' wall time: its codec's busy share
        for r in tqdm(range(args.rounds), desc=f"rounds ({', then '.join(sides)})"):
            got = {}
            for k in sides:
                t0 = time.perf_counter()
                got[k] = run_round(servers[k][1], args, 1000 * r)
                walls[k] += time.perf_counter() - t0
            for k, v in got.items():
                rows[k] += [{**x, "round": r} for x in v]
            if len(got) == 2:
                ratios.append(summarize(got["whole"])["ttfa_p50_ms"] / summarize(got["reuse"])["ttfa_p50_ms"])
        # one read of each server's /metrics: the prompt tokens it reused, its mean ms per stage of
        # time to first audio over every session it served and what held its waiting requests back
        samples = {k: server_samples(url) for k, (_, url) in servers.items()}
        reused = {k: reused_tokens(s) for k, s in samples.items()}
        readings = {k: readings_of(s) for k, s in samples.items()}
        stages = {k: stage_means_ms(totals) for k, (totals, _) in readings.items()}
        waits = {k: counts for k, (_, counts) in readings.items()}
        codec = {k: codec_use(codec_totals(s), walls[k]) for k, s in samples.items()}
    finally:
        for proc, _ in servers.values():
            proc.send_signal(signal.SIGINT)
            proc.wait(30)
    report = {"date": time.strftime("%Y-%m-%d"), "host": os.uname().nodename, "cpus": os.cpu_count(),
              "load_avg_1m": os.getloadavg()[0], "args": {k: str(v) for k, v in vars(args).items()},
              "sides": {k: summarize(v) for k, v in rows.items()}, "p50_ratio_per_round": ratios,
              "prefill_tokens_reused": reused, "ttfa_stage_mean_ms": stages, "admission_waits": waits,
              "codec": codec, "sessions": rows}
    (args.out / "live_prefix.json").write_text(json.dumps(report, indent=2))
    print_report(report, args.concurrency)


def print_report(report: dict[str, Any], concurrency: int) -> None:
    """The sides' first-audio table, then what the servers said of their sessions."""
    from ttsfleet.inference.bench import codec_line

    print("\n| side | sessions | first audio p50 / p90 / p99 ms | steady sessions "
          "| steady p50 / p90 / p99 ms | failed |\n|---|---:|---:|---:|---:|---:|")
    for k, s in report["sides"].items():
        print(f"| {k} | {s['n']} | {s['ttfa_p50_ms']:.0f} / {s['ttfa_p90_ms']:.0f} / {s['ttfa_p99_ms']:.0f} "
              f"| {s['steady_n']} | {s['steady_ttfa_p50_ms']:.0f} / {s['steady_ttfa_p90_ms']:.0f} / "
              f"{s['steady_ttfa_p99_ms']:.0f} | {s['failed']} |")
    print(f"prompt tokens reused (server counter): {report['prefill_tokens_reused']}")
    for k, st in report["ttfa_stage_mean_ms"].items():
        print(f"{k}: time to first audio by stage, mean ms (server): "
              + ", ".join(f"{name} {ms:.0f}" for name, ms in st.items()))
    for k, w in report["admission_waits"].items():
        print(f"{k}: engine iterations that left requests waiting, by cause (server): "
              + ", ".join(f"{reason} {n:.0f}" for reason, n in w.items()))
    for k, use in report["codec"].items():
        if use:
            print(f"{k}: {codec_line({'concurrency': concurrency, **use})}")
    if ratios := report["p50_ratio_per_round"]:
        print(f"whole / reuse p50 per round: {', '.join(f'{x:.2f}' for x in ratios)} "
              f"(median {statistics.median(ratios):.2f})")


if __name__ == "__main__":
    main()
