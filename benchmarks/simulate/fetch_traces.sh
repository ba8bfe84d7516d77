#!/usr/bin/env bash
# Fetch the public one-hour LLM-serving traces the simulator benchmark replays into
# benchmarks/simulate/traces/ (git-ignored; never committed: ~4 MB), pinned to a commit and
# checked by SHA-256. The data is the publishers': Azure LLM inference trace 2023 (CC-BY 4.0,
# Azure/AzurePublicDataset) and Mooncake's FAST'25 conversation trace (kvcache-ai/Mooncake).
#
#   benchmarks/simulate/fetch_traces.sh                  # from raw.githubusercontent.com
#   benchmarks/simulate/fetch_traces.sh --from-git DIR   # from local clones: DIR/<owner>+<repo>/repo
#                                                        # (e.g. the search tool's /work/.mirror)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="$here/traces"
mkdir -p "$out"
from_git=""
if [[ "${1:-}" == "--from-git" ]]; then from_git="${2:?--from-git DIR}"; fi

# name | owner/repo | commit | path | sha256
TRACES=(
  "azure-code-2023.csv|Azure/AzurePublicDataset|b469a113cedca53ddc3bdea71a143dc4b7d8700c|data/AzureLLMInferenceTrace_code.csv|54e9a6d2a4bd06ba1e060304b900abbc74cbea53de96506e60fe5bb4f2277fb6"
  "azure-conv-2023.csv|Azure/AzurePublicDataset|b469a113cedca53ddc3bdea71a143dc4b7d8700c|data/AzureLLMInferenceTrace_conv.csv|2f1e5b666d4e3055fdbba98598ce2ec307767b9064e03e2fa46676dbcc7d0bf8"
  "mooncake-conversation.jsonl|kvcache-ai/Mooncake|3b5a594133958449a1feaf1c9e0fc1b553e34a28|FAST25-release/traces/conversation_trace.jsonl|b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df"
)

for entry in "${TRACES[@]}"; do
  IFS='|' read -r name repo commit path sum <<<"$entry"
  dest="$out/$name"
  if [[ -f "$dest" ]] && echo "$sum  $dest" | sha256sum -c --status; then
    echo "ok      $name"; continue
  fi
  if [[ -n "$from_git" ]]; then
    git -C "$from_git/${repo/\//+}/repo" show "$commit:$path" >"$dest.part"
  else
    curl -fsSL "https://raw.githubusercontent.com/$repo/$commit/$path" -o "$dest.part"
  fi
  if ! echo "$sum  $dest.part" | sha256sum -c --status; then
    echo "checksum mismatch for $name ($repo@$commit:$path)" >&2; rm -f "$dest.part"; exit 1
  fi
  mv "$dest.part" "$dest"
  echo "fetched $name"
done
