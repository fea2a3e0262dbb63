"""2-D sharding: a tiny GPT-2-style byte-level LM on an ('fsdp', 'tensor') mesh.

Megatron-style tensor parallelism over 'tensor' (attention heads and MLP hidden units split;
see ``tiny_gpt.megatron_spec``) combined with FSDP over 'fsdp' (each weight's other dim split,
and the batch split along 'fsdp'). Parameters and inputs are annotated, plus a few activation
hints that pin the Megatron layouts inside each block (``tiny_gpt.annotate_2d_activations``,
off with ``--no-activation-hints``); the partitioner propagates the rest and inserts the
collectives. The corpus is the source of two Python standard-library modules, read offline.

  PYTHONPATH=. python3 examples/train_gpt_2d.py                # (4, 2) mesh, ~1 minute
  PYTHONPATH=. python3 examples/train_gpt_2d.py --tensor 4     # (2, 4) mesh
"""
import argparse
import os
import sys
import time

from tiny_gpt import add_model_args, report_final_loss, validation_loss  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_args(p, steps=250)
    p.add_argument("--tensor", type=int, default=2, help="size of the 'tensor' mesh axis")
    p.add_argument("--no-activation-hints", action="store_true",
                   help="annotate parameters and inputs only (see annotate_2d_activations)")
    p.add_argument("--report", metavar="PATH",
                   help="write an HTML report of the last training step to PATH")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.devices:  # read by torch_spmd when it creates the devices, so set it before
        os.environ["SPMD_NUM_DEVICES"] = str(args.devices)

    import numpy as np
    import torch
    from tqdm import tqdm

    import torch_spmd
    import torch_spmd.core.xla_model as xm
    import torch_spmd.distributed.spmd as xs
    import torch_spmd.runtime as xr

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from tiny_gpt import (GPT, GPTConfig, annotate_2d_activations, batch_at, corpus, lm_loss,
                          shard_2d, split)

    torch.manual_seed(args.seed)
    xr.use_spmd()
    dev = torch_spmd.device()
    n = xr.global_runtime_device_count()
    assert n % args.tensor == 0, f"--tensor {args.tensor} must divide the {n} devices"
    assert args.n_head % args.tensor == 0, "the heads must split evenly over 'tensor'"
    mesh = xs.Mesh(np.arange(n), (n // args.tensor, args.tensor), ("fsdp", "tensor"))
    input_sharding = xs.ShardingSpec(mesh, ("fsdp", None))  # batch over fsdp

    cfg = GPTConfig(block_size=args.block_size, n_layer=args.n_layer, n_head=args.n_head,
                    n_embd=args.n_embd)
    model = GPT(cfg).to(dev)
    shard_2d(model, mesh)
    if not args.no_activation_hints:
        annotate_2d_activations(model, mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    train_data, val_data = split(corpus())
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{n} emulated devices, mesh {dict(mesh.shape())}; GPT {n_params / 1e3:.1f}K params")
    for name in ("blocks.0.attn.q.weight", "blocks.0.attn.proj.weight", "blocks.0.mlp.fc.weight",
                 "blocks.0.mlp.proj.weight", "wte.weight", "head.weight"):
        param = dict(model.named_parameters())[name]
        print(f"  {name:<28} {str(tuple(param.shape)):<10} {xs.get_sharding_spec(param)}")

    losses = []
    t0 = time.time()
    bar = tqdm(range(args.steps), desc="train", unit="step")
    for step in bar:
        x, y = batch_at(train_data, args.batch_size, args.block_size, args.seed, step)
        xb, yb = xm.send_cpu_data_to_device((x, y), dev, input_sharding=input_sharding)
        opt.zero_grad()
        loss = lm_loss(model(xb), yb)
        loss.backward()
        opt.step()
        xm.mark_step()
        losses.append(loss.item())
        if step % 10 == 0:
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
    bar.close()
    stats = torch_spmd.debug.last_step_stats()
    if args.report:  # the last training step (validation runs other steps)
        torch_spmd.debug.report(args.report, model=model, title="2-D GPT (fsdp x tensor)")
    kinds = {}
    for c in stats["collectives"]:
        key = f"{c['kind']}{c['axes']}"
        kinds[key] = kinds.get(key, 0) + 1
    moved = sum(c["bytes"] for c in stats["collectives"])

    val_loss = validation_loss(model, val_data, args, dev, input_sharding)
    print(f"{len(losses)} steps in {time.time() - t0:.1f}s; collectives per training step "
          f"(kind[axes]): {kinds}, {moved / 2**20:.2f} MiB per device; peak "
          f"{stats['peak_bytes_per_device'] / 2**20:.2f} MiB per device")
    recent = report_final_loss(losses, val_loss)
    return recent, val_loss


if __name__ == "__main__":
    main()
