#!/usr/bin/env bash
# Where the 8-rank CPU-seconds go: the floor under issue 14's goal "CPU-seconds per step on 8
# ranks <= 1.15 x one process's". Runs, alternating (--pairs of each), on the peer benchmark's
# dense model (dim 512, 4 layers, ffn 1408, vocab 4096, seq 128, global batch 16, fp32, AdamW):
#   one    one process, batch 16, 2 intra-op threads (the goal's reference);
#   apart  8 independent one-process runs at once, batch 2 and 1 thread each: 8 ranks' compute
#          sharing the cores with no communication at all. Each also runs the whole optimizer
#          and grad norm, of which an FSDP8 rank runs 1/8: 7 x `opt` (one process's optimizer
#          and clip_grad_norm spans, from --profile, measured alone) is subtracted -> `floor`;
#   fsdp8  the 8-rank FSDP8 job on MPI.
# Prints per pair the median CPU-s per step after 2 warm-up steps (summed over processes) and
# the ratios floor/one and fsdp8/one; `fsdp8 - floor` is what distribution costs (collectives,
# copy-in/out, scheduling). With --out FILE writes the figures as JSON. A benchmark: CI does
# not run it.
#
#   bash bench/bench_cpu_floor.sh [--pairs 2] [--steps 12] [--out bench/results/cpu_floor.json]
set -euo pipefail
cd "$(dirname "$0")/.."
pairs=2
steps=12
out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --pairs) pairs=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "bench_cpu_floor: unknown argument $1 (expected --pairs N, --steps N, --out FILE)" >&2; exit 2 ;;
  esac
done
[ -x build/tools/hyperpar-train ] || scripts/setup.sh build
train=build/tools/hyperpar-train
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sets=(--config bench/peer/peer.yaml --set model.dim=512 --set model.ffn_hidden=1408
      --set model.n_layers=4 --set model.vocab_size=4096 --set model.n_heads=8
      --set model.n_kv_heads=4 --set "train.steps=$steps")
# One process's optimizer + grad-norm time at batch 2, alone (1 thread: wall ~ CPU).
OMP_NUM_THREADS=1 "$train" "${sets[@]}" --set train.global_batch_size=2 \
  --profile "$tmp/alone.trace.json" --metrics "$tmp/alone.jsonl" >/dev/null
port=29950
for i in $(seq 1 "$pairs"); do
  OMP_NUM_THREADS=2 "$train" "${sets[@]}" --metrics "$tmp/one-$i.jsonl" >/dev/null
  for r in 0 1 2 3 4 5 6 7; do
    OMP_NUM_THREADS=1 "$train" "${sets[@]}" --set train.global_batch_size=2 \
      --metrics "$tmp/apart-$i-$r.jsonl" >/dev/null &
  done
  wait
  port=$((port + 1))
  build/tools/hyperpar-run --worker_num 8 --backend mpi --master_port "$port" \
    --log_dir "$tmp/logs-$i" -- "$train" "${sets[@]}" --metrics "$tmp/fsdp8-$i.jsonl" >/dev/null
done
python3 - "$tmp" "$pairs" "$out" <<'PY'
import json, statistics, sys
tmp, pairs, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rows = lambda f: [json.loads(l) for l in open(f)][2:]  # after 2 warm-up steps
med_cpu = lambda f: statistics.median(r["cpu_s"] for r in rows(f))
trace = json.load(open(f"{tmp}/alone.trace.json"))
events = trace["traceEvents"] if isinstance(trace, dict) else trace
spans = {}
for e in events:
    if e.get("ph") == "X" and e["name"] in ("optimizer", "clip_grad_norm"):
        spans.setdefault(e["name"], []).append(e["dur"] / 1e6)
opt = sum(statistics.median(v[2:]) for v in spans.values())
res = {"opt_cpu_s": opt, "pairs": []}
print(f"one optimizer + clip_grad_norm at batch 2, alone: {opt:.3f} s")
print("pair  one CPU-s  apart CPU-s  floor CPU-s  fsdp8 CPU-s  floor/one  fsdp8/one  fsdp8-floor")
for i in range(1, pairs + 1):
    one = med_cpu(f"{tmp}/one-{i}.jsonl")
    per = [rows(f"{tmp}/apart-{i}-{r}.jsonl") for r in range(8)]
    n = min(len(p) for p in per)
    apart = statistics.median(sum(p[s]["cpu_s"] for p in per) for s in range(n))
    floor = apart - 7 * opt
    fsdp8 = med_cpu(f"{tmp}/fsdp8-{i}.jsonl")
    res["pairs"].append({"one_cpu_s": one, "apart_cpu_s": apart, "floor_cpu_s": floor,
                         "fsdp8_mpi_cpu_s": fsdp8})
    print(f"{i:4d}  {one:9.3f}  {apart:11.3f}  {floor:11.3f}  {fsdp8:11.3f}  {floor / one:9.2f}"
          f"  {fsdp8 / one:9.2f}  {fsdp8 - floor:11.3f}")
if out:
    with open(out, "w") as f:
        json.dump(res, f, indent=1)
    print("wrote", out)
PY
