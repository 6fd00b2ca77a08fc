#!/usr/bin/env bash
# Faults in a real training job (4 workers, hyperpar-train): the launcher names the worker
# that was killed, never a collateral one (gloo, several times, and MPI); a worker stopped
# with SIGSTOP is detected by the collective watchdog within train_timeout_s + 10 s on both
# backends, naming the op; a gloo node whose master never comes up gives up after the init
# timeout naming the address. Every wait is bounded; only processes this test started are
# signalled.
set -u
build=$1
src=$2
run="$build/tools/hyperpar-run"
train="$build/tools/hyperpar-train"
. "$src/tests/tools/fault_helpers.sh"
tmp=$(mktemp -d)
trap 'for d in "$tmp"/*/; do cleanup_job "${d%/}"; done; rm -rf "$tmp"' EXIT
job=(--config "$src/configs/tp2_fsdp.yaml" --set train.steps=100000 --set train.lr=1e-4)
port=29711

# 1. The culprit: kill -9 one chosen worker mid-run.
for case in "gloo 3" "gloo 1" "gloo 2" "mpi 2"; do
  set -- $case
  backend=$1 victim=$2 d="$tmp/culprit_${1}_$2"
  port=$((port + 1))
  setsid "$run" --worker_num 4 --backend "$backend" --master_port "$port" --log_dir "$d" \
    "$train" "${job[@]}" >"$d.out" 2>&1 &
  launcher=$!
  if wait_for_text "$d/worker_0.log" "step    2 " 120; then
    kill -9 "$(program_pid "$d" "$victim")"
    if timeout 60 tail --pid="$launcher" -f /dev/null; then :; fi
    wait "$launcher"; rc=$?
    check "$backend: launcher exits 137 for the SIGKILLed worker (rc $rc)" [ "$rc" = 137 ]
    check "$backend: worker $victim named as killed by SIGKILL" \
      grep -qF "hyperpar-run: worker $victim killed by SIGKILL; see $d/worker_$victim.log" "$d.out"
    check "$backend: its log says so" grep -q "worker $victim killed by SIGKILL" "$d/worker_$victim.log"
  else
    fail=1
  fi
  grep "hyperpar-run:" "$d.out"
  check "$backend: nothing left" all_gone_within "$d" 10
  cleanup_job "$d"
done

# 2. SIGSTOP of one worker: the others' watchdog fires within train_timeout_s (3 s) + 10 s.
for backend in mpi gloo; do
  d="$tmp/stop_$backend"
  port=$((port + 1))
  setsid "$run" --worker_num 4 --backend "$backend" --master_port "$port" --log_dir "$d" \
    "$train" "${job[@]}" --set comm.train_timeout_s=3 >"$d.out" 2>&1 &
  launcher=$!
  if wait_for_text "$d/worker_0.log" "step    3 " 120; then
    kill -STOP "$(program_pid "$d" 2)"
    start=$(date +%s.%N)
    timeout 30 tail --pid="$launcher" -f /dev/null
    wait "$launcher"; rc=$?
    took=$(echo "$(date +%s.%N) - $start" | bc)
    check "$backend: the job ends non-zero (rc $rc)" [ "$rc" != 0 ]
    check "$backend: detected within 3 + 10 s (took ${took}s)" [ "$(echo "$took < 13" | bc)" = 1 ]
    check "$backend: a worker log names the op, group and timeout" \
      grep -lE "collective watchdog: [a-z_]+ on .*ranks \[.*did not complete within 3 s \(comm.train_timeout_s\)" "$d"/worker_*.log
    check "$backend: the launcher says no worker failed on its own" grep -q "no worker failed on its own" "$d.out"
    grep "hyperpar-run:\|watchdog" "$d.out" | head -3
  else
    fail=1
  fi
  check "$backend: the stopped worker is gone too" all_gone_within "$d" 10
  cleanup_job "$d"
done

# 3. A gloo node whose master never comes up: gives up after comm.init_timeout_s.
d="$tmp/nomaster"
port=$((port + 1))
start=$(date +%s)
out=$(timeout 60 "$run" --worker_num 2 --local_worker_num 1 --node_rank 1 --backend gloo \
  --master_port "$port" --log_dir "$d" "$train" "${job[@]}" --set comm.init_timeout_s=4 2>&1); rc=$?
took=$(( $(date +%s) - start ))
check "no master: fails (rc $rc) within 30 s (took ${took}s)" [ "$rc" != 0 ] && [ "$rc" != 124 ] && [ "$took" -lt 30 ]
check "no master: names address and port and the timeout" \
  grep -qF "the rendezvous store (master) at 127.0.0.1:$port (rank 1 of 2); gave up after 4 s (comm.init_timeout_s)" "$d/worker_1.log"
echo "$out" | grep "hyperpar-run:"
finish_test
