#!/usr/bin/env python3
"""Tokenizes text files with a Hugging Face `tokenizers` tokenizer into hyperpar token files
(the formats of data.format: llm.c .bin by default, or flat u16/u32), with a train/val split.

  # a tokenizer you have (tokenizer.json, as saved by tokenizers or transformers):
  .venv/bin/python scripts/tokenize_hf.py --tokenizer tokenizer.json --out data/mine docs/*.txt
  # or train a byte-level BPE tokenizer of 4096 ids on the same text first:
  .venv/bin/python scripts/tokenize_hf.py --train_vocab 4096 --out data/mine docs/*.txt

Writes OUT/train.bin, OUT/val.bin (the last --val_fraction of each file) and, when it trained
one, OUT/tokenizer.json; prints the tokens written and the vocab_size to put in model:.
Ids >= 65536 need 4 bytes: the llm.c format then uses its uint32 variant (magic 20240801) and
u16 is refused. Needs the `tokenizers` and `numpy` packages (in .venv after scripts/setup.sh).
"""
import argparse
import os
import sys

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

LLMC = {2: (20240520, 1), 4: (20240801, 7)}


def write_tokens(path, ids, fmt, vocab_size):
    width = 4 if fmt == "u32" or vocab_size > 65536 else 2
    if fmt == "u16" and width == 4:
        sys.exit(f"tokenize_hf: vocab_size {vocab_size} does not fit u16; use u32 or llmc")
    arr = np.asarray(ids, dtype=np.uint16 if width == 2 else np.uint32)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        if fmt == "llmc":
            header = np.zeros(256, dtype=np.int32)
            header[0], header[1] = LLMC[width]
            header[2] = len(arr)
            f.write(header.tobytes())
        f.write(arr.astype("<u2" if width == 2 else "<u4").tobytes())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return len(arr)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--tokenizer", help="a tokenizer.json to use")
    src.add_argument("--train_vocab", type=int, help="train a byte-level BPE of this many ids")
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--val_fraction", type=float, default=0.1)
    ap.add_argument("--format", choices=["llmc", "u16", "u32"], default="llmc")
    ap.add_argument("inputs", nargs="+", help="text files")
    a = ap.parse_args()
    if not 0 <= a.val_fraction < 1:
        sys.exit(f"tokenize_hf: --val_fraction must be in [0, 1), got {a.val_fraction}")
    texts = []
    for p in a.inputs:
        with open(p, encoding="utf-8", errors="replace") as f:
            texts.append(f.read())
    os.makedirs(a.out, exist_ok=True)
    if a.tokenizer:
        tok = Tokenizer.from_file(a.tokenizer)
    else:
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=a.train_vocab,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                      show_progress=False)
        tok.train_from_iterator(texts, trainer=trainer)
        tok.save(os.path.join(a.out, "tokenizer.json"))
    vocab = tok.get_vocab_size()
    train, val = [], []
    for text in texts:
        ids = tok.encode(text).ids
        n_val = int(len(ids) * a.val_fraction)
        train.extend(ids[: len(ids) - n_val])
        val.extend(ids[len(ids) - n_val:])
    n = write_tokens(os.path.join(a.out, "train.bin"), train, a.format, vocab)
    print(f"tokenize_hf: {len(texts)} files; {a.out}/train.bin: {n} tokens ({a.format})")
    if a.val_fraction > 0:
        n = write_tokens(os.path.join(a.out, "val.bin"), val, a.format, vocab)
        print(f"tokenize_hf: {a.out}/val.bin: {n} tokens")
    print(f"tokenize_hf: vocab_size {vocab} (set model.vocab_size to it, or to a multiple of tp "
          f"above it)")


if __name__ == "__main__":
    main()
