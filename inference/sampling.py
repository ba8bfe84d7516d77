"""Per-request token sampling for batched DualAR decoding, reproducible and CUDA-graph friendly.

Why counter-based noise instead of ``torch.Generator``: a batch mixes requests with their own
seeds, and a captured CUDA graph cannot hold one generator per row. Each row's randomness is a
pure hash of ``(seed, step, draw, vocab index)``, so a request decodes the same tokens whatever it
is batched with, and the whole sampler is static-shape tensor math (no host sync, no ``.item()``).

Pipeline per row (the Fish reference order): repetition penalty over the window → top-p on the
untempered logits → temperature → top-k → exponential-race draw (≡ multinomial). Rows with
``temperature <= 0`` or ``top_k == 1`` are greedy (argmax after the penalty). Exactly tied logits
rank by vocab index, lower first (a stable sort), so top-k / top-p cut ties the same way everywhere.
Repetition-aware sampling (RAS, S2): if the sampled main token occurred in the last ``ras_window``
main tokens, a second draw at ``ras_temperature`` / ``ras_top_p`` is used instead.
Window entries ``< 0`` are empty and ignored.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor
from ttsfleet.kernels.decode import TOPK_CAP  # the fused sampler's exact top_k range (1..TOPK_CAP)

_M32 = 0xFFFFFFFF


@dataclass(frozen=True)
class SamplingParams:
    """One request's sampling settings. ``seed`` defaults to a fresh random one, fixed for the request."""

    temperature: float = 0.8
    top_p: float = 0.8
    top_k: int = 30
    repetition_penalty: float = 1.0
    seed: int = field(default_factory=lambda: secrets.randbits(31))
    ras: bool = True
    ras_window: int = 10
    ras_temperature: float = 1.0
    ras_top_p: float = 0.9

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")
        if self.repetition_penalty <= 0:
            raise ValueError("repetition_penalty must be > 0")

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0 or self.top_k == 1

    @property
    def fusable(self) -> bool:
        """The fused sampler gives this request exactly the reference's tokens (top-k within the cap)."""
        return self.greedy or 1 <= self.top_k <= TOPK_CAP


@dataclass
class SamplingBatch:
    """Per-row sampling tensors, each ``[bs]``; build with :meth:`from_params`."""

    temperature: Tensor  # float32
    top_p: Tensor  # float32
    top_k: Tensor  # int64, <= 0 = no limit
    repetition_penalty: Tensor  # float32
    seed: Tensor  # int64
    ras: Tensor  # bool
    ras_window: Tensor  # int64
    ras_temperature: Tensor  # float32
    ras_top_p: Tensor  # float32
    #: Host-side: every row is :attr:`SamplingParams.fusable` (the fused kernel may sample this batch).
    fusable: bool = False

    @classmethod
    def from_params(cls, params: Sequence[SamplingParams], device: torch.device | str = "cpu",
                    pad_to: int | None = None) -> SamplingBatch:
        """Stack ``params``; ``pad_to`` repeats greedy rows up to a static (CUDA graph) batch size."""
        rows = list(params)
        if pad_to is not None:
            if pad_to < len(rows):
                raise ValueError(f"pad_to={pad_to} < {len(rows)} requests")
            rows += [SamplingParams(temperature=0.0, seed=0)] * (pad_to - len(rows))

        def t(name: str, dtype: torch.dtype) -> Tensor:
            return torch.tensor([getattr(p, name) for p in rows], dtype=dtype, device=device)

        return cls(
            temperature=t("temperature", torch.float32), top_p=t("top_p", torch.float32),
            top_k=t("top_k", torch.int64), repetition_penalty=t("repetition_penalty", torch.float32),
            seed=t("seed", torch.int64), ras=t("ras", torch.bool), ras_window=t("ras_window", torch.int64),
            ras_temperature=t("ras_temperature", torch.float32), ras_top_p=t("ras_top_p", torch.float32),
            fusable=all(p.fusable for p in rows),
        )

    def tensors(self) -> dict[str, Tensor]:
        """The per-row tensors by field name (what a CUDA graph's static copy refreshes)."""
        return {k: v for k, v in self.__dict__.items() if isinstance(v, Tensor)}

    def copy_(self, other: SamplingBatch) -> SamplingBatch:
        """In-place copy of ``other``'s rows (same batch size): refresh a CUDA graph's static inputs."""
        for k, v in self.tensors().items():
            v.copy_(getattr(other, k))
        return self

    def __len__(self) -> int:
        return int(self.temperature.shape[0])

    def index(self, rows: Tensor) -> SamplingBatch:
        return SamplingBatch(**{k: v[rows] for k, v in self.tensors().items()}, fusable=self.fusable)

    @property
    def greedy(self) -> Tensor:
        return (self.temperature <= 0) | (self.top_k == 1)


def _mix32(x: Tensor) -> Tensor:
    """A 32-bit avalanche hash on int64 tensors holding values in [0, 2^32) (no overflow: consts < 2^31)."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x2C1B3C6D) & _M32
    return x ^ (x >> 16)


def uniform_noise(seed: Tensor, step: Tensor, draw: int, n: int) -> Tensor:
    """``[bs, n]`` float32 in (0, 1): a pure function of (seed, step, draw, column)."""
    x = _mix32(seed.to(torch.int64) & _M32)
    x = _mix32(x ^ (step.to(torch.int64) & _M32))
    x = _mix32(x ^ (draw & _M32))
    cols = torch.arange(n, device=seed.device, dtype=torch.int64)
    x = _mix32(_mix32(x[:, None] ^ cols[None, :]))
    return ((x >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))


def apply_repetition_penalty(logits: Tensor, window: Tensor | None, penalty: Tensor) -> Tensor:
    """Divide positive / multiply negative logits of ids in ``window [bs, W]`` by ``penalty [bs]``."""
    if window is None or window.shape[-1] == 0:
        return logits
    bs, v = logits.shape
    ids = window.to(torch.int64)
    ids = torch.where((ids >= 0) & (ids < v), ids, torch.full_like(ids, v))  # v = dummy column
    hit = torch.zeros(bs, v + 1, dtype=torch.bool, device=logits.device)
    hit.scatter_(1, ids, True)
    hit = hit[:, :v]
    pen = penalty[:, None].to(logits.dtype)
    penalized = torch.where(logits > 0, logits / pen, logits * pen)
    return torch.where(hit, penalized, logits)


def _filtered_probs(logits: Tensor, temperature: Tensor, top_p: Tensor, top_k: Tensor) -> Tensor:
    """Reference order: top-p (untempered) -> temperature -> top-k -> softmax. ``[bs, V]`` float32."""
    logits = logits.float()
    v = logits.shape[-1]
    # stable: exactly tied logits rank by vocab index (lower first), the fused sampler's tie rule
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True, stable=True)
    cum = torch.softmax(sorted_logits, dim=-1).cumsum(-1)
    rank = torch.arange(v, device=logits.device)[None, :]
    remove_sorted = (cum > top_p[:, None]) & (rank > 0)
    k = torch.where(top_k > 0, top_k, torch.full_like(top_k, v))
    remove_sorted |= rank >= k[:, None]
    remove = torch.zeros_like(remove_sorted).scatter(1, order, remove_sorted)
    scaled = logits / temperature.clamp_min(1e-5)[:, None]
    scaled = scaled.masked_fill(remove, float("-inf"))
    return torch.softmax(scaled, dim=-1)


def _race(probs: Tensor, noise: Tensor) -> Tensor:
    """Exponential race: ``argmax(p / E)`` with ``E = -log(u)`` draws index i with probability p_i."""
    return torch.argmax(probs / (-torch.log(noise)), dim=-1)


def sample(logits: Tensor, batch: SamplingBatch, step: Tensor, draw: int,
           window: Tensor | None = None) -> Tensor:
    """Sample one id per row from ``logits [bs, V]``; ``window [bs, W]`` feeds the repetition penalty."""
    logits = apply_repetition_penalty(logits.float(), window, batch.repetition_penalty)
    greedy_ids = torch.argmax(logits, dim=-1)
    probs = _filtered_probs(logits, batch.temperature, batch.top_p, batch.top_k)
    drawn = _race(probs, uniform_noise(batch.seed, step, draw, logits.shape[-1]))
    return torch.where(batch.greedy, greedy_ids, drawn)


def sample_main(logits: Tensor, batch: SamplingBatch, step: Tensor, window: Tensor | None,
                end_index: int) -> Tensor:
    """The main (semantic / end) token with repetition-aware resampling.

    ``logits [bs, S+1]`` are restricted to the semantic ids (index = code) plus end at
    ``end_index``; ``window [bs, W]`` holds previous codebook-0 codes (newest last).
    """
    normal = sample(logits, batch, step, draw=0, window=window)
    if window is None or window.shape[-1] == 0:
        return normal
    high_batch = SamplingBatch(**{**batch.__dict__, "temperature": batch.ras_temperature,
                                  "top_p": batch.ras_top_p})
    high = sample(logits, high_batch, step, draw=1, window=window)
    w = window.shape[-1]
    recent = torch.arange(w, device=window.device)[None, :] >= (w - batch.ras_window[:, None])
    in_window = ((window.to(torch.int64) == normal[:, None]) & recent).any(-1)
    use_high = batch.ras & ~batch.greedy & in_window & (normal != end_index)
    return torch.where(use_high, high, normal)
