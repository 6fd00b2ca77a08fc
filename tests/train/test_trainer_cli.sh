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
--set parallel.fsdp_collectives=flat|'parallel.fsdp_collectives' must be per_param or per_group, got flat
--set parallel.tp=4 --set parallel.expert_tp=4 --set parallel.ep=4|ep 4 must divide dp_shard = 2 when
--set train.global_batch_size=4 --set train.seq_len=1|must divide by tp 2
CASES
# 2. tp=3 on 8 ranks: every rank reports it and exits 2.
timeout 120 "$build/tools/hyperpar-run" --worker_num 8 --log_dir "$tmp/logs" -- "$train" \
  --config "$src/configs/tp2_fsdp.yaml" --set parallel.tp=3 >"$tmp/o3" 2>&1
rc=$?
[ $rc != 0 ] && [ $rc != 124 ] || { echo "FAIL: launcher rc=$rc"; fail=1; }
for r in 0 1 2 3 4 5 6 7; do
  grep -q "world size 8 is not divisible by pp\*tp\*dp_replicate = 3" "$tmp/logs/worker_$r.log" || { echo "FAIL: rank $r"; cat "$tmp/logs/worker_$r.log"; fail=1; }
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
# 2 local experts over 4 expert-FSDP ranks: sharded on dim 1 (no padding), rows 32..47 here.
assert w1["local_shape"] == [2, 16, 64] and w1["placements"] == "(Shard(1), Shard(0))", w1
print("ep dry run ok")
PY
# 3c. Pipeline sizes (exit 2, naming the values) and the dry run of a 1024-rank
# PP x FSDP x TP x EP layout for one rank: its stages, pipeline group and schedule.
pp="$src/configs/pp2_tp2_ep2_fsdp.yaml"
while IFS='|' read -r cfg sets want; do
  # shellcheck disable=SC2086
  "$train" --config "$cfg" $sets --dry-run --world-size 8 >"$tmp/op" 2>&1; rc=$?
  [ $rc = 2 ] && grep -qF -- "$want" "$tmp/op" || { echo "FAIL: $sets (rc $rc): want '$want'"; cat "$tmp/op"; fail=1; }
done <<CASES
$pp|--set parallel.pp=3|world size 8 is not divisible by pp*tp*dp_replicate = 6
$pp|--set parallel.pp_schedule=GPipe --set parallel.pp_virtual_stages=2|runs one stage per rank, got parallel.pp_virtual_stages 2
$pp|--set parallel.pp=8 --set parallel.tp=1 --set parallel.ep=1 --set model.n_layers=4 --set model.moe.layers=[1]|model.n_layers 4 is fewer than the pp x virtual stages = 8 stages
$pp|--set parallel.pp_split=[0,9]|parallel.pp_split [0, 9] must be strictly increasing and below n_layers 8
$pp|--set parallel.pp_split=[0,2,4]|parallel.pp_split lists 3 first layers [0, 2, 4]; expected one per stage (2)
$pp|--set parallel.pp_microbatches=3|must be divisible by dp (2) x micro_batches (1) x pp_microbatches (3)
$pp|--set parallel.pp_schedule=Looped|parallel.pp_schedule
$pp|--set parallel.pp_schedule=Interleaved1F1B --set parallel.pp_virtual_stages=5|model.n_layers 8 is fewer than the pp x virtual stages = 10 stages
$pp|--set parallel.activation_checkpoint=every:0|parallel.activation_checkpoint must be none, full, every:K (K >= 1) or selective, got 'every:0'
$src/configs/single.yaml|--set parallel.pp_microbatches=2|parallel.pp_microbatches, pp_virtual_stages and pp_split need parallel.pp > 1
CASES
"$train" --config "$pp" --set parallel.pp=4 --set parallel.tp=4 --set parallel.ep=4 \
  --set parallel.pp_schedule=Interleaved1F1B --set parallel.pp_virtual_stages=2 \
  --set train.global_batch_size=256 --set parallel.activation_checkpoint=selective \
  --dry-run --world-size 1024 --rank 1000 >"$tmp/dry_pp.json" 2>&1 || { echo "FAIL: 1024-rank pp dry run"; tail -3 "$tmp/dry_pp.json"; fail=1; }
python3 - "$tmp/dry_pp.json" <<'PY' || fail=1
import json, sys
d = json.load(open(sys.argv[1]))
assert d["mesh"] == {"names": ["pp", "dp_replicate", "dp_shard", "tp"], "shape": [4, 1, 64, 4]}, d["mesh"]
p = d["pipeline"]
assert p["schedule"] == "Interleaved1F1B" and p["pp"] == 4 and p["virtual_stages"] == 2, p
assert [s["layers"] for s in p["stages"]] == [[i, i + 1] for i in range(8)], p["stages"]
assert [s["pp_rank"] for s in p["stages"]] == [0, 1, 2, 3, 0, 1, 2, 3]
assert 0 < p["bubble_fraction"] < 1, p
r = d["ranks"][0]
assert r["rank"] == 1000 and r["pp_rank"] == 3 and r["pp_group"] == [232, 488, 744, 1000], r["pp_group"]
assert r["tp_group"] == [1000, 1001, 1002, 1003], r["tp_group"]
acts = r["schedule"].split()
assert acts[0] == "3UNSHARD" and "7F0" in acts and "7B0" in acts and "3SEND_F0" in acts, acts[:8]
names = {x["name"].split(".")[0] + "." + x["name"].split(".")[1] for x in r["parameters"] if x["name"].startswith("layers.")}
assert names == {"layers.3", "layers.7"}, names
assert any(x["name"] == "output.weight" for x in r["parameters"])
assert not any(x["name"].startswith("tok_embeddings") for x in r["parameters"])
print("1024-rank pp dry run ok: bubble", p["bubble_fraction"])
PY
# 4. Metrics file.
"$train" --config "$src/configs/single.yaml" --set train.steps=3 --metrics "$tmp/m.jsonl" >/dev/null 2>&1 || { echo "FAIL: run"; fail=1; }
python3 - "$tmp/m.jsonl" <<'PY' || fail=1
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [r["step"] for r in rows] == [1, 2, 3], rows
for r in rows:
    assert set(r) == {"step", "loss", "grad_norm", "lr", "tokens_per_s", "step_time_s", "peak_rss_mb", "cpu_s"}, r
    assert 0 < r["cpu_s"] < 60, r
print("metrics ok")
PY
# 5. Honest validation: each exits 2 naming the file, key or value.
printf '' >"$tmp/empty.yaml"
printf -- '- a\n- b\n' >"$tmp/seq.yaml"
printf 'train: {steps: 3}\ntrain: {lr: 0.1}\n' >"$tmp/dup.yaml"
printf 'train: {steps: 3, steps: 4}\n' >"$tmp/dup2.yaml"
while IFS='|' read -r args want; do
  # shellcheck disable=SC2086
  "$train" $args >"$tmp/ov" 2>&1; rc=$?
  [ $rc = 2 ] && grep -qF -- "$want" "$tmp/ov" || { echo "FAIL: '$args' (rc $rc): want '$want'"; cat "$tmp/ov"; fail=1; }
done <<CASES
--config $tmp/empty.yaml|config $tmp/empty.yaml is empty
--config $tmp/seq.yaml|config $tmp/seq.yaml: the top level must be a mapping
--config $tmp/dup.yaml|duplicate key 'train' (line 2)
--config $tmp/dup2.yaml|duplicate key 'train.steps'
--config $src/configs/single.yaml --set train.lr=-1|train.lr must be a finite number > 0, got -1
--config $src/configs/single.yaml --set train.lr=.nan|train.lr must be a finite number > 0, got nan
--config $src/configs/single.yaml --set train.lr=.inf|train.lr must be a finite number > 0, got inf
--config $src/configs/single.yaml --set train.warmup_steps=-1|train.warmup_steps must be >= 0, got -1
--config $src/configs/single.yaml --set train.grad_clip=-1|train.grad_clip must be >= 0 (0: no clipping), got -1
--config $src/configs/single.yaml --set train.steps=0|train.steps must be >= 1, got 0
--config $src/configs/single.yaml --set comm.train_timeout_s=0|comm.train_timeout_s must be a number of seconds > 0, got 0
--config $src/configs/single.yaml --set comm.backend=nccl|comm.backend must be mpi or gloo, got 'nccl'
--config $src/configs/tp2_fsdp.yaml|start it with: hyperpar-run --worker_num 2
--config $src/configs/single.yaml --set model.dim=16384 --set model.ffn_hidden=65536 --set model.n_layers=8|rank 0 needs 672.0 GiB for its shards (parameters 168.0 GiB, gradients 168.0 GiB, optimizer state 336.0 GiB),
--config $src/configs/single.yaml --metrics /proc/hp_metrics.jsonl|--metrics /proc/hp_metrics.jsonl is not writable
--config $src/configs/single.yaml --metrics $tmp|--metrics $tmp is a directory
--config $src/configs/tp2_fsdp.yaml --set model.dim=1000000000 --set model.ffn_hidden=1000000000 --dry-run --world-size 8|the model cannot be built: Storage size calculation overflowed
CASES
# n_experts: 0 alone makes the model dense (moe.layers may still list layers).
"$train" --config "$src/configs/tp2_ep2_fsdp.yaml" --set model.moe.n_experts=0 --set parallel.ep=1 --dry-run --world-size 8 --rank 0 >"$tmp/dense.json" 2>&1 \
  && ! grep -q '"layers.1.moe' "$tmp/dense.json" && grep -q '"layers.1.feed_forward.w1.weight"' "$tmp/dense.json" \
  || { echo "FAIL: n_experts 0 is not dense"; head -5 "$tmp/dense.json"; fail=1; }
# Dry-run memory figures of a huge dense model never overflow into negative numbers.
"$train" --config "$src/configs/tp2_fsdp.yaml" --set model.dim=1000000000 --set model.moe.n_experts=0 --set model.ffn_hidden=1000 --dry-run --world-size 8 --rank 1 >"$tmp/huge.json" 2>&1 || { echo "FAIL: huge dry run"; tail -3 "$tmp/huge.json"; fail=1; }
python3 - "$tmp/huge.json" <<'PY' || fail=1
import json, sys
m = json.load(open(sys.argv[1]))["ranks"][0]["memory_bytes"]
assert all(v > 0 for v in m.values()) and m["total"] > 1e18, m
print("huge dry run ok: total", m["total"])
PY
# 6. A loss or gradient norm that stops being finite ends training, naming the step.
"$train" --config "$src/configs/single.yaml" --set train.lr=1e30 --set train.grad_clip=0 --set train.steps=30 >"$tmp/nan" 2>&1; rc=$?
[ $rc != 0 ] && grep -qE "training diverged at step [0-9]+: loss .*, grad_norm .* \(not finite\)" "$tmp/nan" && ! grep -q "step   30" "$tmp/nan" \
  || { echo "FAIL: non-finite loss (rc $rc)"; tail -3 "$tmp/nan"; fail=1; }
# 7. --metrics: a missing parent directory is created.
"$train" --config "$src/configs/single.yaml" --set train.steps=2 --metrics "$tmp/new/sub/m.jsonl" >/dev/null 2>&1 && [ "$(wc -l <"$tmp/new/sub/m.jsonl")" = 2 ] \
  || { echo "FAIL: metrics parent dir"; fail=1; }
# 8. On a terminal: a live progress line (step/total, ETA) redrawn in place.
script -qec "$train --config $src/configs/single.yaml --set train.steps=4" /dev/null >"$tmp/tty" 2>&1 </dev/null
grep -q $'\r\x1b\[Kstep 4/4 \[####################\] 100%' "$tmp/tty" && grep -q "ETA 0:00:00" "$tmp/tty" \
  || { echo "FAIL: no live progress line on a TTY"; cat -v "$tmp/tty" | tail -3; fail=1; }
# 8b. Under the launcher on a terminal: the console gets the live line, worker 0's log one
#     plain line per redraw (no escape sequences).
script -qec "$build/tools/hyperpar-run --worker_num 2 --log_dir $tmp/ttylogs $train --config $src/configs/tp2_fsdp.yaml --set parallel.tp=1 --set train.steps=4" /dev/null >"$tmp/tty2" 2>&1 </dev/null
grep -q $'\r\x1b\[Kstep 4/4' "$tmp/tty2" && [ "$(grep -c '^step [1-4]/4 ' "$tmp/ttylogs/worker_0.log")" = 4 ] && ! grep -q $'\x1b' "$tmp/ttylogs/worker_0.log" \
  || { echo "FAIL: progress under the launcher"; cat -v "$tmp/tty2" | tail -3; cat -v "$tmp/ttylogs/worker_0.log" | tail -5; fail=1; }
# 9. Step lines reach the launcher's console as each step ends, not in one burst at exit:
#    the arrival times of the first and last step lines are at least half the steps' time apart.
"$build/tools/hyperpar-run" --worker_num 2 --log_dir "$tmp/lb" "$train" --config "$src/configs/tp2_fsdp.yaml" \
  --set parallel.tp=1 --set train.steps=12 --metrics "$tmp/lb.jsonl" 2>&1 | while IFS= read -r line; do
  echo "$(date +%s.%N) $line"; done >"$tmp/arrivals"
python3 - "$tmp/arrivals" "$tmp/lb.jsonl" <<'PY' || fail=1
import json, sys
t = [float(l.split()[0]) for l in open(sys.argv[1]) if l.split()[1:2] == ["step"]]
steps = [json.loads(l)["step_time_s"] for l in open(sys.argv[2])]
assert len(t) == 12, f"{len(t)} step lines arrived"
spread, work = t[-1] - t[0], sum(steps[1:])
assert spread >= 0.5 * work, f"step lines arrived within {spread:.3f}s but steps 2..12 took {work:.3f}s"
print(f"line-buffered ok: lines spread over {spread:.3f}s, steps took {work:.3f}s")
PY
# 10. --comm-report on 2 ranks (FSDP2): each metrics line has comm_bytes, the last line is the
#     report with both ranks' groups, and the table is printed.
"$build/tools/hyperpar-run" --worker_num 2 --log_dir "$tmp/cr" "$train" --config "$src/configs/tp2_fsdp.yaml" \
  --set parallel.tp=1 --set train.steps=3 --comm-report --metrics "$tmp/cr.jsonl" >"$tmp/cr.out" 2>&1 \
  || { echo "FAIL: --comm-report run"; tail -5 "$tmp/cr.out"; fail=1; }
grep -q "^comm report: worst bytes / bound" "$tmp/cr.out" || { echo "FAIL: no comm report table"; tail -5 "$tmp/cr.out"; fail=1; }
python3 - "$tmp/cr.jsonl" <<'PY' || fail=1
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
steps, report = rows[:-1], rows[-1]["comm_report"]
assert [r["step"] for r in steps] == [1, 2, 3] and all(r["comm_bytes"] > 0 for r in steps), steps
assert [r["rank"] for r in report["ranks"]] == [0, 1], report
for rank in report["ranks"]:
    ag = [g for g in rank["groups"] if g["group"] == "fsdp layers.0" and g["op"] == "all_gather_into_tensor"]
    # 2 gathers per step (forward, backward refill), one per parameter of the block (2 norms,
    # wq wk wv wo, w1 w2 w3: FSDPCollectives::kPerParam)
    assert len(ag) == 1 and ag[0]["calls"] == 2 * 9 and ag[0]["bytes"] > 0 and ag[0]["ratio"] >= 1, rank
print("comm report ok: worst", report["worst_ratio"], report["worst_at"])
PY
# 11. --profile on 2 ranks (FSDP2, 2 blocks): one Chrome trace with both ranks; per rank every
#     step, each block's forward and backward inside a step, FSDP's asynchronous all-gathers
#     and reduce-scatters on the "collectives in flight" track, and the overlap summary.
"$build/tools/hyperpar-run" --worker_num 2 --log_dir "$tmp/pf" "$train" --config "$src/configs/tp2_fsdp.yaml" \
  --set parallel.tp=1 --set train.steps=3 --profile "$tmp/prof/trace.json" >"$tmp/pf.out" 2>&1 \
  || { echo "FAIL: --profile run"; tail -5 "$tmp/pf.out"; fail=1; }
[ "$(grep -c '^rank [01]: step .* ms; blocking collectives .* overlapped' "$tmp/pf.out")" = 2 ] \
  || { echo "FAIL: no profile summary"; tail -5 "$tmp/pf.out"; fail=1; }
python3 - "$tmp/prof/trace.json" <<'PY' || fail=1
import json, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
spans = [e for e in ev if e["ph"] == "X"]
assert {e["pid"] for e in spans} == {0, 1}, "both ranks"
names = {(e["args"]["name"], e["pid"]) for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
assert names == {(n, p) for n in ("compute", "collectives in flight") for p in (0, 1)}, names
for pid in (0, 1):
    mine = [e for e in spans if e["pid"] == pid]
    steps = sorted((e for e in mine if e["cat"] == "step"), key=lambda e: e["ts"])
    assert [e["name"] for e in steps] == ["step 1", "step 2", "step 3"], steps
    for block in ("layers.0", "layers.1"):
        for kind, cat in ((block, "forward"), (block + " backward", "backward")):
            got = [e for e in mine if e["name"] == kind and e["cat"] == cat]
            assert len(got) == 3, (kind, len(got))
            for e in got:
                assert any(s["ts"] <= e["ts"] and e["ts"] + e["dur"] <= s["ts"] + s["dur"] for s in steps), e
    in_flight = {e["name"] for e in mine if e["tid"] == 1}
    assert {"all_gather_into_tensor", "reduce_scatter_tensor"} <= in_flight, in_flight
    assert any(e["cat"] == "fsdp" and e["name"].startswith("reduce finish fsdp layers.") for e in mine)
    # float32 per-parameter gathers read each shard directly: no copy-in at all
    assert not any(e["cat"] == "fsdp" and e["name"].startswith("copy-in") for e in mine)
print("profile ok:", len(spans), "spans")
PY
#     Profiling marks are identity autograd nodes: losses and gradient norms stay bit-identical.
"$train" --config "$src/configs/single.yaml" --set train.steps=3 --metrics "$tmp/mp.jsonl" --profile "$tmp/p1.json" >/dev/null 2>&1 \
  || { echo "FAIL: single-process --profile"; fail=1; }
python3 - "$tmp/m.jsonl" "$tmp/mp.jsonl" <<'PY' || fail=1
import json, sys
a, b = ([(r["loss"], r["grad_norm"]) for r in map(json.loads, open(f))] for f in sys.argv[1:3])
assert a == b, (a, b)
print("profile leaves training bit-identical")
PY
"$train" --config "$src/configs/single.yaml" --set train.steps=1 --profile /proc/hp_trace.json >"$tmp/pf2" 2>&1
[ $? = 2 ] && grep -q "\-\-profile /proc/hp_trace.json is not writable" "$tmp/pf2" || { echo "FAIL: bad --profile path"; cat "$tmp/pf2"; fail=1; }
rm -rf "$tmp"
[ "$fail" = 0 ] && echo "1 passed, 0 failed" || echo "0 passed, 1 failed"
exit $fail
