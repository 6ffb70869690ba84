#!/usr/bin/env bash
# Compiles every kernel that `xtoken bench kernels --emit-cuda DIR` wrote, without a GPU: NVRTC
# (libnvrtc, with the options cubecl-cuda 0.10 passes: --gpu-architecture=sm_90a or sm_80, the
# CUDA headers' include path, -lineinfo), then `ptxas -v` for each kernel's registers, shared
# memory and spills, and the occupancy its cube size allows on the architecture's flagship
# (H100 for sm_90, A100 for sm_80). Prints a Markdown table (also written to DIR/report.md) and
# exits non-zero when any kernel fails to compile.
#
# NVRTC, ptxas and the CUDA headers come from NVIDIA's PyPI wheels, installed into a virtual
# environment on first use.
#
# Usage: scripts/cuda-compile.sh DIR
# Environment:
#   XTOKEN_CUDA_VENV  the virtual environment (default: $XDG_CACHE_HOME or ~/.cache, then
#                     xtoken/cuda-venv); made, with the wheels, when it lacks them
#   JOBS              kernels compiled at once (default: the number of cores)
set -euo pipefail

dir="${1:?usage: scripts/cuda-compile.sh DIR (written by xtoken bench kernels --emit-cuda DIR)}"
if [ ! -f "$dir/manifest.tsv" ]; then
    echo "error: $dir/manifest.tsv is missing; write DIR with: xtoken bench kernels --emit-cuda DIR" >&2
    exit 2
fi

venv="${XTOKEN_CUDA_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/xtoken/cuda-venv}"
# One CUDA release for all three: 12.9 (cudarc's bindings and cubecl-cuda target CUDA 12).
wheels=(nvidia-cuda-nvrtc-cu12==12.9.86 nvidia-cuda-nvcc-cu12==12.9.86 nvidia-cuda-runtime-cu12==12.9.79)
if ! "$venv/bin/python" -c 'import nvidia.cuda_nvrtc, nvidia.cuda_nvcc, nvidia.cuda_runtime' 2>/dev/null; then
    echo "installing NVRTC, ptxas and the CUDA headers (${wheels[*]}) into $venv" >&2
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "${wheels[@]}"
fi

exec "$venv/bin/python" "$(dirname "$0")/cuda_compile.py" "$dir"
