#!/usr/bin/env bash
# FSDP prefetch on/off: mean step time of the TP=2 + EP=2 + FSDP layout on 8 workers, for a
# medium MoE model (dim 512, 4 layers, 2 of them MoE with 8 experts, seq 128), in the
# Release build. Prints both figures and the ratio; with --out FILE writes them as JSON.
# Steps 1-2 (first-touch allocation, group creation) are left out of the mean.
#
#   bash bench/bench_prefetch.sh [--out build/bench/prefetch.json] [--steps 12]
set -euo pipefail
cd "$(dirname "$0")/.."
out=""
steps=12
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    *) echo "bench_prefetch: unknown argument $1 (expected --out FILE, --steps N)" >&2; exit 2 ;;
  esac
done
[ -x build/tools/hyperpar-train ] || scripts/setup.sh build
tmp=$(mktemp -d)
sets=(--set model.dim=512 --set model.ffn_hidden=1408 --set model.n_layers=4
      --set model.vocab_size=4096 --set model.n_heads=8 --set model.n_kv_heads=4
      --set "model.moe.layers=[1, 3]" --set model.moe.n_experts=8
      --set train.seq_len=128 --set train.global_batch_size=16 --set "train.steps=$steps")
for prefetch in true false; do
  build/tools/hyperpar-run --worker_num 8 --log_dir "$tmp/logs_$prefetch" -- \
    build/tools/hyperpar-train --config configs/tp2_ep2_fsdp.yaml "${sets[@]}" \
    --set "parallel.prefetch=$prefetch" --metrics "$tmp/m_$prefetch.jsonl" >/dev/null
done
python3 - "$tmp" "$out" <<'PY'
import json, statistics, sys
tmp, out = sys.argv[1], sys.argv[2]
res = {}
for p in ("true", "false"):
    rows = [json.loads(l) for l in open(f"{tmp}/m_{p}.jsonl")]
    times = [r["step_time_s"] for r in rows[2:]]
    res["prefetch" if p == "true" else "no_prefetch"] = {
        "mean_step_s": statistics.mean(times), "median_step_s": statistics.median(times),
        "steps": len(times), "final_loss": rows[-1]["loss"]}
ratio = res["prefetch"]["mean_step_s"] / res["no_prefetch"]["mean_step_s"]
res["prefetch_over_no_prefetch"] = ratio
for k in ("prefetch", "no_prefetch"):
    r = res[k]
    print(f"{k:12s} mean {r['mean_step_s']:.4f} s  median {r['median_step_s']:.4f} s  "
          f"({r['steps']} steps), final loss {r['final_loss']:.6f}")
print(f"prefetch / no prefetch step time: {ratio:.3f}")
if res["prefetch"]["final_loss"] != res["no_prefetch"]["final_loss"]:
    print("FAIL: prefetch changed the training result"); sys.exit(1)
if out:
    json.dump(res, open(out, "w"), indent=1)
PY
rm -rf "$tmp"
