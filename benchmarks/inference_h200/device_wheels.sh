#!/usr/bin/env bash
# Fetch, here, the wheels the device image lacks for the served path and its GPU tests, into .whl/
# (ignored by git; carry it: `run(carry=[".whl"])`; speed_run.sh installs it to /tmp/site).
# The device runs Python 3.12 with torch, triton, numpy, typer, rich, httpx, prometheus-client,
# msgpack and pytest already (KINDS.md's package list): every wheel of an image package is dropped
# so the image's own version stays the one imported.
# Usage (repo root): bash benchmarks/inference_h200/device_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST=.whl
TOP=(pydantic cffi fastapi uvicorn uvloop httptools soundfile soxr python-multipart websockets py-spy "fish-audio-sdk==1.3.0"
     pytest-asyncio tiktoken)
# in the image (2026-11-17 list, normalised names): never carried
IMAGE="anyio certifi click h11 httpcore httpx idna numpy typing_extensions rich markdown_it_py mdurl
pygments prometheus_client msgpack pytest pluggy iniconfig packaging shellingham typer
annotated_doc"
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || grep -qx '/.whl/' .gitignore || echo /.whl/ >> .git/info/exclude
rm -rf "$DEST"; mkdir -p "$DEST"
python3 -P -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$DEST" "${TOP[@]}"
# Qwen's BPE ranks for --preset-text qwen-bpe: the data file only (installed --no-deps, never imported)
python3 -P -m pip download -q --no-deps --only-binary=:all: -d "$DEST" "dashscope==2.0.2"
for name in $IMAGE; do rm -f "$DEST"/"$name"-*.whl; done
ls "$DEST"; du -sh "$DEST"
