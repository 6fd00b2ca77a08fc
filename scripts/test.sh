#!/usr/bin/env bash
# Sets everything up, builds, and runs the whole test suite with CTest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh build
cd build
ctest --output-on-failure -j 2 --timeout 600
