#!/usr/bin/env bash
# Installs what this project needs, by purpose:
#
#   scripts/setup.sh demo   what scripts/demo.sh needs: the compiler, the libraries the CycleGAN
#                           example builds on, and Fashion-MNIST (Debian packages, about 130 MB to
#                           download).
#   scripts/setup.sh test   that, and what the test suite needs besides (scripts/test.sh runs this):
#                           Debian packages for the tests (Boost.Test, Open MPI, ...), TensorBoard's
#                           reader and the interop environment with PyTorch (about 2 GB in all),
#                           and, where a CUDA toolkit is installed, clang 19 and the cudnn-frontend
#                           headers.
#   scripts/setup.sh        the same as `test`, for those who call it without an argument (CI).
#
# Each part says in one line what it installs, why, and how big it is. Idempotent: where everything
# is installed it only says so. The README lists the packages.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

usage() {
  echo "usage: scripts/setup.sh [demo|test]   (default: test)" >&2
  echo "  demo: what scripts/demo.sh needs; test: that, and what the test suite needs" >&2
}
purpose=${1:-test}
case $purpose in
  demo | test) ;;
  -h | --help) usage; exit 0 ;;
  *) usage; exit 2 ;;
esac
if [[ $# -gt 1 ]]; then
  usage
  exit 2
fi

have_cuda() { command -v nvcc >/dev/null 2>&1 || [[ -x /usr/local/cuda/bin/nvcc ]]; }

# What the demo builds and runs on (the targets cyclegan_train_cpu and fmnist_classifier, configured
# with the tests off). Open MPI is not among them: the demo's replicas are threads of one process,
# and the trainer links the MPI backend only where it is installed. The sizes said below are
# downloads on Debian 12, the packages these pull in included.
demo_packages=(
  g++                    # the compiler (C++20)
  cmake                  # the build
  libeigen3-dev          # Eigen: the tensors and layers
  libdnnl-dev            # oneDNN 2.6: the CPU engine's convolutions (without it, several times slower)
  zlib1g-dev             # zlib: Fashion-MNIST's files are gzip-compressed
  libstb-dev             # stb: the example writes its sample grids and loss curves as PNG
  dataset-fashion-mnist  # the data set the demo trains and scores on
)
# What the test suite needs besides. Boost.Test is what configuring the tests requires
# (DISTRIBUTE_BUILD_TESTS).
test_packages=(
  libboost-test-dev      # Boost.Test: the test programs' framework
  libopenmpi-dev         # Open MPI: the MPI backend (distribute::mpi) and the `mpi` tests
  openmpi-bin            # mpiexec, which starts those tests' processes
  libbenchmark-dev       # Google Benchmark (listed from the start; no target links it at present)
  nlohmann-json3-dev     # nlohmann's JSON: safetensors files (nn::save_safetensors), the interop tests
  python3-venv           # the virtual environments below (TensorBoard's reader, the interop tests)
  clang-format-19        # the test style.clang_format: every source in the style of .clang-format
)
# Where a CUDA toolkit is installed, clang 19 (Debian 12) reads the GPU code as a second compiler
# (the ctest gpu_syntax.clang; skipped without it). Not needed, and not installed, elsewhere.
gpu_test_packages=(clang-19)

# Says in one line what a group of packages is for and whether it is installed, and adds its
# missing packages to `missing`, which install_packages installs with one apt-get.
missing=()
check_packages() {  # "purpose: what (size): why" package...
  local part=$1 absent=() pkg status
  shift
  for pkg in "$@"; do
    status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
    if [[ "$status" != "install ok installed" ]]; then
      absent+=("$pkg")
    fi
  done
  if [[ ${#absent[@]} -eq 0 ]]; then
    echo "setup.sh: $part; installed"
  else
    echo "setup.sh: $part; missing: ${absent[*]}"
    missing+=("${absent[@]}")
  fi
}

install_packages() {
  check_packages "demo: ${demo_packages[*]} (Debian, about 130 MB to download): the compiler, and the libraries and data set the example builds and trains on" \
    "${demo_packages[@]}"
  if [[ $purpose == test ]]; then
    check_packages "test: ${test_packages[*]} (Debian, about 60 MB to download, 50 MB more for clang-format 19 where clang 19 is not installed): Boost.Test, Open MPI, JSON for safetensors, the Python environments below, and clang-format 19 for the style test" \
      "${test_packages[@]}"
    if have_cuda; then
      check_packages "test: ${gpu_test_packages[*]} (Debian, about 55 MB to download; where CUDA is installed): the second compiler, with which the test gpu_syntax.clang reads the GPU code" \
        "${gpu_test_packages[@]}"
    fi
  fi
  if [[ ${#missing[@]} -eq 0 ]]; then
    return
  fi

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

# An optional component that could not be installed: removes what was half made, leaves the reason
# and the log's last lines in its note file (`.unavailable`), and warns with what follows from it.
optional_not_installed() {  # dir reason log note "what is/are" consequence
  rm -rf "$1"
  { echo "$2"; tail -n 5 "$3"; } >"$4"
  echo "setup.sh: warning: $5 not installed: $2; see $3." >&2
  echo "setup.sh: warning: $6" >&2
}

# An optional component, installed once: where INSTALLED (a command) says it is in place, its line
# PART ("purpose: what (where, size): why") says so, with what NOTE (a command) prints after it;
# otherwise INSTALL runs holding DIR.lock, since several test runs may start this at once in one
# tree, where INSTALLED still fails under the lock (another run may have just finished it).
install_once() {  # dir part installed note install
  if "$3"; then
    echo "setup.sh: $2; installed$("$4")"
    return
  fi
  mkdir -p "$root/build"
  exec 9>"$1.lock"
  flock 9
  if "$3"; then
    echo "setup.sh: $2; installed$("$4")"
  else
    echo "setup.sh: $2; missing"
    "$5"
  fi
  exec 9>&-
}
no_note() { :; }

# A virtual environment at VENV with the pinned REQUIREMENTS (NAME, as people read it) from PyPI,
# pip's output in LOG. Prints nothing where it worked, and why not where it did not.
make_pinned_venv() {  # venv requirements log name
  if ! python3 -m venv "$1" >"$3" 2>&1; then
    echo "python3 -m venv failed (is python3-venv installed?)"
  elif ! "$1/bin/python" -m pip install --quiet --disable-pip-version-check --no-input --only-binary :all: \
      --retries 2 --timeout 30 -r "$2" >>"$3" 2>&1; then
    echo "pip could not install $4 (is PyPI reachable?)"
  fi
}

# The summary tests read what summary::writer wrote back with TensorBoard's own reader
# (tests/summary/read_events.py), from a virtual environment of the pinned versions in
# tests/summary/requirements.txt (about 180 MB). Installed once; afterwards this only compares the
# requirements with the copy the last install left. Where it cannot be installed (no PyPI), this says
# why, leaves that reason in build/tensorboard-venv.unavailable and goes on: the round-trip test is
# then skipped, where otherwise a missing environment fails it.
tensorboard_venv=$root/build/tensorboard-venv
tensorboard_requirements=$root/tests/summary/requirements.txt
tensorboard_installed() {
  [[ -x $tensorboard_venv/bin/python ]] && cmp -s "$tensorboard_requirements" "$tensorboard_venv/installed-requirements.txt"
}
tensorboard_install() {
  local venv=$tensorboard_venv note=$tensorboard_venv.unavailable log=$tensorboard_venv.log
  echo "setup.sh: installing TensorBoard's reader into build/tensorboard-venv (pinned: tests/summary/requirements.txt)"
  rm -rf "$venv" "$note"
  local reason
  reason=$(make_pinned_venv "$venv" "$tensorboard_requirements" "$log" tests/summary/requirements.txt)
  if [[ -n $reason ]]; then
    optional_not_installed "$venv" "$reason" "$log" "$note" "TensorBoard's reader is" \
      "the test summary.round_trip will be skipped."
  else
    cp "$tensorboard_requirements" "$venv/installed-requirements.txt"
    echo "setup.sh: installed TensorBoard's reader ($(du -sh "$venv" | cut -f1) in build/tensorboard-venv)"
  fi
}
install_tensorboard_reader() {
  install_once "$tensorboard_venv" \
    "test: TensorBoard's reader (build/tensorboard-venv, about 180 MB): the summary tests read event files back with it" \
    tensorboard_installed no_note tensorboard_install
}

# The interop tests (tests/interop) check the files nn::save_safetensors and nn::export_onnx write
# with the other side's own code: safetensors, onnx's checker and onnxruntime (the pinned versions in
# tests/interop/requirements.txt, from PyPI), and the example's PyTorch port with torch, in
# build/interop-venv. torch is PyTorch's CPU-only wheel, a few hundred MB, from PyTorch's own index
# (tests/interop/requirements-torch.txt). Where that index cannot be reached, it is PyPI's build of
# the same version, the CUDA one: it runs on a CPU, but with its dependencies it is 2.6 GB to
# download (4.6 GB installed, 63 s). So it is installed with --no-deps, with only what `import torch`
# loads (tests/interop/requirements-torch-pypi.txt): torch, its pure-Python dependencies, and the
# three CUDA libraries libtorch_cuda.so and libtorch_python.so are linked with that a CUDA 13.0
# installation with cuBLAS, cuDNN and NCCL (/usr/local/cuda on our machines) may lack: nvidia-cufile
# (libcufile.so.0, GPUDirect Storage), nvidia-cusparselt-cu13 (libcusparseLt.so.0, structured
# sparsity) and nvidia-nvshmem-cu13 (libnvshmem_host.so.3, NVSHMEM, for libtorch_nvshmem.so):
# 772 MB to download (1.6 GB installed), 27 s from scratch (pip --no-cache-dir, 2 cores at load 3,
# 2026-11-27). Where torch then does not import, as the other CUDA 13 libraries it is linked with
# (cuBLAS, cuDNN, NCCL, cuFFT, ...) are not on the loader's path either, they come from PyPI too
# (tests/interop/requirements-torch-pypi-cuda.txt): another 1.46 GB (1.9 GB installed), 20 s.
# Where PyPI cannot be reached the reason is left in build/interop-venv.unavailable and the tests
# that need it are skipped; where torch cannot be installed from either source, or does not import,
# in build/interop-venv.no-torch, and only the PyTorch tests are.
interop_venv=$root/build/interop-venv
interop_requirements=(requirements.txt requirements-torch.txt requirements-torch-pypi.txt requirements-torch-pypi-cuda.txt)
interop_wanted() { (cd "$root/tests/interop" && cat "${interop_requirements[@]}"); }
interop_installed() {
  [[ -x $interop_venv/bin/python ]] && [[ $(interop_wanted) == "$(cat "$interop_venv/installed-requirements.txt" 2>/dev/null)" ]]
}
interop_note() {
  if [[ -f $interop_venv.no-torch ]]; then
    echo ", without PyTorch: $(head -n 1 "$interop_venv.no-torch")"
  fi
}
interop_install() {
  local venv=$interop_venv dir=$root/tests/interop
  local torch_cpu=$dir/requirements-torch.txt torch_pypi=$dir/requirements-torch-pypi.txt
  local torch_pypi_cuda=$dir/requirements-torch-pypi-cuda.txt
  local note=$venv.unavailable no_torch=$venv.no-torch log=$venv.log
  echo "setup.sh: installing the interop environment into build/interop-venv (pinned: tests/interop/requirements*.txt)"
  rm -rf "$venv" "$note" "$no_torch"
  local reason
  reason=$(make_pinned_venv "$venv" "$dir/requirements.txt" "$log" tests/interop/requirements.txt)
  if [[ -n $reason ]]; then
    optional_not_installed "$venv" "$reason" "$log" "$note" "the interop environment is" \
      "the interop tests that run Python (interop.torch, interop.onnxruntime) will be skipped."
    return
  fi
  local pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input --only-binary :all:
             --retries 2 --timeout 60)
  # Succeeds, printing the error's last line (less the search path torch lists), where torch does
  # not import or compute.
  torch_fails() {
    local out
    out=$("$venv/bin/python" -c 'import torch; assert (torch.ones(2) + 1).sum().item() == 4' 2>&1) && return 1
    echo "$out" >>"$log"
    echo "$out" | tail -n 1 | sed 's/ in the system path \[.*//'
  }
  local missing="" error
  if "${pip[@]}" --index-url https://download.pytorch.org/whl/cpu -r "$torch_cpu" >>"$log" 2>&1; then
    error=$(torch_fails) && missing="torch from https://download.pytorch.org/whl/cpu does not import: $error"
  else
    echo "setup.sh: pip could not install torch from https://download.pytorch.org/whl/cpu; installing it from PyPI (pinned: tests/interop/requirements-torch-pypi.txt)"
    if ! "${pip[@]}" --no-deps -r "$torch_pypi" >>"$log" 2>&1; then
      missing="pip could not install torch from https://download.pytorch.org/whl/cpu (tests/interop/requirements-torch.txt) nor from PyPI (tests/interop/requirements-torch-pypi.txt); is either reachable?"
    elif error=$(torch_fails); then
      echo "setup.sh: PyPI's torch does not find the CUDA 13 libraries it is linked with ($error); installing them from PyPI (pinned: tests/interop/requirements-torch-pypi-cuda.txt, 1.46 GB)"
      if ! "${pip[@]}" --no-deps -r "$torch_pypi_cuda" >>"$log" 2>&1; then
        missing="torch from PyPI needs the CUDA 13 libraries of tests/interop/requirements-torch-pypi-cuda.txt ($error), and pip could not install them"
      elif error=$(torch_fails); then
        missing="torch from PyPI does not import, with the CUDA 13 libraries of tests/interop/requirements-torch-pypi-cuda.txt: $error"
      fi
    fi
  fi
  if [[ -n $missing ]]; then
    { echo "$missing"; tail -n 5 "$log"; } >"$no_torch"
    echo "setup.sh: warning: PyTorch is not installed in build/interop-venv ($log): $missing" >&2
    echo "setup.sh: warning: the test interop.torch will be skipped." >&2
  fi
  interop_wanted >"$venv/installed-requirements.txt"
  echo "setup.sh: installed the interop environment ($(du -sh "$venv" | cut -f1) in build/interop-venv)"
}
install_interop_venv() {
  install_once "$interop_venv" \
    "test: the interop environment (build/interop-venv, about 1.8 GB with PyTorch): the interop tests read the safetensors and ONNX files we write with PyTorch, onnx and onnxruntime" \
    interop_installed interop_note interop_install
}

# Downloads the pinned wheels REQUIREMENT... (no dependencies) into WORK/wheel, pip's output in LOG:
# with pip itself, or one in a throwaway virtual environment (WORK/venv) where the system Python has
# none. Prints nothing where it worked, and why not where it did not.
download_wheels() {  # work log requirement...
  local work=$1 log=$2 pip=()
  shift 2
  if python3 -m pip --version >/dev/null 2>&1; then
    pip=(python3 -m pip)
  elif python3 -m venv "$work/venv" >"$log" 2>&1; then
    pip=("$work/venv/bin/python" -m pip)
  else
    echo "neither pip nor python3 -m venv is available"
    return
  fi
  if ! "${pip[@]}" download --quiet --disable-pip-version-check --no-input --no-deps \
      --only-binary :all: --retries 2 --timeout 30 -d "$work/wheel" "$@" >>"$log" 2>&1; then
    echo "pip could not download $* (is PyPI reachable?)"
  fi
}

# The GPU engine computes convolutions with cuDNN through NVIDIA's cudnn-frontend, a header-only C++
# library that no Debian package has: its headers (about 3 MB; MIT and Apache-2.0, the licences are
# copied with them) are taken from the PyPI wheel nvidia-cudnn-frontend at the version pinned here,
# into build/cudnn-frontend/include, where CMake looks for them (DISTRIBUTE_CUDNN_FRONTEND_INCLUDE_DIR).
# Only where a CUDA toolkit is installed, and only for the tests and the GPU build: the demo builds no
# GPU code. A failed download does not fail the setup: the build then has no cuDNN convolutions (the GPU
# engine says so when asked for one), and the reason is left in build/cudnn-frontend.unavailable.
cudnn_frontend_version=1.32.0
cudnn_frontend_dir=$root/build/cudnn-frontend
cudnn_frontend_installed() {
  [[ -f $cudnn_frontend_dir/include/cudnn_frontend.h && $(cat "$cudnn_frontend_dir/installed-version" 2>/dev/null) == "$cudnn_frontend_version" ]]
}
cudnn_frontend_install() {
  local dir=$cudnn_frontend_dir
  local note=$dir.unavailable log=$dir.log
  echo "setup.sh: fetching the cudnn-frontend $cudnn_frontend_version headers into build/cudnn-frontend"
  rm -rf "$dir" "$note"
  local work reason
  work=$(mktemp -d)
  reason=$(download_wheels "$work" "$log" "nvidia-cudnn-frontend==$cudnn_frontend_version")
  # Only the headers (the wheel's include/) and the licences; the wheel's Python package is not used.
  if [[ -z $reason ]] && ! python3 - "$work/wheel" "$dir" >>"$log" 2>&1 <<'PY'
import glob, os, sys, zipfile
wheel = glob.glob(os.path.join(sys.argv[1], "*.whl"))[0]
out = sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    names = [n for n in z.namelist() if not n.endswith("/") and (
        n.startswith("include/") or (".dist-info/licenses/" in n))]
    if "include/cudnn_frontend.h" not in names:
        sys.exit(f"{os.path.basename(wheel)} has no include/cudnn_frontend.h")
    for n in names:
        target = os.path.join(out, n if n.startswith("include/") else "licenses/" + os.path.basename(n))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with z.open(n) as src, open(target, "wb") as dst:
            dst.write(src.read())
PY
  then
    reason="the nvidia-cudnn-frontend wheel could not be unpacked"
  fi
  rm -rf "$work"
  if [[ -n $reason ]]; then
    optional_not_installed "$dir" "$reason" "$log" "$note" "the cudnn-frontend headers are" \
      "the GPU engine will be built without cuDNN convolutions."
  else
    echo "$cudnn_frontend_version" >"$dir/installed-version"
    echo "setup.sh: installed the cudnn-frontend $cudnn_frontend_version headers ($(du -sh "$dir" | cut -f1) in build/cudnn-frontend)"
  fi
}
install_cudnn_frontend() {
  have_cuda || return 0
  install_once "$cudnn_frontend_dir" \
    "test: the cudnn-frontend $cudnn_frontend_version headers (build/cudnn-frontend, about 3 MB; where CUDA is installed): the GPU engine's convolutions call cuDNN through them" \
    cudnn_frontend_installed no_note cudnn_frontend_install
}

# The CPU engine computes convolutions with oneDNN: Debian 12's libdnnl-dev (above), oneDNN 2.6.3.
# It is the one the build uses: it has Winograd kernels for AVX-512 (oneDNN 3.x dropped them on x86),
# which make the wide 3x3 convolutions of an image generator 2.5-3x faster, and the paper-size
# CycleGAN step with them about 1.7x faster than on oneDNN 3.2 (docs/benchmarks.md).
# With DISTRIBUTE_ONEDNN=3 in the environment this also fetches oneDNN 3.2 (Intel's PyPI wheels
# onednn-cpu-gomp and onednn-devel-cpu-gomp, built on GCC's OpenMP runtime like our own code; the
# library, headers and licences, about 55 MB) into build/onednn, for a build configured with
# -DDISTRIBUTE_DNNL_ROOT=$PWD/build/onednn: the newer kernels for AMX and recent Intel cores, no
# Winograd. Where the wheels cannot be fetched (no PyPI), the reason is left in
# build/onednn.unavailable.
onednn_wheel_version=2023.2.0  # oneDNN 3.2.0
onednn_dir=$root/build/onednn
onednn_installed() {
  [[ -f $onednn_dir/include/oneapi/dnnl/dnnl.h && $(cat "$onednn_dir/installed-version" 2>/dev/null) == "$onednn_wheel_version" ]]
}
onednn_install() {
  local dir=$onednn_dir
  local note=$dir.unavailable log=$dir.log
  echo "setup.sh: fetching oneDNN (PyPI onednn-cpu-gomp $onednn_wheel_version) into build/onednn"
  rm -rf "$dir" "$note"
  local work reason
  work=$(mktemp -d)
  reason=$(download_wheels "$work" "$log" "onednn-cpu-gomp==$onednn_wheel_version" \
    "onednn-devel-cpu-gomp==$onednn_wheel_version")
  # The headers (include/), the library once under its soname with libdnnl.so beside it (the wheel
  # holds three copies of it), and the licences; not the wheels' CMake files, which name other copies.
  if [[ -z $reason ]] && ! python3 - "$work/wheel" "$dir" >>"$log" 2>&1 <<'PY'
import glob, os, re, sys, zipfile
wheels, out = glob.glob(os.path.join(sys.argv[1], "*.whl")), sys.argv[2]
soname = None
for wheel in wheels:
    with zipfile.ZipFile(wheel) as z:
        for n in z.namelist():
            m = re.match(r"[^/]+\.data/data/(.*)", n)
            if not m or n.endswith("/"):
                continue
            path = m.group(1)
            if path.startswith("include/"):
                target = path
            elif re.fullmatch(r"lib/libdnnl\.so\.\d+", path):
                target, soname = path, os.path.basename(path)
            elif path.startswith("share/doc/onednn/"):
                target = "licenses/" + os.path.basename(path)
            else:
                continue
            target = os.path.join(out, target)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with z.open(n) as src, open(target, "wb") as dst:
                dst.write(src.read())
version = os.path.join(out, "include/oneapi/dnnl/dnnl_version.h")
if not soname or not os.path.exists(version):
    sys.exit("the wheels lack lib/libdnnl.so.N or include/oneapi/dnnl/dnnl_version.h")
os.chmod(os.path.join(out, "lib", soname), 0o755)
os.symlink(soname, os.path.join(out, "lib/libdnnl.so"))
v = dict(re.findall(r"#define DNNL_VERSION_(MAJOR|MINOR|PATCH) (\d+)", open(version).read()))
with open(os.path.join(out, "onednn-version"), "w") as f:
    f.write(f"{v['MAJOR']}.{v['MINOR']}.{v['PATCH']}\n")
PY
  then
    reason="the oneDNN wheels could not be unpacked"
  fi
  rm -rf "$work"
  if [[ -n $reason ]]; then
    optional_not_installed "$dir" "$reason" "$log" "$note" "oneDNN $onednn_wheel_version from PyPI is" \
      "build with Debian's oneDNN $(dpkg-query -W -f='${Version}' libdnnl-dev 2>/dev/null || echo '(libdnnl-dev)') (the default)."
  else
    echo "$onednn_wheel_version" >"$dir/installed-version"
    echo "setup.sh: installed oneDNN $(cat "$dir/onednn-version") ($(du -sh "$dir" | cut -f1) in build/onednn);" \
      "configure with -DDISTRIBUTE_DNNL_ROOT=$dir to build on it"
  fi
}
install_onednn() {
  if [[ ${DISTRIBUTE_ONEDNN:-} != 3 ]]; then
    # On AMX, oneDNN 3's bfloat16 kernels can beat 2.6.3's (docs/benchmarks.md): say how to find out.
    if grep -qw amx_bf16 /proc/cpuinfo 2>/dev/null; then
      echo "setup.sh: $purpose: this CPU has AMX, where oneDNN 3 ran the bfloat16 CycleGAN step 1.76x faster than" \
        "Debian's 2.6.3 and float32 1.59x slower: scripts/compare_onednn.sh measures both here and says which to build on"
    fi
    return 0
  fi
  install_once "$onednn_dir" \
    "$purpose: oneDNN 3.2 (build/onednn, about 55 MB; asked for with DISTRIBUTE_ONEDNN=3): its newer kernels, for a build configured with -DDISTRIBUTE_DNNL_ROOT=$onednn_dir" \
    onednn_installed no_note onednn_install
}

install_packages
install_onednn
if [[ $purpose == test ]]; then
  install_tensorboard_reader
  install_interop_venv
  install_cudnn_frontend
else
  echo "setup.sh: demo: the test suite's packages and Python environments (about 2 GB) are not needed; scripts/setup.sh test installs them"
fi
