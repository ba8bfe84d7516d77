#!/usr/bin/env bash
# Bundle, here, DeepGEMM's sources with the CUTLASS and {fmt} commits its submodules pin, and the two
# build wheels the device image may lack, into .ext/deepgemm.tgz (ignored by git; carry it:
# `run(carry=[".whl", ".ext"])`). Why: issue #26 asks for the published block-scaled FP8 kernels measured
# side by side on our GPU (fish-scales-ops runs DeepGEMM's JIT on sm_90); the device cannot download, and
# DeepGEMM builds as a torch extension there (`speed_run.sh deepgemm`). Nothing of it is committed.
# Usage (repo root), after `fetch` of the three repositories:
#   bash benchmarks/inference_h200/deepgemm_bundle.sh /work/.mirror/deepseek-ai+DeepGEMM/repo \
#        /work/.mirror/NVIDIA+cutlass/repo /work/.mirror/fmtlib+fmt/repo
set -euo pipefail
[ $# -eq 3 ] || { echo "usage: deepgemm_bundle.sh DEEPGEMM_GIT CUTLASS_GIT FMT_GIT (bare git directories)" >&2; exit 2; }
DG=$1 CUTLASS=$2 FMT=$3
cd "$(dirname "$0")/../.."
grep -qx '/.ext/' .gitignore || { echo "/.ext/ must be in .gitignore" >&2; exit 2; }
STAGE=$(mktemp -d); trap 'rm -rf "$STAGE"' EXIT
SRC=$STAGE/DeepGEMM; mkdir -p "$SRC"
rev=$(git -C "$DG" rev-parse HEAD)
git -C "$DG" archive "$rev" | tar -x -C "$SRC"
pin() { git -C "$DG" ls-tree "$rev" "third-party/$1" | awk '{print $3}'; }
mkdir -p "$SRC/third-party/cutlass" "$SRC/third-party/fmt"
git -C "$CUTLASS" archive "$(pin cutlass)" include | tar -x -C "$SRC/third-party/cutlass"
git -C "$FMT" archive "$(pin fmt)" include src | tar -x -C "$SRC/third-party/fmt"
echo "DeepGEMM $rev, cutlass $(pin cutlass), fmt $(pin fmt)" | tee "$SRC/BUNDLE.txt"
python3 -P -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux1_x86_64 -d "$STAGE/wheels" wheel ninja
mkdir -p .ext
tar -czf .ext/deepgemm.tgz -C "$STAGE" DeepGEMM wheels
du -h .ext/deepgemm.tgz
