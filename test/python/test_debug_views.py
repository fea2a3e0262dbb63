"""Seeing a sharded step: module attribution of collectives (comm_report), the per-device memory
timeline and the per-device trace, for an executed step and a planned one."""
import json
import os
import sys

import numpy as np
import pytest
import torch

import torch_spmd
import torch_spmd.core.xla_model as xm
import torch_spmd.distributed.spmd as xs
import torch_spmd.plan as plan
from torch_spmd.debug import comm_report, last_step_stats, memory_timeline, module_scope, trace
from torch_spmd.debug.comm_report import total_bytes
from spmd_diff import assert_same, ensure_devices

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
from bench_model import GPT, GPTConfig, sharding_plan  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def devices():
    ensure_devices()
    yield


def gpt_2d_step(device_count=8, mesh_shape=(4, 2)):
    """The 2-D GPT example's step (benchmarks/bench_model.py, '2d' plan): Megatron specs on
    'model', FSDP on 'fsdp', the batch on 'fsdp'. Returns the CPU model and the loss."""
    torch.manual_seed(0)
    cfg = GPTConfig(layers=2, dim=64, heads=2, seq=32, vocab=64, batch=16)
    cpu = GPT(cfg)
    model = GPT(cfg).to(torch_spmd.device())
    model.load_state_dict(cpu.state_dict())
    mesh = xs.Mesh(np.arange(device_count), mesh_shape, ("fsdp", "model"))
    params = dict(model.named_parameters())
    for name, spec in sharding_plan("2d", model).items():
        xs.mark_sharding(params[name], mesh, spec)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    xm.mark_step()
    idx = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq), generator=torch.Generator().manual_seed(1))
    idx_d = idx.to(torch_spmd.device())
    xs.mark_sharding(idx_d, mesh, ("fsdp", None))
    loss = model.loss(idx_d, idx_d)
    loss.backward()
    opt.step()
    xm.mark_step()
    return cpu, model, idx, loss


def test_comm_report_attributes_every_collective_byte_to_a_module():
    cpu, model, idx, loss = gpt_2d_step()
    stats = last_step_stats()
    report = comm_report(print_table=False)
    # Per-module bytes add up to the step's collective bytes exactly.
    assert total_bytes(report) == sum(c["bytes"] for c in stats["collectives"]) > 0
    assert sum(e["count"] for d in report.values() for k in d.values() for e in k.values()) == \
        len(stats["collectives"])
    # Module paths of the running model, forward and backward apart.
    assert "blocks.0.qkv" in report and "blocks.1.fc2" in report
    assert report["blocks.0.qkv"]["backward"]  # its gradient's reduction
    assert any(d["forward"] for d in report.values()) and any(d["backward"] for d in report.values())
    # A partial sum's reduction belongs to the module whose op produced the sum (wherever the
    # op that reads it runs): the row-parallel projection's all-reduce to the projection's
    # forward (read by the block's residual add), the column-parallel qkv's input gradient to
    # qkv's backward (read by the layer norm's backward); each backward op is attributed to
    # the module whose forward op it differentiates.
    assert "all-reduce" in report["blocks.0.proj"]["forward"]
    assert "all-reduce" in report["blocks.0.qkv"]["backward"]
    assert "blocks.0" not in report
    assert not report["blocks.0.ln1"]["forward"].get("all-reduce")
    assert not report["blocks.0.ln1"]["backward"].get("all-reduce")
    assert module_scope.current() == ""  # nothing left open after the step
    # The numbers are still right.
    ref = cpu.loss(idx, idx)
    assert_same(loss.detach().cpu(), ref.detach(), "loss")


def test_memory_timeline_peaks_at_the_step_peak(tmp_path):
    gpt_2d_step()
    stats = last_step_stats()
    data = memory_timeline(str(tmp_path / "mem.json"))
    assert max(data["live_bytes"]) == stats["peak_bytes_per_device"] == data["peak_bytes"]
    assert data["live_bytes"][data["peak_index"]] == data["peak_bytes"]
    assert data["peak_buffers"] and all(b["bytes"] > 0 for b in data["peak_buffers"])
    assert any(b["scope"] for b in data["peak_buffers"])  # labelled with module paths
    assert json.load(open(tmp_path / "mem.json"))["peak_bytes"] == data["peak_bytes"]
    svg = open(tmp_path / "mem.svg").read()
    assert svg.startswith("<svg") and "polyline" in svg
    # matplotlib is a test dependency (scripts/env.sh, install_deps.sh): the PNG is written too.
    assert open(tmp_path / "mem.png", "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_measured_trace_of_an_executed_step(tmp_path):
    gpt_2d_step()
    stats = last_step_stats()
    data = trace(str(tmp_path / "measured.json"))  # executed: the emulator's times by default
    assert data["otherData"]["times"] == "measured on the emulator"
    slices = [e for e in json.load(open(tmp_path / "measured.json"))["traceEvents"] if e["ph"] == "X"]
    assert {e["pid"] for e in slices} == set(range(8))
    lane0 = [e for e in slices if e["pid"] == 0]
    assert len(lane0) == data["otherData"]["instructions"] and len(slices) == 8 * len(lane0)
    # Every collective of the step is an instruction of its lanes, named with its module path.
    collectives = [e for e in lane0 if e["cat"] == "collective"]
    assert len(collectives) == len(stats["collectives"])
    assert any("blocks.0" in e["name"] for e in lane0)
    assert all(e["dur"] > 0 for e in slices)


def test_trace_has_a_lane_per_device_with_ops_and_collectives(tmp_path):
    gpt_2d_step()
    stats = last_step_stats()
    data = trace(str(tmp_path / "trace.json"), hardware="tpu-v4", measured=False)
    loaded = json.load(open(tmp_path / "trace.json"))
    slices = [e for e in loaded["traceEvents"] if e["ph"] == "X"]
    lanes = {e["pid"] for e in slices}
    assert lanes == set(range(8))
    per_device = len(stats["op_costs"]) + len(stats["collectives"])
    assert len(slices) == 8 * per_device
    collectives = [e for e in slices if e["cat"] == "collective" and e["pid"] == 0]
    assert len(collectives) == len(stats["collectives"])
    assert all(e["dur"] > 0 for e in slices)
    # A lane is the cost model's two-stream schedule: ops follow each other on the compute
    # thread, collectives on the communication thread, and the lane ends with the predicted
    # step.
    lane0 = [e for e in slices if e["pid"] == 0]
    for tid, cat in ((0, "op"), (1, "collective")):
        thread = sorted((e for e in lane0 if e["tid"] == tid), key=lambda e: e["ts"])
        assert thread and all(e["cat"] == cat for e in thread)
        for a, b in zip(thread, thread[1:]):
            # A view takes no time; the trace draws it 1 ns (1e-3 us) long.
            assert b["ts"] >= a["ts"] + a["dur"] - 1e-3 - 1e-9
    end = max(e["ts"] + e["dur"] for e in lane0)
    assert end == pytest.approx(data["otherData"]["predicted_step_seconds"] * 1e6, rel=1e-6, abs=1e-3)


def test_views_of_a_planned_step(tmp_path):
    hw = dict(name="test", peak_flops_bf16=1e14, hbm_bytes=16 << 30, hbm_bandwidth=1e12,
              ring_bandwidth=1e11)
    with plan.Plan(hardware=hw) as p:
        gpt_2d_step()
        stats = last_step_stats()
        report = comm_report(print_table=False)
        data = memory_timeline(str(tmp_path / "plan_mem.json"))
        t = trace(str(tmp_path / "plan_trace.json"))
        r = p.report()
        with pytest.raises(RuntimeError, match="planned, not executed"):
            trace(str(tmp_path / "x.json"), measured=True)
    assert total_bytes(report) == sum(c["bytes"] for c in stats["collectives"])
    assert max(data["live_bytes"]) == stats["peak_bytes_per_device"]
    assert t["otherData"]["hardware"] == "test"
    assert t["otherData"]["predicted_step_seconds"] == pytest.approx(r.predicted_step_seconds)


def test_html_report_of_a_64_device_plan_renders_in_headless_chromium(tmp_path):
    # The report of a planned 64-device step, opened in Debian's chromium (installed by
    # scripts/install_deps.sh): it must load and render without console errors.
    import shutil
    import subprocess
    chromium = shutil.which("chromium")
    assert chromium, "chromium is installed by scripts/install_deps.sh"
    page = tmp_path / "report.html"
    code = f"""
import sys
sys.path.insert(0, {os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks")!r})
import numpy as np, torch, torch_spmd
import torch_spmd.core.xla_model as xm
import torch_spmd.distributed.spmd as xs
import torch_spmd.plan as plan
from torch_spmd.debug import report
from bench_model import GPT, GPTConfig, sharding_plan
with plan.Plan(num_devices=64, hardware="tpu-v4"):
    cfg = GPTConfig(layers=2, dim=256, heads=4, seq=128, vocab=1024, batch=64)
    with torch.device("spmd"):
        model = GPT(cfg)
    mesh = xs.Mesh(np.arange(64), (16, 4), ("fsdp", "model"))
    params = dict(model.named_parameters())
    for name, spec in sharding_plan("2d", model).items():
        xs.mark_sharding(params[name], mesh, spec)
    opt = torch.optim.AdamW(model.parameters())
    xm.mark_step()
    idx = torch.zeros(cfg.batch, cfg.seq, dtype=torch.long, device="spmd")
    xs.mark_sharding(idx, mesh, ("fsdp", None))
    model.loss(idx, idx).backward()
    opt.step()
    xm.mark_step()
    report({str(page)!r}, model=model, title="2-D GPT on 64 x TPU v4 (planned)")
"""
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=root), timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    result = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr",
         "--v=0", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    dom = result.stdout
    assert "2-D GPT on 64 x TPU v4 (planned): planned step, 64 devices" in dom
    assert "Collectives per module" in dom and "blocks.0.qkv.weight" in dom and "<svg" in dom
    console = [line for line in result.stderr.splitlines() if "CONSOLE" in line]
    assert console == [], console


def test_a_forward_that_raises_leaves_no_module_or_scope_behind():
    # The module tracker's stack holds modules weakly and pops them even when forward raises:
    # a failed forward neither keeps the model's tensors alive nor leaves its scope set.
    import gc
    from torch_spmd import _C
    gc.collect()
    before = _C._live_tensor_count()
    m = torch.nn.Sequential(torch.nn.Linear(4, 3)).to(torch_spmd.device())
    with pytest.raises(RuntimeError):
        m(torch.randn(2, 5).to(torch_spmd.device()))
    assert module_scope.current() == ""
    del m
    gc.collect()
    assert _C._live_tensor_count() == before


def _ops_by_scope() -> dict:
    by_scope = {}
    for op, _, _, _, _, scope, _ in last_step_stats()["op_costs"]:
        by_scope.setdefault(scope, []).append(op)
    return by_scope


def test_each_backward_op_is_attributed_to_the_module_whose_forward_op_it_differentiates():
    # No hooks on tensors: autograd's nodes remember which module's forward created them.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 4)).to(torch_spmd.device())
    x = torch.randn(5, 8).to(torch_spmd.device())  # needs no gradient
    model(x).square().sum().backward()
    xm.mark_step()
    by_scope = _ops_by_scope()
    assert by_scope["1"] == ["aten::relu"] and by_scope["1 (backward)"] == ["aten::threshold_backward"]
    # The last layer's backward computes its weight's and its input's gradients; the first
    # layer's only its weight's (its input needs none).
    assert by_scope["2 (backward)"].count("aten::mm") == 2
    assert by_scope["0 (backward)"].count("aten::mm") == 1
    # The loss ran outside any module: its backward is the outermost level's.
    assert "aten::pow.Tensor_Scalar" in by_scope[""] and "aten::mul.Tensor" in by_scope[" (backward)"]
    assert set(by_scope) == {"", "0", "1", "2", " (backward)", "0 (backward)", "1 (backward)",
                             "2 (backward)"}
    assert module_scope.current() == ""

    # A second backward accumulates into .grad (AccumulateGrad, which differentiates no forward
    # op): its adds stay in the backward.
    model(x).sum().backward()
    xm.mark_step()
    adds = [s for s, ops in _ops_by_scope().items() for op in ops if op == "aten::add.Tensor"]
    assert adds and all(s.endswith(" (backward)") for s in adds)

    # Turned off, the backward of a forward recorded while it was on is not attributed either.
    for p in model.parameters():
        p.grad = None
    loss = model(x).sum()
    module_scope.enable(False)
    try:
        loss.backward()
        xm.mark_step()
        by_scope = _ops_by_scope()
        assert set(by_scope) == {"", "0", "1", "2"}  # the forward's, recorded while on
        assert "aten::threshold_backward" in by_scope[""]
    finally:
        module_scope.enable(True)


def test_html_report_of_an_executed_step(tmp_path):
    # Headed as an executed step priced on the host; the one file it writes; the ops that ran
    # replicated listed; each parameter's annotation apart from the layout its data has now (a
    # parameter nobody annotated holds the step's choice); the collectives heaviest first.
    from torch_spmd.debug import report
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 16))
    model = model.to(torch_spmd.device())
    mesh = xs.Mesh(np.arange(8), (4, 2), ("fsdp", "model"))
    xs.mark_sharding(model[0].weight, mesh, ("model", "fsdp"))
    x = torch.randn(64, 16).to(torch_spmd.device())
    xs.mark_sharding(x, mesh, ("fsdp", None))
    m = (torch.randn(8, 4, 4) + 4 * torch.eye(4)).to(torch_spmd.device())
    xs.mark_sharding(m, mesh, ("fsdp", None, None))
    loss = model(x).pow(2).mean() + torch.linalg.inv(m).sum()  # inv: no sharding rule
    loss.backward()
    xm.mark_step()
    fallbacks = last_step_stats()["replicated_fallback_ops"]
    assert fallbacks
    page_path = tmp_path / "step.html"
    page = report(str(page_path), model=model, title="MLP step")
    assert sorted(os.listdir(tmp_path)) == ["step.html"]
    assert "MLP step: executed step, 8 devices" in page and "Executed step on 8 x host" in page
    assert "Plan on" not in page
    for op in fallbacks:
        assert f"<td>{op}</td>" in page
    for name, p in model.named_parameters():
        row = page.split(f"<td>{name}</td>", 1)[1].split("</tr>", 1)[0]
        want = "[{model}, {fsdp}]" if name == "0.weight" else "(none)"
        assert row.split("<td>")[3].startswith(want), (name, row)
    section = page.split("Collectives per module", 1)[1].split("Memory per device", 1)[0]
    sizes = [int(r.split('<td class="n">')[2].split("<")[0].replace(",", ""))
             for r in section.split("<tr>")[2:]]
    assert len(sizes) > 1 and sizes == sorted(sizes, reverse=True), sizes


def test_gradient_reductions_belong_to_the_backward_not_the_optimizer():
    # FSDP: a gradient's reduce-scatter is read by the optimizer update, but it reduces the
    # sum the layer's backward produced: the comm report charges it there.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    model = model.to(torch_spmd.device())
    mesh = xs.Mesh(np.arange(8), (8,), ("fsdp",))
    for p in model.parameters():
        xs.mark_sharding(p, mesh, ("fsdp",) + (None,) * (p.dim() - 1))
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(64, 16).to(torch_spmd.device())
    xs.mark_sharding(x, mesh, ("fsdp", None))
    model(x).pow(2).mean().backward()
    opt.step()
    xm.mark_step()
    report = comm_report(print_table=False)
    assert not report.get("optimizer", {}).get("update"), report.get("optimizer")
    reduced = sum(e["count"] for d in report.values() for e in [d["backward"].get("reduce-scatter")] if e)
    assert reduced >= 4, report  # two weights and two biases


def test_mfu_leaves_out_recomputation_hfu_counts_it():
    # Activation checkpointing runs each block's forward again in the backward: hardware FLOPs
    # (HFU) count it, model FLOPs (MFU) do not; without checkpointing the two agree.
    from torch.utils.checkpoint import checkpoint
    hw = dict(name="test", peak_flops_bf16=1e14, hbm_bytes=16 << 30, hbm_bandwidth=1e12,
              ring_bandwidth=1e11)
    reports = {}
    for remat in (False, True):
        with plan.Plan(hardware=hw) as p:
            torch.manual_seed(0)
            with torch.device("spmd"):
                blocks = torch.nn.ModuleList(torch.nn.Sequential(
                    torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
                    for _ in range(3))
            x = torch.zeros(32, 64, device="spmd", requires_grad=True)
            h = x
            for b in blocks:
                h = checkpoint(b, h, use_reentrant=False) if remat else b(h)
            h.sum().backward()
            xm.mark_step()
            reports[remat] = p.report()
    plain, remat = reports[False], reports[True]
    assert plain.recomputed_flops == 0 and plain.mfu == pytest.approx(plain.hfu)
    # The recomputed forward: what the backward reads of each block, its first matmul and the
    # GELU (the second matmul's output is not needed).
    forward_matmuls = 3 * (2 * 32 * 64 * 256)
    assert forward_matmuls <= remat.recomputed_flops <= 1.2 * forward_matmuls
    # (Views count a nominal FLOP per element in model_flops, never as recomputation.)
    assert remat.model_flops - remat.recomputed_flops == pytest.approx(plain.model_flops, rel=0.02)
    assert remat.hfu > remat.mfu
    assert "HFU (recomputation counted)" in str(remat) and "HFU" not in str(plain)
