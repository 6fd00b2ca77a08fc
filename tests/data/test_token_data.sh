#!/usr/bin/env bash
# Real token data end to end: hyperpar-data and scripts/tokenize_hf.py make token files from
# text written here; training on them (with evaluation) matches the single rank on 8 ranks
# (TP2 x FSDP4, MPI and gloo); a checkpoint resumes on another layout with exactly the
# batches an uninterrupted run takes; bad data stops every rank with exit 2 and a message
# naming the file; configs/bytes_text.yaml runs a few steps on 8 workers.
set -u
build=$1
src=$2
here=$(cd "$(dirname "$0")" && pwd)
. "$src/tests/tools/fault_helpers.sh"
train="$build/tools/hyperpar-train"
run="$build/tools/hyperpar-run"
py="$src/.venv/bin/python"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
match() { "$py" "$here/metrics_match.py" "$@"; }

# Text: a few KB of varied English-like lines per file, from a fixed generator.
mkdir -p "$tmp/text/sub"
python3 - "$tmp/text" <<'PY'
import random, sys
words = ("the model trains on every rank and the loss falls while the shards move between "
         "ranks in each step of training data checkpoint license software free copy").split()
for i, name in enumerate(["a.txt", "b.txt", "sub/c.txt"]):
    r = random.Random(i)
    with open(f"{sys.argv[1]}/{name}", "w") as f:
        for _ in range(400):
            f.write(" ".join(r.choice(words) for _ in range(r.randint(4, 12))).capitalize() + ".\n")
PY
ln -s "$tmp/text/a.txt" "$tmp/text/sub/link-to-a.txt"
total=$(cat "$tmp/text/a.txt" "$tmp/text/b.txt" "$tmp/text/sub/c.txt" | wc -c)

# 1. hyperpar-data: byte tokens, every byte once (the symlink is skipped), train/val split.
"$build/tools/hyperpar-data" bytes --out "$tmp/bytes" --val_fraction 0.1 "$tmp/text" >"$tmp/d.out" 2>&1
check "hyperpar-data exits 0" test $? = 0
n_train=$(sed -n 's/.*train.bin: \([0-9]*\) tokens.*/\1/p' "$tmp/d.out")
n_val=$(sed -n 's/.*val.bin: \([0-9]*\) tokens.*/\1/p' "$tmp/d.out")
check "3 files, symlink skipped" grep -q "3 files, $total bytes" "$tmp/d.out"
check "train + val tokens = $total bytes" test "$((n_train + n_val))" = "$total"
check "llm.c files: header + 2 bytes a token" test "$(stat -c %s "$tmp/bytes/train.bin")" = "$((1024 + 2 * n_train))"

cat >"$tmp/bytes.yaml" <<YAML
model: {vocab_size: 256, dim: 64, n_layers: 2, n_heads: 4, n_kv_heads: 2, ffn_hidden: 96}
train: {steps: 6, global_batch_size: 8, seq_len: 32, lr: 0.003, warmup_steps: 1, seed: 5,
        eval_interval: 3, eval_batches: 2}
data: {path: "$tmp/bytes/train.bin", val_path: "$tmp/bytes/val.bin"}
YAML

# 2. Single rank vs TP2 x FSDP4 on 8 ranks, MPI and gloo: every step's loss, grad norm and
#    val_loss within 1e-5.
"$train" --config "$tmp/bytes.yaml" --metrics "$tmp/m1.jsonl" >"$tmp/o1" 2>&1
check "single rank trains on the token file" test $? = 0
check "val_loss reported in the log" grep -q "val_loss" "$tmp/o1"
check "data described in the log" grep -q "windows of 33 tokens, format llmc" "$tmp/o1"
check "the loss falls" python3 -c "
import json; m=[json.loads(l) for l in open('$tmp/m1.jsonl')]; assert m[-1]['loss'] < m[0]['loss'] - 0.5, m"
for backend in mpi gloo; do
  port=$([ $backend = gloo ] && echo "--master_port 29731" || echo "")
  # shellcheck disable=SC2086
  timeout 300 "$run" --worker_num 8 --backend $backend $port --log_dir "$tmp/l8$backend" "$train" \
    --config "$tmp/bytes.yaml" --set parallel.tp=2 --metrics "$tmp/m8$backend.jsonl" >"$tmp/o8$backend" 2>&1
  check "8 ranks TP2 x FSDP4 ($backend) run" test $? = 0
  check "8 ranks ($backend) = 1 rank" match "$tmp/m1.jsonl" "$tmp/m8$backend.jsonl"
done

# 3. Resume on another layout: 3 steps on 8 ranks (TP2), then steps 4..6 on 4 ranks (FSDP4)
#    from the checkpoint; the same batches as the uninterrupted single-rank run.
timeout 300 "$run" --worker_num 8 --log_dir "$tmp/lr1" "$train" --config "$tmp/bytes.yaml" \
  --set parallel.tp=2 --set train.steps=3 --set checkpoint.dir="$tmp/ck" --set checkpoint.interval=3 \
  --metrics "$tmp/mr.jsonl" >"$tmp/or1" 2>&1
check "first half on 8 ranks" test $? = 0
check "data position in the checkpoint" grep -q '"consumed_samples": 24, "epoch": 0, "index": 24' "$tmp/ck/step-3/hyperpar_state.json"
timeout 300 "$run" --worker_num 4 --log_dir "$tmp/lr2" "$train" --config "$tmp/bytes.yaml" \
  --set checkpoint.dir="$tmp/ck" --metrics "$tmp/mr.jsonl" >"$tmp/or2" 2>&1
check "second half on 4 ranks" test $? = 0
check "resumed run = uninterrupted run" match "$tmp/m1.jsonl" "$tmp/mr.jsonl"

# 4. Bad data: exit 2 on every rank, named file and offset, nobody left waiting.
timeout 120 "$run" --worker_num 8 --log_dir "$tmp/lbad" "$train" --config "$tmp/bytes.yaml" \
  --set parallel.tp=2 --set model.vocab_size=100 >"$tmp/obad" 2>&1
rc=$?
check "ids >= vocab_size: the job fails (not a timeout)" test $rc != 0 -a $rc != 124
for r in 0 3 7; do
  check "rank $r names file and offset" grep -q "/bytes/[a-z]*.bin: token id [0-9]* at token offset [0-9]* (byte offset [0-9]*) is >= model.vocab_size 100" "$tmp/lbad/worker_$r.log"
done
check "exit code 2" grep -q "exited with code 2" "$tmp/obad"
check "nothing left running" all_gone_within "$tmp/lbad" 10
head -c 4000 /dev/urandom >"$tmp/raw.bin"
"$train" --config "$tmp/bytes.yaml" --set data.path="$tmp/raw.bin" >"$tmp/oraw" 2>&1
check "headerless file with format auto: exit 2" test $? = 2
check "asks for u16 or u32" grep -q "set data.format to u16" "$tmp/oraw"
"$train" --config "$tmp/bytes.yaml" --set data.path="$tmp/nothing-*.bin" >"$tmp/onone" 2>&1
check "no matching file: exit 2" test $? = 2
check "says so" grep -q "matches no file" "$tmp/onone"
"$train" --config "$tmp/bytes.yaml" --set data.val_fraction=0.1 >"$tmp/oboth" 2>&1
check "val_path and val_fraction: exit 2" test $? = 2

# 5. A Hugging Face tokenizer trained here (tokenizers), its ids in the same format.
"$py" "$src/scripts/tokenize_hf.py" --train_vocab 320 --out "$tmp/bpe" "$tmp/text/a.txt" "$tmp/text/b.txt" "$tmp/text/sub/c.txt" >"$tmp/t.out" 2>&1
check "tokenize_hf.py trains a tokenizer and writes tokens" test $? = 0
check "vocab_size printed" grep -q "vocab_size 3[0-9][0-9]" "$tmp/t.out"
"$py" "$src/scripts/tokenize_hf.py" --tokenizer "$tmp/bpe/tokenizer.json" --out "$tmp/bpe2" "$tmp/text/a.txt" "$tmp/text/b.txt" "$tmp/text/sub/c.txt" >/dev/null 2>&1
check "the saved tokenizer.json gives the same ids" cmp -s "$tmp/bpe/train.bin" "$tmp/bpe2/train.bin"
check "BPE tokens are fewer than bytes" test "$(stat -c %s "$tmp/bpe/train.bin")" -lt "$(stat -c %s "$tmp/bytes/train.bin")"
"$train" --config "$tmp/bytes.yaml" --set model.vocab_size=320 --set data.path="$tmp/bpe/train.bin" \
  --set data.val_path="$tmp/bpe/val.bin" --set train.steps=3 >"$tmp/obpe" 2>&1
check "trains on the BPE tokens with evaluation" grep -q "step    3 .*val_loss" "$tmp/obpe"

# 6. configs/bytes_text.yaml, a few steps on 8 workers on its corpus (the license texts of
#    Debian's base-files, made into token files here as the README shows).
"$build/tools/hyperpar-data" bytes --out "$tmp/licenses" /usr/share/common-licenses >"$tmp/dl.out" 2>&1
check "hyperpar-data on /usr/share/common-licenses" grep -q "train.bin: [0-9]* tokens" "$tmp/dl.out"
timeout 300 "$run" --worker_num 8 --log_dir "$tmp/lbt" "$train" --config "$src/configs/bytes_text.yaml" \
  --set train.steps=2 --set train.eval_interval=2 --set train.eval_batches=1 \
  --set data.path="$tmp/licenses/train.bin" --set data.val_path="$tmp/licenses/val.bin" >"$tmp/obt" 2>&1
check "bytes_text.yaml on 8 workers" test $? = 0
check "bytes_text.yaml evaluates" grep -q "step    2 .*val_loss" "$tmp/lbt/worker_0.log"
cleanup_job "$tmp/lbad"
finish_test
