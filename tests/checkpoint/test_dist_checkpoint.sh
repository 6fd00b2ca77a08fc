#!/usr/bin/env bash
# Distributed checkpoints end to end (8 ranks where a layout needs them), on the 107k-
# parameter MoE config: save under TP2+EP2+FSDP; resume on the same layout bit-identically;
# load under EP4 (4 ranks), HSDP2xTP2, FSDP8 and 1 rank with bit-identical full tensors and
# losses within 1e-5; PyTorch DCP reads hyperpar's checkpoint and hyperpar reads PyTorch's
# (full tensors, and DTensor shards from a 2-rank gloo run); corruption is refused (exit 2);
# a rank killed during saves leaves the newest complete checkpoint loadable; preemption by
# SIGTERM saves and exits 143; --max_restarts resumes from the newest checkpoint; async saves
# equal sync ones; a pipelined (PP2) checkpoint resumes under PP=1 and PP=4. Every wait is
# bounded.
set -u
# The test build uses AddressSanitizer; leak reports at exit are off as in scripts/test.sh.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0}
build=$1
src=$2
run="$build/tools/hyperpar-run"
train="$build/tools/hyperpar-train"
ckpt="$build/tools/hyperpar-ckpt"
py="$src/.venv/bin/python"
interop="$src/tests/checkpoint/dcp_interop.py"
. "$src/tests/tools/fault_helpers.sh"
tmp=$(mktemp -d)
trap 'for d in "$tmp"/*/; do cleanup_job "${d%/}"; done; rm -rf "$tmp"' EXIT
cfg=(--config "$src/configs/tp2_ep2_fsdp.yaml")
train8() { timeout 300 "$run" --worker_num 8 --log_dir "$1" "$train" "${cfg[@]}" "${@:2}"; }

# Losses of steps FROM..TO in metrics files A and B (last line per step) agree within TOL.
same_losses() {
  "$py" - "$@" <<'PY'
import json, sys
a, b, lo, hi, tol = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
def rows(p):
    d = {}
    for l in open(p):
        r = json.loads(l); d[r["step"]] = r["loss"]
    return d
ra, rb = rows(a), rows(b)
worst = max(abs(ra[s] - rb[s]) for s in range(lo, hi + 1))
ok = worst <= tol
print(f"steps {lo}..{hi}: max |loss diff| {worst:.3g} (tolerance {tol:g})")
sys.exit(0 if ok else 1)
PY
}

# Reference: 20 uninterrupted steps.
train8 "$tmp/l_ref" --set train.steps=20 --metrics "$tmp/ref.jsonl" >/dev/null 2>&1
check "reference run" [ "$(wc -l <"$tmp/ref.jsonl" 2>/dev/null)" = 20 ]
# 10 steps, checkpoints every 5 (keep 1: only step-10 stays), the full model exported.
train8 "$tmp/l_a" --set train.steps=10 --set checkpoint.dir="$tmp/D" --set checkpoint.interval=5 \
  --set checkpoint.keep=1 --metrics "$tmp/a.jsonl" --export "$tmp/exp10.safetensors" >/dev/null 2>&1
check "step-10 saved, step-5 deleted by keep 1" [ -f "$tmp/D/step-10/manifest.json" ] && [ ! -e "$tmp/D/step-5" ]
check "hyperpar-ckpt inspect: intact, boxes listed" bash -c "'$ckpt' inspect '$tmp/D' >'$tmp/inspect' && grep -q 'layers.1.moe.experts.w1  Float \[4, 64, 64\]' '$tmp/inspect' && grep -q 'sizes and xxh64 all match' '$tmp/inspect' && grep -q 'step 10, saved on 8 ranks' '$tmp/inspect'"

# Same layout: 10 more steps continue bit-identically.
cp "$tmp/a.jsonl" "$tmp/resumed.jsonl"
train8 "$tmp/l_b" --set train.steps=20 --set checkpoint.dir="$tmp/D" --metrics "$tmp/resumed.jsonl" >"$tmp/b.out" 2>&1
check "resume message" grep -q "resumed from $tmp/D/step-10 (step 10, saved on 8 ranks); continuing at step 11" "$tmp/b.out"
check "same layout: losses 11..20 bit-identical" same_losses "$tmp/ref.jsonl" "$tmp/resumed.jsonl" 11 20 0

# Other layouts and world sizes: full tensors bit-identical after load, losses within 1e-5.
# The save shards the experts on dim 1 (2 local experts over 4 expert-FSDP ranks);
# experts_dim0 loads them on dim 0 (padded: two ranks hold no expert rows).
while IFS='|' read -r name n sets; do
  d="$tmp/l_$name"
  # shellcheck disable=SC2086
  if [ "$n" = 1 ]; then
    timeout 300 "$train" "${cfg[@]}" $sets --set train.steps=10 --set checkpoint.resume="$tmp/D/step-10" --export "$tmp/exp_$name.safetensors" >"$d.out" 2>&1 </dev/null
    timeout 300 "$train" "${cfg[@]}" $sets --set train.steps=20 --set checkpoint.resume="$tmp/D/step-10" --metrics "$tmp/m_$name.jsonl" >>"$d.out" 2>&1 </dev/null
  else
    timeout 300 "$run" --worker_num "$n" --log_dir "$d" "$train" "${cfg[@]}" $sets --set train.steps=10 --set checkpoint.resume="$tmp/D/step-10" --export "$tmp/exp_$name.safetensors" >"$d.out" 2>&1 </dev/null
    timeout 300 "$run" --worker_num "$n" --log_dir "$d" "$train" "${cfg[@]}" $sets --set train.steps=20 --set checkpoint.resume="$tmp/D/step-10" --metrics "$tmp/m_$name.jsonl" >>"$d.out" 2>&1 </dev/null
  fi
  check "$name: full tensors bit-identical to the saved ones" "$py" -c "
from safetensors.torch import load_file; import torch, sys
a, b = load_file('$tmp/exp10.safetensors'), load_file('$tmp/exp_$name.safetensors')
assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), 'differ'
print('$name:', len(a), 'tensors bit-identical')"
  check "$name: losses 11..20 within 1e-5 of the uninterrupted run" same_losses "$tmp/ref.jsonl" "$tmp/m_$name.jsonl" 11 20 1e-5
done <<'LAYOUTS'
experts_dim0|8|--set parallel.expert_shard_dim=0
ep4|4|--set parallel.tp=1 --set parallel.ep=4
hsdp2_tp2|8|--set parallel.ep=1 --set parallel.dp_replicate=2
fsdp8|8|--set parallel.tp=1 --set parallel.ep=1
single|1|--set parallel.tp=1 --set parallel.ep=1
LAYOUTS

# PyTorch reads hyperpar's checkpoint (DCP + HuggingFaceStorageReader).
check "PyTorch DCP reads the 8-rank checkpoint" "$py" "$interop" dcp-read "$tmp/D/step-10" "$tmp/exp10.safetensors"
# hyperpar reads PyTorch's: full tensors (1 process) and DTensor shards (2 ranks, gloo).
"$py" "$interop" dcp-write "$tmp/exp10.safetensors" "$tmp/pt_full" >/dev/null 2>&1
timeout 120 "$src/.venv/bin/torchrun" --nproc_per_node 2 --master_port 29781 "$interop" dcp-write "$tmp/exp10.safetensors" "$tmp/pt_dist" >"$tmp/pt_dist.out" 2>&1
check "PyTorch wrote a 2-rank sharded checkpoint" [ "$(ls "$tmp/pt_dist"/*.safetensors 2>/dev/null | wc -l)" -ge 2 ]
for pt in pt_full pt_dist; do
  cp "$tmp/D/step-10/hyperpar_state.json" "$tmp/$pt/"  # the step; PyTorch has no optimizer state here
  train8 "$tmp/l_$pt" --set train.steps=10 --set checkpoint.resume="$tmp/$pt" --set checkpoint.strict=false --export "$tmp/exp_$pt.safetensors" >"$tmp/$pt.out" 2>&1
  check "$pt: hyperpar (TP2+EP2+FSDP) loads PyTorch's checkpoint bit-identically" "$py" -c "
from safetensors.torch import load_file; import torch
a, b = load_file('$tmp/exp10.safetensors'), load_file('$tmp/exp_$pt.safetensors')
assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)"
  check "$pt: missing optimizer state reported" grep -q "optimizer state tensors were not in the checkpoint" "$tmp/$pt.out"
done

# Corruption: refused with exit 2 naming the file; nothing deleted.
cp -r "$tmp/D" "$tmp/C"
f=$(ls "$tmp/C/step-10"/rank-00003-part-0.safetensors)
printf '\x01' | dd of="$f" bs=1 seek=200 conv=notrunc 2>/dev/null
train8 "$tmp/l_c" --set train.steps=12 --set checkpoint.dir="$tmp/C" >"$tmp/c.out" 2>&1; rc=$?
check "corrupted checkpoint: exit 2 (rc $rc)" [ "$rc" = 2 ]
check "corrupted checkpoint: the file and (altered) named" grep -qF "$f has xxh64" "$tmp"/l_c/worker_*.log
check "corrupted checkpoint: nothing deleted" [ -f "$f" ] && [ -f "$tmp/C/step-10/manifest.json" ]
"$ckpt" inspect "$tmp/C" >"$tmp/ci" 2>&1; rc=$?
check "hyperpar-ckpt inspect reports it (exit $rc)" [ "$rc" = 2 ] && grep -q "(altered)" "$tmp/ci"

# Async saves write the same checkpoint as sync ones.
train8 "$tmp/l_async" --set train.steps=10 --set checkpoint.dir="$tmp/A" --set checkpoint.interval=5 --set checkpoint.async=true >/dev/null 2>&1
check "async: step-5 and step-10 complete" [ -f "$tmp/A/step-5/manifest.json" ] && [ -f "$tmp/A/step-10/manifest.json" ]
check "async step-10 equals the sync one" "$py" "$interop" assemble-compare "$tmp/A/step-10" "$tmp/D/step-10"

# A rank killed during saves (every step saves): the newest complete checkpoint loads.
for delay in 0.05 0.3; do
  d="$tmp/l_kill_$delay"
  setsid "$run" --worker_num 8 --log_dir "$d" "$train" "${cfg[@]}" --set train.steps=1000 \
    --set checkpoint.dir="$tmp/K$delay" --set checkpoint.interval=1 --set checkpoint.keep=3 >/dev/null 2>&1 &
  launcher=$!
  wait_for_text "$d/worker_0.log" "step    4 " 120 >/dev/null && sleep "$delay" && kill -9 "$(program_pid "$d" 3)"
  timeout 60 tail --pid="$launcher" -f /dev/null
  newest=$(ls -d "$tmp/K$delay"/step-* 2>/dev/null | grep -v '\.tmp-' | sort -t- -k2 -n | tail -1)
  check "kill during saves ($delay s): newest complete checkpoint $newest is intact" quiet "$ckpt" inspect "$tmp/K$delay"
  n=$(basename "$newest" | cut -d- -f2)
  check "kill during saves ($delay s): it resumes from step $n" quiet train8 "$d.r" --set train.steps=$((n + 1)) --set checkpoint.dir="$tmp/K$delay"
  cleanup_job "$d"
done

# Preemption: SIGTERM to the launcher saves a checkpoint after the current step, exit 143.
d="$tmp/l_pre"
setsid "$run" --worker_num 8 --log_dir "$d" "$train" "${cfg[@]}" --set train.steps=100000 --set checkpoint.dir="$tmp/P" >"$d.out" 2>&1 &
launcher=$!
wait_for_text "$d/worker_0.log" "step    3 " 120 >/dev/null
kill -TERM "$launcher"
timeout 60 tail --pid="$launcher" -f /dev/null
wait "$launcher"; rc=$?
check "preemption: launcher exits 143 (rc $rc)" [ "$rc" = 143 ]
check "preemption: the step and the checkpoint are named" grep -qE "preempted \(Terminated\) after step [0-9]+; checkpoint saved at $tmp/P/step-[0-9]+" "$d/worker_0.log"
check "preemption: that checkpoint is complete" quiet "$ckpt" inspect "$tmp/P"
cleanup_job "$d"

# Preemption of one worker (a scheduler signalling it directly): every rank stops after the
# same step, the checkpoint is saved, the job ends with 143.
d="$tmp/l_pre1"
setsid "$run" --worker_num 8 --log_dir "$d" "$train" "${cfg[@]}" --set train.steps=100000 --set checkpoint.dir="$tmp/P1" >"$d.out" 2>&1 &
launcher=$!
wait_for_text "$d/worker_0.log" "step    3 " 120 >/dev/null
kill -TERM "$(program_pid "$d" 5)"
timeout 60 tail --pid="$launcher" -f /dev/null
wait "$launcher"; rc=$?
check "preempting worker 5: the job exits 143 (rc $rc)" [ "$rc" = 143 ]
check "preempting worker 5: every rank stopped after the same step" bash -c "[ \$(grep -ho 'preempted (Terminated) after step [0-9]*' '$d'/worker_*.log | sort -u | wc -l) = 1 ] && [ \$(grep -l 'preempted (Terminated)' '$d'/worker_*.log | wc -l) = 8 ]"
check "preempting worker 5: its checkpoint is complete" quiet "$ckpt" inspect "$tmp/P1"
cleanup_job "$d"

# --max_restarts: kill a worker after step 6 of 20 (interval 5): the job restarts from its
# newest complete checkpoint (step 5, or a later one where the small model's ~20 ms steps
# outran the kill) and its losses equal the uninterrupted run's.
d="$tmp/l_restart"
setsid "$run" --worker_num 8 --max_restarts 1 --log_dir "$d" "$train" "${cfg[@]}" --set train.steps=20 \
  --set checkpoint.dir="$tmp/R" --set checkpoint.interval=5 --metrics "$tmp/restart.jsonl" >"$d.out" 2>&1 &
launcher=$!
wait_for_text "$d/worker_0.log" "step    6 " 120 >/dev/null && kill -9 "$(program_pid "$d" 2)"
timeout 200 tail --pid="$launcher" -f /dev/null
wait "$launcher"; rc=$?
check "restart: the job ends well (rc $rc)" [ "$rc" = 0 ]
[ "$rc" = 0 ] || grep -v "^step" "$d.out" | tail -8
check "restart: names the failed worker" grep -q "worker 2 killed by SIGKILL" "$d.out"
check "restart: says it restarts" grep -q "restarting the job (restart 1 of 1)" "$d.out"
check "restart: resumed from a checkpoint of this job (step 5, 10 or 15)" \
  grep -qE "resumed from $tmp/R/step-(5|10|15) \(step (5|10|15)" "$d.out"
grep -o "resumed from $tmp/R/step-[0-9]*" "$d.out" | sed 's|.*/|restart: resumed from |' 
check "restart: losses 1..20 equal the uninterrupted run" same_losses "$tmp/ref.jsonl" "$tmp/restart.jsonl" 1 20 0
cleanup_job "$d"

# Pipeline stages: a PP2 x TP2 x EP2 x FSDP checkpoint (each stage's ranks write their own
# layers' boxes) resumes under PP=1 (TP2 x EP2 x FSDP on 8 ranks) and under PP=4 with 2
# interleaved stages per rank: the next steps' losses match the uninterrupted PP2 run.
pp=(--config "$src/configs/pp2_tp2_ep2_fsdp.yaml")
train8pp() { timeout 300 "$run" --worker_num 8 --log_dir "$1" "$train" "${pp[@]}" "${@:2}"; }
train8pp "$tmp/l_ppref" --set train.steps=6 --metrics "$tmp/ppref.jsonl" >/dev/null 2>&1
check "pp2 reference run" [ "$(wc -l <"$tmp/ppref.jsonl" 2>/dev/null)" = 6 ]
train8pp "$tmp/l_ppa" --set train.steps=3 --set checkpoint.dir="$tmp/PIPE" --set checkpoint.interval=3 \
  --metrics "$tmp/ppa.jsonl" --export "$tmp/ppexp3.safetensors" >/dev/null 2>&1
check "pp2: step-3 saved by 8 ranks" bash -c "'$ckpt' inspect '$tmp/PIPE' | grep -q 'step 3, saved on 8 ranks'"
# --export gathers every stage to rank 0; PyTorch DCP reads the pipelined checkpoint and finds
# exactly those tensors.
check "PyTorch DCP reads the pp2 checkpoint, equal to the pp2 --export" "$py" "$interop" dcp-read "$tmp/PIPE/step-3" "$tmp/ppexp3.safetensors"
check "pp2 --export holds both stages (embedding, layers 0-7, head)" "$py" -c "
from safetensors import safe_open
k = set(safe_open('$tmp/ppexp3.safetensors', 'pt').keys())
assert {'tok_embeddings.weight', 'output.weight', 'norm.weight'} <= k, k
assert {f'layers.{l}.attention.wq.weight' for l in range(8)} <= k, k"
while IFS='|' read -r name sets; do
  cp -r "$tmp/PIPE" "$tmp/P_$name"
  # shellcheck disable=SC2086
  train8pp "$tmp/l_pp_$name" --set train.steps=6 --set checkpoint.dir="$tmp/P_$name" $sets \
    --metrics "$tmp/pp_$name.jsonl" >"$tmp/pp_$name.out" 2>&1
  check "pp2 -> $name: resumed at step 4" grep -q "continuing at step 4" "$tmp/pp_$name.out"
  check "pp2 -> $name: losses 4..6 within 1e-5" same_losses "$tmp/ppref.jsonl" "$tmp/pp_$name.jsonl" 4 6 1e-5
done <<'CASES'
pp1|--set parallel.pp=1 --set parallel.pp_microbatches=1
pp4v2|--set parallel.pp=4 --set parallel.tp=1 --set parallel.ep=1 --set parallel.pp_schedule=Interleaved1F1B --set parallel.pp_virtual_stages=2
CASES
finish_test
