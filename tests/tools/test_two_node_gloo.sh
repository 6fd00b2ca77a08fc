#!/usr/bin/env bash
# Two "nodes" on loopback: two hyperpar-run --backend gloo launchers with 4 local workers
# each (--node_rank 0 and 1) form one 8-rank world; the 8-rank collective tests pass on it.
set -u
build=$1
logs=$(mktemp -d)
common=(--worker_num 8 --local_worker_num 4 --backend gloo --master_addr 127.0.0.1 --master_port 29651)
"$build/tools/hyperpar-run" "${common[@]}" --node_rank 1 --log_dir "$logs/n1" -- "$build/test_dist_mpi" >/dev/null 2>&1 &
n1=$!
timeout 300 "$build/tools/hyperpar-run" "${common[@]}" --node_rank 0 --log_dir "$logs/n0" -- "$build/test_dist_mpi"
rc0=$?
wait $n1
rc1=$?
fail=0
[ "$rc0" = 0 ] && [ "$rc1" = 0 ] || { echo "FAIL: node 0 rc=$rc0, node 1 rc=$rc1"; tail -20 "$logs"/n1/*.log; fail=1; }
# Node 1 holds global ranks 4..7 with local ranks 0..3.
[ -f "$logs/n1/worker_7.log" ] && [ ! -f "$logs/n1/worker_0.log" ] || { echo "FAIL: node 1 rank numbering"; ls "$logs/n1"; fail=1; }
grep -q "PASSED" "$logs/n1/worker_7.log" || { echo "FAIL: worker 7 did not pass"; fail=1; }
rm -rf "$logs"
[ "$fail" = 0 ] && echo "1 passed, 0 failed" || echo "0 passed, 1 failed"
exit $fail
