#!/usr/bin/env bash
# hyperpar's schedule generators against PyTorch's (torch.distributed.pipelining in .venv):
# for a grid of (schedule, pp, virtual stages, microbatches), every rank's compute order
# (F, B, I, W) is the same (sizes PyTorch refuses, e.g. 1F1B with fewer microbatches than
# ranks, are checked valid in hyperpar instead); and hyperpar-schedule's exit codes for a valid schedule and an
# impossible combination.
set -u
build=$1
src=$2
. "$src/tests/tools/fault_helpers.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
grid=""
for pp in 2 4 8; do
  for m in 1 2 4 8 16; do
    grid="$grid GPipe:$pp:1:$m 1F1B:$pp:1:$m"
    for v in 1 2 3; do
      rounds=$((m / pp)); [ $rounds -lt 1 ] && rounds=1
      [ $((m % rounds)) = 0 ] || continue
      grid="$grid Interleaved1F1B:$pp:$v:$m"
      [ $m -ge $pp ] && grid="$grid InterleavedZeroBubble:$pp:$v:$m"
    done
  done
done
"$src/.venv/bin/python" "$src/tests/parallel/pytorch_schedules.py" "$tmp/pt" $grid 2>"$tmp/pyerr"
check "PyTorch built every schedule of the grid" test $? = 0
n=0 same=0 refused=0
for spec in $grid; do
  IFS=: read -r name pp v m <<<"$spec"
  if grep -q "^refused:" "$tmp/pt/$name-$pp-$v-$m.txt"; then
    # PyTorch rejects these sizes; hyperpar's schedule for them must still be valid.
    refused=$((refused + 1))
    check "$spec (PyTorch refuses it) is valid in hyperpar" quiet "$build/tools/hyperpar-schedule" \
      --schedule "$name" --pp "$pp" --virtual_stages "$v" --microbatches "$m" --fsdp
    continue
  fi
  n=$((n + 1))
  "$build/tools/hyperpar-schedule" --schedule "$name" --pp "$pp" --virtual_stages "$v" \
    --microbatches "$m" --compute_only >"$tmp/hp.txt" 2>&1
  if cmp -s "$tmp/hp.txt" "$tmp/pt/$name-$pp-$v-$m.txt"; then
    same=$((same + 1))
  else
    echo "differs: $spec"; diff "$tmp/hp.txt" "$tmp/pt/$name-$pp-$v-$m.txt" | head -6
  fi
done
echo "$same of $n schedules identical to PyTorch's ($refused more PyTorch refuses)"
check "every rank's F/B/I/W order equals PyTorch's ($n schedules)" test "$same" = "$n"
"$build/tools/hyperpar-schedule" --schedule Interleaved1F1B --pp 4 --virtual_stages 2 --microbatches 8 --fsdp >"$tmp/ok.txt"
check "a lowered schedule with FSDP is valid" grep -q "valid; bubble fraction" "$tmp/ok.txt"
"$build/tools/hyperpar-schedule" --schedule 1F1B --pp 4 --virtual_stages 2 --microbatches 8 >"$tmp/bad.txt" 2>&1
check "1F1B with 2 virtual stages: exit 2" test $? = 2
check "names the values" grep -q "pp_virtual_stages 2" "$tmp/bad.txt"
"$build/tools/hyperpar-schedule" --schedule GPipe --pp 4 --microbatches 8 --n_layers 3 >"$tmp/bad2.txt" 2>&1
check "fewer layers than stages: exit 2" test $? = 2
finish_test
