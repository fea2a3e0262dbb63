"""torch_spmd demo: a small MLP trained on the spmd device next to the same model on CPU.

The model runs data-parallel over the emulated 8-device pod (batch sharded on 'data'), so
every step also exercises propagation, partitioning and the gradient all-reduces. Losses are
printed side by side; they agree to float rounding.
"""
import copy

import torch

import torch_spmd
import torch_spmd.core.xla_model as xm
import torch_spmd.debug.metrics as met
import torch_spmd.distributed.spmd as xs
import torch_spmd.runtime as xr


def main(steps: int = 10) -> None:
    torch.manual_seed(0)
    torch.set_num_threads(2)
    dev = torch_spmd.device()
    n = xr.global_runtime_device_count()
    mesh = xs.Mesh(list(range(n)), (n,), ("data",))

    cpu_model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    model = copy.deepcopy(cpu_model).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    cpu_opt = torch.optim.Adam(cpu_model.parameters(), lr=1e-2)

    print(f"spmd device: {dev}, {n} emulated devices, mesh {dict(mesh.shape())}")
    print(f"{'step':>4}  {'spmd loss':>12}  {'cpu loss':>12}  {'|diff|':>10}")
    for step in range(steps):
        x, y = torch.randn(64, 32), torch.randn(64, 8)
        xd, yd = x.to(dev), y.to(dev)
        xs.mark_sharding(xd, mesh, ("data", None))  # data parallel: shard the batch
        xs.mark_sharding(yd, mesh, ("data", None))

        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(xd), yd)
        loss.backward()
        opt.step()
        xm.mark_step()

        cpu_opt.zero_grad()
        cpu_loss = torch.nn.functional.mse_loss(cpu_model(x), y)
        cpu_loss.backward()
        cpu_opt.step()
        a, b = loss.item(), cpu_loss.item()
        print(f"{step:>4}  {a:>12.6f}  {b:>12.6f}  {abs(a - b):>10.2e}")

    stats = torch_spmd.debug.last_step_stats()
    kinds = {}
    for c in stats["collectives"]:
        kinds[c["kind"]] = kinds.get(c["kind"], 0) + 1
    print(f"last step: collectives {kinds}, peak bytes/device {stats['peak_bytes_per_device']}")
    print(f"compiles: {met.counter_value('UncachedCompile')} uncached, "
          f"{met.counter_value('CachedCompile')} cached")


if __name__ == "__main__":
    main()
