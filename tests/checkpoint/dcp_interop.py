"""Test-only peer for hyperpar checkpoints: PyTorch's own DCP Hugging Face storage and the
safetensors library, from .venv. Never used by hyperpar itself.

  dcp_interop.py assemble-compare A B [--prefix P]   full tensors of two checkpoints are equal
  dcp_interop.py dcp-read CKPT EXPORT                 torch.distributed.checkpoint.load with
                                                      HuggingFaceStorageReader == EXPORT
  dcp_interop.py dcp-write EXPORT OUT                 PyTorch writes EXPORT's tensors with
                                                      HuggingFaceStorageWriter (under torchrun:
                                                      DTensor shards, one file set per rank)
Each prints what it checked and exits non-zero on any difference.
"""
import json
import os
import sys

import torch
from safetensors import safe_open
from safetensors.torch import load_file


def assemble(path):
    """Full tensors from every *.safetensors box of a checkpoint directory."""
    boxes = {}
    for name in sorted(os.listdir(path)):
        if not name.endswith(".safetensors"):
            continue
        with safe_open(os.path.join(path, name), framework="pt") as f:
            meta = f.metadata() or {}
            info = json.loads(meta.get("DCP_SHARDING_INFO", "{}"))
            for key in f.keys():
                t = f.get_tensor(key)
                off = info.get(key, {}).get("saved_offsets", [0] * t.dim())
                boxes.setdefault(key, []).append((off, t))
    full = {}
    for key, parts in boxes.items():
        shape = [max(o[d] + t.shape[d] for o, t in parts) for d in range(parts[0][1].dim())]
        out = torch.full(shape, float("nan"), dtype=parts[0][1].dtype)
        for off, t in parts:
            out[tuple(slice(o, o + s) for o, s in zip(off, t.shape))] = t
        assert not torch.isnan(out).any(), f"{key}: the boxes do not cover the tensor"
        full[key] = out
    return full


def assemble_compare(a, b, prefix=""):
    fa, fb = assemble(a), assemble(b)
    ka = {k for k in fa if k.startswith(prefix)}
    kb = {k for k in fb if k.startswith(prefix)}
    assert ka == kb, f"keys differ: only in {a}: {sorted(ka - kb)[:5]}, only in {b}: {sorted(kb - ka)[:5]}"
    for k in sorted(ka):
        assert torch.equal(fa[k], fb[k]), f"{k} differs (max {(fa[k] - fb[k]).abs().max().item()})"
    print(f"bit-identical: {len(ka)} tensors of {a} and {b}")


def dcp_read(ckpt, export):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageReader

    ref = load_file(export)
    state = {k: torch.zeros_like(v) for k, v in ref.items()}
    dcp.load(state, storage_reader=HuggingFaceStorageReader(ckpt))
    for k, v in ref.items():
        assert torch.equal(state[k], v), f"{k}: DCP read differs from hyperpar's full tensor"
    print(f"PyTorch DCP HuggingFaceStorageReader read {len(ref)} parameters of {ckpt}, equal to hyperpar's full tensors")


def dcp_write(export, out):
    """PyTorch saves EXPORT's tensors with HuggingFaceStorageWriter. Under torchrun (gloo,
    WORLD_SIZE > 1) every tensor is a DTensor Shard(0) on a 1-D mesh, as FSDP2's state dict
    holds it, and every rank writes its own shard (save_distributed)."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageWriter

    ref = load_file(export)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        dcp.save(ref, storage_writer=HuggingFaceStorageWriter(out))
        print(f"PyTorch wrote {len(ref)} full tensors to {out}")
        return
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (world,))
    state = {k: distribute_tensor(v, mesh, [Shard(0)]) for k, v in ref.items()}
    dcp.save(state, storage_writer=HuggingFaceStorageWriter(out, save_distributed=True))
    if dist.get_rank() == 0:
        print(f"PyTorch ({world} ranks, DTensor Shard(0)) wrote {len(ref)} tensors to {out}")
    dist.destroy_process_group()


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "assemble-compare":
        prefix = sys.argv[5] if len(sys.argv) > 5 and sys.argv[4] == "--prefix" else ""
        assemble_compare(sys.argv[2], sys.argv[3], prefix)
    elif cmd == "dcp-read":
        dcp_read(sys.argv[2], sys.argv[3])
    elif cmd == "dcp-write":
        dcp_write(sys.argv[2], sys.argv[3])
    else:
        sys.exit(f"unknown command {cmd}")
