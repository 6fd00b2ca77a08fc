#!/usr/bin/env bash
# hyperpar-train's command line: invalid configs exit 2 on every rank before any
# communication, --dry-run prints valid JSON for one rank of a simulated world, --metrics
# writes one JSON object per step.
set -u
build=$1
src=$2
train="$build/tools/hyperpar-train"
tmp=$(mktemp -d)
fail=0
# 1. Unknown key and bad sizes, one process.
"$train" --config "$src/configs/single.yaml" --set model.colour=3 >"$tmp/o1" 2>&1
[ $? = 2 ] && grep -q "unknown key 'model.colour'" "$tmp/o1" || { echo "FAIL: unknown key"; cat "$tmp/o1"; fail=1; }
"$train" --config "$src/configs/single.yaml" --set model.n_kv_heads=3 >"$tmp/o2" 2>&1
[ $? = 2 ] && grep -q "not divisible by n_kv_heads" "$tmp/o2" || { echo "FAIL: heads"; cat "$tmp/o2"; fail=1; }
# Expert-parallel and resharding sizes, reported before anything starts (exit 2).
while IFS='|' read -r sets want; do
  # shellcheck disable=SC2086
  "$train" --config "$src/configs/tp2_ep2_fsdp.yaml" $sets --dry-run --world-size 8 >"$tmp/ob" 2>&1
  [ $? = 2 ] && grep -q "$want" "$tmp/ob" || { echo "FAIL: $sets"; cat "$tmp/ob"; fail=1; }
done <<'CASES'
--set parallel.ep=3|n_experts 4 is not divisible by ep 3
--set parallel.reshard_after_forward=3|reshard_after_forward = 3 must divide dp_shard = 4
--set parallel.expert_tp=4|parallel.expert_tp must be 1
--set parallel.tp=4 --set parallel.expert_tp=4 --set parallel.ep=4|ep 4 must divide dp_shard = 2 when
--set train.global_batch_size=4 --set train.seq_len=1|must divide by tp 2
CASES
# 2. tp=3 on 8 ranks: every rank reports it and exits 2.
timeout 120 "$build/tools/hyperpar-run" --worker_num 8 --log_dir "$tmp/logs" -- "$train" \
  --config "$src/configs/tp2_fsdp.yaml" --set parallel.tp=3 >"$tmp/o3" 2>&1
rc=$?
[ $rc != 0 ] && [ $rc != 124 ] || { echo "FAIL: launcher rc=$rc"; fail=1; }
for r in 0 1 2 3 4 5 6 7; do
  grep -q "world size 8 is not divisible by tp\*dp_replicate = 3" "$tmp/logs/worker_$r.log" || { echo "FAIL: rank $r"; cat "$tmp/logs/worker_$r.log"; fail=1; }
done
grep -q "exited with code 2" "$tmp/o3" || { echo "FAIL: exit code 2 not reported"; cat "$tmp/o3"; fail=1; }
# 3. Dry run for rank 5 of 8.
"$train" --config "$src/configs/tp2_fsdp.yaml" --dry-run --world-size 8 --rank 5 >"$tmp/dry.json" 2>&1 || { echo "FAIL: dry run"; fail=1; }
python3 - "$tmp/dry.json" <<'PY' || fail=1
import json, sys
d = json.load(open(sys.argv[1]))
r = d["ranks"][0]
assert d["world_size"] == 8 and r["rank"] == 5, d
assert r["tp_group"] == [4, 5] and r["dp_group"] == [1, 3, 5, 7], r
p = {x["name"]: x for x in r["parameters"]}
wq = p["layers.0.attention.wq.weight"]
assert wq["global_shape"] == [64, 64] and wq["local_shape"] == [8, 64], wq
assert wq["placements"] == "(StridedShard(0, sf=2), Shard(0))", wq
assert r["memory_bytes"]["optimizer_state"] == 2 * r["memory_bytes"]["parameters"]
print("dry run ok:", len(p), "parameters, rank 5 holds", r["memory_bytes"]["parameters"], "parameter bytes")
PY
# 3b. Dry run of the EP config: ep and expert-FSDP groups of rank 5 (parallel/expert_mesh.h).
"$train" --config "$src/configs/tp2_ep2_fsdp.yaml" --dry-run --world-size 8 --rank 5 >"$tmp/dry_ep.json" 2>&1 || { echo "FAIL: ep dry run"; fail=1; }
python3 - "$tmp/dry_ep.json" <<'PY' || fail=1
import json, sys
r = json.load(open(sys.argv[1]))["ranks"][0]
assert r["ep_group"] == [4, 5] and r["expert_dp_group"] == [1, 3, 5, 7], r
w1 = {x["name"]: x for x in r["parameters"]}["layers.1.moe.experts.w1"]
assert w1["local_shape"] == [0, 64, 64] and w1["placements"] == "(StridedShard(0, sf=2), Shard(0))", w1
print("ep dry run ok")
PY
# 4. Metrics file.
"$train" --config "$src/configs/single.yaml" --set train.steps=3 --metrics "$tmp/m.jsonl" >/dev/null 2>&1 || { echo "FAIL: run"; fail=1; }
python3 - "$tmp/m.jsonl" <<'PY' || fail=1
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [r["step"] for r in rows] == [1, 2, 3], rows
for r in rows:
    assert set(r) == {"step", "loss", "grad_norm", "lr", "tokens_per_s", "step_time_s", "peak_rss_mb"}, r
print("metrics ok")
PY
rm -rf "$tmp"
[ "$fail" = 0 ] && echo "1 passed, 0 failed" || echo "0 passed, 1 failed"
exit $fail
