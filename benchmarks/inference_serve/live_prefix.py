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
medians, p90 and the per-round ratio spread, then per side the server's time to first audio by
stage (means and p99s), admission waits and codec use over the steady sessions (/metrics read live
at each round's steady window: :class:`SteadyEdges`) and over the whole rounds; writes them and
every session to ``OUT/live_prefix.json``. Why the steady split: the whole rounds' stage means
include the first wave's burst (on the H200, 2026-12-04 run15 at c=64: queue 101 ms mean over the
rounds, where ``bench serve``'s steady window at c=64 shows 0-2 ms), so they cannot say what makes
the steady first audio slow.

The client's own share: every session is the SDK's sync websocket, a reader and a sender thread
apiece, so at c=64 ~190 threads share this interpreter, and a first audio is timed only once its
thread has the interpreter lock back. Its first-audio p99 (313 ms over all sessions on an H100 at
c=64, 2026-12-05d) sat well above the server's stage p99s, as ``bench serve``'s did before its
client was found late (:mod:`ttsfleet.inference.loop_lag`). So each client process runs a lag probe
(:class:`~ttsfleet.inference.loop_lag.ThreadLag`: a thread asking to wake every 5 ms; how late it
woke is the lock's wait plus the scheduler's), reported per side over the steady windows and the
whole rounds (``client_thread_lag``: every process's wake-ups merged, and the worst process's p99);
and ``--client-procs N`` spreads each round's sessions over N spawned processes, each its share of
``--concurrency`` as threads (sessions still open in order, the first ``concurrency`` together), its
sessions' open and first-audio events relayed to this process's :class:`SteadyEdges`. A tail that
shrinks with more client processes was the client's; one that stays is the server's.

    python -P benchmarks/inference_serve/live_prefix.py OUT [--checkpoint tiny --device cpu]
    python3 -m benchmarks.inference_serve.live_prefix OUT --checkpoint s2-pro --device cuda  # device
    ... --concurrency 64 --client-procs 4  # the same round from 4 client processes of 16 threads each
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import queue
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import traceback
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
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
    from ttsfleet.devtools.serve_proc import start_serve

    return start_serve(flags, log)


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


class SteadyEdges:
    """/metrics read live, in a thread, at the two edges of one round's steady window as its
    sessions reach them (:mod:`ttsfleet.inference.bench_steady` does the arithmetic).

    The steady sessions are those :func:`summarize` calls steady: every one after the first wave,
    the drain's included. So the window opens when the first of them opens *and* every first-wave
    session has had its first audio (or ended without one: no earlier moment is known), and it
    closes when every session of the round has had its first audio (or ended): the first audios the
    server counts between the two reads are the steady sessions' and none of the first wave's — the
    same sessions as the client's steady percentiles (one that got its first audio before the last
    first-wave session did would be missed: that round's first wave still bursting). Not ``bench
    serve``'s window (:mod:`ttsfleet.inference.bench_window`: up to the first client leaving):
    its steady latencies are the requests that started inside it, these are every later session.
    A round of no more sessions than ``first_wave`` has no window: no reads."""

    def __init__(self, url: str, first_wave: int, sessions: int) -> None:
        self.url = url
        self._first_wave = first_wave
        self._waiting_first = set(range(min(first_wave, sessions)))  # first-wave sessions to first audio
        self._waiting_all = set(range(sessions))  # every session to first audio
        self._steady_open = False
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(2, thread_name_prefix="metrics-read")
        self.moments: dict[str, float] = {}  # edge -> when it was reached (perf_counter)
        self._reads: dict[str, Future] = {}

    def opened(self, i: int) -> None:
        """Session ``i`` opens."""
        if i >= self._first_wave:
            with self._lock:
                self._steady_open = True
                self._edges()

    def first_audio(self, i: int) -> None:
        """Session ``i`` got its first audio or ended (idempotent per session)."""
        with self._lock:
            self._waiting_first.discard(i)
            self._waiting_all.discard(i)
            self._edges()

    def _edges(self) -> None:
        if "start" not in self._reads and self._steady_open and not self._waiting_first:
            self._read("start")
        if "start" in self._reads and "end" not in self._reads and not self._waiting_all:
            self._read("end")

    def _read(self, edge: str) -> None:
        from ttsfleet.inference.bench_steady import read_now

        self.moments[edge] = time.perf_counter()
        self._reads[edge] = self._pool.submit(read_now, self.url)

    def collect(self) -> tuple[Any, Any] | None:
        """``(window, (start read, end read))`` once both reads finished; None where the round had
        no window (or a read came back empty)."""
        from ttsfleet.inference.bench_window import Window

        reads = {edge: f.result() for edge, f in self._reads.items()}
        self._pool.shutdown()
        if set(reads) != {"start", "end"} or not reads["start"].samples or not reads["end"].samples:
            return None
        return Window(self.moments["start"], self.moments["end"]), (reads["start"], reads["end"])


class EdgeEvents:
    """:class:`SteadyEdges`' two calls made in a client process (``--client-procs`` above 1): sent to
    the parent, which owns the round's SteadyEdges and tells it in the order they arrive."""

    def __init__(self, events: Any) -> None:
        self._events = events  # a multiprocessing queue to the parent

    def opened(self, i: int) -> None:
        self._events.put(("opened", i))

    def first_audio(self, i: int) -> None:
        self._events.put(("first_audio", i))


def one_session(url: str, pause_s: float, seed: int, frames: int = 0,
                edges: SteadyEdges | EdgeEvents | None = None, index: int = 0) -> dict[str, Any]:
    """One live session; first audio from the first text handed over to the first chunk received.
    ``frames``: the session's ``max_new_tokens`` per segment (0: the server's cap); ``edges``: told
    when session ``index`` opens and gets its first audio (or ends without)."""
    import fishaudio
    from ttsfleet.inference.api import DEFAULT_SAMPLE_RATE
    from ttsfleet.inference.bench_playback import Playback

    handed: list[float] = []
    play, rate = Playback(), DEFAULT_SAMPLE_RATE["pcm"]  # the server's pcm rate: the request names none

    def text():
        time.sleep(pause_s)
        handed.append(time.perf_counter())
        yield TEXT[0]
        yield TEXT[1]

    limit = {"max_new_tokens": frames} if frames else {}
    first, size = None, 0
    start = time.perf_counter()
    if edges is not None:
        edges.opened(index)
    try:
        with fishaudio.FishAudio(api_key="x", base_url=url) as fish:
            for chunk in fish.tts.stream_websocket(text(), format="pcm", reference_id=VOICE_ID,
                                                   config=fishaudio.TTSConfig(temperature=0.7, top_p=0.7,
                                                                              **limit)):
                if first is None and chunk:
                    first = time.perf_counter()
                    if edges is not None:
                        edges.first_audio(index)
                size += len(chunk)
                play.feed(time.perf_counter(), len(chunk) / 2 / rate)
    finally:
        if edges is not None:
            edges.first_audio(index)
    return {"ttfa_s": None if first is None else first - handed[0], "wall_s": time.perf_counter() - start,
            "audio_bytes": size, "seed": seed, "stalls": play.stalls, "stall_s": play.stall_s,
            "first_stall_at_s": play.first_stall_at_s}


#: One client process's lag probe over a round (:class:`~ttsfleet.inference.loop_lag.ThreadLag`):
#: its wake-ups' times and lags (``at_s``, ``lags_s``).
ProcLags = tuple[list[float], list[float]]


@dataclass
class Round:
    """One side's round: its sessions (in index order), the server's /metrics at its steady window's
    edges (:meth:`SteadyEdges.collect`), each client process's lag probe and the sessions' wall time
    (from the first wave's start to the last session's end: the codec's busy share is over it)."""

    rows: list[dict[str, Any]]
    span: Any
    lags: list[ProcLags]
    wall_s: float


def run_round(url: str, args: argparse.Namespace, seed: int) -> Round:
    """``args.sessions`` sessions, ``args.concurrency`` at a time; the first ``concurrency`` of them
    open together (the first wave), each later one as an earlier one ends (steady state). Session
    lengths spread by ``--frames-spread`` (:func:`~ttsfleet.inference.bench.spread_frames`). The
    sessions run as threads of this process, or of ``--client-procs`` processes that share the
    concurrency (:func:`run_in_procs`)."""
    edges = SteadyEdges(url, args.concurrency, args.sessions)
    run = run_in_process if args.client_procs == 1 else run_in_procs
    rows, lags, wall = run(url, args, seed, edges)
    rows.sort(key=lambda r: r["index"])
    rows = [{**{k: v for k, v in r.items() if k != "index"}, "first_wave": r["index"] < args.concurrency}
            for r in rows]
    return Round(rows, edges.collect(), lags, wall)


def take_index(counter: Any, sessions: int) -> int | None:
    """The next session to open (a ``multiprocessing.Value`` shared by every client thread of the
    round, whichever process: sessions open in index order as in one pool), None once all have."""
    with counter.get_lock():
        i = counter.value
        if i >= sessions:
            return None
        counter.value = i + 1
    return i


def run_share(url: str, args: argparse.Namespace, seed: int, threads: int, counter: Any,
              edges: SteadyEdges | EdgeEvents) -> list[dict[str, Any]]:
    """``threads`` of the round's concurrency: each runs sessions one after another, taking the next
    index each time (:func:`take_index`), so its share stays busy until the round's sessions run out.
    The sessions' rows, each with its ``index`` and the client process that ran it."""
    from ttsfleet.inference.bench import spread_frames

    def sessions() -> list[dict[str, Any]]:
        out = []
        while (i := take_index(counter, args.sessions)) is not None:
            frames = spread_frames(args.frames, args.frames_spread, seed, i) if args.frames else 0
            out.append({**one_session(url, args.pause_ms / 1000, seed + i, frames, edges, i), "index": i,
                        "client_pid": os.getpid()})
        return out

    with ThreadPoolExecutor(threads) as pool:
        futures = [pool.submit(sessions) for _ in range(threads)]
        return [row for f in futures for row in f.result()]


def run_in_process(url: str, args: argparse.Namespace, seed: int,
                   edges: SteadyEdges) -> tuple[list[dict[str, Any]], list[ProcLags], float]:
    """The round as threads of this one process (``--client-procs 1``), its lag probe beside them."""
    from ttsfleet.inference.loop_lag import ThreadLag

    lag, counter = ThreadLag(), multiprocessing.get_context("spawn").Value("i", 0)
    lag.start()
    t0 = time.perf_counter()
    try:
        rows = run_share(url, args, seed, args.concurrency, counter, edges)
    finally:
        lag.stop()
    return rows, [(lag.at_s, lag.lags_s)], time.perf_counter() - t0


def shares(concurrency: int, procs: int) -> list[int]:
    """Each client process's threads: the concurrency split as evenly as it goes."""
    return [concurrency // procs + (j < concurrency % procs) for j in range(procs)]


def client_proc(url: str, args: argparse.Namespace, seed: int, threads: int, counter: Any, events: Any,
                go: Any) -> None:
    """One client process of a round (spawned: a top-level function): imports what a session needs,
    says it is ready and waits for ``go`` (every process ready, so the first wave opens together),
    then runs its share (:func:`run_share`) with its own lag probe; its sessions' open and
    first-audio events, then its rows and lags (or the error) go to the parent on ``events``."""
    try:
        import fishaudio  # noqa: F401 -- imported before the start, not inside the first wave
        from ttsfleet.inference.bench_playback import Playback  # noqa: F401
        from ttsfleet.inference.loop_lag import ThreadLag

        events.put(("ready", None))
        go.wait()
        lag = ThreadLag()
        lag.start()
        try:
            rows = run_share(url, args, seed, threads, counter, EdgeEvents(events))
        finally:
            lag.stop()
        events.put(("done", (rows, (lag.at_s, lag.lags_s))))
    except BaseException:  # the parent raises it: a round missing a process's sessions is no result
        events.put(("error", traceback.format_exc()))


def run_in_procs(url: str, args: argparse.Namespace, seed: int,
                 edges: SteadyEdges) -> tuple[list[dict[str, Any]], list[ProcLags], float]:
    """The round over ``--client-procs`` spawned processes (:func:`client_proc`), each its
    :func:`shares` of the concurrency as threads and its own lag probe. Why: ~190 threads of one
    interpreter (three a session at c=64) wait for one lock, and a session's first audio is timed
    only once its thread has it back; spread over processes, that wait is the client's no more.
    This process only relays their events to ``edges`` (:func:`relay`)."""
    ctx = multiprocessing.get_context("spawn")
    counter, events, go = ctx.Value("i", 0), ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=client_proc, args=(url, args, seed, n, counter, events, go), daemon=True,
                         name=f"live-client-{j}")
             for j, n in enumerate(shares(args.concurrency, args.client_procs))]
    for p in procs:
        p.start()
    try:
        return relay(events, procs, go, edges)
    except BaseException:
        for p in procs:  # a failed round: the other processes' sessions are no result either
            p.terminate()
        raise
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()


def relay(events: Any, procs: list[Any], go: Any,
          edges: SteadyEdges) -> tuple[list[dict[str, Any]], list[ProcLags], float]:
    """The client processes' events until each has sent its results: ``go`` once all are ready, each
    session's open and first audio to ``edges`` (in the order they arrive: a ms or so after they
    happened, the same for every session), then their rows, lags and the wall time from ``go``."""
    ready, rows, lags, t0 = 0, [], [], time.perf_counter()
    while len(lags) < len(procs):
        try:
            kind, what = events.get(timeout=1.0)
        except queue.Empty:
            if dead := [p.name for p in procs if p.exitcode not in (None, 0)]:
                raise RuntimeError(f"client processes {dead} died without a result") from None
            continue
        if kind == "opened":
            edges.opened(what)
        elif kind == "first_audio":
            edges.first_audio(what)
        elif kind == "ready":
            ready += 1
            if ready == len(procs):
                t0 = time.perf_counter()
                go.set()
        elif kind == "done":
            rows += what[0]
            lags.append(what[1])
        else:
            raise RuntimeError(f"a client process failed:\n{what}")
    return rows, lags, time.perf_counter() - t0


def client_lag(rounds: list[tuple[Any, list[ProcLags]]]) -> dict[str, dict[str, float]]:
    """The bench client's own lateness (its lag probes, every process's merged), over the rounds'
    steady windows (those that had one: the wake-ups between its edges) and over the whole rounds,
    each with the worst single process's p99 (a round's)."""
    from ttsfleet.inference.loop_lag import lags_between

    whole = [lags for _, procs in rounds for _, lags in procs]
    steady = [lags_between(at, lags, span[0].start, span[0].end)
              for span, procs in rounds if span is not None for at, lags in procs]
    return {"steady": merged_lags(steady), "whole": merged_lags(whole)}


def merged_lags(per_proc: list[list[float]]) -> dict[str, float]:
    """:func:`~ttsfleet.inference.loop_lag.lag_summary` of every process's lags together, and the
    worst process's p99 beside it (NaN where none ticked)."""
    from ttsfleet.inference.loop_lag import lag_summary

    worst = max((lag_summary(p)["p99_ms"] for p in per_proc if p), default=float("nan"))
    return {**lag_summary([x for p in per_proc for x in p]), "worst_proc_p99_ms": worst}


def summarize(rows: list[dict[str, Any]]) -> dict[str, float]:
    """First audio over all sessions, and over the steady ones alone (after the first wave, which
    opens ``concurrency`` sessions at one instant: a burst no steady load has); beside it, the
    listener's underruns (:mod:`ttsfleet.inference.bench_playback`): the share of sessions with a gap,
    the p99 of their summed silence and the median audio played before the first gap."""
    from ttsfleet.inference.bench_playback import first_stall_p50, underrun_tail

    out: dict[str, float] = {"failed": sum(r["ttfa_s"] is None or not r["audio_bytes"] for r in rows)}
    for name, pick in (("", rows), ("steady_", [r for r in rows if not r.get("first_wave", True)])):
        t = [r["ttfa_s"] * 1000 for r in pick if r["ttfa_s"] is not None]
        out[f"{name}n"] = len(t)
        for q in (50, 90, 99):
            out[f"{name}ttfa_p{q}_ms"] = float(np.percentile(t, q)) if t else float("nan")
        share, p99_s = underrun_tail((r.get("stalls", 0), r.get("stall_s", 0.0))
                                     for r in pick if r["audio_bytes"])
        out[f"{name}stalled_share"], out[f"{name}stall_p99_ms"] = share, 1000 * p99_s
        out[f"{name}first_stall_at_p50_ms"] = 1000 * first_stall_p50(
            r.get("first_stall_at_s") for r in pick if r["audio_bytes"])
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
    ap.add_argument("--client-procs", type=int, default=1,
                    help="client processes the sessions are spread over, each its share of --concurrency "
                         "as threads (1: all threads of this one interpreter)")
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
    if not 1 <= args.client_procs <= args.concurrency:
        ap.error(f"--client-procs {args.client_procs}: from 1 to --concurrency ({args.concurrency})")
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
    spans: dict[str, list[Any]] = {k: [] for k in sides}  # per round: (steady window, its two reads)
    lags: dict[str, list[Any]] = {k: [] for k in sides}  # per round: (its span, its processes' lags)
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
        from ttsfleet.inference.bench_steady import Counts, span_reading, view_of

        walls = dict.fromkeys(sides, 0.0)  # each side's sessions' wall time: its codec's busy share
        for r in tqdm(range(args.rounds), desc=f"rounds ({', then '.join(sides)})"):
            got = {}
            for k in sides:
                done = run_round(servers[k][1], args, 1000 * r)
                got[k] = done.rows
                walls[k] += done.wall_s
                spans[k].append(done.span)
                lags[k].append((done.span, done.lags))
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
        # the same figures over the rounds' steady windows (read live at their edges: SteadyEdges),
        # and the whole rounds' stage p99s and first audios beside them (the server's totals: every
        # session it served)
        whole = {k: view_of(Counts.between([], s, walls[k])) for k, s in samples.items()}
        steady = {k: span_reading(v) if all(v) else None for k, v in spans.items()}  # every round's
    finally:
        for proc, _ in servers.values():
            proc.send_signal(signal.SIGINT)
            proc.wait(30)
    report = {"date": time.strftime("%Y-%m-%d"), "host": os.uname().nodename, "cpus": os.cpu_count(),
              "load_avg_1m": os.getloadavg()[0], "args": {k: str(v) for k, v in vars(args).items()},
              "sides": {k: summarize(v) for k, v in rows.items()}, "p50_ratio_per_round": ratios,
              "prefill_tokens_reused": reused, "ttfa_stage_mean_ms": stages, "admission_waits": waits,
              "codec": codec, **steady_report(whole, steady),
              "client_thread_lag": {k: client_lag(v) for k, v in lags.items()}, "sessions": rows}
    (args.out / "live_prefix.json").write_text(json.dumps(report, indent=2))
    print_report(report, args.concurrency)


def steady_report(whole: dict[str, Any], steady: dict[str, Any]) -> dict[str, Any]:
    """The report's keys beside the whole rounds' (``ttfa_stage_mean_ms``, ``admission_waits``,
    ``codec``): per side, the whole rounds' stage p99s, the same figures over the rounds' steady
    windows (:class:`SteadyEdges`; a side is left out where a round had none) and ``steady_reads``:
    whether the side's windows were read, their seconds and first audios (summed over the rounds)
    beside all the server's, and how late the reads were sent (the worst round's)."""
    out: dict[str, Any] = {"ttfa_stage_p99_ms": {k: v.stage_p99_ms for k, v in whole.items()},
                           "engine": {k: v.engine for k, v in whole.items() if v.engine}}
    for key, part in (("ttfa_stage_steady_mean_ms", "stage_means_ms"),
                      ("ttfa_stage_steady_p99_ms", "stage_p99_ms"),
                      ("admission_waits_steady", "waits"), ("codec_steady", "codec"),
                      ("engine_steady", "engine")):
        out[key] = {k: getattr(r.view, part) for k, r in steady.items() if r is not None}
    out["steady_reads"] = {}
    for k, r in steady.items():
        entry: dict[str, Any] = {"read": r is not None, "whole_requests": whole[k].requests}
        if r is not None:
            entry.update(seconds=r.view.seconds, requests=r.view.requests, start_lag_ms=r.start_lag_ms,
                         end_lag_ms=r.end_lag_ms)
        out["steady_reads"][k] = entry
    return out


STEADY, WHOLE = "steady sessions", "whole rounds, first wave included"
#: The server's lines per side: (report key, what its figures are, the span they cover).
SERVER_LINES = (
    ("ttfa_stage_steady_mean_ms", "time to first audio by stage, mean ms (server)", STEADY),
    ("ttfa_stage_steady_p99_ms", "time to first audio by stage, p99 ms (server, each its own)", STEADY),
    ("admission_waits_steady", "engine iterations that left requests waiting, by cause (server)", STEADY),
    ("ttfa_stage_mean_ms", "time to first audio by stage, mean ms (server)", WHOLE),
    ("ttfa_stage_p99_ms", "time to first audio by stage, p99 ms (server, each its own)", WHOLE),
    ("admission_waits", "engine iterations that left requests waiting, by cause (server)", WHOLE),
)


def print_report(report: dict[str, Any], concurrency: int) -> None:
    """The sides' first-audio table, then what the servers said of their sessions: per side, over
    the steady sessions' window first (what the steady first audio is made of), then over the whole
    rounds."""
    from ttsfleet.inference.bench import codec_line
    from ttsfleet.inference.bench_engine_loop import engine_line

    print("\n| side | sessions | first audio p50 / p90 / p99 ms | steady sessions "
          "| steady p50 / p90 / p99 ms | steady: sessions with underruns, silence p99 ms, "
          "first after ms (p50) | failed |\n|---|---:|---:|---:|---:|---:|---:|")
    for k, s in report["sides"].items():
        print(f"| {k} | {s['n']} | {s['ttfa_p50_ms']:.0f} / {s['ttfa_p90_ms']:.0f} / {s['ttfa_p99_ms']:.0f} "
              f"| {s['steady_n']} | {s['steady_ttfa_p50_ms']:.0f} / {s['steady_ttfa_p90_ms']:.0f} / "
              f"{s['steady_ttfa_p99_ms']:.0f} | {s['steady_stalled_share']:.1%}, "
              f"{s['steady_stall_p99_ms']:.0f}, {s['steady_first_stall_at_p50_ms']:.0f} | {s['failed']} |")
    print(f"prompt tokens reused (server counter): {report['prefill_tokens_reused']}")
    procs = int(report["args"].get("client_procs", 1))
    for k in report["sides"]:
        print(steady_read_line(k, report.get("steady_reads", {}).get(k)))
        if lag := report.get("client_thread_lag", {}).get(k):
            print(client_lag_line(k, lag, procs))
        for key, what, span in SERVER_LINES:
            if values := report.get(key, {}).get(k):
                print(f"{k}: {what}, {span}: " + ", ".join(f"{name} {v:.0f}" for name, v in values.items()))
        for key, span in (("codec_steady", "the steady windows"), ("codec", "the rounds' wall time")):
            if use := report.get(key, {}).get(k):
                print(f"{k}: {codec_line({'concurrency': concurrency, **use}, span)}")
        for key, span in (("engine_steady", STEADY), ("engine", WHOLE)):
            if use := report.get(key, {}).get(k):
                print(f"{k}: {engine_line({'concurrency': concurrency, **use}, span)}")
    if ratios := report["p50_ratio_per_round"]:
        print(f"whole / reuse p50 per round: {', '.join(f'{x:.2f}' for x in ratios)} "
              f"(median {statistics.median(ratios):.2f})")


def client_lag_line(side: str, lag: dict[str, dict[str, float]], procs: int) -> str:
    """How late the bench client's own threads woke, over the steady windows where it has them."""

    def words(s: dict[str, float], span: str) -> str:
        return (f"p50 {s['p50_ms']:.1f} / p99 {s['p99_ms']:.1f} / max {s['max_ms']:.0f} ms {span} "
                f"({s['ticks']} ticks, worst process p99 {s['worst_proc_p99_ms']:.1f})")

    spans = [words(lag["steady"], "over the steady windows")] if lag["steady"]["ticks"] else []
    return (f"{side}: the bench client's own threads ({procs} process{'es' if procs > 1 else ''}) "
            "woke late by " + "; ".join([*spans, words(lag["whole"], "over the whole rounds")])
            + ": its first audios are read that much late")


def steady_read_line(side: str, r: dict[str, Any] | None) -> str:
    """Where a side's steady windows were read, or that they were not."""
    if not r or not r["read"]:
        return (f"{side}: no steady window (no more sessions than --concurrency, or an edge not read): "
                f"the server's figures below are the whole rounds' only")
    return (f"{side}: steady windows read live: {r['seconds']:.2f} s, {r['requests']} of the server's "
            f"{r['whole_requests']} first audios, reads {r['start_lag_ms']:.1f}/{r['end_lag_ms']:.1f} ms "
            f"after their edges")


if __name__ == "__main__":
    main()
