#!/usr/bin/env bash
# Builds bench/go (peers_bench: client_golang and VictoriaMetrics/metrics
# beside tokenmeter) offline from Debian's Go packages, in GOPATH mode:
#   golang-go (1.19), golang-github-prometheus-client-golang-dev (1.14),
#   golang-github-victoriametrics-metrics-dev (1.23)
# (their dependencies, client_model, common, procfs, protobuf, come with
# them). No module download, no network.
#
# Usage: bench/go/build.sh OUT_DIR
#   writes OUT_DIR/peers_bench; Go's build cache is OUT_DIR/go-cache.
#        bench/go/build.sh --check
#   only checks that go and the packages are here (exit 0 or 77).
# Environment: GO (the go command, default go), TM_GOPATH (default
#   /usr/share/gocode, where Debian's golang-*-dev packages put sources).
# Exit status: 0 built; 77 when go or one of the packages is missing (a line
# on stderr says which: the caller leaves the Go peers out); 1 when the
# build itself fails.
set -euo pipefail

src="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${1:?usage: bench/go/build.sh OUT_DIR}"
gopath="${TM_GOPATH:-/usr/share/gocode}"
go="${GO:-go}"

if ! command -v "$go" >/dev/null 2>&1; then
  echo "bench/go: $go not found (Debian: golang-go): the Go peers are left out" >&2
  exit 77
fi
for pkg in github.com/prometheus/client_golang/prometheus \
           github.com/prometheus/common/expfmt \
           github.com/VictoriaMetrics/metrics; do
  if [[ ! -d "$gopath/src/$pkg" ]]; then
    echo "bench/go: $gopath/src/$pkg not found (Debian:" \
         "golang-github-prometheus-client-golang-dev," \
         "golang-github-victoriametrics-metrics-dev): the Go peers are left out" >&2
    exit 77
  fi
done
[[ "$out" == --check ]] && exit 0

mkdir -p "$out/go-cache"
out="$(cd "$out" && pwd)"
cd "$src"
GOPATH="$gopath" GO111MODULE=off GOFLAGS= GOPROXY=off GOCACHE="$out/go-cache" \
  "$go" build -o "$out/peers_bench" .
