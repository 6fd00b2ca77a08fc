#!/usr/bin/env bash
# Sets everything up, builds the test build (AddressSanitizer on), runs all tests with CTest.
set -euo pipefail
cd "$(dirname "$0")/.."
HYPERPAR_SANITIZE=ON HYPERPAR_BUILD_TYPE=RelWithDebInfo scripts/setup.sh build-asan
cd build-asan
# Leak checking is off: Open MPI keeps its one-time MPI_Init allocations until exit, which
# LeakSanitizer reports; every other ASan check (overflow, use-after-free) stays on.
export ASAN_OPTIONS=detect_leaks=0
ctest --output-on-failure -j 2 --timeout 600
