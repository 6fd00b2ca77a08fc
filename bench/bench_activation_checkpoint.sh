#!/usr/bin/env bash
# Activation checkpointing: peak RSS and step time of one process training a deep dense
# model with a long sequence (16 layers, dim 256, seq 1024, batch 4, fp32, AdamW), for
# parallel.activation_checkpoint none / full / every:2 / selective, each in its own process
# (peak RSS is per process), in the Release build. The losses must agree exactly (checked).
# Prints a table; with --out FILE writes the figures as JSON. Step 1 is left out of the times.
#
#   bash bench/bench_activation_checkpoint.sh [--out bench/results/activation_checkpoint.json]
set -euo pipefail
cd "$(dirname "$0")/.."
out=""
steps=4
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    *) echo "bench_activation_checkpoint: unknown argument $1 (expected --out FILE, --steps N)" >&2; exit 2 ;;
  esac
done
[ -x build/tools/hyperpar-train ] || scripts/setup.sh build
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sets=(--set model.dim=256 --set model.ffn_hidden=768 --set model.n_layers=16
      --set model.vocab_size=256 --set model.n_heads=8 --set model.n_kv_heads=4
      --set model.moe.n_experts=0 --set train.seq_len=1024 --set train.global_batch_size=4
      --set "train.steps=$steps")
modes=(none full every:2 selective)
for mode in "${modes[@]}"; do
  build/tools/hyperpar-train --config configs/single.yaml "${sets[@]}" \
    --set "parallel.activation_checkpoint=$mode" --metrics "$tmp/m_${mode/:/_}.jsonl" >/dev/null
done
python3 - "$tmp" "$out" "${modes[@]}" <<'PY'
import json, statistics, sys
tmp, out, modes = sys.argv[1], sys.argv[2], sys.argv[3:]
res = {}
for m in modes:
    rows = [json.loads(l) for l in open(f"{tmp}/m_{m.replace(':', '_')}.jsonl")]
    res[m] = {"peak_rss_mb": rows[-1]["peak_rss_mb"],
              "median_step_s": statistics.median(r["step_time_s"] for r in rows[1:]),
              "losses": [r["loss"] for r in rows]}
base = res["none"]
print(f"{'mode':<10} {'peak RSS MiB':>13} {'vs none':>8} {'step s':>8} {'vs none':>8}")
for m in modes:
    r = res[m]
    r["rss_vs_none"] = r["peak_rss_mb"] / base["peak_rss_mb"]
    r["time_vs_none"] = r["median_step_s"] / base["median_step_s"]
    print(f"{m:<10} {r['peak_rss_mb']:>13.0f} {r['rss_vs_none']:>8.2f} {r['median_step_s']:>8.2f} {r['time_vs_none']:>8.2f}")
    assert r["losses"] == base["losses"], f"{m}: losses differ from none: {r['losses']} vs {base['losses']}"
print("losses identical in every mode")
if out:
    json.dump({"model": "16 layers, dim 256, ffn 768, seq 1024, batch 4, fp32, 1 process", "modes": res},
              open(out, "w"), indent=1)
PY
