# Shared by scripts/demo, scripts/test and .ci/run: dependency installation and build helpers.
# shellcheck shell=bash

DTRAIN_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# Debian packages dtrain builds, tests and demonstrates with.
DTRAIN_PACKAGES=(
  cmake g++ make pkg-config
  mpich libmpich-dev
  libhdf5-mpich-dev hdf5-tools
  libibverbs-dev
  doctest-dev
  libopenblas-dev
  zlib1g-dev
  hipcc
  dataset-fashion-mnist
  python3-h5py
  clang-format
  libcli11-dev
  libyaml-cpp-dev
  gfortran
  gnuplot-nox
  clang libclang-rt-14-dev slurm-wlm munge
)

# ensure_packages [extra packages...]: installs what is missing (as root) or prints the exact
# apt-get line to run and stops (not root). Idempotent.
ensure_packages() {
  local missing=()
  local p
  for p in "${DTRAIN_PACKAGES[@]}" "$@"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
      missing+=("$p")
    fi
  done
  if [ ${#missing[@]} -eq 0 ]; then
    echo "dtrain: all required Debian packages are installed"
    return 0
  fi
  if [ "$(id -u)" -ne 0 ]; then
    echo "dtrain: missing Debian packages: ${missing[*]}" >&2
    echo "dtrain: run as root:  apt-get update && apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
  echo "dtrain: installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
}

# Where the CUDA toolkit lives when it is not on PATH.
add_cuda_to_path() {
  if ! command -v nvcc >/dev/null 2>&1; then
    local d
    for d in /usr/local/cuda/bin /usr/local/cuda-*/bin; do
      if [ -x "$d/nvcc" ]; then
        export PATH="$PATH:$d"
        break
      fi
    done
  fi
}

# configure_build DIR [cmake args...]: Release with assertions kept (the project flags undefine
# NDEBUG), MPICH named explicitly.
configure_build() {
  local dir=$1
  shift
  add_cuda_to_path
  cmake -S "$DTRAIN_ROOT" -B "$dir" -DCMAKE_BUILD_TYPE=Release \
    -DMPI_CXX_COMPILER="$(command -v mpicxx.mpich)" -DMPI_C_COMPILER="$(command -v mpicc.mpich)" \
    -DMPIEXEC_EXECUTABLE="$(command -v mpiexec.mpich)" "$@"
}

# Number of parallel build jobs: all online cores (getconf, not nproc: nproc honours
# OMP_NUM_THREADS, which a user's job environment often sets to 1).
build_jobs() {
  getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2
}
