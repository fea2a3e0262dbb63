"""FSDPv2: a tiny GPT-2-style byte-level LM trained fully sharded, with resumable checkpoints.

``SpmdFullyShardedDataParallel`` (FSDPv2) shards every parameter along the mesh axis 'fsdp'
(each on its largest dim) and the batch along it too; the partitioner turns that into FSDP's
all-gather-before-use / reduce-scatter-the-gradients schedule. Each transformer block is its
own FSDPv2 unit (``transformer_auto_wrap_policy``). The corpus is the source of two Python
standard-library modules, read offline.

With ``--ckpt-dir`` the run saves sharded checkpoints (``CheckpointManager``, every
``--ckpt-every`` steps, atomically) and resumes from the latest one when started again.

  PYTHONPATH=. python3 examples/train_gpt_fsdpv2.py              # ~1 minute on 2 cores
  PYTHONPATH=. python3 examples/train_gpt_fsdpv2.py --dp 2       # mesh ('data', 'fsdp') = (2, 4)
  PYTHONPATH=. python3 examples/train_gpt_fsdpv2.py --ckpt-dir /tmp/gpt --steps 100
  PYTHONPATH=. python3 examples/train_gpt_fsdpv2.py --ckpt-dir /tmp/gpt --steps 200  # resumes
"""
import argparse
import functools
import os
import sys
import time

from tiny_gpt import add_model_args, report_final_loss, validation_loss  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_args(p, steps=300)
    p.add_argument("--dp", type=int, default=1,
                   help="size of an extra 'data' mesh axis (FSDPv2 extra_data_axis)")
    p.add_argument("--no-auto-wrap", action="store_true",
                   help="one FSDPv2 unit for the whole model instead of one per block")
    p.add_argument("--ckpt-dir", default=None, help="save/resume sharded checkpoints here")
    p.add_argument("--ckpt-every", type=int, default=50)
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
    from torch_spmd.distributed.checkpoint import CheckpointManager, prime_optimizer
    from torch_spmd.experimental.spmd_fully_sharded_data_parallel import (
        SpmdFullyShardedDataParallel as FSDPv2)
    from torch_spmd.distributed.wrap import transformer_auto_wrap_policy

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from tiny_gpt import GPT, Block, GPTConfig, batch_at, corpus, lm_loss, split

    torch.manual_seed(args.seed)
    xr.use_spmd()
    dev = torch_spmd.device()
    n = xr.global_runtime_device_count()
    assert n % args.dp == 0, f"--dp {args.dp} must divide the {n} devices"
    if args.dp > 1:
        mesh = xs.Mesh(np.arange(n), (args.dp, n // args.dp), ("data", "fsdp"))
        batch_axes, extra = ("data", "fsdp"), "data"
    else:
        mesh = xs.Mesh(np.arange(n), (n,), ("fsdp",))
        batch_axes, extra = "fsdp", None
    input_sharding = xs.ShardingSpec(mesh, (batch_axes, None))

    cfg = GPTConfig(block_size=args.block_size, n_layer=args.n_layer, n_head=args.n_head,
                    n_embd=args.n_embd)
    policy = None if args.no_auto_wrap else functools.partial(
        transformer_auto_wrap_policy, transformer_layer_cls={Block})
    model = FSDPv2(GPT(cfg), mesh=mesh, auto_wrap_policy=policy, extra_data_axis=extra)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    train_data, val_data = split(corpus())
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{n} emulated devices, mesh {dict(mesh.shape())}; GPT {n_params / 1e3:.1f}K params, "
          f"{len(train_data)} training bytes; weights sharded over 'fsdp', "
          f"batch over {batch_axes}")

    start, mgr = 0, None
    if args.ckpt_dir:
        mgr = CheckpointManager(args.ckpt_dir, save_interval=args.ckpt_every, max_to_keep=2)
        if mgr.all_steps():
            step = mgr.latest_step()
            prime_optimizer(opt)  # the optimizer state must exist to be loaded in place
            state = {"model": model.state_dict(), "optim": opt.state_dict(), "step": 0}
            mgr.restore(step, state)
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["optim"])
            start = state["step"]
            print(f"resumed from step {start} ({args.ckpt_dir})")

    losses = []
    t0 = time.time()
    bar = tqdm(range(start, args.steps), desc="train", unit="step")
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
        if mgr is not None:
            mgr.save(step + 1, {"model": model.state_dict(), "optim": opt.state_dict(),
                                "step": step + 1})
    bar.close()
    if mgr is not None:
        mgr.join()
    # The FSDP schedule of the last training step: parameter all-gathers, gradient
    # reduce-scatters.
    kinds = {}
    for c in torch_spmd.debug.last_step_stats()["collectives"]:
        kinds[c["kind"]] = kinds.get(c["kind"], 0) + 1

    val_loss = validation_loss(model, val_data, args, dev, input_sharding)
    print(f"{len(losses)} steps in {time.time() - t0:.1f}s; collectives per training step: "
          f"{kinds}")
    recent = report_final_loss(losses, val_loss)
    return recent, val_loss


if __name__ == "__main__":
    main()
