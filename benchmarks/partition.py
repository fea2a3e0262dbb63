"""Partitioner benchmark, measured side by side in one run.

1. Compile time of a 12-layer transformer training step (forward, backward, Adam) partitioned
   2-D (fsdp x tensor) over 8 and 64 emulated devices: the CompileTime of the steady-state step
   (propagation, partitioning, lowering).
2. Collective bytes per step for data parallel, FSDP, Megatron tensor parallel and 2-D
   (fsdp x tensor), next to the ring formulas for the same step: all-reduce moves 2(n-1)/n*S per
   device, all-gather and reduce-scatter (n-1)/n*S, where S is the full tensor. "measured"
   applies those formulas to the collectives the partitioner actually inserted
   (last_step_stats); "expected" is the model-level analysis of each strategy, from parameter
   and activation sizes alone. The ratio should be 1.00.

    PYTHONPATH=. /usr/bin/python3 benchmarks/partition.py [--write]
"""
import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
from bench_model import GPT, GPTConfig, sharding_plan  # noqa: E402
from common.docs import write_section  # noqa: E402


def ring_bytes(c) -> float:
    """Bytes one device sends for collective `c` (its input buffer is c['bytes'])."""
    n, b = c["group_size"], c["bytes"]
    if n <= 1:
        return 0.0
    kind = c["kind"]
    if kind == "all-reduce":
        return 2 * (n - 1) / n * b
    if kind == "all-gather":        # input is a shard: the full tensor is n * b
        return (n - 1) * b
    if kind in ("reduce-scatter", "all-to-all"):
        return (n - 1) / n * b
    return float(b)                 # collective-permute


def expected_bytes(strategy, model, cfg, mesh_shape) -> float:
    """The strategy's collective volume per device, from the model's sizes."""
    fl = 4  # float32
    params = dict(model.named_parameters())
    act = cfg.batch * cfg.seq * cfg.dim * fl  # one [B, S, D] activation
    if strategy == "dp":
        n = mesh_shape[0]
        return sum(2 * (n - 1) / n * p.numel() * fl for p in params.values())
    if strategy == "megatron":
        n = mesh_shape[0]
        # Per block: forward all-reduces after the attention output and the second MLP linear,
        # backward all-reduces of the gradients entering the qkv and first MLP linears.
        return cfg.layers * 4 * 2 * (n - 1) / n * act
    if strategy == "fsdp":
        n = mesh_shape[0]
        total = 0.0
        for name, p in params.items():
            # Gathered for forward; again for backward where the backward reads the parameter
            # (linear and layer-norm weights, layer-norm biases); the gradient reduce-scattered.
            gathers = 2 if GPT.used_in_backward(name) else 1
            total += (gathers + 1) * (n - 1) / n * p.numel() * fl
        return total
    if strategy == "2d":
        f, m = mesh_shape
        total = cfg.layers * 4 * 2 * (m - 1) / m * act / f
        plan = sharding_plan("2d", model)
        for name, p in params.items():
            spec = plan.get(name, ())
            model_tiles = m if "model" in spec else 1
            gathers = 2 if GPT.used_in_backward(name) else 1
            if "fsdp" in spec:
                total += (gathers + 1) * (f - 1) / f * p.numel() * fl / model_tiles
            else:  # replicated over fsdp: its gradient is all-reduced over fsdp
                total += 2 * (f - 1) / f * p.numel() * fl / model_tiles
        return total
    raise ValueError(strategy)


def run_strategy(strategy: str, mesh_shape, cfg: GPTConfig, steps: int = 3) -> dict:
    """Trains `steps` steps under `strategy`; returns compile time and collective volumes."""
    import numpy as np
    import torch
    import torch_spmd
    import torch_spmd.core.xla_model as xm
    import torch_spmd.debug.metrics as met
    import torch_spmd.distributed.spmd as xs

    torch.manual_seed(0)
    torch.set_num_threads(1)
    dev = torch_spmd.device()
    names = {"dp": ("data",), "fsdp": ("fsdp",), "megatron": ("model",), "2d": ("fsdp", "model")}
    n = int(np.prod(mesh_shape))
    mesh = xs.Mesh(np.arange(n), tuple(mesh_shape), names[strategy])
    model = GPT(cfg).to(dev)
    for name, p in model.named_parameters():
        spec = sharding_plan(strategy, model).get(name)
        if spec is not None:
            xs.mark_sharding(p, mesh, spec)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    batch_axis = {"dp": "data", "fsdp": "fsdp", "megatron": None, "2d": "fsdp"}[strategy]
    met.clear_all()
    compile_times = []
    for step in range(steps):
        tokens = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq + 1))
        x, y = tokens[:, :-1].to(dev), tokens[:, 1:].to(dev)
        if batch_axis:
            xs.mark_sharding(x, mesh, (batch_axis, None))
            xs.mark_sharding(y, mesh, (batch_axis, None))
        before = met.metric_data("CompileTime")
        loss = model.loss(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        xm.mark_step()
        after = met.metric_data("CompileTime")
        if after and (not before or after[0] > before[0]):
            compile_times.append(after[2][-1])
    stats = torch_spmd.debug.last_step_stats()
    measured = sum(ring_bytes(c) for c in stats["collectives"])
    kinds = {}
    for c in stats["collectives"]:
        kinds[c["kind"]] = kinds.get(c["kind"], 0) + 1
    return {
        "strategy": strategy,
        "mesh": list(mesh_shape),
        "devices": n,
        "compile_s": compile_times[-1] if compile_times else None,
        "uncached": met.counter_value("UncachedCompile"),
        "measured_bytes": measured,
        "expected_bytes": expected_bytes(strategy, model, cfg, mesh_shape),
        "collectives": kinds,
        "fallbacks": stats["replicated_fallback_ops"],
        "peak_bytes": stats["peak_bytes_per_device"],
        "loss": loss.item(),
    }


def child(args) -> None:
    cfg = GPTConfig(**json.loads(args.config))
    print(json.dumps(run_strategy(args.strategy, json.loads(args.mesh), cfg)))


def spawn(strategy, mesh_shape, cfg: GPTConfig) -> dict:
    n = 1
    for s in mesh_shape:
        n *= s
    env = dict(os.environ, SPMD_NUM_DEVICES=str(n))
    cmd = [sys.executable, __file__, "--child", "--strategy", strategy,
           "--mesh", json.dumps(list(mesh_shape)), "--config", json.dumps(cfg.__dict__)]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--strategy", help=argparse.SUPPRESS)
    parser.add_argument("--mesh", help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    if args.child:
        return child(args)

    compile_rows = []
    for mesh_shape, heads, batch in (((4, 2), 2, 16), ((16, 4), 4, 32)):
        cfg = GPTConfig(layers=12, dim=64, heads=heads, seq=32, vocab=64, batch=batch)
        r = spawn("2d", mesh_shape, cfg)
        compile_rows.append(r)
    volume_rows = []
    cfg = GPTConfig(layers=2, dim=64, heads=2, seq=32, vocab=64, batch=32)
    for strategy, mesh_shape in (("dp", (8,)), ("fsdp", (8,)), ("megatron", (8,)), ("2d", (4, 2))):
        c = cfg if strategy != "megatron" else GPTConfig(**dict(cfg.__dict__, heads=8))
        volume_rows.append(spawn(strategy, mesh_shape, c))

    lines = ["| model | mesh (fsdp, model) | devices | compile time of the training step (s) | collectives per step | fallbacks |",
             "|---|---|---:|---:|---:|---|"]
    for r in compile_rows:
        lines.append(f"| 12-layer GPT, d=64 | {tuple(r['mesh'])} | {r['devices']} | {r['compile_s']:.2f} | "
                     f"{sum(r['collectives'].values())} | {r['fallbacks'] or 'none'} |")
    compile_table = "\n".join(lines)
    lines = ["| strategy | mesh | collectives per step | measured bytes/device | ring-formula bytes/device | ratio |",
             "|---|---|---|---:|---:|---:|"]
    for r in volume_rows:
        ratio = r["measured_bytes"] / r["expected_bytes"]
        kinds = ", ".join(f"{v} {k}" for k, v in sorted(r["collectives"].items()))
        lines.append(f"| {r['strategy']} | {tuple(r['mesh'])} | {kinds} | {r['measured_bytes']:.0f} | "
                     f"{r['expected_bytes']:.0f} | {ratio:.2f} |")
    volume_table = "\n".join(lines)
    print(compile_table)
    print()
    print(volume_table)
    if args.write:
        body = ("`benchmarks/partition.py`. Compile time: the steady-state training step (forward, "
                "backward, Adam) of a 12-layer GPT (d=64, seq 32), 2-D sharded "
                "(Megatron specs on 'model', FSDP on 'fsdp', batch on 'fsdp'); CompileTime covers "
                "propagation, partitioning and lowering.\n\n" + compile_table +
                "\n\nCollective volume per training step of a 2-layer GPT (d=64, seq 32, batch 32) "
                "on 8 devices. *measured*: the ring formulas (all-reduce 2(n-1)/n·S, all-gather and "
                "reduce-scatter (n-1)/n·S) applied to the collectives the partitioner inserted; "
                "*expected*: the same formulas applied to the strategy's textbook communication "
                "(DP: one all-reduce per gradient; FSDP: parameters gathered for forward and, where "
                "the backward reads them, for backward, gradients reduce-scattered; Megatron: 4 "
                "activation all-reduces per block; 2-D: both, over their axes).\n\n" + volume_table)
        write_section(os.path.join(os.path.dirname(__file__), "..", "docs", "benchmarks.md"),
                      "Partitioning (issue: propagation and partitioner)", body)


if __name__ == "__main__":
    main()
