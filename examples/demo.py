"""torch_spmd demo: a small MLP learns a task on an emulated 8-device pod, next to the same
model trained on CPU.

The model is sharded two ways at once on a ('data', 'model') mesh: the batch over 'data' (data
parallel) and the two linear layers Megatron-style over 'model' (the first by output features,
the second by input features). torch_spmd propagates those annotations through the forward,
backward and Adam step, inserts the collectives they need, and runs one program per device.
The losses match CPU eager to float rounding and fall as the model learns; the report at the
end shows what the sharded run did: each parameter's sharding, the step's collectives and the
bytes they move, and each device's memory.

    scripts/demo.sh [--steps N] [--devices N]
"""
import argparse
import copy

import torch

import torch_spmd
import torch_spmd.core.xla_model as xm
import torch_spmd.debug.metrics as met
import torch_spmd.distributed.spmd as xs
import torch_spmd.runtime as xr

try:
    from tqdm import tqdm
except ImportError:  # the bar is a nicety
    tqdm = None


def make_task(n_samples: int, d_in: int, n_classes: int):
    """Points labelled by a fixed random 'teacher' network: learnable, not memorizable noise."""
    g = torch.Generator().manual_seed(1234)
    teacher = torch.nn.Sequential(torch.nn.Linear(d_in, 64), torch.nn.Tanh(),
                                  torch.nn.Linear(64, n_classes))
    for p in teacher.parameters():
        p.data = torch.randn(p.shape, generator=g)
    x = torch.randn(n_samples, d_in, generator=g)
    with torch.no_grad():
        y = teacher(x).argmax(1)
    return x, y


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--devices", type=int, default=None,
                    help="emulated devices (default: SPMD_NUM_DEVICES or 8); must be even")
    ap.add_argument("--report", metavar="PATH",
                    help="write an HTML report of the last training step (shardings, "
                         "collectives per module, memory timeline) to PATH")
    args = ap.parse_args()
    if args.devices is not None:
        xr.configure_devices(args.devices)
    torch.manual_seed(0)
    torch.set_num_threads(2)

    dev = torch.device("spmd")
    n = xr.global_runtime_device_count()
    if n % 2:
        raise SystemExit(f"the demo's mesh is (n/2, 2): needs an even device count, got {n}")
    mesh = xs.Mesh(list(range(n)), (n // 2, 2), ("data", "model"))

    d_in, hidden, n_classes = 32, 256, 10
    x_all, y_all = make_task(4096, d_in, n_classes)
    cpu_model = torch.nn.Sequential(torch.nn.Linear(d_in, hidden), torch.nn.ReLU(),
                                    torch.nn.Linear(hidden, n_classes))
    model = copy.deepcopy(cpu_model).to(dev)
    # Megatron MLP: column-parallel, then row-parallel; the batch is data parallel.
    xs.mark_sharding(model[0].weight, mesh, ("model", None))
    xs.mark_sharding(model[0].bias, mesh, ("model",))
    xs.mark_sharding(model[2].weight, mesh, (None, "model"))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    cpu_opt = torch.optim.Adam(cpu_model.parameters(), lr=3e-3)
    loss_fn = torch.nn.CrossEntropyLoss()

    print(f"torch {torch.__version__}, device {dev}: {n} emulated devices on mesh "
          f"{dict(mesh.shape())}")
    rows = []
    steps = range(args.steps)
    bar = tqdm(steps, desc="training", unit="step", ncols=90) if tqdm else steps
    for step in bar:
        idx = torch.randint(0, x_all.shape[0], (args.batch,))
        x, y = x_all[idx], y_all[idx]
        xd, yd = x.to(dev), y.to(dev)
        xs.mark_sharding(xd, mesh, ("data", None))
        xs.mark_sharding(yd, mesh, ("data",))

        opt.zero_grad()
        loss = loss_fn(model(xd), yd)
        loss.backward()
        opt.step()
        xm.mark_step()

        cpu_opt.zero_grad()
        cpu_loss = loss_fn(cpu_model(x), y)
        cpu_loss.backward()
        cpu_opt.step()

        a, b = loss.item(), cpu_loss.item()
        rows.append((step, a, b))
        if tqdm:
            bar.set_postfix(spmd=f"{a:.4f}", cpu=f"{b:.4f}")

    print(f"\n{'step':>5}  {'spmd loss':>10}  {'cpu loss':>10}  {'|diff|':>9}")
    every = max(1, len(rows) // 10)
    for step, a, b in rows[::every] + ([rows[-1]] if (len(rows) - 1) % every else []):
        print(f"{step:>5}  {a:>10.5f}  {b:>10.5f}  {abs(a - b):>9.1e}")
    with torch.no_grad():
        xd = x_all.to(dev)
        xs.mark_sharding(xd, mesh, ("data", None))
        acc = (model(xd).argmax(1).cpu() == y_all).float().mean().item()
    print(f"accuracy on all {len(y_all)} points: {acc:.3f} "
          f"(chance {1 / n_classes:.2f})")

    print(f"\nmesh {dict(mesh.shape())}, devices {mesh.device_ids.tolist()}")
    print("parameter shardings:")
    for name, p in model.named_parameters():
        spec = torch_spmd._C._get_sharding_spec(p) or "{replicated}"
        print(f"  {name:<10} {str(tuple(p.shape)):<11} {spec}")

    # One more training step, to report exactly what a step does.
    idx = torch.randint(0, x_all.shape[0], (args.batch,))
    xd, yd = x_all[idx].to(dev), y_all[idx].to(dev)
    xs.mark_sharding(xd, mesh, ("data", None))
    xs.mark_sharding(yd, mesh, ("data",))
    opt.zero_grad()
    loss_fn(model(xd), yd).backward()
    opt.step()
    xm.mark_step()
    stats = torch_spmd.debug.last_step_stats()
    kinds = {}
    for c in stats["collectives"]:
        k = kinds.setdefault(c["kind"], [0, 0])
        k[0] += 1
        k[1] += c["bytes"]
    print("collectives in one training step (bytes per device):")
    for kind, (count, nbytes) in sorted(kinds.items()):
        print(f"  {kind:<18} x{count:<3} {fmt_bytes(nbytes)}")
    print(f"FLOPs per device per step: {stats['flops_per_device']:.3g}")
    print("memory per device (in use / peak):")
    for d in range(n):
        info = xm.get_memory_info(d)
        print(f"  device {d}: {fmt_bytes(info['bytes_used']):>10} / "
              f"{fmt_bytes(info['peak_bytes_used']):>10}")
    print(f"compiles: {met.counter_value('UncachedCompile')} uncached, "
          f"{met.counter_value('CachedCompile')} cached (steady-state steps reuse one program)")
    if args.report:
        torch_spmd.debug.report(args.report, model=model, title="demo: Megatron + data parallel MLP")
        print(f"report: {args.report}")


if __name__ == "__main__":
    main()
