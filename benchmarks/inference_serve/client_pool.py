"""The bench client's own share of first audio: ``bench serve --connections shared`` (one pooled httpx
client for every listener, the bench before 2026-12-07e) beside ``own`` (a client and connection per
listener), against a stand-in server that only streams bytes — so whatever waits is the client's.

Why: on an H100 (2026-12-07e) the client's wait for the response headers had a p99 of 120-227 ms at
c=64 and 0.8-6.2 s at c=128, nearly all of it outside the server's app by its own Server-Timing; the
stand-in isolates the client (`inference/bench_clients.py` says what its pool does).

The stand-in (``serve`` below, uvicorn on uvloop + httptools like ``ttsfleet serve``) answers /readyz, an
empty /metrics, and /v1/tts with ``--chunks`` pcm chunks of ``--chunk-bytes``, one every ``--every-s``
after a 50 ms start, its app's time in Server-Timing. The sides alternate round by round.

    python3 -P benchmarks/inference_serve/client_pool.py OUT [--concurrency 64,128 --per-client 6 --rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SIDES = ("shared", "own")


def stand_in(chunks: int, every_s: float, chunk_bytes: int) -> Any:
    """The stand-in server's ASGI app."""
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse, StreamingResponse
    from starlette.routing import Route

    async def text(request: Any) -> PlainTextResponse:
        return PlainTextResponse("ok" if request.url.path == "/readyz" else "")

    async def tts(request: Any) -> StreamingResponse:
        t0 = time.perf_counter()
        await request.body()

        async def body() -> Any:
            await asyncio.sleep(0.05)
            for _ in range(chunks):
                yield b"\0" * chunk_bytes
                await asyncio.sleep(every_s)

        return StreamingResponse(body(), media_type="audio/pcm", headers={
            "X-Sample-Rate": "44100", "X-Frames-Per-Second": "21.5",
            "Server-Timing": f"app;dur={(time.perf_counter() - t0) * 1000:.2f}"})

    return Starlette(routes=[Route("/readyz", text), Route("/metrics", text),
                             Route("/v1/tts", tts, methods=["POST"])])


def serve(port: int, chunks: int, every_s: float, chunk_bytes: int) -> None:
    import uvicorn

    uvicorn.run(stand_in(chunks, every_s, chunk_bytes), host="127.0.0.1", port=port, log_level="warning",
                loop="uvloop", http="httptools")


def start_stand_in(args: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    from ttsfleet.devtools.ports import free_port
    from ttsfleet.devtools.serve_proc import python_cmd, wait_ready

    port = free_port()
    proc = subprocess.Popen([*python_cmd(), __file__, "--serve", str(port), "--chunks", str(args.chunks),
                             "--every-s", str(args.every_s), "--chunk-bytes", str(args.chunk_bytes), "x"])
    url = f"http://127.0.0.1:{port}"
    wait_ready(proc, url, "the stand-in server", ready_timeout_s=30)
    return proc, url


def bench(url: str, side: str, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    from ttsfleet.devtools.serve_proc import python_cmd

    done = subprocess.run([*python_cmd(), "-m", "ttsfleet.cli", "bench", "serve", "--url", url,
                           "--concurrency", args.concurrency, "--per-client", str(args.per_client),
                           "--connections", side, "--out", str(out)], capture_output=True, text=True)
    (out / "bench.txt").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        sys.exit(f"bench serve --connections {side} failed: {done.stderr[-1500:]}")
    return json.loads((out / "bench.json").read_text())


def row(side: str, rnd: int, lv: dict[str, Any]) -> str:
    ms = lambda key: f"{lv[key] * 1000:.0f}"  # noqa: E731
    return (f"| {lv['concurrency']} | {rnd} | {side} | {ms('headers_p50_s')} / {ms('headers_p99_s')} | "
            f"{ms('sent_p50_s')} / {ms('sent_p99_s')} | {lv['new_connections']} | {ms('ttfa_p50_s')} / "
            f"{ms('ttfa_p99_s')} | {lv['client_loop_lag'].get('p99_ms', float('nan')):.1f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--concurrency", default="64,128")
    ap.add_argument("--per-client", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--chunks", type=int, default=60)
    ap.add_argument("--every-s", type=float, default=0.02)
    ap.add_argument("--chunk-bytes", type=int, default=4096)
    ap.add_argument("--serve", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        return serve(args.serve, args.chunks, args.every_s, args.chunk_bytes)
    proc, url = start_stand_in(args)
    rows = ["| c | round | connections | headers wait p50 / p99 ms | of it until written p50 / p99 ms | "
            "new connections (timed) | first byte p50 / p99 ms | client loop late p99 ms |",
            "|---:|---:|---|---:|---:|---:|---:|---:|"]
    try:
        for rnd in range(1, args.rounds + 1):
            for side in SIDES:
                report = bench(url, side, args, args.out / f"{side}{rnd}")
                rows += [row(side, rnd, lv) for lv in report["levels"]]
                print(f"round {rnd} {side} done", flush=True)
    finally:
        proc.terminate()
        proc.wait(10)
    table = "\n".join(sorted(rows[2:], key=lambda r: int(r.split("|")[1])))
    text = "\n".join(rows[:2]) + "\n" + table + "\n"
    (args.out / "table.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
