# Shared by scripts/test and scripts/conformance: install what is missing, configure once,
# build incrementally. Source it; do not run it.

MIH_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
MIH_BUILD_DIR=${MIH_BUILD_DIR:-$MIH_ROOT/build}
MIH_JOBS=${MIH_JOBS:-$(nproc)}

# Debian 12 packages of the build. libopenblas0-pthread matters: with Debian's reference BLAS,
# libtorch matmuls run about 30x slower (7 vs 216 GFLOP/s for 512x512 fp32 measured here).
# libxml2-utils: xmllint, which the evidence tests validate the JUnit report with. libvalijson-dev:
# the JSON Schema validator of the evidence contract (header-only, build only).
MIH_PACKAGES=(g++ cmake ninja-build ccache libtorch-dev libgloo-dev nlohmann-json3-dev libcli11-dev
              libgtest-dev libgmock-dev libssl-dev libopenblas0-pthread
              libstb-dev libxml2-utils libvalijson-dev python3 python3-venv)
# What scripts/test adds: the real launchers its tests run (torchrun from python3-torch,
# mpirun from openmpi-bin), ip(8) for the two-host test's network namespaces, and python3-jsonschema:
# a second JSON Schema implementation the contract test validates evidence with. universal-ctags:
# what the structure lint measures each function's length with (tests/lint/structure.py).
MIH_TEST_PACKAGES=(python3-torch python3-jsonschema openmpi-bin iproute2 slurm-wlm munge universal-ctags)

mih_log() { printf 'mih: %s\n' "$*" >&2; }

source "$MIH_ROOT/scripts/lib/python_env.sh"

# Installs the packages of MIH_PACKAGES (and any given as arguments) that are missing:
# apt-get as root, sudo otherwise; a clear message when neither works.
mih_ensure_packages() {
  local wanted=("${MIH_PACKAGES[@]}" "$@") missing=() p
  for p in "${wanted[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  local apt=(apt-get)
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
      apt=(sudo apt-get)
    else
      mih_log "missing Debian packages: ${missing[*]}"
      mih_log "this script installs them with apt-get as root, or with sudo, and can do neither here."
      mih_log "install them, then run this again:  sudo apt-get install -y ${missing[*]}"
      exit 1
    fi
  fi
  mih_log "installing missing packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  if ! "${apt[@]}" install -y --no-install-recommends "${missing[@]}"; then
    mih_log "apt-get install failed; refreshing the package lists and trying again"
    "${apt[@]}" update && "${apt[@]}" install -y --no-install-recommends "${missing[@]}" || {
      mih_log "could not install: ${missing[*]}"
      exit 1
    }
  fi
}

# Configures the build directory once (Ninja when available), and again when the transformers
# Python (MIH_TRANSFORMERS_PYTHON, from mih_ensure_python_env) changed; then builds `targets`
# (all when none given) incrementally.
mih_build() {
  local configure=() cached=""
  if [ -n "${MIH_TRANSFORMERS_PYTHON+set}" ]; then
    [ -f "$MIH_BUILD_DIR/CMakeCache.txt" ] &&
      cached=$(sed -n 's/^MIH_TRANSFORMERS_PYTHON:[A-Z]*=//p' "$MIH_BUILD_DIR/CMakeCache.txt")
    [ "$cached" != "$MIH_TRANSFORMERS_PYTHON" ] && configure=(-DMIH_TRANSFORMERS_PYTHON="$MIH_TRANSFORMERS_PYTHON")
  fi
  if [ ! -f "$MIH_BUILD_DIR/CMakeCache.txt" ]; then
    local generator=()
    command -v ninja >/dev/null && generator=(-G Ninja)
    cmake -S "$MIH_ROOT" -B "$MIH_BUILD_DIR" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo "${configure[@]}"
  elif [ ${#configure[@]} -gt 0 ]; then
    cmake -S "$MIH_ROOT" -B "$MIH_BUILD_DIR" "${configure[@]}"
  fi
  local target_args=()
  local t
  for t in "$@"; do target_args+=(--target "$t"); done
  cmake --build "$MIH_BUILD_DIR" -j "$MIH_JOBS" "${target_args[@]}"
}
