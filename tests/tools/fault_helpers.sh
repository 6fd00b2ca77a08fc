# Shared helpers of the launcher fault tests (sourced). Every process a test starts is in
# its own session (setsid) and is found again through the launcher's pid records, so a
# test only ever signals or checks what it started itself.
fail=0
check() {  # check DESCRIPTION COMMAND...: runs the command, records a failure
  local what=$1; shift
  if "$@"; then echo "ok: $what"; else echo "FAIL: $what"; fail=1; fi
}
quiet() { "$@" >/dev/null 2>&1; }  # check "..." quiet CMD: the command's output hidden, not check's
# Pids recorded by the shims of a log dir (shims and programs).
recorded_pids() { cat "$1"/worker_*.pid 2>/dev/null | sed -n 's/^\(shim\|program\)=//p'; }
# Live (non-zombie) processes among the given pids.
live() {
  local p s
  for p in "$@"; do
    s=$(ps -o stat= -p "$p" 2>/dev/null) || continue
    case $s in Z*) ;; *) echo "$p";; esac
  done
}
# Waits up to $2 seconds until every pid recorded in log dir $1 (and any mpirun started for
# it) is gone; true when none is left.
all_gone_within() {
  local dir=$1 secs=$2 t=0
  while true; do
    if [ -z "$(live $(recorded_pids "$dir") $(pgrep -f "mpirun.*--worker-shim $dir" || true))" ]; then return 0; fi
    [ "$t" -ge $((secs * 10)) ] && break
    sleep 0.1; t=$((t + 1))
  done
  echo "still running after ${secs}s:"; ps -o pid,stat,args -p "$(recorded_pids "$dir" | paste -sd,)" 2>/dev/null
  return 1
}
# Waits up to $3 seconds for file $1 to contain $2.
wait_for_text() {
  local t=0
  while [ "$t" -lt $(($3 * 10)) ]; do grep -q -- "$2" "$1" 2>/dev/null && return 0; sleep 0.1; t=$((t + 1)); done
  echo "'$2' did not appear in $1 within $3 s"; cat "$1" 2>/dev/null | tail -5; return 1
}
# Program pid of worker $2 in log dir $1.
program_pid() { sed -n 's/^program=//p' "$1/worker_$2.pid"; }
# Kills whatever of a log dir's job is left (end of a test, whatever happened).
cleanup_job() {
  local p
  for p in $(live $(recorded_pids "$1")); do kill -9 "$p" 2>/dev/null; done
  for p in $(pgrep -f "mpirun.*--worker-shim $1" || true); do kill -9 "$p" 2>/dev/null; done
}
finish_test() {
  [ "$fail" = 0 ] && echo "1 passed, 0 failed" || echo "0 passed, 1 failed"
  exit $fail
}
