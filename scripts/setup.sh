#!/usr/bin/env bash
# Installs the Debian packages this project builds and tests with (the README lists them).
# Idempotent: when everything is installed it only says so.
set -euo pipefail

packages=(
  g++
  cmake
  libeigen3-dev
  libboost-test-dev
  libopenmpi-dev
  openmpi-bin
  libbenchmark-dev
  libstb-dev
  zlib1g-dev
  dataset-fashion-mnist
  libdnnl-dev
)

missing=()
for pkg in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
  if [[ "$status" != "install ok installed" ]]; then
    missing+=("$pkg")
  fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "setup.sh: all ${#packages[@]} required packages are installed"
  exit 0
fi

echo "setup.sh: missing packages: ${missing[*]}"

if [[ $(id -u) -eq 0 ]]; then
  as_root=()
elif command -v sudo >/dev/null 2>&1; then
  as_root=(sudo)
else
  echo "setup.sh: error: installing packages needs root, and sudo is not available." >&2
  echo "setup.sh: as root, run: apt-get update && apt-get install -y --no-install-recommends ${missing[*]}" >&2
  exit 1
fi

echo "setup.sh: running: ${as_root[*]:+${as_root[*]} }apt-get update"
"${as_root[@]}" apt-get update
echo "setup.sh: running: ${as_root[*]:+${as_root[*]} }apt-get install -y --no-install-recommends ${missing[*]}"
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive \
  apt-get install -y --no-install-recommends "${missing[@]}"
echo "setup.sh: installed: ${missing[*]}"
