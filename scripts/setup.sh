#!/usr/bin/env bash
# Installs the Debian packages this project builds and tests with (the README lists them), and the
# Python virtual environment with TensorBoard that the summary tests read event files with.
# Idempotent: when everything is installed it only says so.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

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
  python3-venv
)

# Where a CUDA toolkit is installed, clang 19 (Debian 12, about 50 MB) reads the GPU code as a second
# compiler (the ctest gpu_syntax.clang; skipped without it). Not needed, and not installed, elsewhere.
if command -v nvcc >/dev/null 2>&1 || [[ -x /usr/local/cuda/bin/nvcc ]]; then
  packages+=(clang-19)
fi

missing=()
for pkg in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
  if [[ "$status" != "install ok installed" ]]; then
    missing+=("$pkg")
  fi
done

install_packages() {
  if [[ ${#missing[@]} -eq 0 ]]; then
    echo "setup.sh: all ${#packages[@]} required packages are installed"
    return
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
}

# The summary tests read what summary::writer wrote back with TensorBoard's own reader
# (tests/summary/read_events.py), from a virtual environment of the pinned versions in
# tests/summary/requirements.txt (about 180 MB). Installed once; afterwards this only compares the
# requirements with the copy the last install left. Where it cannot be installed (no PyPI), this says
# why, leaves that reason in build/tensorboard-venv.unavailable and goes on: the round-trip test is
# then skipped, where otherwise a missing environment fails it.
install_tensorboard_reader() {
  local venv=$root/build/tensorboard-venv
  local requirements=$root/tests/summary/requirements.txt
  local note=$venv.unavailable log=$venv.log
  if [[ -x $venv/bin/python ]] && cmp -s "$requirements" "$venv/installed-requirements.txt"; then
    echo "setup.sh: TensorBoard's reader is installed (build/tensorboard-venv)"
    return
  fi
  mkdir -p "$root/build"
  # One install at a time: several test runs may start at once in one tree.
  exec 9>"$venv.lock"
  flock 9
  if [[ -x $venv/bin/python ]] && cmp -s "$requirements" "$venv/installed-requirements.txt"; then
    exec 9>&-
    return
  fi
  echo "setup.sh: installing TensorBoard's reader into build/tensorboard-venv (pinned: tests/summary/requirements.txt)"
  rm -rf "$venv" "$note"
  local reason=""
  if ! python3 -m venv "$venv" >"$log" 2>&1; then
    reason="python3 -m venv failed (is python3-venv installed?)"
  elif ! "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input --only-binary :all: \
      --retries 2 --timeout 30 -r "$requirements" >>"$log" 2>&1; then
    reason="pip could not install tests/summary/requirements.txt (is PyPI reachable?)"
  fi
  if [[ -n $reason ]]; then
    rm -rf "$venv"
    { echo "$reason"; tail -n 5 "$log"; } >"$note"
    echo "setup.sh: warning: TensorBoard's reader is not installed: $reason; see $log." >&2
    echo "setup.sh: warning: the test summary.round_trip will be skipped." >&2
  else
    cp "$requirements" "$venv/installed-requirements.txt"
    echo "setup.sh: installed TensorBoard's reader ($(du -sh "$venv" | cut -f1) in build/tensorboard-venv)"
  fi
  exec 9>&-
}

install_packages
install_tensorboard_reader
