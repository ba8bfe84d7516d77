"""Public LLM-serving trace formats, read directly into a simulator :class:`~ttsfleet.sim.trace.Trace`.

So a user can replay production traffic (theirs or a published one) without converting it first.
Three request-level formats, each one request per row, read in their published column layouts:

* ``azure`` — Azure LLM inference traces (``Azure/AzurePublicDataset``, 2023 and 2024):
  CSV ``TIMESTAMP,ContextTokens,GeneratedTokens``, the timestamp a date-time
  (``2023-11-16 18:15:46.6805900``, an optional UTC offset);
* ``burstgpt`` — BurstGPT (``HPMLL/BurstGPT``): CSV
  ``Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type`` (newer releases add
  ``Session ID`` and ``Elapsed time``), the timestamp in seconds from the trace's start; rows
  with 0 response tokens are failed requests and are dropped;
* ``mooncake`` — Mooncake (``kvcache-ai/Mooncake``, FAST'25 traces): JSON lines
  ``{"timestamp": ms, "input_length": n, "output_length": n, "hash_ids": [...]}``.

A request's audio length comes from its generated tokens: an LLM's generated token and a TTS
frame are both one autoregressive decode step, so ``frames_per_token`` (default 1) converts one
into the other. Requests are counted into 1 s bins from the first request on; the bins' counts
are replayed exactly (:attr:`Trace.counts`), not re-drawn as Poisson arrivals. ``scale``
multiplies the request rate (a fluid: 0.5 replays half of every second's requests); a window
(``start_s``, ``duration_s``, seconds from the first request) cuts a part of a long trace.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ttsfleet.errors import UserError
from ttsfleet.sim.trace import Trace

#: Formats :func:`load_trace` reads; ``csv`` is the simulator's own (:func:`~ttsfleet.sim.trace.load_csv`).
FORMATS = ("auto", "csv", "azure", "burstgpt", "mooncake")

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
BURSTGPT_COLUMNS = ("Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens",
                    "Log Type")
MOONCAKE_KEYS = ("timestamp", "input_length", "output_length")


def detect_format(path: Path) -> str:
    """The format of a trace file from its first line (header or first JSON object)."""
    first = _first_line(path)
    if first.startswith("{"):
        return "mooncake"
    cols = {c.strip() for c in next(csv.reader([first]), [])}
    if set(AZURE_COLUMNS) <= cols:
        return "azure"
    if {"Timestamp", "Response tokens"} <= cols:
        return "burstgpt"
    if "t" in cols:
        return "csv"
    raise UserError(f"{path}: unknown trace format (header {first[:80]!r}); use --trace-format "
                    f"{'|'.join(FORMATS[1:])}")


def _first_line(path: Path) -> str:
    try:
        with path.open(encoding="utf-8-sig") as fh:
            for line in fh:
                if line.strip():
                    return line.strip()
    except OSError as exc:
        raise UserError(f"cannot read trace {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise UserError(f"{path}: not a text trace file") from None
    raise UserError(f"{path}: trace is empty")


def _csv_rows(path: Path, need: tuple[str, ...], name: str) -> Iterator[tuple[int, dict[str, str]]]:
    with path.open(newline="", encoding="utf-8-sig") as fh:
        reader = csv.DictReader(fh)
        cols = [c.strip() for c in (reader.fieldnames or [])]
        missing = [c for c in need if c not in cols]
        if missing:
            raise UserError(f"{path}: not a {name} trace: missing column(s) "
                            f"{', '.join(missing)} (got {', '.join(cols) or 'nothing'})")
        reader.fieldnames = cols
        yield from enumerate(reader, start=2)


def _timestamp(text: str) -> float:
    """Seconds since the epoch for an Azure trace time (7 fractional digits; UTC if no offset)."""
    stamp = dt.datetime.fromisoformat(text.strip())
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=dt.UTC)
    return stamp.timestamp()


def read_azure(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Arrival times (s) and generated tokens of an Azure LLM inference trace."""
    ts, out = [], []
    for lineno, row in _csv_rows(path, AZURE_COLUMNS, "Azure LLM inference"):
        try:
            ts.append(_timestamp(row["TIMESTAMP"]))
            out.append(float(row["GeneratedTokens"]))
        except (TypeError, ValueError):
            raise UserError(f"{path}:{lineno}: malformed row {dict(row)!r}") from None
    return np.asarray(ts, dtype=np.float64), np.asarray(out, dtype=np.float64)


def read_burstgpt(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Arrival times (s) and response tokens of a BurstGPT trace; failed requests (0 response
    tokens) are dropped."""
    ts, out = [], []
    for lineno, row in _csv_rows(path, ("Timestamp", "Response tokens"), "BurstGPT"):
        try:
            t, n = float(row["Timestamp"]), float(row["Response tokens"])
        except (TypeError, ValueError):
            raise UserError(f"{path}:{lineno}: malformed row {dict(row)!r}") from None
        if n > 0:
            ts.append(t)
            out.append(n)
    return np.asarray(ts, dtype=np.float64), np.asarray(out, dtype=np.float64)


def read_mooncake(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Arrival times (s) and output tokens of a Mooncake JSONL trace (timestamps in ms)."""
    ts, out = [], []
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                ts.append(float(rec["timestamp"]) / 1000.0)
                out.append(float(rec["output_length"]))
            except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                raise UserError(f"{path}:{lineno}: not a Mooncake record (needs "
                                f"{', '.join(MOONCAKE_KEYS)}): {line.strip()[:80]!r}") from None
    return np.asarray(ts, dtype=np.float64), np.asarray(out, dtype=np.float64)


READERS = {"azure": read_azure, "burstgpt": read_burstgpt, "mooncake": read_mooncake}


def bin_requests(times: np.ndarray, tokens: np.ndarray, *, name: str, frames_per_token: float = 1.0,
                 scale: float = 1.0, start_s: float = 0.0, duration_s: float | None = None,
                 default_mean_frames: float = 220.0) -> Trace:
    """Per-request arrivals → a 1 s :class:`Trace` replaying each second's requests exactly."""
    if not len(times):
        raise UserError(f"{name}: no requests")
    if not (np.all(np.isfinite(times)) and np.all(np.isfinite(tokens))):
        raise UserError(f"{name}: timestamps and token counts must be finite")
    if np.any(tokens < 0):
        raise UserError(f"{name}: token counts must be >= 0")
    for label, value in (("trace scale", scale), ("frames per token", frames_per_token)):
        if not (math.isfinite(value) and value > 0):
            raise UserError(f"{label} must be > 0, got {value}")
    if start_s < 0 or (duration_s is not None and duration_s <= 0):
        raise UserError(f"{name}: the window needs start >= 0 and duration > 0")
    rel = times - times.min()  # rows need not be sorted (Azure's are not quite)
    keep = rel >= start_s
    if duration_s is not None:
        keep &= rel < start_s + duration_s
    rel, tok = rel[keep] - start_s, tokens[keep]
    if not len(rel):
        raise UserError(f"{name}: no requests in the window starting at {start_s:g} s")
    n = int(math.ceil(duration_s)) if duration_s is not None else int(rel.max()) + 1
    sec = np.minimum(rel.astype(np.int64), n - 1)
    counts = np.bincount(sec, minlength=n).astype(np.float64)
    frames = np.bincount(sec, weights=tok * frames_per_token, minlength=n)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(counts > 0, frames / np.maximum(counts, 1), np.nan)
    fill_value = float(np.nanmean(mean)) if np.any(counts > 0) else default_mean_frames
    mean = np.where(np.isnan(mean), fill_value, mean)
    mean = np.maximum(mean, 1.0)  # a request decodes at least one frame
    counts *= scale
    return Trace(rate=counts.copy(), mean_frames=mean, name=name, counts=counts)


def load_trace(path: str | Path, fmt: str = "auto", *, frames_per_token: float = 1.0,
               scale: float = 1.0, start_s: float = 0.0, duration_s: float | None = None) -> Trace:
    """Read a trace file in any of :data:`FORMATS` (``auto``: from its first line)."""
    from ttsfleet.sim.trace import load_csv

    p = Path(path)
    if not p.is_file():
        raise UserError(f"trace file not found: {p}")
    if fmt not in FORMATS:
        raise UserError(f"--trace-format {fmt!r}: choose from {', '.join(FORMATS)}")
    if fmt == "auto":
        fmt = detect_format(p)
    if fmt == "csv":
        tr = load_csv(p)
        return tr.scaled(scale).window(start_s, duration_s)
    times, tokens = READERS[fmt](p)
    return bin_requests(times, tokens, name=f"{p.name} ({fmt})", frames_per_token=frames_per_token,
                        scale=scale, start_s=start_s, duration_s=duration_s)
