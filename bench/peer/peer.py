"""PyTorch side of hyperpar's side-by-side benchmark (bench/peer/run_peer.sh). Public APIs only:
transformers' LlamaForCausalLM (the same architecture as hyperpar's dense Transformer; hyperpar
imports its weights through model.init_from), torch.distributed's DeviceMesh, fully_shard
(FSDP2), parallelize_module (TP) and torch.optim.AdamW.

  peer.py init DIR --dim 512 --layers 4 --heads 8 --kv_heads 4 --ffn 1408 --vocab 4096 --seed 0
               [--experts E --top_k K]
      a random Llama (with --experts: a Mixtral, MoE in every layer) in DIR (transformers'
      save_pretrained, fp32): both sides start from it
  peer.py train --hf DIR --batches B.safetensors --tp T --lr .. --warmup .. --wd .. --clip ..
                [--loss_parallel 1|0] --metrics M.jsonl
      trains on exactly hyperpar's batches (hyperpar-data batches): single process, or under
      torchrun (gloo) on a (dp, tp) mesh: TP (colwise q/k/v/gate/up and lm_head, rowwise o/down
      and the embedding; for Mixtral attention only, experts whole; with --loss_parallel 1, the
      default as in torchtitan and hyperpar, lm_head's logits stay split over the vocabulary into
      the loss under loss_parallel()) then fully_shard per decoder
      layer (the last not resharded after forward, as torchtitan) and on the root. Per step, rank 0
      writes {"step", "loss", "grad_norm", "step_time_s", "cpu_s", "peak_rss_mb"} (loss: mean
      over the global batch; cpu_s: CPU seconds summed over ranks; peak RSS: max over ranks).
The update is hyperpar's: AdamW(betas 0.9, 0.95, eps 1e-8, decoupled wd), lr linear warm-up
over --warmup steps, global grad-norm clipping, mean next-token cross-entropy in fp32.
"""
import argparse
import contextlib
import json
import os
import resource
import time

import torch
import torch.nn.functional as F


def init(args):
    from transformers import LlamaConfig, LlamaForCausalLM, MixtralConfig, MixtralForCausalLM

    torch.manual_seed(args.seed)
    common = dict(vocab_size=args.vocab, hidden_size=args.dim, intermediate_size=args.ffn,
                  num_hidden_layers=args.layers, num_attention_heads=args.heads,
                  num_key_value_heads=args.kv_heads, rms_norm_eps=1e-5, rope_theta=10000.0,
                  tie_word_embeddings=False, max_position_embeddings=4096)
    if args.experts > 0:
        # Mixtral: MoE in every layer, softmax router, top-k renormalised, no jitter, no
        # auxiliary loss in training (output_router_logits off), as hyperpar's MoE.
        model = MixtralForCausalLM(MixtralConfig(num_local_experts=args.experts,
                                                 num_experts_per_tok=args.top_k,
                                                 router_jitter_noise=0.0,
                                                 output_router_logits=False, **common))
    else:
        model = LlamaForCausalLM(LlamaConfig(**common))
    model.save_pretrained(args.dir, safe_serialization=True)


def clip_grad_norm(params, max_norm):
    """Global grad-norm clipping over parameters on different meshes (under TP the norms'
    weights live on dp only, the rest on (dp, tp); clip_grad_norm_ refuses the mix): one total
    norm per mesh, combined, as torchtitan does."""
    by_mesh = {}
    for p in params:
        if p.grad is not None:
            by_mesh.setdefault(getattr(p.grad, "device_mesh", None), []).append(p.grad)
    total = torch.zeros((), dtype=torch.float64)
    for grads in by_mesh.values():
        n = torch.nn.utils.get_total_norm(grads, 2.0)
        n = n.full_tensor() if hasattr(n, "full_tensor") else n
        total += n.double() ** 2
    total = total.sqrt()
    coef = max_norm / (total.item() + 1e-6)
    if coef < 1:
        for grads in by_mesh.values():
            for g in grads:
                g.mul_(coef)
    return total


def train(args):
    import torch.distributed as dist
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1:
        dist.init_process_group("gloo")
    model = AutoModelForCausalLM.from_pretrained(args.hf, dtype=torch.float32,
                                                 attn_implementation="sdpa")
    moe = model.config.model_type == "mixtral"
    model.train()
    dp = world // args.tp
    dp_rank = rank // args.tp
    if world > 1:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor import Replicate, Shard
        from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                       parallelize_module)

        mesh = init_device_mesh("cpu", (dp, args.tp), mesh_dim_names=("dp", "tp"))
        if args.tp > 1:
            plan = {"model.embed_tokens": RowwiseParallel(input_layouts=Replicate()),
                    # loss parallel (torchtitan's default): logits stay split over the
                    # vocabulary into the loss, as hyperpar's parallel.loss_parallel
                    "lm_head": ColwiseParallel(output_layouts=Shard(-1),
                                               use_local_output=not args.loss_parallel)
                    if args.loss_parallel else ColwiseParallel(output_layouts=Replicate())}
            for i in range(len(model.model.layers)):
                p = f"model.layers.{i}."
                # Mixtral's experts and router stay whole on each tp rank (PyTorch has no expert
                # parallelism for transformers' MoE): both tp ranks compute every expert.
                mlp = () if moe else ("mlp.gate_proj", "mlp.up_proj")
                for n in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj") + mlp:
                    plan[p + n] = ColwiseParallel()
                for n in ("self_attn.o_proj",) + (() if moe else ("mlp.down_proj",)):
                    plan[p + n] = RowwiseParallel()
            parallelize_module(model, mesh["tp"], plan)
        # torchtitan's default: the last block is not resharded after forward (backward needs
        # it at once); FSDP2 keeps the root unsharded after forward by itself.
        layers = model.model.layers
        for i, layer in enumerate(layers):
            fully_shard(layer, mesh=mesh["dp"], reshard_after_forward=i < len(layers) - 1)
        fully_shard(model, mesh=mesh["dp"])
    loss_context = contextlib.nullcontext
    if world > 1 and args.tp > 1 and args.loss_parallel:
        from torch.distributed.tensor.parallel import loss_parallel
        loss_context = loss_parallel
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=args.wd)
    batches = load_file(args.batches)
    tokens, targets = batches["tokens"], batches["targets"]
    steps, gbs = tokens.shape[0], tokens.shape[1]
    rows = slice(dp_rank * (gbs // dp), (dp_rank + 1) * (gbs // dp))
    out = open(args.metrics, "w") if rank == 0 else None
    for step in range(1, steps + 1):
        t0, c0 = time.perf_counter(), time.process_time()
        lr = args.lr * step / args.warmup if args.warmup > 0 and step <= args.warmup else args.lr
        for g in opt.param_groups:
            g["lr"] = lr
        with loss_context():
            logits = model(input_ids=tokens[step - 1, rows]).logits
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                                   targets[step - 1, rows].reshape(-1))
            loss.backward()
        norm = clip_grad_norm(list(model.parameters()), args.clip)
        opt.step()
        opt.zero_grad()
        stats = torch.tensor([loss.item(), time.process_time() - c0], dtype=torch.float64)
        rss = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0])
        if world > 1:
            stats[0] /= world  # the mean over ranks (tp ranks agree)
            dist.all_reduce(stats)
            dist.all_reduce(rss, op=dist.ReduceOp.MAX)
        secs = time.perf_counter() - t0
        if out:
            out.write(json.dumps({"step": step, "loss": stats[0].item(), "grad_norm": norm.item(),
                                  "step_time_s": secs, "cpu_s": stats[1].item(),
                                  "peak_rss_mb": rss.item()}) + "\n")
            out.flush()
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    i = sub.add_parser("init")
    i.add_argument("dir")
    for k, v in (("dim", 512), ("layers", 4), ("heads", 8), ("kv_heads", 4), ("ffn", 1408),
                 ("vocab", 4096), ("seed", 0), ("experts", 0), ("top_k", 2)):
        i.add_argument("--" + k, type=int, default=v)
    t = sub.add_parser("train")
    t.add_argument("--hf", required=True)
    t.add_argument("--batches", required=True)
    t.add_argument("--metrics", required=True)
    t.add_argument("--tp", type=int, default=1)
    t.add_argument("--loss_parallel", type=int, default=1)
    t.add_argument("--lr", type=float, default=1e-3)
    t.add_argument("--warmup", type=int, default=2)
    t.add_argument("--wd", type=float, default=0.01)
    t.add_argument("--clip", type=float, default=1.0)
    a = ap.parse_args()
    init(a) if a.cmd == "init" else train(a)
