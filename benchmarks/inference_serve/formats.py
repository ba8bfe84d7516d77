"""What each response format and bitrate gives, measured on a running server with ffprobe, ffmpeg and
python-soundfile (the README's format table comes from this script's output).

    python -P benchmarks/inference_serve/formats.py --url http://127.0.0.1:8000 [--api-key KEY] > out.md

Every row is one real request: Fish ``POST /v1/tts`` (whole file and ``streaming: true``) and
OpenAI ``POST /v1/audio/speech`` (always streamed, 24 kHz). Reported: the sample rate and bitrate
ffprobe reads (MP3: the stream's CBR rate; Opus: the packets' average, and the file's with Ogg
framing; AAC: the file's), whether python-soundfile and ffmpeg decode it, and whether both decode
the same number of samples.
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
import soundfile as sf

TEXT = " ".join(f"This is sentence number {i} of the format sample, long enough for a segment."
                for i in range(3))
EXT = {"mp3": "mp3", "opus": "ogg", "flac": "flac", "aac": "aac", "wav": "wav"}


def probe(data: bytes, ext: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"a.{ext}"
        path.write_bytes(data)
        entries = "format=bit_rate,duration:stream=bit_rate,sample_rate"
        out = subprocess.run(["ffprobe", "-v", "error", "-show_entries", entries, "-of", "json", str(path)],
                             capture_output=True, text=True, timeout=60, check=True).stdout
        packets = subprocess.run(["ffprobe", "-v", "error", "-show_entries", "packet=size", "-of", "csv=p=0",
                                  str(path)], capture_output=True, text=True, timeout=60, check=True).stdout
    info = json.loads(out)
    stream, fmt = info["streams"][0], info.get("format", {})
    seconds = float(fmt.get("duration") or 0)
    payload = sum(int(v.strip(",")) for v in packets.split()) * 8 / seconds / 1000 if seconds else 0.0
    return {"rate": int(stream["sample_rate"]), "stream_kbps": int(stream.get("bit_rate", 0)) / 1000,
            "file_kbps": int(fmt.get("bit_rate", 0)) / 1000, "packets_kbps": payload, "seconds": seconds}


def decoders(data: bytes) -> tuple[str, str]:
    """(python-soundfile's verdict, ffmpeg's): a sample count or the error."""
    try:
        frames = str(sf.read(io.BytesIO(data), dtype="int16")[0].shape[0])
    except Exception as exc:  # noqa: BLE001 - the verdict is the point
        frames = f"fails ({str(exc)[:24]}...)"
    proc = subprocess.run(["ffmpeg", "-v", "error", "-i", "pipe:0", "-f", "s16le", "-ac", "1", "pipe:1"],
                          input=data, capture_output=True, timeout=60)
    return frames, str(len(proc.stdout) // 2) if proc.returncode == 0 else "fails"


def rows(url: str, key: str | None) -> list[dict]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    out = []
    with httpx.Client(base_url=url, headers=headers, timeout=300) as c:
        cases = [("fish", "mp3", {"mp3_bitrate": b}, s) for b in (64, 128, 192) for s in (False, True)]
        cases += [("fish", "mp3", {"mp3_bitrate": 192, "sample_rate": 24000}, False)]
        cases += [("fish", "opus", {"opus_bitrate": b}, False) for b in (24, 32, 48, 64, -1000)]
        cases += [("fish", f, {}, s) for f in ("flac", "aac", "wav") for s in (False, True)]
        cases += [("openai", f, {}, True) for f in ("mp3", "opus", "aac", "flac", "wav")]
        for route, fmt, extra, streaming in cases:
            if route == "fish":
                resp = c.post("/v1/tts", json={"text": TEXT, "format": fmt, "seed": 1, "streaming": streaming,
                                               **extra})
            else:
                resp = c.post("/v1/audio/speech", json={"input": TEXT, "model": "tts-1", "voice": "alloy",
                                                        "response_format": fmt, "seed": 1})
            resp.raise_for_status()
            soundfile_says, ffmpeg_says = decoders(resp.content)
            out.append({"route": route, "format": fmt, "asked": extra, "streamed": streaming,
                        **probe(resp.content, EXT[fmt]), "soundfile": soundfile_says, "ffmpeg": ffmpeg_says})
    return out


def table(measured: list[dict]) -> str:
    lines = ["| route | format | asked | streamed | Hz | ffprobe kbps | file kbps | soundfile | ffmpeg |",
             "|---|---|---|---|---:|---:|---:|---|---|"]
    for r in measured:
        kbps = r["packets_kbps"] if r["format"] == "opus" else r["stream_kbps"] or r["file_kbps"]
        asked = ", ".join(f"{k}={v}" for k, v in r["asked"].items()) or "-"
        lines.append(f"| {r['route']} | {r['format']} | {asked} | {'yes' if r['streamed'] else 'no'} | "
                     f"{r['rate']} | {kbps:.1f} | {r['file_kbps']:.1f} | {r['soundfile']} | {r['ffmpeg']} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--api-key")
    ap.add_argument("--json", type=Path, help="also write the raw rows here")
    args = ap.parse_args()
    measured = rows(args.url, args.api_key)
    if args.json:
        args.json.write_text(json.dumps(measured, indent=1))
    print(table(measured))
    return 0


if __name__ == "__main__":
    sys.exit(main())
