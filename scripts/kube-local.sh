#!/usr/bin/env bash
# The local Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler) for the operator's real-cluster tests and for trying the chart.
#
#   scripts/kube-local.sh build        build the pinned binaries once (cached; a no-op after)
#   scripts/kube-local.sh up [DIR]     build if needed, run it with 4 fake GPU nodes until Ctrl-C
#                                      ($PYTHON, default python3, must have ttsfleet installed)
#                                      (prints the admin KUBECONFIG to use with kubectl/helm)
#
# The release is pinned in scripts/kube-local/go.mod (a wrapper module: k8s.io/kubernetes
# replaces its staging modules with local paths, so they are pinned there to v0.Y.Z). Binaries,
# Go module cache and build cache live in ${TTSFLEET_KUBE_CACHE:-/var/cache/ttsfleet/kube}, outside
# the repo, so a second run and every later CI run on the same machine reuse them.
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE="${TTSFLEET_KUBE_CACHE:-/var/cache/ttsfleet/kube}"
VERSION="$(awk '/^require k8s.io\/kubernetes /{print $3}' scripts/kube-local/go.mod)"
BIN="${TTSFLEET_KUBE_BIN:-$CACHE/bin-$VERSION}"
export GOMODCACHE="$CACHE/gomod" GOCACHE="$CACHE/gocache" GOFLAGS="-mod=mod" GOTOOLCHAIN=local

build() {
  if [ -x "$BIN/kube-apiserver" ] && [ -x "$BIN/kube-controller-manager" ] \
      && [ -x "$BIN/kube-scheduler" ] && [ -x "$BIN/etcd" ]; then
    echo "== kube-local: $VERSION binaries cached in $BIN"
    return
  fi
  command -v go >/dev/null || { echo "kube-local: Go is needed to build the control plane" >&2; exit 2; }
  command -v openssl >/dev/null || apt-get install -y -qq --no-install-recommends openssl
  echo "== kube-local: building $VERSION control plane into $BIN (first time: long on 2 cores)"
  mkdir -p "$BIN.tmp"
  start=$(date +%s)
  # The version the API server reports (/version: Helm checks the chart's kubeVersion against it).
  minor="$(echo "$VERSION" | cut -d. -f2)"
  ver="k8s.io/component-base/version"
  ldflags="-s -w -X $ver.gitVersion=$VERSION -X $ver.gitMajor=1 -X $ver.gitMinor=$minor"
  ldflags="$ldflags -X $ver.gitTreeState=clean -X $ver.buildDate=1970-01-01T00:00:00Z"
  (cd scripts/kube-local && nice -n 10 go build -trimpath -ldflags="$ldflags" -o "$BIN.tmp/" \
      k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
      k8s.io/kubernetes/cmd/kube-scheduler go.etcd.io/etcd/server/v3)
  mv "$BIN.tmp/server" "$BIN.tmp/etcd"
  rm -rf "$BIN" && mv "$BIN.tmp" "$BIN"
  echo "== kube-local: built in $(( $(date +%s) - start )) s"
}

case "${1:-build}" in
  build) build ;;
  up) build; export TTSFLEET_KUBE_BIN="$BIN"; exec "${PYTHON:-python3}" -P -m ttsfleet.devtools.localkube "${2:-kube-local}" ;;
  *) echo "usage: $0 build | up [DIR]" >&2; exit 2 ;;
esac
