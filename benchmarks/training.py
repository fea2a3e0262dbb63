"""Training-step benchmark: per-device peak memory, FLOPs per device and model-FLOPs
utilization, for one GPT under several shardings, measured side by side in one run.

What transfers to a real pod is per-device: peak memory (measured by the emulated devices'
accounting, and the static estimate of the partitioned program), FLOPs per device and the
collectives. Step time here is host time: the 8 emulated devices share this machine's cores,
so "host MFU" (model FLOPs of the step / step time / the host's measured matmul peak) measures
the emulator, not a pod. MFU follows the PyTorch/XLA SPMD post: 6 * tokens * parameters.

    PYTHONPATH=. /usr/bin/python3 benchmarks/training.py [--write]
"""
import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from bench_model import GPT, GPTConfig, sharding_plan, spmd_train_step  # noqa: E402

CFG = GPTConfig(layers=4, dim=128, heads=4, seq=64, vocab=256, batch=32)
STRATEGIES = (("1 device", "none", (1,)), ("data parallel", "dp", (8,)),
              ("FSDP", "fsdp", (8,)), ("Megatron TP", "megatron", (8,)),
              ("2-D fsdp x tensor", "2d", (4, 2)))


def host_matmul_peak(threads: int) -> float:
    """FLOP/s of a large fp32 matmul on this host (the emulator's compute ceiling)."""
    import torch
    torch.set_num_threads(threads)
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    a @ b
    best = 0.0
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(4):
            a @ b
        best = max(best, 4 * 2 * 1024 ** 3 / (time.perf_counter() - start))
    return best


def measure(strategy: str, mesh_shape) -> dict:
    import numpy as np
    import torch
    import torch_spmd
    import torch_spmd.core.xla_model as xm
    import torch_spmd.distributed.spmd as xs
    from torch_spmd import _C

    threads = os.cpu_count() or 1
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    dev = torch_spmd.device()
    n = int(np.prod(mesh_shape))
    names = {"none": ("data",), "dp": ("data",), "fsdp": ("fsdp",), "megatron": ("model",),
             "2d": ("fsdp", "model")}[strategy]
    mesh = xs.Mesh(np.arange(n), tuple(mesh_shape), names)
    model = GPT(CFG).to(dev)
    if strategy != "none":
        for name, p in model.named_parameters():
            spec = sharding_plan(strategy, model).get(name)
            if spec is not None:
                xs.mark_sharding(p, mesh, spec)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    batch_axis = {"none": None, "dp": "data", "fsdp": "fsdp", "megatron": None, "2d": "fsdp"}[strategy]

    def step():
        tokens = torch.randint(0, CFG.vocab, (CFG.batch, CFG.seq + 1))
        return spmd_train_step(model, opt, tokens, mesh, batch_axis)

    for _ in range(3):  # compile, warm up
        step()
    _C._reset_peak_memory()
    times = []
    for _ in range(3):
        start = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - start)
    loss.item()
    stats = torch_spmd.debug.last_step_stats()
    params = sum(p.numel() for p in model.parameters())
    tokens = CFG.batch * CFG.seq
    step_time = min(times)
    model_flops = 6 * tokens * params
    return {
        "devices": n,
        "params": params,
        "model_flops": model_flops,
        "flops_per_device": stats["flops_per_device"],
        "peak_measured": max(xm.get_memory_info(d)["peak_bytes_used"] for d in range(n)),
        "peak_static": stats["peak_bytes_per_device"],
        "resident": max(xm.get_memory_info(d)["bytes_used"] for d in range(n)),
        "step_s": step_time,
        "host_mfu": model_flops / step_time / host_matmul_peak(threads),
        "collectives": len(stats["collectives"]),
    }


def run(strategy, mesh_shape) -> dict:
    n = 1
    for s in mesh_shape:
        n *= s
    env = dict(os.environ, SPMD_NUM_DEVICES=str(n))
    cmd = [sys.executable, __file__, "--child", strategy, json.dumps(list(mesh_shape))]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child[0], json.loads(args.child[1]))))
        return
    rows = [(label, mesh, run(strategy, mesh)) for label, strategy, mesh in STRATEGIES]
    base = rows[0][2]
    lines = [
        "| sharding | mesh | resident bytes/device | peak bytes/device (measured) | peak (static estimate) "
        "| peak vs 1 device | GFLOP/device/step | collectives | host step (s) | host MFU |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label, mesh, r in rows:
        lines.append(
            f"| {label} | {tuple(mesh)} | {r['resident']:,} | {r['peak_measured']:,} | {r['peak_static']:,} | "
            f"{r['peak_measured'] / base['peak_measured']:.2f}x | {r['flops_per_device'] / 1e9:.3f} | "
            f"{r['collectives']} | {r['step_s']:.3f} | {r['host_mfu'] * 100:.1f}% |")
    table = "\n".join(lines)
    print(table)
    if args.write:
        from common.docs import write_section
        body = (f"`benchmarks/training.py`: a {CFG.layers}-layer GPT (d={CFG.dim}, {CFG.heads} heads, "
                f"seq {CFG.seq}, vocab {CFG.vocab}, {rows[0][2]['params']:,} parameters), batch "
                f"{CFG.batch}, Adam; steady-state step (best of 3). Resident: bytes each device "
                "holds between steps (parameters and optimizer state); peak: during the step. "
                "Host MFU = 6·tokens·params / step time / this host's fp32 matmul peak; the "
                "emulated devices share the host's cores, so it measures the emulator, not a "
                "pod.\n\n" + table)
        write_section(os.path.join(os.path.dirname(__file__), "..", "docs", "benchmarks.md"),
                      "Training step: memory per device and FLOPs (issue: training at pod scale)",
                      body)


if __name__ == "__main__":
    main()
