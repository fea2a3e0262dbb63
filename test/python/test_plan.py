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


def test_plan_keeps_the_values_of_ids_and_masks_made_by_factories():
    # Python that reads masks and positions (Hugging Face's mask code) runs inside a plan:
    # integer and boolean values computed without random numbers from factories and uploads
    # keep their values, across steps too; anything else still holds no data.
    mesh = mesh_of((8,))
    hw = dict(peak_flops_bf16=1e12, hbm_bytes=16 << 30, hbm_bandwidth=1e11, ring_bandwidth=1e10)
    mask_cpu = torch.ones(16, 8, dtype=torch.long)
    mask_cpu[3, 5:] = 0
    with plan.Plan(hardware=hw):
        dev = torch_spmd.device()
        positions = torch.arange(8, device=dev).unsqueeze(0).expand(16, 8)
        assert bool((positions[:, -1] == 7).all())
        mask = mask_cpu.to(dev)
        xs.mark_sharding(mask, mesh, ("x", None))
        packed = mask.cumsum(-1) * mask
        xm.mark_step()
        assert torch.equal(packed.cpu(), mask_cpu.cumsum(-1) * mask_cpu)
        assert not bool(mask.bool().all())
        assert int((packed + positions).sum()) == int((mask_cpu.cumsum(-1) * mask_cpu + torch.arange(8)).sum())
        # Random draws, floating values and what they feed hold no data.
        for unknown in (torch.randint(0, 4, (8,), device=dev), torch.ones(8, device=dev) * 2,
                        (torch.randn(8, device=dev) > 0).long()):
            with pytest.raises(RuntimeError, match="holds no data"):
                unknown.cpu()
        floats = torch.ones(8).to(dev)
        with pytest.raises(RuntimeError, match="holds no data"):
            (floats > 0).all().item()


def test_plan_keeps_recent_programs_and_drops_the_least_recently_used():
    """A planned training loop alternating two graphs (a train and an eval step) partitions
    each once; past the cache's 16 programs, the least recently used one is dropped."""
    from torch_spmd.debug import metrics as met
    mesh = mesh_of((8,))
    with plan.Plan(num_devices=8):
        x = torch.zeros(64, 32, device=torch_spmd.device())
        xs.mark_sharding(x, mesh, ("x", None))
        xm.mark_step()

        def run(k):  # graph k: a different slice, a different program
            y = x[: k + 1].sum(0)
            xm.mark_step()
            return y

        def uncached():
            return met.counter_value("UncachedCompile") or 0

        before = uncached()
        for _ in range(3):
            run(0)
            run(1)
        assert uncached() - before == 2
        for k in range(2, 16):  # 16 programs held now
            run(k)
        before = uncached()
        run(0)   # used again: now the most recent
        run(16)  # one more: 1, the least recently used, goes
        assert uncached() == before + 1
        run(0)
        assert uncached() == before + 1
        run(1)   # planned again
        assert uncached() == before + 2


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


FSDP_MLP = """
    from torch_spmd.experimental.spmd_fully_sharded_data_parallel import \\
        SpmdFullyShardedDataParallel as FSDPv2
    # Six Linear+GELU layers, FSDPv2 over 8 devices: every layer's weight is all-gathered
    # before its matmul, its gradient reduced after. Communication and compute are comparable
    # on this hardware, so how much of it overlaps decides the step.
    hw = dict(name="test", peak_flops_bf16=2e12, hbm_bytes=16 << 30, hbm_bandwidth=1e12,
              ring_bandwidth=5e9, link_latency=1e-6)
    with plan.Plan(num_devices=8, hardware=hw) as p:
        mesh = xs.Mesh(np.arange(8), (8,), ("fsdp",))
        with torch.device("spmd"):
            model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(512, 512),
                                                              torch.nn.GELU())
                                          for _ in range(6)])
        model = FSDPv2(model, mesh=mesh)
        xm.mark_step()
        x = torch.empty(8192, 512, device="spmd")
        xs.mark_sharding(x, mesh, ("fsdp", None))
        model(x).sum().backward()
        xm.mark_step()
        r = p.report()
    print(json.dumps(dict(r.as_dict(), text=str(r), hardware=None)))
"""


def test_fsdp_all_gathers_overlap_compute():
    r = run_script(FSDP_MLP)
    compute, comm = r["compute_seconds"], r["communication_seconds"]
    step = r["predicted_step_seconds"]
    gathers = [c for c in r["collectives"] if c["kind"] == "all-gather"]
    assert gathers and comm > 0.3 * compute and compute > 0.3 * comm
    # The critical path of the two streams lies between full overlap and none, strictly below
    # the serial sum: later layers' weights are gathered while earlier layers compute.
    assert r["overlapped_step_seconds"] == pytest.approx(max(compute, comm))
    assert r["no_overlap_step_seconds"] == pytest.approx(compute + comm)
    assert max(compute, comm) <= step * (1 + 1e-12)
    assert step < 0.95 * (compute + comm)
    assert sum(g["exposed_seconds"] for g in gathers) < 0.5 * sum(g["seconds"] for g in gathers)
    # Where the time goes: ops split by what bounds them, exposed communication the rest.
    assert r["exposed_communication_seconds"] == pytest.approx(step - compute)
    assert r["compute_bound_seconds"] + r["memory_bound_seconds"] == pytest.approx(compute)
    modules = r["time_by_module"]
    assert sum(m["seconds"] for m in modules) == pytest.approx(step)
    assert sum(m["compute_seconds"] for m in modules) == pytest.approx(compute)
    assert any(m["module"].startswith("_orig_module.0") for m in modules)
    assert "time by module" in r["text"] and "exposed" in r["text"]


TOPOLOGY = """
    def dp_allreduce(n, hardware):
        # Data parallel over n devices: every gradient is all-reduced over all of them.
        with plan.Plan(num_devices=n, hardware=hardware) as p:
            mesh = xs.Mesh(np.arange(n), (n,), ("data",))
            w = torch.empty(4096, 4096, device="spmd", requires_grad=True)
            x = torch.empty(8 * n, 4096, device="spmd")
            xs.mark_sharding(x, mesh, ("data", None))
            (x @ w).sum().backward()
            g = w.grad
            xm.mark_step()
            r = p.report()
        big = max(r.collectives, key=lambda c: c["bytes"])
        return dict(seconds=big["seconds"] / big["count"], crosses=big["crosses_hosts"],
                    algorithm=big["algorithm"], bytes=big["bytes"], group=big["group_size"])

    out = dict(one_host=dp_allreduce(8, "h100-80gb"), two_hosts=dp_allreduce(16, "h100-80gb"))
    # TPU v5e slices of 4 chips: 8 chips are two slices joined by DCN.
    v5e = plan.resolve("tpu-v5e")
    out["one_slice"] = dp_allreduce(8, v5e)
    out["two_slices"] = dp_allreduce(8, dict(v5e, devices_per_slice=4))
    out["dcn_bandwidth"] = v5e["dcn_bandwidth"]
    out["ring_bandwidth"] = v5e["ring_bandwidth"]
    print(json.dumps(out))
"""


def test_collectives_by_topology():
    out = run_script(TOPOLOGY)
    one, two = out["one_host"], out["two_hosts"]
    assert one["group"] == 8 and two["group"] == 16 and one["bytes"] == two["bytes"]
    assert not one["crosses"] and two["crosses"]
    # 16 GPUs on two hosts: the ring crosses the hosts over the 8 NICs of each host's members
    # (min(NVLink, 8 x 50 GB/s) = 400 GB/s), not one NIC: barely slower than inside one host.
    # The one-NIC model charged 2 * 15/16 s / 50e9, 9.6x the one-host time.
    assert 1.0 < two["seconds"] / one["seconds"] < 1.5
    # Two TPU slices: the all-reduce crosses DCN (hierarchically: inside each slice over ICI,
    # across the slices over each chip's DCN share), far slower than inside one slice.
    s1, s2 = out["one_slice"], out["two_slices"]
    assert not s1["crosses"] and s2["crosses"] and s2["algorithm"] == "hierarchical"
    # Across the slices each chip sends its quarter of the buffer over DCN: 2 * 1/2 * s/4.
    assert s2["seconds"] > 0.25 * s2["bytes"] / out["dcn_bandwidth"]
    assert s2["seconds"] > 4 * s1["seconds"]


GRADIENT_REDUCTION = """
    def dp_step(overlap):
        # Data parallel over 8 A100s, four layers: each weight's gradient is all-reduced.
        hw = dict(plan.resolve("a100-80gb"), overlap_grad_reduce=overlap)
        with plan.Plan(num_devices=8, hardware=hw) as p:
            mesh = xs.Mesh(np.arange(8), (8,), ("data",))
            ws = [torch.empty(4096, 4096, device="spmd", requires_grad=True) for _ in range(4)]
            h = torch.empty(8 * 2048, 4096, device="spmd")
            xs.mark_sharding(h, mesh, ("data", None))
            for w in ws:
                h = torch.relu(h @ w)
            h.sum().backward()
            xm.mark_step()
            r = p.report()
        grads = [c for c in r.collectives
                 if c["kind"] == "all-reduce" and c["bytes"] >= 4096 * 4096 * 4]
        return dict(step=r.predicted_step_seconds, compute=r.compute_seconds,
                    count=sum(c["count"] for c in grads),
                    seconds=sum(c["seconds"] for c in grads),
                    exposed=sum(c["exposed_seconds"] for c in grads))

    out = dict(during=dp_step(True), after=dp_step(False))
    try:
        plan.resolve(dict(plan.resolve("a100-80gb"), overlap_grad_reduce="no"))
        out["error"] = None
    except ValueError as e:
        out["error"] = str(e)
    print(json.dumps(out))
"""


def test_gradient_reduction_during_or_after_the_backward():
    out = run_script(GRADIENT_REDUCTION)
    during, after = out["during"], out["after"]
    assert during["count"] == after["count"] == 4
    assert during["compute"] == pytest.approx(after["compute"])
    assert during["seconds"] == pytest.approx(after["seconds"])
    # During the backward (DDP's buckets, FSDP, XLA): the later layers' gradients are reduced
    # while the earlier layers' backward runs; only the last ones made stay exposed.
    assert during["exposed"] < 0.5 * during["seconds"]
    # After it (Megatron-LM without --overlap-grad-reduce): every reduction is exposed, and the
    # step is longer by exactly what that exposes.
    assert after["exposed"] == pytest.approx(after["seconds"], rel=1e-6)
    assert after["step"] - during["step"] == pytest.approx(after["exposed"] - during["exposed"],
                                                           rel=1e-6)
    assert "overlap_grad_reduce" in out["error"] and "'no'" in out["error"]


def test_tiny_all_reduce_on_8192_chips_costs_microseconds():
    out = run_script("""
        with plan.Plan(num_devices=8192, hardware="tpu-v5p") as p:
            mesh = xs.Mesh(np.arange(8192), (8192,), ("x",))
            v = torch.empty(8192, device="spmd")
            xs.mark_sharding(v, mesh, ("x",))
            y = v.sum().exp()      # the sum's partial results are all-reduced first: 4 bytes
            xm.mark_step()
            r = p.report()
        print(json.dumps(r.collectives))
    """)
    ar = [c for c in out if c["kind"] == "all-reduce" and c["bytes"] == 4]
    assert len(ar) == 1 and ar[0]["group_size"] == 8192
    # A flat ring: 2 * 8191 steps of 5 us = 82 ms. A tree: 2 * 13 steps, 130 us.
    assert 1e-6 < ar[0]["seconds"] < 1e-3, ar[0]
    assert ar[0]["algorithm"] == "tree"


def test_new_presets_resolve_with_sources():
    names = ("tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e", "a100-40gb", "a100-80gb", "h100-80gb",
             "h100-96gb", "h200")
    for name in names:
        hw = plan.resolve(name)
        assert hw["name"] == name and hw["peak_flops_bf16"] > 1e14 and hw["hbm_bytes"] > 1e10
        # Fitted where the calibration data has runs, transferred to the family's chips
        # without (hardware.py, "Fitted constants", "Transferred constants"): never the peak.
        a100, h100 = (0.63, 48e-6), (0.51, 48e-6)
        constants = {"tpu-v4": (0.76, 0.0), "tpu-v5e": (0.85, 0.0), "tpu-v5p": (0.86, 0.0),
                     "tpu-v6e": (0.80, 0.0), "a100-40gb": a100, "a100-80gb": a100,
                     "h100-80gb": h100, "h200": h100, "h100-96gb": (0.48, 48e-6)}
        assert (hw["matmul_efficiency"], hw["kernel_overhead"]) == constants[name], name
        assert hw["hbm_efficiency"] == 1.0
        assert hw["matmul_tile"] in (128, 256) and hw["link_latency"] > 0
        tpu = name.startswith("tpu")
        if tpu:
            assert "dcn_bandwidth" in hw and hw["torus_dims"] in (2, 3)
            assert hw["devices_per_slice"] >= 256
        assert hw["matrix_units"] == (0 if tpu else 108 if name.startswith("a100") else 132)
        if not tpu:
            assert hw["devices_per_host"] == 8 and "cross_host_bandwidth" in hw
    for chip in ("TPU v4", "TPU v5e", "TPU v5p", "TPU v6e", "A100 40GB", "H100 80GB", "H100 96GB",
                 "H200"):
        assert chip in plan.hardware.__doc__  # each preset's sources
    v6e = plan.resolve("v6e")
    assert v6e["peak_flops_bf16"] == 918e12 and v6e["hbm_bandwidth"] == 1640e9
    assert v6e["matmul_tile"] == 256 and v6e["devices_per_slice"] == 256 and v6e["torus_dims"] == 2
    h100_96, h100_80 = plan.resolve("h100-96gb"), plan.resolve("h100-80gb")
    assert h100_96["peak_flops_bf16"] < h100_80["peak_flops_bf16"]
    assert plan.resolve("h200")["hbm_bandwidth"] == 4800e9
    assert plan.resolve("a100-40gb")["hbm_bandwidth"] == 1555e9
    # Custom dicts: efficiencies default to the peak; a domain is a host or a slice, not both.
    hw = plan.resolve(dict(peak_flops_bf16=1e12, hbm_bytes=1e9, hbm_bandwidth=1e11,
                           ring_bandwidth=1e10))
    assert hw["matmul_efficiency"] == 1.0 and hw["matmul_tile"] == 0 and hw["matrix_units"] == 0
    with pytest.raises(ValueError, match="both devices_per_host and devices_per_slice"):
        plan.resolve(dict(hw, devices_per_slice=4))
    with pytest.raises(ValueError, match="fraction"):
        plan.resolve(dict(hw, matmul_efficiency=1.5))
