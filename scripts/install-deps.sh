#!/usr/bin/env bash
# Installs the Debian 12 packages tokenmeter needs to build, test and run its
# demo, then OpenTelemetry's npm packages for the OTLP tests (tests/otel,
# pinned by its package-lock.json). Idempotent: when everything is present it
# prints nothing and makes no network call. Needs root (or sudo) only when a
# Debian package is missing.
set -euo pipefail

packages=(
  meson ninja-build pkg-config g++ clang-14 libclang-rt-14-dev libuv1-dev
  libmsgpack-dev libspdlog-dev node-llhttp libsystemd-dev zlib1g-dev
  libgtest-dev libgmock-dev libbenchmark-dev prometheus
  python3-prometheus-client python3-msgpack wrk systemd prometheus-cpp-dev
  curl clang-format-14 clang-tidy-14 libssl-dev libcrypt-dev libyaml-cpp-dev
  apache2-utils openssl debhelper devscripts lintian dh-python scdoc
  python3-mesonpy python3-pyproject-metadata python3-venv python3-pip
  python3-dev python3-numpy chromium libcurl4-openssl-dev
  protobuf-compiler libprotobuf-dev golang-github-prometheus-client-model-dev
)
# Benchmarks only (bench/go: the Go peers of bench/run_all.sh, built
# offline from these sources; the product never needs them).
packages+=(
  golang-go golang-github-prometheus-client-golang-dev
  golang-github-victoriametrics-metrics-dev
)

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
  [ "$status" = "installed" ] || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}" >&2
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq \
    --no-install-recommends "${missing[@]}" >/dev/null
fi

# OpenTelemetry's receiver, protobuf decoder and JS SDK for the OTLP tests:
# `npm ci` when tests/otel/node_modules is missing or older than the
# lockfile (npm ci leaves node_modules/.package-lock.json as its stamp);
# install scripts off, none of these packages needs one. Without npm, or
# when npm ci fails, those tests skip (exit 77) and say why.
otel_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/tests/otel"
stamp="$otel_dir/node_modules/.package-lock.json"
if ! command -v npm >/dev/null 2>&1; then
  echo "install-deps: npm not found: the OpenTelemetry (OTLP) tests will be skipped" >&2
elif [ ! -e "$stamp" ] || [ "$otel_dir/package-lock.json" -nt "$stamp" ]; then
  echo "install-deps: npm ci in tests/otel (OpenTelemetry test tooling)" >&2
  if ! (cd "$otel_dir" && npm ci --ignore-scripts --no-audit --no-fund \
          --loglevel=error >/dev/null); then
    echo "install-deps: npm ci failed: the OpenTelemetry (OTLP) tests will be skipped" >&2
  fi
fi
