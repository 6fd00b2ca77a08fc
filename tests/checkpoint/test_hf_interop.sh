#!/usr/bin/env bash
# Hugging Face models in and out, checked by transformers itself (test-only, in .venv):
# (a) models trained by hyperpar on 8 ranks and exported by hyperpar-ckpt export --hf load in
#     transformers with the same logits (<= 1e-5 relative, fp32) and loss on a batch: dense
#     as LlamaForCausalLM, all-MoE as MixtralForCausalLM (sharded files with an index);
# (b) random LlamaForCausalLM / MixtralForCausalLM made and saved by transformers, imported
#     with model.init_from on 8 ranks (TP2 x FSDP4; TP2 x EP2 x FSDP for Mixtral): the same
#     logits and the same first-step loss;
# (c) what cannot be converted is refused with exit 2 and the reason.
set -u
build=$1
src=$2
here=$(cd "$(dirname "$0")" && pwd)
. "$src/tests/tools/fault_helpers.sh"
train="$build/tools/hyperpar-train"
run="$build/tools/hyperpar-run"
ckpt="$build/tools/hyperpar-ckpt"
py="$src/.venv/bin/python"
interop() { "$py" "$here/hf_interop.py" "$@" 2>&1 | grep -v -e Warning -e "Loading weights" -e "Writing model"; return "${PIPESTATUS[0]}"; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

# Byte-level training data from this repository's own text.
"$build/tools/hyperpar-data" bytes --out "$tmp/data" --val_fraction 0 "$src/README.md" "$src/include" >/dev/null
base="--set data.path=$tmp/data/train.bin --set train.global_batch_size=8 --set train.seq_len=32 --set train.lr=0.003"
cat >"$tmp/dense.yaml" <<YAML
model: {vocab_size: 256, dim: 64, n_layers: 2, n_heads: 8, n_kv_heads: 4, ffn_hidden: 96,
        rope_theta: 20000, norm_eps: 1.0e-6}
train: {steps: 3, seed: 3}
YAML

# (a) dense: 3 steps on 8 ranks (TP2 x FSDP4), export, then one more step on one rank from
#     the checkpoint, dumping that step's logits: transformers must agree on them.
# shellcheck disable=SC2086
timeout 300 "$run" --worker_num 8 --log_dir "$tmp/la" "$train" --config "$tmp/dense.yaml" $base \
  --set parallel.tp=2 --set checkpoint.dir="$tmp/ck" --set checkpoint.interval=3 >"$tmp/oa" 2>&1
check "dense model trained on 8 ranks" test $? = 0
"$ckpt" export --hf "$tmp/hf-dense" "$tmp/ck" >"$tmp/oe" 2>&1
check "export --hf: LlamaForCausalLM in one file" grep -q "as LlamaForCausalLM: 21 tensors, .* in 1 file" "$tmp/oe"
# shellcheck disable=SC2086
"$train" --config "$tmp/dense.yaml" $base --set checkpoint.dir="$tmp/ck" --set train.steps=4 \
  --metrics "$tmp/ma.jsonl" --dump-first-batch "$tmp/dump-a" >/dev/null 2>&1
check "hyperpar's logits of the trained model dumped" test -f "$tmp/dump-a/rows-0.safetensors"
check "(a) transformers = hyperpar (LlamaForCausalLM)" interop compare "$tmp/hf-dense" "$tmp/dump-a" --metrics "$tmp/ma.jsonl" --step 4

# (a) Mixtral: MoE in every layer, no shared expert; TP2 x EP2 x FSDP; sharded export.
# shellcheck disable=SC2086
timeout 300 "$run" --worker_num 8 --log_dir "$tmp/lm" "$train" --config "$tmp/dense.yaml" $base \
  --set model.moe.n_experts=4 --set model.moe.top_k=2 --set "model.moe.layers=[0, 1]" \
  --set parallel.tp=2 --set parallel.ep=2 --set checkpoint.dir="$tmp/ckm" --set checkpoint.interval=3 >"$tmp/om" 2>&1
check "Mixtral-shaped model trained on 8 ranks" test $? = 0
"$ckpt" export --hf "$tmp/hf-moe" --max_shard_size 60000 "$tmp/ckm" >"$tmp/oem" 2>&1
check "export --hf: MixtralForCausalLM in several files with an index" grep -q "as MixtralForCausalLM: 41 tensors, .* files (with an index)" "$tmp/oem"
check "the index names every weight file" "$py" -c "
import json, os; ix = json.load(open('$tmp/hf-moe/model.safetensors.index.json'))
files = set(ix['weight_map'].values()); assert len(files) > 1 and all(os.path.exists('$tmp/hf-moe/' + f) for f in files)
assert 'model.layers.1.block_sparse_moe.experts.3.w2.weight' in ix['weight_map']"
# shellcheck disable=SC2086
"$train" --config "$tmp/dense.yaml" $base --set model.moe.n_experts=4 --set "model.moe.layers=[0, 1]" \
  --set checkpoint.dir="$tmp/ckm" --set train.steps=4 --metrics "$tmp/mm.jsonl" --dump-first-batch "$tmp/dump-m" >/dev/null 2>&1
check "(a) transformers = hyperpar (MixtralForCausalLM)" interop compare "$tmp/hf-moe" "$tmp/dump-m" --metrics "$tmp/mm.jsonl" --step 4
# The comparison can fail: the dense export against the MoE model's logits must not match.
interop compare "$tmp/hf-dense" "$tmp/dump-m" >"$tmp/oneg" 2>&1
check "a different model's logits are reported as a mismatch" grep -q MISMATCH "$tmp/oneg"

# (b) transformers' own random models, imported on 8 ranks.
cat >"$tmp/import.yaml" <<YAML
model: {init_from: "hf:$tmp/hf-llama"}
train: {steps: 2, seed: 1}
YAML
check "transformers saves a random Llama" interop make llama "$tmp/hf-llama" --seed 1
check "transformers saves a random Mixtral" interop make mixtral "$tmp/hf-mixtral" --seed 2
# shellcheck disable=SC2086
timeout 300 "$run" --worker_num 8 --log_dir "$tmp/lb" "$train" --config "$tmp/import.yaml" $base \
  --set parallel.tp=2 --metrics "$tmp/mb.jsonl" --dump-first-batch "$tmp/dump-b" >"$tmp/ob" 2>&1
check "Llama imported on 8 ranks (TP2 x FSDP4)" grep -q "initialised from hf:.* (LlamaForCausalLM)" "$tmp/lb/worker_0.log"
check "(b) Llama: same logits and first-step loss" interop compare "$tmp/hf-llama" "$tmp/dump-b" --metrics "$tmp/mb.jsonl" --step 1
# shellcheck disable=SC2086
timeout 300 "$run" --worker_num 8 --log_dir "$tmp/lbm" "$train" --config "$tmp/import.yaml" $base \
  --set model.init_from="hf:$tmp/hf-mixtral" --set parallel.tp=2 --set parallel.ep=2 \
  --metrics "$tmp/mbm.jsonl" --dump-first-batch "$tmp/dump-bm" >"$tmp/obm" 2>&1
check "Mixtral imported on 8 ranks (TP2 x EP2 x FSDP)" grep -q "initialised from hf:.* (MixtralForCausalLM)" "$tmp/lbm/worker_0.log"
check "(b) Mixtral: same logits and first-step loss" interop compare "$tmp/hf-mixtral" "$tmp/dump-bm" --metrics "$tmp/mbm.jsonl" --step 1

# (c) Refusals.
# shellcheck disable=SC2086
"$train" --config "$tmp/import.yaml" $base --set model.dim=128 --set model.n_heads=8 >"$tmp/oc1" 2>&1
check "a model key disagreeing with config.json: exit 2" test $? = 2
check "names the key and value" grep -q "disagrees with model.dim = 128;" "$tmp/oc1"
# shellcheck disable=SC2086
"$train" --config "$tmp/import.yaml" $base --set model.n_heads=8 >/dev/null 2>&1
check "an agreeing model key is fine" test $? = 0
# shellcheck disable=SC2086
"$train" --config "$src/configs/single.yaml" --set train.steps=1 --set checkpoint.dir="$tmp/cks" --set checkpoint.interval=1 >/dev/null 2>&1
"$ckpt" export --hf "$tmp/hf-shared" "$tmp/cks" >"$tmp/oc2" 2>&1
check "a shared-expert model: export refused (exit 2)" test $? = 2
check "with the reason" grep -q "shared_expert_gate" "$tmp/oc2"
check "nothing written for it" test ! -e "$tmp/hf-shared/config.json"
"$ckpt" export --hf "$tmp/hf-dense" "$tmp/ck" >"$tmp/oc3" 2>&1
check "a non-empty output directory: refused (exit 2)" test $? = 2
check "export kept the earlier files" test -f "$tmp/hf-dense/model.safetensors"
"$ckpt" export --hf "$tmp/hf-dense" --overwrite "$tmp/ck" >/dev/null 2>&1
check "--overwrite replaces an earlier hyperpar export" test $? = 0
mkdir -p "$tmp/user" && echo keep >"$tmp/user/notes.txt"
"$ckpt" export --hf "$tmp/user" --overwrite "$tmp/ck" >/dev/null 2>&1
check "--overwrite never replaces what is not a hyperpar export" test $? = 2 -a -f "$tmp/user/notes.txt"
finish_test
