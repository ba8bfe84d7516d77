"""Where each thread of a server spends its samples: a py-spy ``--format raw`` profile, summarised.

Usage: ``python3 -P benchmarks/inference_h200/pyspy_summary.py PROFILE.txt[.gz] [MIN_SHARE]`` prints,
per thread, its sample count and every function (file:line) on the stack in at least ``MIN_SHARE``
(default 0.04) of that thread's samples — inclusive time, so a caller and its callee both appear.
"""

from __future__ import annotations

import collections
import gzip
import sys


def summarise(lines: list[str], min_share: float) -> list[str]:
    per_thread: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[tuple[str, str]] = collections.Counter()
    for line in lines:
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        frames = stack.split(";")
        per_thread[frames[0]] += int(count)
        for frame in set(frames[1:]):
            inclusive[(frames[0], frame)] += int(count)
    out = []
    for thread, total in per_thread.most_common():
        out.append(f"== {thread}: {total} samples")
        rows = sorted(((n, f) for (t, f), n in inclusive.items() if t == thread), reverse=True)
        out += [f"{n / total * 100:5.1f}% {f}" for n, f in rows if n >= min_share * total]
    return out


def main() -> None:
    path = sys.argv[1]
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        lines = f.read().splitlines()
    print("\n".join(summarise(lines, float(sys.argv[2]) if len(sys.argv) > 2 else 0.04)))


if __name__ == "__main__":
    main()
