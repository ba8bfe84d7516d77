"""Which kernels run on a device: decided here and nowhere else, once per device.

The decision is the GPU catalog's (:meth:`ttsfleet.catalog.GpuCatalog.dispatch_for_capability`): a
device's compute capability names its class (``arch``), and the class says which backend runs
(``kernel_backend``: ``triton`` = the fused Triton kernels of this package, ``reference`` = the torch
reference with the same numerics) and which scheme ``auto`` quantization means there. A GPU no
class describes runs the reference. Adding a GPU class is a catalog entry, not a code change here.

One process switch, ``TTSFLEET_KERNELS``, read once (at the first decision):

* ``auto`` (default): the catalog's backend on CUDA devices, the reference on CPU;
* ``reference``: the reference everywhere (A/B numerics, debugging);
* ``interpret``: the Triton kernels on CPU tensors too, through Triton's interpreter (needs
  ``TRITON_INTERPRET=1`` before triton is imported: how CI checks the kernels without a GPU).

:func:`configure` sets the mode (tests that compare the two backends in one process);
:func:`use_catalog` sets the run's catalog (the model loader, with the catalog the server or CLI
resolved), so a class added by a catalog file gets its backend. Call sites ask :func:`use_triton`
(a dictionary lookup).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, get_args

if TYPE_CHECKING:
    import torch
    from torch import Tensor

    from ttsfleet.catalog import GpuCatalog

Mode = Literal["auto", "reference", "interpret"]
MODES: tuple[str, ...] = get_args(Mode)
ENV = "TTSFLEET_KERNELS"


@dataclass(frozen=True)
class KernelPlan:
    """What one device runs. ``backend`` is final: the kernels never re-check the device."""

    device: str
    backend: Literal["triton", "reference"]
    scheme: str  # what ``auto`` quantization means on this device
    gpu_classes: tuple[str, ...]  # the catalog classes with this device's arch (empty: unknown)
    reason: str
    #: GEMMs of at least ``prefill_min_rows`` rows (prefill) go to this library; smaller ones
    #: (decode) to ``backend``. "triton": no split.
    prefill_gemm: str = "triton"
    prefill_min_rows: int = 0

    @property
    def fused(self) -> bool:
        return self.backend == "triton"

    def large_gemm(self, rows: int) -> bool:
        """Whether a GEMM of ``rows`` rows runs cuBLAS's block-scaled kernel instead of ours."""
        return self.fused and self.prefill_gemm == "cublas_blockwise" and rows >= self.prefill_min_rows


_mode: Mode | None = None
_catalog: GpuCatalog | None = None
_plans: dict[tuple[str, int], KernelPlan] = {}


def _read_mode() -> Mode:
    raw = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if raw not in MODES:
        raise ValueError(f"{ENV}={raw!r}: expected one of {', '.join(MODES)}")
    return raw  # type: ignore[return-value]


def mode() -> Mode:
    """The process switch (read from the environment on first use, or set by :func:`configure`)."""
    global _mode
    if _mode is None:
        _mode = _read_mode()
    return _mode


def configure(mode: Mode | None = None, catalog: GpuCatalog | None = None) -> None:
    """Set the switch (``None``: re-read ``TTSFLEET_KERNELS``) and the run's catalog; forget plans."""
    global _mode, _catalog
    if mode is not None and mode not in MODES:
        raise ValueError(f"kernel mode {mode!r}: expected one of {', '.join(MODES)}")
    _mode = mode if mode is not None else _read_mode()
    if catalog is not None:
        _catalog = catalog
    _plans.clear()


def use_catalog(catalog: GpuCatalog | None) -> None:
    """Decide with ``catalog`` from now on (``None``: the built-in one); keeps the mode, forgets plans."""
    global _catalog
    _catalog = catalog
    _plans.clear()


def run_catalog() -> GpuCatalog:
    """The catalog decisions are made with: the run's (:func:`use_catalog`), else the built-in one."""
    from ttsfleet.catalog import GpuCatalog

    return _catalog if _catalog is not None else GpuCatalog.default()


@functools.cache
def triton_importable() -> bool:
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return True


def plan_for_capability(capability: tuple[int, int], catalog: GpuCatalog | None = None,
                        kernel_mode: Mode = "auto", device: str = "cuda:0") -> KernelPlan:
    """The plan for a CUDA device of ``capability`` (no device is touched); ``catalog`` defaults to
    :func:`run_catalog`."""
    d = (catalog or run_catalog()).dispatch_for_capability(*capability)
    if kernel_mode == "reference":
        return KernelPlan(device, "reference", d.quantization, d.gpu_classes, f"{ENV}=reference")
    if d.kernel_backend == "triton" and not triton_importable():
        return KernelPlan(device, "reference", d.quantization, d.gpu_classes, "triton does not import")
    cc = f"sm_{capability[0]}{capability[1]}"
    why = f"catalog: {cc} is {', '.join(d.gpu_classes)}" if d.gpu_classes else f"catalog: no class has {cc}"
    return KernelPlan(device, d.kernel_backend, d.quantization, d.gpu_classes, why, d.prefill_gemm,
                      d.prefill_gemm_min_rows)


def _decide(device: torch.device) -> KernelPlan:
    name = str(device)
    m = mode()
    if device.type != "cuda":
        interp = m == "interpret" and os.environ.get("TRITON_INTERPRET") == "1" and triton_importable()
        why = "Triton interpreter (TTSFLEET_KERNELS=interpret)" if interp else "not a CUDA device"
        return KernelPlan(name, "triton" if interp else "reference", "bf16", (), why)
    import torch

    return plan_for_capability(torch.cuda.get_device_capability(device), _catalog, m, name)


def plan(device: torch.device | str) -> KernelPlan:
    """The plan for ``device`` (decided on first use, then cached)."""
    import torch

    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    key = (dev.type, dev.index or 0)
    p = _plans.get(key)
    if p is None:
        p = _plans[key] = _decide(dev)
    return p


def use_triton(t: Tensor) -> bool:
    """True when ``t``'s device runs the Triton kernels."""
    key = (t.device.type, t.device.index or 0)
    p = _plans.get(key)
    return (p if p is not None else plan(t.device)).fused


def large_gemm(t: Tensor, rows: int) -> bool:
    """True when a GEMM of ``rows`` rows on ``t``'s device takes the catalog's prefill library."""
    key = (t.device.type, t.device.index or 0)
    p = _plans.get(key)
    return (p if p is not None else plan(t.device)).large_gemm(rows)


def backend_name(t: Tensor) -> str:
    return plan(t.device).backend
