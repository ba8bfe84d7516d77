"""Does ``cuda_tensor[i] = number`` wait for the GPU, and does ``cuda_tensor[i].fill_(number)``?

Queues ~0.5 s of matmuls, then times the host call alone (no synchronize before it): a call that
syncs takes as long as the queue, one that launches takes microseconds. Prints one line per form.
Usage (a CUDA machine): ``python3 -P benchmarks/inference_h200/setitem_sync.py``.
"""

from __future__ import annotations

import time

import torch


def host_ms(assign, a: torch.Tensor) -> float:  # noqa: ANN001
    torch.cuda.synchronize()
    for _ in range(20):
        a @ a
    t0 = time.perf_counter()
    assign()
    took = time.perf_counter() - t0
    torch.cuda.synchronize()
    return 1000 * took


def main() -> None:
    x = torch.zeros(8, device="cuda", dtype=torch.int64)
    a = torch.randn(8192, 8192, device="cuda")
    host_ms(lambda: x[3].fill_(1), a)  # warm-up
    forms = {"x[3] = 5": lambda: x.__setitem__(3, 5), "x[3].fill_(5)": lambda: x[3].fill_(5),
             "x[3:4] = 5": lambda: x.__setitem__(slice(3, 4), 5)}
    for name, assign in forms.items():
        print(f"{name:>14}: host {host_ms(assign, a):8.3f} ms with ~20 matmuls queued "
              f"({torch.cuda.get_device_name()}, torch {torch.__version__})")


if __name__ == "__main__":
    main()
