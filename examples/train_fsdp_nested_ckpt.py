"""FSDP (ZeRO-3) with nested wrapping, activation checkpointing and checkpoint consolidation.

PyTorch/XLA's multi-process FSDP: one process per device (``xmp.spawn``), each holding 1/N of
every parameter, gradient and Adam state. Every transformer block of the byte-level GPT of
``tiny_gpt.py`` is its own FSDP instance (``transformer_auto_wrap_policy``) and is
activation-checkpointed (``checkpoint_module``), so only one block's full parameters and
activations are live at a time. At the end every rank saves its shard of the model, the
shards are consolidated into one state dict of the plain (unwrapped) GPT, which is loaded with
``strict=True`` and evaluated on CPU: its validation loss must equal the sharded model's.

  PYTHONPATH=. python3 examples/train_fsdp_nested_ckpt.py             # ~1-2 minutes on 2 cores
  PYTHONPATH=. python3 examples/train_fsdp_nested_ckpt.py --steps 20 --nprocs 2
"""
import argparse
import functools
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nprocs", type=int, default=4, help="processes (one device each)")
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--batch-size", type=int, default=16, help="per process")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--ckpt-dir", default=None, help="where the checkpoints go (default: a temp dir)")
    return p.parse_args(argv)


def build_model(args):
    import torch
    from tiny_gpt import GPT, GPTConfig
    torch.manual_seed(0)  # the same initial weights on every rank (and for the CPU check)
    return GPT(GPTConfig(n_layer=args.layers))


def train(index, args, prefix):
    import torch
    from tqdm import tqdm

    import torch_spmd
    import torch_spmd.core.xla_model as xm
    from torch_spmd.distributed.fsdp import XlaFullyShardedDataParallel as FSDP
    from torch_spmd.distributed.fsdp import checkpoint_module
    from torch_spmd.distributed.fsdp.wrap import transformer_auto_wrap_policy
    from tiny_gpt import Block, batch_at, corpus, lm_loss, split

    rank, world = xm.get_ordinal(), xm.xrt_world_size()
    dev = torch_spmd.device()
    model = build_model(args)
    for i, block in enumerate(model.blocks):
        model.blocks[i] = checkpoint_module(block)  # recompute its activations in backward
    policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Block})
    model = FSDP(model, auto_wrap_policy=policy)  # ZeRO-3: each block, then the rest
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)  # sees only this rank's shards

    train_data, val_data = split(corpus())
    ctx = 64
    bar = tqdm(range(args.steps), desc=f"rank {rank}", disable=rank != 0, mininterval=1.0)
    for step in bar:
        # Each rank reads its own quarter of the global batch.
        x, y = batch_at(train_data, args.batch_size * world, ctx, seed=0, step=step)
        x, y = x.chunk(world)[rank].to(dev), y.chunk(world)[rank].to(dev)
        opt.zero_grad(set_to_none=True)
        loss = lm_loss(model(x), y)
        loss.backward()
        model.clip_grad_norm_(1.0)
        opt.step()  # not xm.optimizer_step: the gradients were already reduce-scattered
        xm.mark_step()
        if step % 10 == 0 or step == args.steps - 1:
            bar.set_postfix(loss=f"{loss.item():.3f}")
    # The sharded model's validation loss, for the check after consolidation (every rank runs
    # the forward: FSDP gathers parameters collectively).
    vx, vy = batch_at(val_data, 32, ctx, seed=1, step=0)
    with torch.no_grad():
        val_loss = lm_loss(model(vx.to(dev)), vy.to(dev)).item()
    if rank == 0:
        with open(prefix + "_val_loss.txt", "w") as f:
            f.write(repr(val_loss))

    ckpt = {"model": model.state_dict(), "shard_metadata": model.get_shard_metadata(),
            "optimizer": opt.state_dict()}
    xm.save(ckpt, f"{prefix}_rank-{rank:08d}-of-{world:08d}.pth", master_only=False)
    xm.rendezvous("saved")


def main(argv=None):
    args = parse_args(argv)
    import torch

    import torch_spmd.distributed.xla_multiprocessing as xmp
    from torch_spmd.distributed.fsdp import consolidate_sharded_model_checkpoints
    from tiny_gpt import batch_at, corpus, lm_loss, split

    ckpt_dir = args.ckpt_dir or tempfile.mkdtemp(prefix="fsdp_nested_")
    prefix = os.path.join(ckpt_dir, "final_ckpt")
    xmp.spawn(train, args=(args, prefix), nprocs=args.nprocs)

    full_sd, path = consolidate_sharded_model_checkpoints(prefix, "_rank-*-of-*.pth")
    model = build_model(args)
    model.load_state_dict(full_sd, strict=True)  # the plain GPT: no FSDP anywhere
    _, val = split(corpus())
    x, y = batch_at(val, 32, 64, seed=1, step=0)
    with torch.no_grad():
        val_loss = lm_loss(model(x), y).item()
    with open(prefix + "_val_loss.txt") as f:
        sharded_loss = float(f.read())
    print(f"consolidated checkpoint: {path}")
    print(f"{args.nprocs} processes, ZeRO-3 + checkpointing, {args.steps} steps: validation loss "
          f"{sharded_loss:.4f} (sharded model), {val_loss:.4f} (consolidated, on CPU)")
    assert abs(val_loss - sharded_loss) <= 1e-4 * max(1.0, abs(val_loss)), (val_loss, sharded_loss)


if __name__ == "__main__":
    main()
