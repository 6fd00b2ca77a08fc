#!/usr/bin/env bash
# Sets everything up, then runs the main job on 8 workers.
# Until the trainer exists, the main job is the 8-rank mesh + collectives demonstration.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh build
exec build/tools/hyperpar-run --worker_num 8 --log_dir build/logs/main -- build/tools/hyperpar-demo "$@"
