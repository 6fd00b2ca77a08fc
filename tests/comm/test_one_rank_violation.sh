#!/usr/bin/env bash
# A contract violation on one rank only: that rank reports it synchronously (message names
# the op, group and tag), the launcher stops the 7 ranks blocked in the collective within
# 30 s and names worker 3. Nothing is left running.
set -u
build=$1
backend=${2:-mpi}
logs=$(mktemp -d)
start=$(date +%s)
out=$(timeout 120 "$build/tools/hyperpar-run" --worker_num 8 --backend "$backend" --master_port 29637 --log_dir "$logs" -- "$build/one_rank_violation" 2>&1)
rc=$?
elapsed=$(( $(date +%s) - start ))
echo "$out"
fail=0
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || { echo "FAIL: rc=$rc"; fail=1; }
[ "$elapsed" -lt 30 ] || { echo "FAIL: took ${elapsed}s"; fail=1; }
echo "$out" | grep -q "worker 3 exited with code 1" || { echo "FAIL: worker 3 not named"; fail=1; }
grep -q "all_reduce on mesh dim dp ranks \[0, 1, 2, 3, 4, 5, 6, 7\] ($backend) (tag 'layers.3.w2.weight'): tensor (shape \[4, 4\] strides \[1, 4\]" "$logs/worker_3.log" \
  || { echo "FAIL: message"; cat "$logs/worker_3.log"; fail=1; }
sleep 1
# Exited workers may linger a moment as zombies until reaped; only live ones count.
if ps -eo stat=,args= | awk '$1 !~ /^Z/' | grep -F "$build/one_rank_violation" | grep -v grep; then
  echo "FAIL: orphan workers still running"; pkill -f "$build/one_rank_violation"; fail=1
fi
rm -rf "$logs"
[ "$fail" = 0 ] && echo "1 passed, 0 failed" || echo "0 passed, 1 failed"
exit $fail
