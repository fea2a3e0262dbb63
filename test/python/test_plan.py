"""Plan mode (torch_spmd.plan): a step is partitioned and analysed, not run. The analysis is the
same code the executed step reports through, so for models small enough to execute the two
must agree exactly; each comparison runs in a fresh process so no other test's tensors count
as resident."""
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import torch_spmd
import torch_spmd.core.xla_model as xm
import torch_spmd.distributed.spmd as xs
import torch_spmd.plan as plan
from torch_spmd.debug import last_step_stats
from spmd_diff import ensure_devices, mesh_of, step

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module", autouse=True)
def devices():
    ensure_devices()
    yield


def run_script(body: str, env=None) -> dict:
    code = textwrap.dedent("""
        import json, os, copy
        os.environ.setdefault("SPMD_NUM_DEVICES", "8")
        import numpy as np, torch, torch_spmd
        import torch_spmd.core.xla_model as xm
        import torch_spmd.distributed.spmd as xs
        import torch_spmd.plan as plan
        from torch_spmd.debug import last_step_stats
    """) + textwrap.dedent(body)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=ROOT, **(env or {})), timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


SELF_CONSISTENCY = """
    KEYS = ("peak_bytes_per_device", "device_peak_bytes", "resident_bytes_per_device",
            "flops_per_device", "model_flops", "peak_op")

    def summary(stats):
        s = {k: stats[k] for k in KEYS}
        s["collectives"] = [(c["kind"], c["axes"], c["group_size"], c["bytes"])
                            for c in stats["collectives"]]
        return s

    def cpu_params():
        return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Linear(64, 32)).parameters()

    def train(strategy):
        torch.manual_seed(0)
        cpu = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(),
                                  torch.nn.Linear(64, 32))
        mesh = xs.Mesh(np.arange(8), (4, 2), ("data", "model"))
        model = copy.deepcopy(cpu).to("spmd")
        if strategy == "megatron":
            xs.mark_sharding(model[0].weight, mesh, ("model", None))
            xs.mark_sharding(model[0].bias, mesh, ("model",))
            xs.mark_sharding(model[2].weight, mesh, (None, "model"))
        else:  # fsdp-style: parameters on dim 0 over both axes
            for p in model.parameters():
                xs.mark_sharding(p, mesh, (("data", "model"),) + (None,) * (p.dim() - 1))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        x = torch.randn(16, 32).to("spmd")
        xs.mark_sharding(x, mesh, ("data", None))
        xm.mark_step()
        steps = []
        for _ in range(2):
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=False)
            xm.mark_step()
            steps.append(summary(last_step_stats()))
        return steps

    result = {}
    hw = dict(name="test", peak_flops_bf16=1e12, hbm_bytes=16 << 30, hbm_bandwidth=1e11,
              ring_bandwidth=1e10)
    for strategy in ("megatron", "fsdp"):
        with plan.Plan(hardware=hw) as p:
            planned = train(strategy)
            report = p.report()
        import gc; gc.collect()
        executed = train(strategy)
        gc.collect()
        result[strategy] = dict(planned=planned, executed=executed,
                                params=sum(q.numel() for q in cpu_params()),
                                report_peak=report.peak_bytes_per_device[0],
                                report_resident=report.resident_bytes_per_device[0],
                                report_devices=len(report.peak_bytes_per_device))
    print(json.dumps(result))
"""


def test_plan_equals_executed_step_for_small_models():
    result = run_script(SELF_CONSISTENCY)
    for strategy, r in result.items():
        assert r["planned"] == r["executed"], strategy
        last = r["planned"][-1]
        assert last["resident_bytes_per_device"] > 0 and last["flops_per_device"] > 0
        assert last["collectives"], f"{strategy}: a sharded step communicates"
        assert r["report_peak"] == last["device_peak_bytes"]
        assert r["report_resident"] == last["resident_bytes_per_device"]
        assert r["report_devices"] == 8
    # FSDP-style, every parameter split 8 ways: with Adam each device keeps 16 bytes per
    # parameter / 8 (parameter, gradient, two moments: one copy each; an updated parameter's
    # annotated value is not held twice), plus its quarter of the batch and the scalar loss.
    fsdp = result["fsdp"]["executed"][-1]
    assert fsdp["resident_bytes_per_device"] == 16 * result["fsdp"]["params"] // 8 + 16 * 32 * 4 // 4 + 4


def test_reading_planned_data_raises_naming_the_plan():
    mesh = mesh_of((8,))
    hw = dict(peak_flops_bf16=1e12, hbm_bytes=16 << 30, hbm_bandwidth=1e11, ring_bandwidth=1e10)
    with plan.Plan(hardware=hw):
        t = torch.randn(16, 4).to(torch_spmd.device())
        xs.mark_sharding(t, mesh, ("x", None))
        y = (t * 2).sum()
        xm.mark_step()
        assert xs.get_sharding_spec(t) == mesh.get_op_sharding(("x", None))
        for read in (lambda: y.item(), lambda: t.cpu(), lambda: xs.XLAShardedTensor(t).local_shards):
            with pytest.raises(RuntimeError, match=r"holds no data.*torch_spmd\.plan\.Plan"):
                read()
    # Outside the plan the planned tensor still cannot run; a fresh one does, and is right.
    with pytest.raises(RuntimeError, match="holds no data"):
        (t + 1).cpu()
    x = torch.randn(16, 4)
    assert torch.equal((x.to(torch_spmd.device()) * 2).cpu(), x * 2)


def test_plan_2048_devices_reports_every_device():
    out = run_script("""
        import time
        t0 = time.perf_counter()
        with plan.Plan(num_devices=2048, hardware="tpu-v5p", mesh_shape=(256, 8),
                       axis_names=("fsdp", "tensor")) as p:
            mesh = xs.get_global_mesh()
            with torch.device("spmd"):
                w = torch.empty(8192, 8192)
            xs.mark_sharding(w, mesh, ("fsdp", "tensor"))
            x = torch.empty(4096, 8192, device="spmd")
            xs.mark_sharding(x, mesh, ("fsdp", None))
            y = x @ w
            xm.mark_step()
            r = p.report()
        print(json.dumps(dict(n=len(r.peak_bytes_per_device), fits=r.fits,
                              flops=r.flops_per_device, model=r.model_flops,
                              kinds=[c["kind"] for c in r.collectives],
                              devices_after=torch_spmd.runtime.global_runtime_device_count(),
                              seconds=time.perf_counter() - t0, text=str(r))))
    """)
    assert out["n"] == 2048 and out["fits"]
    assert out["model"] == 2 * 4096 * 8192 * 8192
    # x rows over 256 'fsdp' devices, w columns over 8 'tensor' ones: each device computes a
    # 16 x 8192 x 1024 block, after moving w's 'fsdp' tiling off its rows.
    assert out["flops"] == 2 * 16 * 8192 * 1024
    assert out["kinds"]
    assert out["devices_after"] == 8  # restored
    assert "Plan on 2048 x tpu-v5p" in out["text"]


def test_a_step_that_does_not_fit_says_where():
    hw = dict(name="tiny", peak_flops_bf16=1e12, hbm_bytes=1 << 20, hbm_bandwidth=1e11,
              ring_bandwidth=1e10)
    with plan.Plan(hardware=hw) as p:
        a = torch.empty(1024, 1024, device=torch_spmd.device())   # 4 MiB, replicated
        b = (a @ a).relu()
        xm.mark_step()
        r = p.report()
    assert not r.fits
    assert r.peak_bytes_per_device[0] >= 2 * 4 * 1024 * 1024
    assert "does not fit" in r.out_of_memory and str(1 << 20) in r.out_of_memory
    assert r.peak_op in r.out_of_memory
    assert "NO" in str(r)


def test_hardware_presets_and_validation():
    for name in ("tpu-v4", "tpu-v5e", "tpu-v5p", "a100-80gb", "h100-80gb"):
        hw = plan.resolve(name)
        assert hw["peak_flops_bf16"] > 1e13 and hw["hbm_bytes"] > 1e10 and hw["name"] == name
    with pytest.raises(ValueError, match="unknown hardware 'tpu-v9'"):
        plan.Plan(hardware="tpu-v9")
    with pytest.raises(ValueError, match="lacks"):
        plan.Plan(hardware=dict(peak_flops_bf16=1e12))
    with pytest.raises(ValueError, match="num_devices must be a positive int"):
        plan.Plan(num_devices=0)


def test_plans_do_not_nest():
    hw = dict(peak_flops_bf16=1e12, hbm_bytes=16 << 30, hbm_bandwidth=1e11, ring_bandwidth=1e10)
    with plan.Plan(hardware=hw):
        with pytest.raises(RuntimeError, match="plans do not nest"):
            with plan.Plan(hardware=hw):
                pass
    assert not torch_spmd._C._planning()


def test_flops_come_from_the_rules():
    # The op-name table missed aten::matmul: a 4-D matmul reported 8,192 FLOPs.
    a, b = torch.randn(4, 8, 16, 32), torch.randn(4, 8, 32, 16)
    out = torch.matmul(a.to(torch_spmd.device()), b.to(torch_spmd.device()))
    stats = step([out])
    assert stats["flops_per_device"] == 2 * 4 * 8 * 16 * 32 * 16
    assert torch.allclose(out.cpu(), torch.matmul(a, b), atol=1e-5)
    # Sharded: each device does its tile of the iteration space; model FLOPs count it once.
    mesh = mesh_of((4, 2))
    x, w = torch.randn(16, 32), torch.randn(32, 8)
    xd = x.to(torch_spmd.device())
    xs.mark_sharding(xd, mesh, ("data", "model"))
    wd = w.to(torch_spmd.device())
    xs.mark_sharding(wd, mesh, ("model", None))
    stats = step([xd @ wd])
    assert stats["flops_per_device"] == 2 * (16 // 4) * (32 // 2) * 8
    assert stats["model_flops"] == 2 * 16 * 32 * 8


def test_meta_model_to_empty_and_the_host_preset():
    # The torch 2.x way: build on meta, then to_empty onto the device; the host preset is
    # measured on this machine.
    out = run_script("""
        with plan.Plan(hardware="host") as p:
            with torch.device("meta"):
                model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                            torch.nn.Linear(256, 64))
            model = model.to_empty(device="spmd")
            mesh = xs.Mesh(np.arange(8), (8,), ("x",))
            for q in model.parameters():
                xs.mark_sharding(q, mesh, ("x",) + (None,) * (q.dim() - 1))
            x = torch.empty(32, 64, device="spmd")
            xs.mark_sharding(x, mesh, ("x", None))
            model(x).sum().backward()
            xm.mark_step()
            r = p.report()
        n = sum(q.numel() for q in model.parameters())
        print(json.dumps(dict(resident=r.resident_bytes_per_device[0], n=n,
                              peak_flops=r.hardware["peak_flops_fp32"], name=r.hardware["name"],
                              step=r.predicted_step_seconds, mfu=r.mfu)))
    """)
    assert out["name"] == "host" and out["peak_flops"] > 1e8
    # Parameters and gradients, each split 8 ways, and the input's shard.
    assert out["resident"] == 2 * 4 * out["n"] // 8 + 32 * 64 * 4 // 8
    assert out["step"] > 0 and 0 < out["mfu"] < 1
