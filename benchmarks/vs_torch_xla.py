"""Step time of one PyTorch/XLA SPMD training script on the real PyTorch/XLA 2.9 (CPU) and on
torch_spmd, side by side in one run.

The script is written against PyTorch/XLA's API (torch_xla.core.xla_model,
torch_xla.distributed.spmd, torch_xla.runtime); torch_spmd runs it unmodified through
torch_spmd.xla.install(). The model is step_time.py's GPT (4 layers, d=128, seq 64, batch 64),
Adam, trained on the same batches from the same parameters:
- 1 device (no SPMD);
- data parallel over 8 devices (the batch sharded, parameters replicated);
- FSDP over 8 devices (every parameter's dim 0 and the batch sharded);
each lazy and compiled (`torch.compile(model.loss, backend="openxla")`). Seconds per step
from host batch to the loss on the host (mark_step, then loss.item()): the median of 10 steps
after 3 warm-up steps; "first step" is the first step's time (tracing and compiling included).
Losses are compared between the two implementations.

Real PyTorch/XLA lives in a throw-away venv (never a dependency of torch_spmd):
    python3 -m venv /tmp/xlavenv && /tmp/xlavenv/bin/pip install torch==2.9.0 torch_xla==2.9.0 numpy
    PYTHONPATH=. .venv/bin/python benchmarks/vs_torch_xla.py [--xla-python /tmp/xlavenv/bin/python] [--write]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CONFIGS = [("1 device", 1, "none"), ("data parallel, 8 devices", 8, "dp"),
           ("FSDP, 8 devices", 8, "fsdp")]
WARMUP, STEPS = 3, 10


def child(impl: str, devices: int, strategy: str, compiled: bool) -> dict:
    if impl == "torch_spmd":
        import torch_spmd.xla
        torch_spmd.xla.install()
    import numpy as np
    import torch
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_model import GPT, GPTConfig, sharding_plan

    torch.set_num_threads(2)
    cfg = GPTConfig(layers=4, dim=128, heads=4, seq=64, vocab=256, batch=64)
    if strategy != "none":
        xr.use_spmd()
    dev = torch_xla.device()
    torch.manual_seed(0)
    model = GPT(cfg).to(dev)
    mesh = None
    if strategy != "none":
        n = xr.global_runtime_device_count()
        mesh = xs.Mesh(np.arange(n), (n,), ("fsdp",))
        plan = sharding_plan(strategy, model)
        for name, p in model.named_parameters():
            if name in plan:
                xs.mark_sharding(p, mesh, plan[name])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = torch.compile(model.loss, backend="openxla") if compiled else model.loss
    tokens = torch.randint(0, cfg.vocab, (WARMUP + STEPS, cfg.batch, cfg.seq + 1),
                           generator=torch.Generator().manual_seed(0))
    times, losses = [], []
    for tok in tokens:
        start = time.perf_counter()
        x, y = tok[:, :-1].to(dev), tok[:, 1:].to(dev)
        if mesh is not None:
            xs.mark_sharding(x, mesh, ("fsdp", None))
            xs.mark_sharding(y, mesh, ("fsdp", None))
        loss = loss_fn(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        xm.mark_step()
        losses.append(loss.item())
        times.append(time.perf_counter() - start)
    return {"first": times[0], "step": statistics.median(times[WARMUP:]), "losses": losses,
            "devices": devices}


def run_child(python: str, impl: str, devices: int, strategy: str, compiled: bool) -> dict:
    env = dict(os.environ, PJRT_DEVICE="CPU", CPU_NUM_DEVICES=str(devices),
               SPMD_NUM_DEVICES=str(devices), OMP_NUM_THREADS="2")
    if impl == "torch_xla":  # (its own venv's torch: nothing of ours on the path)
        env.pop("PYTHONPATH", None)
    args = [python, os.path.abspath(__file__), "--child", impl, str(devices), strategy,
            "compiled" if compiled else "lazy"]
    out = subprocess.run(args, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{impl} {strategy} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def report(rows) -> str:
    lines = ["| script | PyTorch/XLA 2.9 s/step | torch_spmd s/step | PyTorch/XLA / torch_spmd "
             "| first step: PyTorch/XLA | first step: torch_spmd | losses (13 steps) |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for name, xla, ours in rows:
        worst = max(abs(a - b) / abs(b) for a, b in zip(ours["losses"], xla["losses"]))
        lines.append(f"| {name} | {xla['step']:.4f} | {ours['step']:.4f} | "
                     f"{xla['step'] / ours['step']:.2f}x | {xla['first']:.2f} s | "
                     f"{ours['first']:.2f} s | max rel. diff {worst:.1e} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--xla-python", default="/tmp/xlavenv/bin/python",
                        help="a Python with torch==2.9.0 and torch_xla==2.9.0")
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    if args.child:
        impl, devices, strategy, mode = args.child
        print(json.dumps(child(impl, int(devices), strategy, mode == "compiled")))
        return
    if not os.path.exists(args.xla_python):
        sys.exit(f"{args.xla_python} not found: make the venv as this script's docstring says")
    rows = []
    for compiled in (False, True):
        for name, devices, strategy in CONFIGS:
            label = name + (", compiled (openxla)" if compiled else "")
            xla = run_child(args.xla_python, "torch_xla", devices, strategy, compiled)
            ours = run_child(sys.executable, "torch_spmd", devices, strategy, compiled)
            rows.append((label, xla, ours))
            print(report(rows[-1:]).splitlines()[-1], flush=True)
    table = report(rows)
    print(table)
    if args.write:
        import torch
        from common.docs import write_section
        body = (
            "`benchmarks/vs_torch_xla.py`: one PyTorch/XLA SPMD training script (step_time.py's "
            "GPT: 4 layers, d=128, seq 64, batch 64, Adam) run by the real PyTorch/XLA 2.9.0 on "
            "CPU (`PJRT_DEVICE=CPU`, its own venv, torch 2.9.0) and unmodified by torch_spmd "
            f"(torch_spmd.xla.install(), torch {torch.__version__}), side by side in one run on "
            "2 cores. Seconds per step from host batch to the loss on the host, median of 10 "
            "steps after 3 warm-up steps; first step: tracing and compiling included. Ratio "
            "above 1: torch_spmd is faster.\n\n" + table)
        write_section(os.path.join(os.path.dirname(__file__), "..", "docs", "benchmarks.md"),
                      "Against the real PyTorch/XLA on CPU (issue 27)", body)


if __name__ == "__main__":
    main()
