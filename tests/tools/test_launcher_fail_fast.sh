#!/usr/bin/env bash
# hyperpar-run fail-fast: worker 3 exits 3 at once, the others would sleep 120 s. The
# launcher must return non-zero within 30 s, name worker 3 and its log, and leave no
# worker behind.
set -u
build=$1
logs=$(mktemp -d)
marker="hp_failfast_$$"
start=$(date +%s)
out=$("$build/tools/hyperpar-run" --worker_num 4 --log_dir "$logs" -- \
  bash -c "if [ \"\$RANK\" = 3 ]; then echo boom; exit 3; fi; exec -a $marker sleep 120" 2>&1)
rc=$?
elapsed=$(( $(date +%s) - start ))
echo "$out"
fail=0
[ "$rc" -ne 0 ] || { echo "FAIL: launcher exited 0"; fail=1; }
[ "$elapsed" -lt 30 ] || { echo "FAIL: took ${elapsed}s"; fail=1; }
echo "$out" | grep -q "worker 3 exited with code 3" || { echo "FAIL: worker 3 not named"; fail=1; }
echo "$out" | grep -q "$logs/worker_3.log" || { echo "FAIL: log not named"; fail=1; }
grep -q boom "$logs/worker_3.log" || { echo "FAIL: worker log missing output"; fail=1; }
sleep 1
if ps -eo stat=,args= | awk '$1 !~ /^Z/' | grep -F "$marker" | grep -v grep; then echo "FAIL: orphan workers"; pkill -f "$marker"; fail=1; fi
# Environment set for every worker.
"$build/tools/hyperpar-run" --worker_num 2 --log_dir "$logs/env" -- \
  bash -c 'echo "R=$RANK W=$WORLD_SIZE L=$LOCAL_RANK LW=$LOCAL_WORLD_SIZE M=$MASTER_ADDR:$MASTER_PORT"' >/dev/null 2>&1
grep -q "R=1 W=2 L=1 LW=2 M=127.0.0.1:29500" "$logs/env/worker_1.log" || { echo "FAIL: env"; cat "$logs/env/worker_1.log"; fail=1; }
rm -rf "$logs"
[ "$fail" = 0 ] && echo "1 passed, 0 failed" || echo "0 passed, 1 failed"
exit $fail
