"""Request schemas and error bodies of the HTTP API, kept apart from the server so they can be tested,
documented and reused by the load generator without importing FastAPI or torch.

``TTSRequest`` follows Fish Audio's public ``POST /v1/tts`` (fish_tts_api.json); ``SpeechRequest`` is
the OpenAI-style ``POST /v1/audio/speech``. Every way a request can be wrong ends as an
:class:`ApiError` carrying an HTTP status and a ``{status, message, reason}`` body, never a 500.
"""

from __future__ import annotations

import base64
import json
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

AudioFormat = Literal["wav", "pcm", "mp3", "opus"]
FORMATS: tuple[str, ...] = ("wav", "pcm", "mp3", "opus")
#: Sample rates the encoders accept, per format (opus only supports its own set).
SAMPLE_RATES: dict[str, tuple[int, ...]] = {
    "wav": (8000, 16000, 22050, 24000, 32000, 44100, 48000),
    "pcm": (8000, 16000, 22050, 24000, 32000, 44100, 48000),
    "mp3": (8000, 16000, 22050, 24000, 32000, 44100, 48000),
    "opus": (8000, 12000, 16000, 24000, 48000),
}
DEFAULT_SAMPLE_RATE = {"wav": 44100, "pcm": 44100, "mp3": 44100, "opus": 48000}
#: OpenAI voices accepted without a stored reference (they all mean "the model's default voice").
OPENAI_VOICES = ("default", "alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx", "sage",
                 "shimmer", "verse")
REFERENCE_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class ApiError(Exception):
    """A request the client can fix (4xx) or a state the server is in (429/503)."""

    def __init__(self, status: int, message: str, reason: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.reason = reason
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"status": self.status, "message": self.message, "reason": self.reason}


def audio_bytes(v: Any) -> bytes:
    """Audio arrives as raw bytes in msgpack and as base64 text in JSON."""
    if isinstance(v, (bytes, bytearray)):
        return bytes(v)
    if isinstance(v, str):
        try:
            return base64.b64decode(v, validate=True)
        except ValueError:
            raise ValueError("audio must be bytes (msgpack) or base64 (JSON)") from None
    raise ValueError("audio must be bytes (msgpack) or base64 (JSON)")


class ReferenceAudio(BaseModel):
    """A voice sample and its transcript for zero-shot cloning (audio: raw bytes, or base64 in JSON)."""

    model_config = ConfigDict(extra="ignore")

    audio: bytes
    text: str

    @field_validator("audio", mode="before")
    @classmethod
    def _decode_audio(cls, v: Any) -> bytes:
        return audio_bytes(v)


class Prosody(BaseModel):
    model_config = ConfigDict(extra="ignore")

    speed: float = Field(default=1.0, ge=0.5, le=2.0)
    volume: float = Field(default=0.0, ge=-30.0, le=20.0)
    normalize_loudness: bool = True


class TTSRequest(BaseModel):
    """Body of ``POST /v1/tts`` (Fish Audio compatible; unknown fields are ignored, like the cloud)."""

    model_config = ConfigDict(extra="ignore")

    text: str
    temperature: float = Field(default=0.7, ge=0.0, le=1.0)
    top_p: float = Field(default=0.7, ge=0.0, le=1.0)
    references: list[ReferenceAudio] | None = None
    reference_id: str | list[str] | None = None
    prosody: Prosody | None = None
    chunk_length: int = Field(default=300, ge=100, le=300)
    normalize: bool = True
    format: AudioFormat = "mp3"
    sample_rate: int | None = None
    mp3_bitrate: Literal[64, 128, 192] = 128
    opus_bitrate: Literal[-1000, 24000, 32000, 48000, 64000] = -1000
    latency: Literal["low", "normal", "balanced"] = "normal"
    max_new_tokens: int = Field(default=1024, ge=1)
    repetition_penalty: float = Field(default=1.2, ge=0.5, le=2.0)
    min_chunk_length: int = Field(default=50, ge=0, le=100)
    condition_on_previous_chunks: bool = True
    early_stop_threshold: float = Field(default=1.0, ge=0.0, le=1.0)
    features: list[str] = Field(default_factory=list)
    # Extensions (the local fish-speech server has streaming and seed): top_k, streaming, seed.
    top_k: int = Field(default=30, ge=0, le=4096)
    streaming: bool = False
    seed: int | None = Field(default=None, ge=0, le=2**31 - 1)

    @field_validator("references", mode="before")
    @classmethod
    def _flatten_speakers(cls, v: Any) -> Any:
        # Multi-speaker form is a list of lists; this engine serves one speaker per request.
        if isinstance(v, list) and v and all(isinstance(x, list) for x in v):
            if len(v) > 1:
                raise ValueError("multi-speaker references are not supported by this server")
            return v[0]
        return v


class SpeechRequest(BaseModel):
    """Body of the OpenAI-style ``POST /v1/audio/speech``."""

    model_config = ConfigDict(extra="ignore")

    input: str
    model: str = "tiny"
    voice: str = "default"
    response_format: Literal["wav", "pcm", "mp3", "opus", "flac", "aac"] = "mp3"
    speed: float = Field(default=1.0, ge=0.5, le=2.0)
    stream: bool = False
    stream_format: Literal["audio", "sse"] = "audio"
    temperature: float = Field(default=0.7, ge=0.0, le=1.0)
    top_p: float = Field(default=0.7, ge=0.0, le=1.0)
    max_new_tokens: int = Field(default=1024, ge=1)
    seed: int | None = Field(default=None, ge=0, le=2**31 - 1)

    def to_tts(self) -> TTSRequest:
        if self.response_format in ("flac", "aac"):
            raise ApiError(400, f"response_format {self.response_format!r} is not supported "
                           f"(supported: {', '.join(FORMATS)})", "unsupported_format")
        voice = None if self.voice.lower() in OPENAI_VOICES else self.voice
        return TTSRequest(text=self.input, reference_id=voice, format=self.response_format,
                          prosody=Prosody(speed=self.speed), streaming=self.stream,
                          temperature=self.temperature, top_p=self.top_p,
                          max_new_tokens=self.max_new_tokens, seed=self.seed)


class AddReference(ReferenceAudio):
    """Body of ``POST /v1/references/add``: a reference voice plus the id it is stored under."""

    id: str

    @field_validator("id")
    @classmethod
    def _valid_id(cls, v: str) -> str:
        if not REFERENCE_ID_RE.match(v):
            raise ValueError("id must be 1-64 characters of letters, digits, '_', '-' or '.'")
        return v


def decode_body(raw: bytes, content_type: str | None) -> Any:
    """Parse a JSON or msgpack body; anything else is a 415, a broken body a 400."""
    ctype = (content_type or "").split(";")[0].strip().lower()
    if ctype in ("application/json", ""):
        if not raw:
            raise ApiError(400, "request body is empty", "empty_body")
        try:
            return json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ApiError(400, f"malformed JSON body: {exc}", "malformed_body") from None
    if ctype in ("application/msgpack", "application/x-msgpack", "application/vnd.msgpack"):
        import msgpack

        try:
            return msgpack.unpackb(raw, raw=False, strict_map_key=False)
        except Exception as exc:  # msgpack raises a handful of unrelated types
            raise ApiError(400, f"malformed msgpack body: {type(exc).__name__}", "malformed_body") from None
    raise ApiError(415, f"unsupported content type {ctype!r} (use application/json or application/msgpack)",
                   "unsupported_media_type")


def parse_model(cls: type[BaseModel], data: Any) -> Any:
    """Validate ``data`` into ``cls``, turning validation errors into one readable 400."""
    if not isinstance(data, dict):
        raise ApiError(400, "request body must be an object", "invalid_request")
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        parts = []
        for e in exc.errors()[:5]:
            loc = ".".join(str(x) for x in e["loc"]) or "body"
            parts.append(f"{loc}: {e['msg']}")
        fields = {str(e["loc"][0]) for e in exc.errors() if e["loc"]}
        reason = "unsupported_format" if fields & {"format", "response_format"} else "invalid_request"
        raise ApiError(400, "invalid request: " + "; ".join(parts), reason) from None


def check_sample_rate(fmt: str, sample_rate: int | None) -> int:
    """The output sample rate for ``fmt``: the format default, or the requested one if supported."""
    if sample_rate is None:
        return DEFAULT_SAMPLE_RATE[fmt]
    allowed = SAMPLE_RATES[fmt]
    if sample_rate not in allowed:
        raise ApiError(400, f"sample_rate {sample_rate} is not supported for {fmt} "
                       f"(supported: {', '.join(map(str, allowed))})", "bad_sample_rate")
    return sample_rate


_WS = re.compile(r"\s+")


def normalize_text(text: str) -> str:
    """Light text normalization: unify whitespace and quotes (numbers are left to the model)."""
    text = text.replace("\u201c", '"').replace("\u201d", '"').replace("\u2019", "'")
    return _WS.sub(" ", text).strip()


_SENTENCE_END = re.compile(r"(?<=[.!?;:\u3002\uff01\uff1f])\s+")


def split_text(text: str, chunk_length: int, min_chunk_length: int = 0) -> list[str]:
    """Split text into segments of at most ``chunk_length`` characters, at sentence ends if possible.

    Each segment is generated in turn (conditioned on the previous one), like Fish Audio's
    ``chunk_length``; a segment shorter than ``min_chunk_length`` is merged into its neighbour.
    """
    out: list[str] = []
    cur = ""
    for sent in _SENTENCE_END.split(text.strip()):
        while len(sent) > chunk_length:  # one long sentence: cut at the last space before the limit
            cut = sent.rfind(" ", 0, chunk_length)
            cut = cut if cut > 0 else chunk_length
            if cur:
                out.append(cur)
                cur = ""
            out.append(sent[:cut].strip())
            sent = sent[cut:].strip()
        if not cur:
            cur = sent
        elif len(cur) + 1 + len(sent) <= chunk_length:
            cur = f"{cur} {sent}"
        else:
            out.append(cur)
            cur = sent
    if cur:
        out.append(cur)
    if len(out) > 1 and len(out[-1]) < min_chunk_length and len(out[-2]) + 1 + len(out[-1]) <= chunk_length:
        out[-2:] = [f"{out[-2]} {out[-1]}"]
    return [s for s in out if s]
