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
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

AudioFormat = Literal["wav", "pcm", "mp3", "opus", "flac", "aac"]
FORMATS: tuple[str, ...] = get_args(AudioFormat)
_RATES = (8000, 16000, 22050, 24000, 32000, 44100, 48000)
#: Sample rates the encoders accept, per format (opus only supports its own set).
SAMPLE_RATES: dict[str, tuple[int, ...]] = {
    "wav": _RATES, "pcm": _RATES, "mp3": _RATES, "flac": _RATES, "aac": _RATES,
    "opus": (8000, 12000, 16000, 24000, 48000),
}
DEFAULT_SAMPLE_RATE = {"wav": 44100, "pcm": 44100, "mp3": 44100, "opus": 48000, "flac": 44100, "aac": 44100}
#: OpenAI's speech API answers every format at 24 kHz (its ``pcm`` is 24 kHz 16-bit mono little-endian).
OPENAI_SAMPLE_RATE = 24000
#: OpenAI voices accepted without a stored reference (they all mean "the model's default voice").
OPENAI_VOICES = ("default", "alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx", "sage",
                 "shimmer", "verse", "marin", "cedar")
#: OpenAI's speech models, accepted by name (each means the model this server serves), besides the
#: served model's own name; dated snapshots of gpt-4o-mini-tts (``gpt-4o-mini-tts-2025-03-20``) too.
OPENAI_TTS_MODELS = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")
_MODEL_SNAPSHOT = re.compile(r"^gpt-4o-mini-tts-\d{4}-\d{2}-\d{2}$")
#: Reference ids: upstream fish-speech allows letters, digits, ``-``, ``_`` and spaces (1-255); ``.`` is
#: kept from earlier versions of this server. The first character may not be a space or a dot, so an id
#: is always a plain file name.
REFERENCE_ID_RE = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_. -]{0,254}$")
#: Opus bitrates: Fish's HTTP schema says bps (24000 ...), its SDKs send kbps (24 ...); -1000 = automatic.
OPUS_BITRATES = (-1000, 24, 32, 48, 64, 24000, 32000, 48000, 64000)
OpusBitrate = Literal[-1000, 24, 32, 48, 64, 24000, 32000, 48000, 64000]


class ApiError(Exception):
    """A request the client can fix (4xx) or a state the server is in (429/503)."""

    def __init__(self, status: int, message: str, reason: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.reason = reason
        self.headers = headers or {}
        self.counted = False  # already recorded in /metrics by whoever raised it

    def body(self) -> dict[str, Any]:
        return {"status": self.status, "message": self.message, "reason": self.reason}


class ErrorBody(BaseModel):
    """What every error answers (Fish Audio's error schema)."""

    status: int
    message: str
    reason: str | None = None


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

    audio: bytes = Field(json_schema_extra={"format": "binary"})
    text: str

    @field_validator("audio", mode="before")
    @classmethod
    def _decode_audio(cls, v: Any) -> bytes:
        return audio_bytes(v)


#: Request schemas refuse NaN and infinities by name ("a finite number") instead of letting them
#: fail a range check with a misleading message ("less than or equal to 1").
_REQUEST_CONFIG = ConfigDict(extra="ignore", allow_inf_nan=False)


class Prosody(BaseModel):
    """Speed (a tape-speed change: 0.25-4, OpenAI's range, which holds Fish's 0.5-2) and volume in dB."""

    model_config = _REQUEST_CONFIG

    speed: float = Field(default=1.0, ge=0.25, le=4.0)
    volume: float = Field(default=0.0, ge=-30.0, le=20.0)
    normalize_loudness: bool = True


class TTSRequest(BaseModel):
    """Body of ``POST /v1/tts`` (Fish Audio compatible; unknown fields are ignored, like the cloud).

    Ranges follow upstream fish-speech's ``ServeTTSRequest`` where it is wider than the cloud schema
    (``chunk_length`` up to 1000, ``max_new_tokens: 0`` = no limit but the server's cap), and accept
    what the official SDKs send on their defaults (``opus_bitrate: 32`` in kbps).
    """

    model_config = _REQUEST_CONFIG

    text: str
    temperature: float = Field(default=0.7, ge=0.0, le=1.0)
    top_p: float = Field(default=0.7, ge=0.0, le=1.0)
    references: list[ReferenceAudio] | None = None
    reference_id: str | list[str] | None = None
    prosody: Prosody | None = None
    chunk_length: int = Field(default=300, ge=100, le=1000)
    normalize: bool = True
    format: AudioFormat = "mp3"
    sample_rate: int | None = None
    mp3_bitrate: Literal[64, 128, 192] = 128
    opus_bitrate: OpusBitrate = Field(default=-1000, description="-1000 = automatic; kbps or bps")
    latency: Literal["low", "normal", "balanced"] = "normal"
    max_new_tokens: int = Field(default=1024, ge=0, description="frames per segment; 0 = the server's cap")
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

    @property
    def opus_bps(self) -> int:
        """The Opus bitrate in bits per second (-1000 = automatic), whichever unit the client used."""
        rate = int(self.opus_bitrate)
        return rate * 1000 if 0 < rate < 1000 else rate


class VoiceId(BaseModel):
    """OpenAI's custom-voice form ``{"id": ...}``; here the id names a stored reference voice."""

    model_config = ConfigDict(extra="ignore")

    id: str = Field(min_length=1)


class SpeechRequest(BaseModel):
    """Body of OpenAI's ``POST /v1/audio/speech``: always streamed as it generates, every format at 24 kHz.

    ``stream_format: "sse"`` answers OpenAI's event stream (``speech.audio.delta`` / ``speech.audio.done``).
    """

    model_config = _REQUEST_CONFIG

    input: str
    model: str | None = Field(default=None, examples=["tts-1", "gpt-4o-mini-tts"],
                              description="tts-1, tts-1-hd, gpt-4o-mini-tts (or a dated snapshot of it) or "
                              "the served model's name; all mean the served model (omitted: the same)")
    voice: str | VoiceId = "default"
    instructions: str | None = None  # accepted; this model has no instruction following
    response_format: AudioFormat = "mp3"
    speed: float = Field(default=1.0, ge=0.25, le=4.0)
    stream_format: Literal["audio", "sse"] = "audio"
    stream: bool = False  # earlier extension; the response is always streamed now
    temperature: float = Field(default=0.7, ge=0.0, le=1.0)
    top_p: float = Field(default=0.7, ge=0.0, le=1.0)
    max_new_tokens: int = Field(default=1024, ge=0)
    seed: int | None = Field(default=None, ge=0, le=2**31 - 1)

    @property
    def sse(self) -> bool:
        return self.stream_format == "sse"

    @property
    def reference_voice(self) -> str | None:
        """The stored reference voice this request names, None for a built-in voice."""
        voice = self.voice.id if isinstance(self.voice, VoiceId) else self.voice
        return None if voice.lower() in OPENAI_VOICES else voice

    def check_model(self, served: str) -> None:
        """400 (as OpenAI answers) unless ``model`` is omitted, an OpenAI speech model or ``served``."""
        name = self.model
        if name is None or name == served or name in OPENAI_TTS_MODELS or _MODEL_SNAPSHOT.match(name):
            return
        raise ApiError(400, f"model {name!r} is not served here (use {', '.join(OPENAI_TTS_MODELS)} or "
                       f"{served!r})", "unknown_model")

    def to_tts(self) -> TTSRequest:
        return TTSRequest(text=self.input, reference_id=self.reference_voice, format=self.response_format,
                          sample_rate=OPENAI_SAMPLE_RATE, prosody=Prosody(speed=self.speed), streaming=True,
                          temperature=self.temperature, top_p=self.top_p,
                          max_new_tokens=self.max_new_tokens, seed=self.seed)


class AddReference(ReferenceAudio):
    """Body of ``POST /v1/references/add``: a reference voice plus the id it is stored under."""

    id: str

    @field_validator("id")
    @classmethod
    def _valid_id(cls, v: str) -> str:
        if not REFERENCE_ID_RE.match(v):
            raise ValueError("id must be 1-255 letters, digits, '_', '-', '.' or spaces (not starting with "
                             "a space or '.')")
        return v


def _as_list(v: Any) -> Any:
    """A form field sent once arrives as a value, sent several times as a list: always a list."""
    return v if isinstance(v, list) else [] if v in (None, "") else [v]


class CreateVoice(BaseModel):
    """Body of Fish Audio's ``POST /model`` (the SDK's ``voices.create``): a multipart form of voice
    samples (``voices``, files) and their transcripts (``texts``), stored as one reference voice."""

    model_config = ConfigDict(extra="ignore")

    title: str = Field(min_length=1, max_length=255)
    voices: list[bytes] = Field(min_length=1, max_length=8, json_schema_extra={"items": {"format": "binary"}})
    texts: list[str] = Field(default_factory=list, max_length=8)
    description: str = ""
    tags: list[str] = Field(default_factory=list)
    visibility: Literal["public", "unlist", "private"] = "private"
    type: Literal["tts"] = "tts"
    train_mode: Literal["fast"] = "fast"

    @field_validator("voices", mode="before")
    @classmethod
    def _voice_files(cls, v: Any) -> Any:
        return [audio_bytes(x) for x in _as_list(v)]

    @field_validator("texts", "tags", mode="before")
    @classmethod
    def _lists(cls, v: Any) -> Any:
        return _as_list(v)


class UpdateVoice(BaseModel):
    """Body of Fish Audio's ``PATCH /model/{id}`` (the SDK's ``voices.update``)."""

    model_config = ConfigDict(extra="ignore")

    title: str | None = Field(default=None, min_length=1, max_length=255)
    description: str | None = None
    visibility: Literal["public", "unlist", "private"] | None = None
    tags: list[str] | None = None

    @field_validator("tags", mode="before")
    @classmethod
    def _lists(cls, v: Any) -> Any:
        return None if v is None else _as_list(v)


class DeleteReference(BaseModel):
    """Body of ``DELETE /v1/references/delete``."""

    reference_id: str = Field(min_length=1)


class UpdateReference(BaseModel):
    """Body of ``POST /v1/references/update``: rename a stored reference voice."""

    old_reference_id: str = Field(min_length=1)
    new_reference_id: str = Field(min_length=1)


MSGPACK_TYPES = ("application/msgpack", "application/x-msgpack", "application/vnd.msgpack")


def decode_body(raw: bytes, content_type: str | None) -> Any:
    """Parse a JSON or msgpack body; anything else is a 415, a broken body a 400.

    Bodies that parse but cannot be served are 400s too: nesting deeper than the parser's recursion
    limit, and JSON strings holding a lone UTF-16 surrogate (``"\\ud800"``), which no encoder can write.
    """
    ctype = (content_type or "").split(";")[0].strip().lower()
    if ctype in ("application/json", ""):
        if not raw:
            raise ApiError(400, "request body is empty", "empty_body")
        try:
            data = json.loads(raw)
        except RecursionError:
            raise ApiError(400, "JSON body is nested too deeply", "malformed_body") from None
        except (ValueError, UnicodeDecodeError) as exc:
            raise ApiError(400, f"malformed JSON body: {exc}", "malformed_body") from None
        _reject_lone_surrogates(data)
        return data
    if ctype in MSGPACK_TYPES:
        import msgpack

        try:
            return msgpack.unpackb(raw, raw=False, strict_map_key=False)
        except Exception as exc:  # msgpack raises a handful of unrelated types
            raise ApiError(400, f"malformed msgpack body: {type(exc).__name__}", "malformed_body") from None
    raise ApiError(415, f"unsupported content type {ctype!r} (use application/json, application/msgpack"
                   " or multipart/form-data for references)", "unsupported_media_type")


def _reject_lone_surrogates(data: Any) -> None:
    try:
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise ApiError(400, "body holds a lone UTF-16 surrogate (not valid Unicode text)",
                       "malformed_body") from None
    except RecursionError:
        raise ApiError(400, "JSON body is nested too deeply", "malformed_body") from None


def parse_model(cls: type[BaseModel], data: Any) -> Any:
    """Validate ``data`` into ``cls``, turning validation errors into one readable 400."""
    if not isinstance(data, dict):
        raise ApiError(400, "request body must be an object", "invalid_request")
    try:
        return cls.model_validate(data)
    except RecursionError:
        raise ApiError(400, "request body is nested too deeply", "invalid_request") from None
    except ValidationError as exc:
        parts = []
        for e in exc.errors(include_input=False, include_url=False)[:5]:
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
