"""Limits (issue 51): a host allocation over an address-space limit (RLIMIT_AS) fails the step
with the allocator's error and keeps every other tensor; a long run of a sharded model keeps the
process's memory, open files and compile cache flat. Each in its own process (the limits apply
to the whole process). SPMD_SOAK_STEPS sets the soak's length (2,000 by default; 10,000 were
run for the closing note of issue 51)."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow  # processes

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SOAK_STEPS = int(os.environ.get("SPMD_SOAK_STEPS", "2000"))


def _run(script, *args, **env):
    full = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
                SPMD_NUM_DEVICES="8", OMP_NUM_THREADS="1", **env)
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(script), *map(str, args)],
                       env=full, capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_an_allocation_over_the_address_space_limit_fails_the_step_only():
    out = _run("""
        import json, resource, torch
        import torch_spmd, torch_spmd.runtime as xr, torch_spmd.core.xla_model as xm
        xr.use_spmd()
        dev = torch_spmd.device()
        keep = (torch.arange(64.) * 3).to(dev)
        xm.mark_step()
        vm = int([l for l in open("/proc/self/status") if l.startswith("VmSize")][0].split()[1])
        resource.setrlimit(resource.RLIMIT_AS, (vm * 1024 + (1 << 30), resource.RLIM_INFINITY))
        error = None
        try:
            (torch.ones(1 << 28, device=dev) * 2).sum().item()   # 1 GiB on each of 8 devices
        except RuntimeError as e:
            error = str(e)
        print(json.dumps({"error": error,
                          "keep": torch.equal(keep.cpu(), torch.arange(64.) * 3),
                          "after": (keep + 1).sum().item()}))
    """, SPMD_DEVICE_MEMORY="64GiB")  # (the emulated devices would refuse it first)
    assert out["error"] and "can't allocate memory" in out["error"], out
    assert "aten::ones" in out["error"], out  # the op that allocated
    assert out["keep"] and out["after"] == 6112.0, out


def test_a_long_run_keeps_memory_open_files_and_the_compile_cache_flat():
    out = _run("""
        import json, os, sys, numpy as np, torch
        import torch_spmd, torch_spmd.runtime as xr, torch_spmd.core.xla_model as xm
        import torch_spmd.distributed.spmd as xs
        from torch_spmd import _C
        steps = int(sys.argv[1])
        xr.use_spmd()
        dev = torch_spmd.device()
        mesh = xs.Mesh(np.arange(8), (4, 2), ("data", "model"))
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(24, 40), torch.nn.GELU(),
                                    torch.nn.Linear(40, 8)).to(dev)
        xs.mark_sharding(model[0].weight, mesh, ("model", None))
        xs.mark_sharding(model[2].weight, mesh, (None, "model"))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

        def rss():
            return int([l for l in open("/proc/self/status")
                        if l.startswith("VmRSS")][0].split()[1]) * 1024

        marks = {}
        for step in range(1, steps + 1):
            x = torch.randn(16, 24).to(dev)
            xs.mark_sharding(x, mesh, ("data", None))
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            xm.mark_step()
            if step in (steps // 10, steps):
                loss.item()
                marks[step] = {"rss": rss(), "fds": len(os.listdir("/proc/self/fd")),
                               "cache": _C._compile_cache_size()}
        print(json.dumps({"marks": marks, "loss": loss.item()}))
    """, SOAK_STEPS)
    early, late = (out["marks"][str(s)] for s in (SOAK_STEPS // 10, SOAK_STEPS))
    assert late["cache"] == early["cache"], out  # steady state reuses its programs
    assert late["fds"] <= early["fds"], out
    # Memory: no growth with the steps beyond allocator noise (a leak of one step's tensors
    # would add them thousands of times).
    assert late["rss"] - early["rss"] < 32 << 20, out
    print(out)
