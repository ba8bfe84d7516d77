"""Catalog files shared by tests in several folders (one copy, so a test of "a new GPU class is one
file" exercises the same file everywhere)."""

from __future__ import annotations

import textwrap

#: Everything a B200 is, in one file. The capacity figures are placeholders for tests, not
#: measurements (a real entry takes them from ``ttsfleet bench`` on the card).
B200_YAML = textwrap.dedent("""\
    classes:
      b200:
        display_name: NVIDIA B200 180GB
        arch: sm_100a
        memory_gb: 180
        quantization: mxfp8
        model_load_s: 90
        relative_cost: 1.4
        capacity:
          source: "placeholder for tests, not measured"
          points:
            - {concurrency: 1, frames_per_s: 200, ttfa_s: 0.07}
            - {concurrency: 64, frames_per_s: 10000, ttfa_s: 0.10}
    """)
