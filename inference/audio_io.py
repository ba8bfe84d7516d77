"""Audio in and out of the server: encode float32 chunks to wav / pcm / mp3 / opus / flac / aac as
they decode, and decode uploaded reference audio.

Resampling is one stateful libsoxr stream per response. Encoders are incremental so a streamed
response can send bytes as soon as frames decode: WAV and
PCM are written directly, MP3 (LAME) and Ogg/Opus go through libsndfile (python-soundfile) writing
into an in-memory sink whose new bytes are drained after every chunk. Header patches that libsndfile
makes at close (it seeks back to byte 0) are kept for whole responses and dropped for streamed ones,
where those bytes are already on the wire; decoders do not need them. AAC (ADTS, OpenAI's ``aac``)
has no encoder in libsndfile: it goes through an ``ffmpeg`` child process fed on stdin and drained
by a reader thread, and is refused with a clear message where ffmpeg is not installed.

FLAC is the exception: its length lives in STREAMINFO at the start of the file, and a stream of
unknown length (total samples 0, as the format allows) is read by ffmpeg but not by libsndfile,
which takes it for 2^63 frames (python-soundfile: "array is too big"; libsndfile issue #1038). So
over HTTP a FLAC response is held until its audio is complete and sent with an exact header; only
the live WebSocket (``stream_flac=True``) streams FLAC of unknown length.

Bitrates: libsndfile maps a "compression level" onto the encoder's bitrate linearly, over a range
that depends on the codec (and for MP3 on the MPEG version the sample rate implies); the levels
here are that mapping inverted, so LAME gets the CBR rate asked for, or the nearest one the MPEG
version has (:func:`mp3_bitrate_kbps`), and libopus its target bitrate.
"""

from __future__ import annotations

import io
import shutil
import struct
import subprocess
import threading

import numpy as np

#: Streamed WAV files carry this "unknown" size in their RIFF and data headers.
_UNKNOWN_SIZE = 0xFFFFFFFF


def wav_header(sample_rate: int, num_samples: int | None, channels: int = 1) -> bytes:
    """A 16-bit PCM WAV header; ``num_samples=None`` writes the streaming (unknown length) form."""
    block = 2 * channels
    data_size = _UNKNOWN_SIZE if num_samples is None else num_samples * block
    riff_size = _UNKNOWN_SIZE if num_samples is None else 36 + data_size
    return (b"RIFF" + struct.pack("<I", riff_size) + b"WAVE"
            + b"fmt " + struct.pack("<IHHIIHH", 16, 1, channels, sample_rate, sample_rate * block, block, 16)
            + b"data" + struct.pack("<I", data_size))


#: MPEG Layer III bitrates (kbps) by MPEG version, as libsndfile picks it from the sample rate:
#: MPEG-1 (32-48 kHz), MPEG-2 (16-24 kHz), MPEG-2.5 (8-12 kHz; libsndfile caps it at 64 kbps).
MP3_BITRATES: dict[str, tuple[int, ...]] = {
    "mpeg1": (32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320),
    "mpeg2": (8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160),
    "mpeg2.5": (8, 16, 24, 32, 40, 48, 56, 64),
}


def _mpeg_version(sample_rate: int) -> str:
    return "mpeg1" if sample_rate >= 32000 else "mpeg2" if sample_rate >= 16000 else "mpeg2.5"


def mp3_bitrate_kbps(requested: int, sample_rate: int) -> int:
    """The CBR bitrate an MP3 at ``sample_rate`` gets for ``requested`` kbps: the same, or the nearest
    its MPEG version has (192 at 24 kHz is 160: MPEG-2 stops there)."""
    rates = MP3_BITRATES[_mpeg_version(sample_rate)]
    return min(rates, key=lambda r: (abs(r - requested), r))


def mp3_compression_level(requested: int, sample_rate: int) -> float:
    """libsndfile's compression level for a CBR MP3 of ``requested`` kbps at ``sample_rate``.

    libsndfile sets ``bitrate = int(max - level * (max - min))`` over the MPEG version's range and
    LAME rounds that to a valid rate; the level aims at the middle of the wanted rate's rounding
    interval, so float error cannot tip it to a neighbour."""
    rates = MP3_BITRATES[_mpeg_version(sample_rate)]
    lo, hi = rates[0], rates[-1]
    target = mp3_bitrate_kbps(requested, sample_rate) + 0.5
    return min(max((hi - target) / (hi - lo), 0.0), 1.0)


def opus_compression_level(bps: int, channels: int = 1) -> float:
    """libsndfile's compression level for an Opus target of ``bps`` bits/s (it maps the level onto
    6-256 kbps per channel: ``bitrate = (1 - level) * 250000 + 6000``)."""
    per_channel = bps / channels
    return min(max(1.0 - (per_channel - 6000.0) / 250000.0, 0.0), 1.0)


def clip_unit(x: np.ndarray) -> np.ndarray:
    """``x`` clipped to [-1, 1] as a new array, by two ufunc calls: ``np.clip`` goes through Python
    wrappers that cost more than the clipping of a streamed chunk (py-spy of the served path at c=64,
    2026-12-02: 12 % of the event loop's thread inside ``np.clip``)."""
    y = np.maximum(x, -1.0)
    return np.minimum(y, 1.0, out=y)


def to_int16(x: np.ndarray) -> bytes:
    y = clip_unit(x)
    return np.multiply(y, 32767.0, out=y).astype("<i2").tobytes()


class Resampler:
    """Streaming resampler (libsoxr, HQ) that also applies prosody speed as a tape-speed change.

    Stateful across chunks: a streamed response carries exactly the samples of the whole-file one
    (per-chunk resampling would click at every chunk edge and drift by a sample per chunk).
    """

    def __init__(self, src_rate: int, dst_rate: int, speed: float = 1.0):
        self.in_rate = float(src_rate) * float(speed)  # playing faster = treating the input as faster
        self.out_rate = float(dst_rate)
        self.identity = self.in_rate == self.out_rate
        self._stream = None

    def __call__(self, x: np.ndarray, last: bool = False) -> np.ndarray:
        """Resample one chunk; ``last=True`` flushes the filter's tail."""
        x = np.asarray(x, dtype=np.float32)
        if self.identity:
            return x
        if self._stream is None:
            import soxr

            self._stream = soxr.ResampleStream(self.in_rate, self.out_rate, 1, dtype="float32", quality="HQ")
        return self._stream.resample_chunk(x, last=last)


class _Sink(io.RawIOBase):
    """A seekable in-memory file for libsndfile; ``drain()`` returns bytes appended since last time."""

    def __init__(self) -> None:
        super().__init__()
        self.buf = bytearray()
        self.pos = 0
        self.sent = 0

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def write(self, b) -> int:  # type: ignore[override]
        data = bytes(b)
        end = self.pos + len(data)
        if end > len(self.buf):
            self.buf.extend(b"\0" * (end - len(self.buf)))
        self.buf[self.pos:end] = data
        self.pos = end
        return len(data)

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self.pos, 2: len(self.buf)}[whence]
        self.pos = base + offset
        return self.pos

    def tell(self) -> int:
        return self.pos

    def read(self, n: int = -1) -> bytes:
        return b""

    def drain(self) -> bytes:
        out = bytes(self.buf[self.sent:])
        self.sent = len(self.buf)
        return out


class AudioEncoder:
    """Incremental encoder for one response: ``push(chunk)`` → bytes to send, ``finish()`` → the tail.

    For whole (non-streamed) responses call :meth:`encode_all` instead, which writes exact headers.
    """

    def __init__(self, fmt: str, sample_rate: int, src_rate: int, *, mp3_bitrate: int = 128,
                 opus_bitrate: int = -1000, volume_db: float = 0.0, speed: float = 1.0,
                 stream_flac: bool = False):
        if fmt not in ENCODABLE:
            raise ValueError(f"unknown format {fmt!r}")
        self.fmt = fmt
        self.sample_rate = sample_rate
        self.gain = float(10 ** (volume_db / 20.0))
        self.resample = Resampler(src_rate, sample_rate, speed)
        self.samples_out = 0
        self._mp3_bitrate = mp3_bitrate
        self._opus_bitrate = opus_bitrate
        self._sink: _Sink | None = None
        self._sf = None
        self._aac: _FfmpegAac | None = None
        self._started = False
        #: FLAC held until finish() for an exact header (see the module docstring), unless streamed.
        self._held: list[np.ndarray] | None = [] if fmt == "flac" and not stream_flac else None

    @property
    def inline(self) -> bool:
        """Cheap enough to run on the event loop: raw PCM / WAV at the source rate. Everything else
        (resampling, LAME, libopus, FLAC, ffmpeg) is pushed from a worker thread by the server."""
        return self.fmt in ("wav", "pcm") and self.resample.identity

    async def push_async(self, chunk: np.ndarray) -> bytes:
        """:meth:`push` off the event loop unless it is :attr:`inline`."""
        if self.inline:
            return self.push(chunk)
        import asyncio

        return await asyncio.to_thread(self.push, chunk)

    async def finish_async(self) -> bytes:
        """:meth:`finish` off the event loop unless it is :attr:`inline`."""
        if self.inline:
            return self.finish()
        import asyncio

        return await asyncio.to_thread(self.finish)

    def _open_sndfile(self) -> None:
        import soundfile as sf

        self._sink = _Sink()
        if self.fmt == "mp3":
            level = mp3_compression_level(self._mp3_bitrate, self.sample_rate)
            self._sf = sf.SoundFile(self._sink, "w", samplerate=self.sample_rate, channels=1, format="MP3",
                                    subtype="MPEG_LAYER_III", compression_level=level,
                                    bitrate_mode="CONSTANT")
        elif self.fmt == "opus":
            kw = {}
            if self._opus_bitrate > 0:  # -1000 = libopus' automatic bitrate
                kw["compression_level"] = opus_compression_level(self._opus_bitrate)
            self._sf = sf.SoundFile(self._sink, "w", samplerate=self.sample_rate, channels=1, format="OGG",
                                    subtype="OPUS", **kw)
        else:  # flac
            self._sf = sf.SoundFile(self._sink, "w", samplerate=self.sample_rate, channels=1, format="FLAC",
                                    subtype="PCM_16")

    def _prep(self, chunk: np.ndarray, last: bool = False) -> np.ndarray:
        x = np.asarray(chunk, dtype=np.float32).reshape(-1)
        if self.gain != 1.0:
            x = x * self.gain
        x = clip_unit(self.resample(x, last=last))
        self.samples_out += x.size
        return x

    def push(self, chunk: np.ndarray, last: bool = False) -> bytes:
        """Encode one chunk of source-rate float32 audio; returns the bytes ready to send."""
        x = self._prep(chunk, last=last)
        if self._held is not None:
            self._held.append(x)
            return b""
        head = b""
        if not self._started:
            self._started = True
            if self.fmt == "wav":
                head = wav_header(self.sample_rate, None)
            elif self.fmt == "aac":
                self._aac = _FfmpegAac(self.sample_rate)
            else:
                self._open_sndfile()
        if self.fmt in ("wav", "pcm"):
            return head + to_int16(x)
        if self._aac is not None:
            return self._aac.write(x)
        assert self._sf is not None and self._sink is not None
        if x.size:
            self._sf.write(x)
        return self._sink.drain()

    def finish(self) -> bytes:
        """Flush the resampler and the encoder; returns the last bytes of a streamed response."""
        head = self.push(np.zeros(0, np.float32), last=True)
        if self._held is not None:
            audio = np.concatenate(self._held) if self._held else np.zeros(0, np.float32)
            self._held = None
            return self._whole(audio)
        if self.fmt in ("wav", "pcm"):
            return head
        if self._aac is not None:
            return head + self._aac.close()
        assert self._sf is not None and self._sink is not None
        self._sf.close()
        return head + self._sink.drain()

    def abort(self) -> None:
        """Release the encoder of a response that will not be finished (client gone)."""
        if self._aac is not None:
            self._aac.kill()

    def encode_all(self, audio: np.ndarray) -> bytes:
        """Encode a whole response with exact headers (sizes, LAME tag)."""
        return self._whole(self._prep(audio, last=True))

    def _whole(self, x: np.ndarray) -> bytes:
        """Prepared (resampled, gained) samples as one file with exact headers."""
        if self.fmt == "pcm":
            return to_int16(x)
        if self.fmt == "wav":
            return wav_header(self.sample_rate, x.size) + to_int16(x)
        if self.fmt == "aac":
            enc = _FfmpegAac(self.sample_rate)
            return enc.write(x) + enc.close()
        self._started = True
        self._open_sndfile()
        assert self._sf is not None and self._sink is not None
        if x.size:
            self._sf.write(x)
        self._sf.close()
        return bytes(self._sink.buf)


ENCODABLE = ("wav", "pcm", "mp3", "opus", "flac", "aac")


def can_encode(fmt: str) -> bool:
    """Whether this machine can write ``fmt`` (aac needs ffmpeg)."""
    return fmt in ENCODABLE and (fmt != "aac" or shutil.which("ffmpeg") is not None)


class _FfmpegAac:
    """AAC-LC in ADTS frames from an ffmpeg child: float32 samples in on stdin, bytes out as they come."""

    def __init__(self, sample_rate: int, bitrate_kbps: int = 128):
        ffmpeg = shutil.which("ffmpeg")
        if ffmpeg is None:
            raise ValueError("aac needs ffmpeg on the server")
        self._proc = subprocess.Popen(
            [ffmpeg, "-hide_banner", "-loglevel", "error", "-f", "f32le", "-ar", str(sample_rate), "-ac", "1",
             "-i", "pipe:0", "-c:a", "aac", "-b:a", f"{bitrate_kbps}k", "-f", "adts", "pipe:1"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self._out = bytearray()
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, name="ttsfleet-aac", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        while chunk := self._proc.stdout.read1(65536):
            with self._lock:
                self._out.extend(chunk)

    def _take(self) -> bytes:
        with self._lock:
            out = bytes(self._out)
            self._out.clear()
        return out

    def write(self, x: np.ndarray) -> bytes:
        assert self._proc.stdin is not None
        if x.size:
            self._proc.stdin.write(np.asarray(x, dtype="<f4").tobytes())
            self._proc.stdin.flush()
        return self._take()

    def close(self) -> bytes:
        assert self._proc.stdin is not None
        self._proc.stdin.close()
        self._reader.join(timeout=60)
        self._proc.wait(timeout=60)
        return self._take()

    def kill(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(timeout=10)


def decode_audio(data: bytes) -> tuple[np.ndarray, int]:
    """Decode uploaded audio (wav, flac, mp3, ogg; anything ffmpeg reads) to mono float32."""
    import soundfile as sf

    if not data:
        raise ValueError("audio is empty")
    try:
        x, sr = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
        return x.mean(axis=1).astype(np.float32), int(sr)
    except Exception:  # libsndfile does not know it: try ffmpeg
        pass
    ffmpeg = shutil.which("ffmpeg")
    if ffmpeg is None:
        raise ValueError("audio could not be decoded (unsupported format)")
    proc = subprocess.run([ffmpeg, "-hide_banner", "-loglevel", "error", "-i", "pipe:0", "-f", "f32le",
                           "-ac", "1", "-ar", "44100", "pipe:1"], input=data, capture_output=True, timeout=60)
    if proc.returncode != 0 or not proc.stdout:
        raise ValueError("audio could not be decoded (unsupported or corrupt)")
    return np.frombuffer(proc.stdout, dtype="<f4").astype(np.float32), 44100
