#!/usr/bin/env bash
# Sets everything up, then runs the main job: the reported TP=2 + EP=2 + FSDP configuration
# (configs/tp2_ep2_fsdp.yaml: meta init, 20 steps) on 8 workers. Extra arguments go to
# hyperpar-train (e.g. --set train.steps=100).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh build
exec build/tools/hyperpar-run --worker_num 8 --log_dir build/logs/main -- \
  build/tools/hyperpar-train --config configs/tp2_ep2_fsdp.yaml --metrics build/logs/main/metrics.jsonl "$@"
