#!/usr/bin/env bash
# hyperpar-run under faults and habits (issue: jobs that behave): the msrun command form
# without "--", --join True, the config's comm.backend honoured and a conflicting --backend
# refused, flag errors exit 2, a busy --log_dir refused, kill -9 of the launcher leaves no
# process behind (MPI and gloo), and SIGTERM/SIGINT/SIGHUP reach every worker with exit
# 128+signal once none is left. Every wait is bounded.
set -u
build=$1
src=$2
run="$build/tools/hyperpar-run"
. "$src/tests/tools/fault_helpers.sh"
tmp=$(mktemp -d)
trap 'for d in "$tmp"/*/; do cleanup_job "${d%/}"; done; rm -rf "$tmp"' EXIT

# 1. msrun's form, no "--"; --join True with a separate value; the program's own flags untouched.
out=$(timeout 60 "$run" --worker_num=2 --local_worker_num=2 --master_port=8128 --log_dir="$tmp/msrun" \
  --join True bash -c 'echo "rank=$RANK world=$WORLD_SIZE args=$*"' prog --join=False 2>&1)
rc=$?
check "msrun form runs (rc $rc)" [ "$rc" = 0 ]
check "program args untouched" grep -q "rank=1 world=2 args=--join=False" "$tmp/msrun/worker_1.log"
check "worker 0 echoed to the console" grep -q "rank=0 world=2" <<<"$out"
check "torchrun spelling --nproc_per_node" timeout 60 "$run" --nproc_per_node 2 --log_dir "$tmp/tr" true

# 1b. --join False returns at once; a detached supervisor runs the job to its end.
start=$(date +%s.%N)
out=$(timeout 30 "$run" --worker_num 2 --join False --log_dir "$tmp/nojoin" bash -c 'sleep 2; echo done-$RANK' 2>&1); rc=$?
took=$(echo "$(date +%s.%N) - $start" | bc)
check "--join False returns at once (rc $rc, ${took}s)" [ "$rc" = 0 ] && [ "$(echo "$took < 1.5" | bc)" = 1 ]
check "--join False names its supervisor" grep -q "under supervisor pid" <<<"$out"
check "--join False job runs to its end" wait_for_text "$tmp/nojoin/worker_1.exit" "code=0" 30
check "--join False: worker 0's output in launcher.log" wait_for_text "$tmp/nojoin/launcher.log" done-0 10

# 2. Flag errors: exit 2, naming flag, value and expectation.
while IFS='|' read -r flags want; do
  # shellcheck disable=SC2086
  msg=$("$run" $flags --log_dir "$tmp/flags" true 2>&1); rc=$?
  check "flags '$flags' exit 2 (rc $rc)" [ "$rc" = 2 ]
  check "flags '$flags' say: $want" grep -qF -- "$want" <<<"$msg"
done <<'CASES'
--worker_num 0|--worker_num must be a positive integer, got 0
--master_port 70000|--master_port must be 1..65535, got 70000
--join=maybe|--join takes True|true|1|False|false|0, got 'maybe'
--nnodes 2 --nproc_per_node 2 --worker_num 8|--worker_num 8 disagrees with --nnodes 2 x workers per node 2 = 4
--backend nccl|--backend must be mpi or gloo, got 'nccl'
CASES

# 3. One place decides the backend: the config's comm.backend when the launcher is silent;
#    a conflicting --backend is refused naming both.
printf 'comm: {backend: gloo}\n' >"$tmp/gloo.yaml"
timeout 60 "$run" --worker_num 2 --log_dir "$tmp/cfg" bash -c 'echo "backend=$HYPERPAR_BACKEND"' _ --config "$tmp/gloo.yaml" >/dev/null 2>&1
check "comm.backend gloo honoured" grep -q "backend=gloo" "$tmp/cfg/worker_1.log"
msg=$("$run" --worker_num 2 --backend mpi --log_dir "$tmp/cfg2" bash -c true _ --config "$tmp/gloo.yaml" 2>&1); rc=$?
check "backend conflict exits 2 (rc $rc)" [ "$rc" = 2 ]
check "conflict names both" grep -qF -e "--backend mpi conflicts with comm.backend: gloo in $tmp/gloo.yaml" <<<"$msg"

# 4. A second job on a busy --log_dir is refused; the running job's log survives.
setsid "$run" --worker_num 2 --log_dir "$tmp/busy" bash -c 'echo first-job-$RANK; exec sleep 60' >/dev/null 2>&1 &
wait_for_text "$tmp/busy/worker_1.log" first-job-1 20 || fail=1
msg=$("$run" --worker_num 2 --log_dir "$tmp/busy" bash -c 'echo second-job' 2>&1); rc=$?
check "busy log dir refused with exit 2 (rc $rc)" [ "$rc" = 2 ]
check "refusal names the lock" grep -qF "is in use by a running job (lock $tmp/busy/hyperpar-run.lock" <<<"$msg"
check "running job's log intact" grep -q first-job-1 "$tmp/busy/worker_1.log"
cleanup_job "$tmp/busy"

# 5. kill -9 of the launcher mid-run: nothing it started survives 10 s (both backends).
for backend in mpi gloo; do
  d="$tmp/kill9_$backend"
  setsid "$run" --worker_num 4 --backend "$backend" --log_dir "$d" bash -c 'echo up; exec sleep 120' >/dev/null 2>&1 &
  launcher=$!
  for r in 0 1 2 3; do wait_for_text "$d/worker_$r.pid" program= 30 >/dev/null || fail=1; done
  check "$backend: 4 programs running before the kill" [ "$(live $(recorded_pids "$d") | wc -l)" -ge 8 ]
  kill -9 "$launcher"
  check "$backend: kill -9 of the launcher leaves no worker, shim or mpirun after 10 s" all_gone_within "$d" 10
  cleanup_job "$d"
done

# 6. SIGTERM / SIGINT / SIGHUP reach every worker; exit 128+signal once none is left.
for case in "mpi TERM 143" "gloo INT 130" "gloo HUP 129" "mpi INT 130"; do
  set -- $case
  d="$tmp/sig_$1_$2"
  setsid "$run" --worker_num 3 --backend "$1" --log_dir "$d" bash -c \
    "trap 'echo got-$2; exit 7' $2; echo ready; while true; do sleep 0.2; done" >"$d.out" 2>&1 &
  launcher=$!
  for r in 0 1 2; do wait_for_text "$d/worker_$r.log" ready 30 >/dev/null || fail=1; done
  kill -"$2" "$launcher"
  wait "$launcher"; rc=$?
  check "$1 SIG$2: launcher exits $3 (rc $rc)" [ "$rc" = "$3" ]
  for r in 0 1 2; do check "$1 SIG$2 reached worker $r" grep -q "got-$2" "$d/worker_$r.log"; done
  check "$1 SIG$2: nothing left when the launcher returned" all_gone_within "$d" 0
  cleanup_job "$d"
done
# 7. A worker that ignores SIGTERM is SIGKILLed after the grace period; the launcher still
#    exits 143 only once nothing is left (bounded: well under 15 s).
d="$tmp/stubborn"
setsid "$run" --worker_num 2 --backend gloo --stop_grace_s 3 --log_dir "$d" bash -c "trap '' TERM; echo ready; while true; do sleep 0.2; done" >/dev/null 2>&1 &
launcher=$!
for r in 0 1; do wait_for_text "$d/worker_$r.log" ready 30 >/dev/null || fail=1; done
start=$(date +%s)
kill -TERM "$launcher"
timeout 30 tail --pid="$launcher" -f /dev/null
wait "$launcher"; rc=$?
took=$(( $(date +%s) - start ))
check "stubborn worker: launcher exits 143 (rc $rc) within 15 s (${took}s)" [ "$rc" = 143 ] && [ "$took" -lt 15 ]
check "stubborn worker: SIGKILLed, nothing left" all_gone_within "$d" 0
check "stubborn worker: its log says SIGKILL" grep -q "worker 1 killed by SIGKILL" "$d/worker_1.log"
cleanup_job "$d"
finish_test
