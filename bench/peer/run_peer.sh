#!/usr/bin/env bash
# hyperpar against PyTorch 2.13 (FSDP2 + TP, gloo) on the same model, initial weights and
# batches, alternating runs (hyperpar MPI, PyTorch, hyperpar gloo, ...; --pairs of each) for
# single process, FSDP8 and TP2 x FSDP4 on 8 ranks. Model: a dense Llama, dim 512, 4 layers,
# 8 heads (4 KV), ffn 1408, vocab 4096; seq 128, global batch 16, fp32, AdamW. One intra-op
# thread per rank on 8 ranks, 2 in the single process. Layout tp2_ep2_fsdp: a Mixtral of the
# same size with 4 experts (top 2, expert ffn 704) in every layer; hyperpar runs TP2 x EP2 x
# FSDP4, PyTorch TP2 on attention with the experts whole under FSDP4 (PyTorch has no expert
# parallelism for transformers' MoE modules, so each of its tp ranks computes every expert).
# Reports per layout and backend the median step time after 2 warm-up steps, the ratio
# hyperpar / PyTorch (min / median / max over the pairs), CPU-seconds per step (all ranks),
# peak RSS per rank, and whether the losses agree within 1e-5 (relative) at every step. Writes
# bench/results/peer.json. A benchmark: nothing here is timed by CI.
#
#   bash bench/peer/run_peer.sh [--pairs 3] [--steps 12]
#                               [--layouts "single fsdp8 tp2_fsdp4 tp2_ep2_fsdp"]
#                               [--build build] [--out bench/results/peer.json]
# (CI runs it once as a smoke test, 1 pair of 3 single-process steps in the test build: the
# losses must agree; its times are not looked at.)
set -euo pipefail
cd "$(dirname "$0")/../.."
pairs=3
steps=12
layouts="single fsdp8 tp2_fsdp4 tp2_ep2_fsdp"
build=build
out=bench/results/peer.json
while [ $# -gt 0 ]; do
  case "$1" in
    --pairs) pairs=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --layouts) layouts=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "run_peer: unknown argument $1 (expected --pairs N, --steps N, --layouts LIST, --build DIR, --out FILE)" >&2; exit 2 ;;
  esac
done
[ -x "$build/tools/hyperpar-train" ] || scripts/setup.sh "$build"
py=.venv/bin/python
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$py" bench/peer/peer.py init "$tmp/hf"
case " $layouts " in *" tp2_ep2_fsdp "*) "$py" bench/peer/peer.py init "$tmp/hf-moe" --experts 4 --top_k 2 --ffn 704 ;; esac
"$build"/tools/hyperpar-data batches --config bench/peer/peer.yaml --set "model.init_from=hf:$tmp/hf" \
  --set "train.steps=$steps" --out "$tmp/batches.safetensors" >/dev/null
port=29800
for layout in $layouts; do
  hf="$tmp/hf" ep=1
  case $layout in
    single) tp=1 ;;
    fsdp8) tp=1 ;;
    tp2_fsdp4) tp=2 ;;
    tp2_ep2_fsdp) tp=2 ep=2 hf="$tmp/hf-moe" ;;
    *) echo "run_peer: unknown layout $layout" >&2; exit 2 ;;
  esac
  sets=(--set "model.init_from=hf:$hf" --set "train.steps=$steps")
  for i in $(seq 1 "$pairs"); do
    for side in hyperpar_mpi pytorch hyperpar_gloo; do
      m="$tmp/$layout-$side-$i.jsonl"
      port=$((port + 1))
      case $layout-$side in
        single-hyperpar_mpi)
          OMP_NUM_THREADS=2 "$build"/tools/hyperpar-train --config bench/peer/peer.yaml "${sets[@]}" --metrics "$m" >/dev/null ;;
        single-hyperpar_gloo) continue ;;  # one process: no backend involved
        single-pytorch)
          OMP_NUM_THREADS=2 "$py" bench/peer/peer.py train --hf "$hf" --batches "$tmp/batches.safetensors" --metrics "$m" 2>/dev/null ;;
        *-hyperpar_*)
          "$build"/tools/hyperpar-run --worker_num 8 --backend "${side#hyperpar_}" --master_port "$port" \
            --log_dir "$tmp/logs-$layout-$side-$i" -- "$build"/tools/hyperpar-train --config bench/peer/peer.yaml \
            "${sets[@]}" --set "parallel.tp=$tp" --set "parallel.ep=$ep" --metrics "$m" >/dev/null ;;
        *-pytorch)
          # Each rank's output in its own file (torchrun's summary alone hides a rank's
          # error). A failed run is kept for inspection and retried once on a fresh port.
          for try in 1 2; do
            logs="$tmp/pt-$layout-$i-$try"
            OMP_NUM_THREADS=1 "$py" -m torch.distributed.run --nproc_per_node 8 --master_port "$port" \
              --log-dir "$logs" --redirects 3 \
              bench/peer/peer.py train --hf "$hf" --batches "$tmp/batches.safetensors" --tp "$tp" \
              --metrics "$m" >/dev/null 2>"$logs.err" && break
            kept=$(mktemp -d /tmp/peer-pytorch-failure.XXXXXX)
            cp -r "$logs" "$logs.err" "$kept"/ 2>/dev/null || true
            echo "run_peer: PyTorch $layout run $i failed (try $try); its logs: $kept" >&2
            tail -3 "$logs.err" >&2
            find "$logs" -name stderr.log -size +0 -exec tail -5 {} + >&2 2>/dev/null || true
            [ "$try" = 1 ] || exit 1
            rm -f "$m"
            port=$((port + 1))
          done ;;
      esac
    done
  done
done
mkdir -p "$(dirname "$out")"
"$py" bench/peer/summarize.py "$tmp" "$pairs" "$layouts" "$out"
