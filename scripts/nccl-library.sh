#!/usr/bin/env bash
# Prints the directory of NCCL's libnccl.so.2 from NVIDIA's PyPI wheel (nvidia-nccl-cu12, the
# copy PyTorch installs), installing the wheel into a virtual environment on first use; no GPU
# is needed. xtoken finds NCCL there through XTOKEN_NCCL:
#
#   export XTOKEN_NCCL="$(bash scripts/nccl-library.sh)"
#
# Environment:
#   XTOKEN_CUDA_VENV  the virtual environment (default: $XDG_CACHE_HOME or ~/.cache, then
#                     xtoken/cuda-venv, the one scripts/cuda-compile.sh uses)
set -euo pipefail

venv="${XTOKEN_CUDA_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/xtoken/cuda-venv}"
wheel=nvidia-nccl-cu12==2.32.3
if ! "$venv/bin/python" -c 'import nvidia.nccl' 2>/dev/null; then
    echo "installing NCCL ($wheel) into $venv" >&2
    [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "$wheel"
fi
dir="$("$venv/bin/python" -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))')"
if [ ! -f "$dir/libnccl.so.2" ]; then
    echo "error: $dir/libnccl.so.2 is missing after installing $wheel" >&2
    exit 1
fi
echo "$dir"
