#!/usr/bin/env bash
# Installs the Debian 12 packages tokenmeter needs to build, test and run its
# demo. Idempotent: when everything is present it prints nothing and makes no
# network call. Needs root (or sudo) only when something is missing.
set -euo pipefail

packages=(
  meson ninja-build pkg-config g++ clang-14 libclang-rt-14-dev libuv1-dev
  libmsgpack-dev libspdlog-dev node-llhttp libsystemd-dev zlib1g-dev
  libgtest-dev libgmock-dev libbenchmark-dev prometheus
  python3-prometheus-client python3-msgpack wrk systemd prometheus-cpp-dev
  curl clang-format-14 clang-tidy-14 libssl-dev libcrypt-dev libyaml-cpp-dev
  apache2-utils openssl debhelper devscripts lintian dh-python scdoc
  python3-mesonpy python3-pyproject-metadata python3-venv python3-pip
  python3-dev python3-numpy chromium
  protobuf-compiler libprotobuf-dev golang-github-prometheus-client-model-dev
  protobuf-compiler libprotobuf-dev golang-github-prometheus-client-model-dev
)

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
  [ "$status" = "installed" ] || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "install-deps: installing ${missing[*]}" >&2
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq \
  --no-install-recommends "${missing[@]}" >/dev/null
