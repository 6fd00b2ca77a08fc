#!/usr/bin/env bash
# Installs everything hyperpar needs (Debian 12/13) and builds it. Quick when already done.
# Usage: scripts/setup.sh [build-dir]   (HYPERPAR_BUILD_TYPE=Release|Debug, default Release;
#        HYPERPAR_SANITIZE=ON builds with AddressSanitizer)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${1:-build}
pkgs=(cmake g++ make libopenmpi-dev openmpi-bin libyaml-cpp-dev libgtest-dev libcli11-dev libgloo-dev libxxhash-dev nlohmann-json3-dev python3-venv bc procps)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  echo "[setup] installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi
if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c 'import torch' >/dev/null 2>&1; then
  echo "[setup] creating .venv with the pinned torch wheel (LibTorch)"
  python3 -m venv .venv
  .venv/bin/pip install -q torch==2.13.0
fi
# Test-only: PyTorch DCP's safetensors reader/writer (checkpoint interop tests) needs
# safetensors and numpy; the Hugging Face interop tests and scripts/tokenize_hf.py need
# transformers and tokenizers.
if ! .venv/bin/python -c 'import safetensors, numpy, transformers, tokenizers' >/dev/null 2>&1 ||
   [ "$(.venv/bin/python -c 'import transformers; print(transformers.__version__)')" != 5.25.0 ]; then
  .venv/bin/pip install -q safetensors==0.8.0 numpy==2.2.6 transformers==5.25.0 tokenizers==0.23.3
fi
TORCH_PREFIX=$(.venv/bin/python -c 'import torch.utils; print(torch.utils.cmake_prefix_path)' 2>/dev/null)
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE="${HYPERPAR_BUILD_TYPE:-Release}" \
  -DHYPERPAR_SANITIZE="${HYPERPAR_SANITIZE:-OFF}" \
  -DCMAKE_PREFIX_PATH="${CMAKE_PREFIX_PATH:+$CMAKE_PREFIX_PATH;}$TORCH_PREFIX" >/dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)"
