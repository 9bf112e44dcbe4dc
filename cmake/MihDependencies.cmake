# Finds every external dependency once and exposes it as an imported target, so that linking
# a target is the only way to use one (their headers are then SYSTEM and our -Werror stays
# quiet): cmake/MihFindDependencies.cmake, shared with the installed package. Sets
# MIH_WITH_GLOO and MIH_WITH_NCCL for harness/compat.
#
# Debian 12: apt-get install libtorch-dev libgloo-dev nlohmann-json3-dev libcli11-dev
#            libgtest-dev libssl-dev libstb-dev (mih_ensure_packages of scripts/lib/common.sh
#            does this).
# libtorch 2.x (pip wheel): -DCMAKE_PREFIX_PATH=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')
# Header-only libraries missing on a machine can be pointed at with
# -DMIH_EXTRA_INCLUDE_DIR=<dir holding nlohmann/ and CLI/>.

# The imported targets (also what the installed package's mihConfig.cmake recreates).
include(MihFindDependencies)
message(STATUS "mih: libtorch ${Torch_VERSION} (${TORCH_INSTALL_PREFIX})")

# Gloo: Debian ships its headers (libgloo-dev); pip wheels do not (GLOO_INSTALL OFF), so the
# Gloo factory compiles only where the headers are found. See docs/libtorch-compat.md section 1.6.
include(CheckIncludeFileCXX)
set(CMAKE_REQUIRED_INCLUDES ${TORCH_INCLUDE_DIRS})
set(CMAKE_REQUIRED_QUIET ON)
check_include_file_cxx("gloo/algorithm.h" MIH_HAVE_GLOO_HEADERS)
unset(CMAKE_REQUIRED_INCLUDES)
if(MIH_HAVE_GLOO_HEADERS)
  set(MIH_WITH_GLOO ON)
else()
  set(MIH_WITH_GLOO OFF)
  message(WARNING "mih: gloo headers not found; the Gloo backend is compiled out "
                  "(install libgloo-dev, or add a gloo checkout to the include path)")
endif()

# NCCL: only a CUDA build of libtorch has it; torch_cuda exports USE_C10D_NCCL itself.
if(TARGET torch_cuda OR TORCH_CUDA_LIBRARIES)
  set(MIH_WITH_NCCL ON)
  set(MIH_WITH_CUDA ON)  # harness/probes reads the CUDA allocator's peak
else()
  set(MIH_WITH_NCCL OFF)
  set(MIH_WITH_CUDA OFF)
endif()
message(STATUS "mih: gloo=${MIH_WITH_GLOO} nccl=${MIH_WITH_NCCL}")
