"""Test-only interop with Hugging Face transformers (installed into .venv by scripts/setup.sh).

  hf_interop.py make llama|mixtral OUT [--seed S] [--vocab V]   a small random model, saved
                                                                by transformers (fp32)
  hf_interop.py compare HF_DIR DUMP_DIR [--metrics M --step N]  transformers' logits on the
                                                                rows hyperpar dumped
                                                                (--dump-first-batch), and
                                                                the step's loss

compare: the dumped rows (tokens, targets, hyperpar's logits; one file per data-parallel
rank) are joined in row order, the model in HF_DIR (loaded by transformers'
AutoModelForCausalLM, fp32, eager attention) runs on the tokens, and
  max |logits_hf - logits_hyperpar| / max |logits_hf| <= 1e-5
is required: both sides compute the same fp32 graph, so only the summation order differs
(observed: ~1e-7). With --metrics, the loss hyperpar reported at step N (the dumped step)
must equal transformers' mean cross-entropy on those rows within 1e-5 (relative).
Exits 1 with the figures on a mismatch.
"""
import argparse
import glob
import json
import os
import sys

import torch
from safetensors.torch import load_file


def make(kind, out, seed, vocab):
    from transformers import LlamaConfig, LlamaForCausalLM, MixtralConfig, MixtralForCausalLM

    torch.manual_seed(seed)
    common = dict(vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=8, num_key_value_heads=4, rms_norm_eps=1e-6,
                  rope_theta=50000.0, tie_word_embeddings=False, max_position_embeddings=256)
    if kind == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    else:
        model = MixtralForCausalLM(MixtralConfig(num_local_experts=4, num_experts_per_tok=2,
                                                 sliding_window=None, **common))
    # transformers' default init has std 0.02 everywhere, which makes near-uniform logits:
    # widen it so the comparison sees real differences between positions and tokens.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.8, 1.2)
            else:
                p.normal_(0, 0.2)
    model.save_pretrained(out)
    print(f"hf_interop: saved a random {type(model).__name__} to {out}")


def load_rows(dump):
    files = sorted(glob.glob(os.path.join(dump, "rows-*.safetensors")),
                   key=lambda f: int(f.rsplit("-", 1)[1].split(".")[0]))
    if not files:
        sys.exit(f"hf_interop: no rows-*.safetensors in {dump}")
    parts = [load_file(f) for f in files]
    return {k: torch.cat([p[k] for p in parts]) for k in ("tokens", "targets", "logits")}


def compare(hf_dir, dump, metrics, step):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32,
                                                 attn_implementation="eager")
    model.eval()
    rows = load_rows(dump)
    with torch.no_grad():
        logits = model(rows["tokens"]).logits.float()
    ours = rows["logits"]
    if logits.shape != ours.shape:
        sys.exit(f"hf_interop: shapes differ: transformers {tuple(logits.shape)}, "
                 f"hyperpar {tuple(ours.shape)}")
    rel = ((logits - ours).abs().max() / logits.abs().max()).item()
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)),
                                             rows["targets"].reshape(-1)).item()
    print(f"hf_interop: {type(model).__name__} on {ours.shape[0]} rows x {ours.shape[1]} "
          f"tokens: max relative logit difference {rel:.3e} (limit 1e-5); transformers' loss "
          f"{loss:.8f}")
    ok = rel <= 1e-5
    if metrics:
        reported = None
        for line in open(metrics):
            m = json.loads(line)
            if m["step"] == step:
                reported = m["loss"]
        if reported is None:
            sys.exit(f"hf_interop: step {step} not in {metrics}")
        loss_rel = abs(reported - loss) / abs(loss)
        print(f"hf_interop: hyperpar's loss at step {step}: {reported:.8f}, relative difference "
              f"{loss_rel:.3e} (limit 1e-5)")
        ok = ok and loss_rel <= 1e-5
    if not ok:
        print("hf_interop: MISMATCH")
        sys.exit(1)


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    mk = sub.add_parser("make")
    mk.add_argument("kind", choices=["llama", "mixtral"])
    mk.add_argument("out")
    mk.add_argument("--seed", type=int, default=0)
    mk.add_argument("--vocab", type=int, default=256)
    cp = sub.add_parser("compare")
    cp.add_argument("hf_dir")
    cp.add_argument("dump")
    cp.add_argument("--metrics")
    cp.add_argument("--step", type=int, default=1)
    a = ap.parse_args()
    if a.cmd == "make":
        make(a.kind, a.out, a.seed, a.vocab)
    else:
        compare(a.hf_dir, a.dump, a.metrics, a.step)


if __name__ == "__main__":
    main()
