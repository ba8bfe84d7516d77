#!/usr/bin/env bash
# Install everything the test suite needs on a fresh Debian machine (system packages and Python
# packages), then run the whole suite. This is the README's test command and what CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."
# The repository root holds the `operator/` component folder; `python3 -m ...` puts the working
# directory first on sys.path, where that folder would shadow the standard library's `operator`
# (pip and pytest die at start-up in a venv). Safe-path mode keeps the cwd off sys.path.
export PYTHONSAFEPATH=1

SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
APT_PACKAGES=(
  slurmctld slurmd slurm-client slurmrestd munge   # a real Slurm for tests/slurm
  slurmdbd mariadb-server                          # Slurm accounting: sacct in tests/slurm
  prometheus                                       # prometheus + promtool for metrics/rules tests
  espeak-ng sox ffmpeg libsndfile1                 # real speech audio for fill-job tests
)
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "== apt-get install ${missing[*]}"
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# torch and the extras in ONE resolver run, so torch is installed once and the pair is consistent:
# the test extra pins the triton this torch itself requires (tests/core/test_packaging.py checks
# it). PyPI's Linux x86_64 torch wheel is the CUDA build (with its nvidia-* wheels, a few GB);
# PyPI has no CPU-only Linux wheel. Where download.pytorch.org is reachable,
# TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu makes it the CPU build (2.13.0+cpu).
TORCH_PIN="torch==2.13.0"
index_args=()
if [ -n "${TORCH_INDEX_URL:-}" ]; then index_args=(--extra-index-url "$TORCH_INDEX_URL"); fi
echo "== pip install $TORCH_PIN + .[all] (one resolver run)"
python3 -P -m pip install -q --disable-pip-version-check "${index_args[@]}" "$TORCH_PIN" -e ".[all]"
# Qwen's BPE ranks (S2 Pro's text vocabulary) as Alibaba's dashscope ships them, for the qwen-bpe
# preset text; only its data file is read (never imported), so none of its dependencies is needed
python3 -P -m pip install -q --disable-pip-version-check --no-deps "dashscope==2.0.2"

bash scripts/kube-local.sh build   # the local Kubernetes control plane (cached; tests/operator/kube)

echo "== ruff"
python3 -P -m ruff check .

echo "== pytest"
python3 -P -m pytest -q -p no:cacheprovider --durations=25 "$@"
