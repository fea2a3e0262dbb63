"""Auto-sharding (torch_spmd.plan.auto_shard): the dim classes it searches over, a layout never
worse than the hand-written ones, the memory budget, and the chosen layout executed: equal to
CPU eager, with exactly the planned collectives and peak."""
import copy
import dataclasses
import math

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_spmd.core.xla_model as xm
import torch_spmd.distributed.spmd as xs
from torch_spmd.plan import auto_shard, plan_layouts, report_last_step
from torch_spmd.plan.auto_shard import _rank

pytestmark = pytest.mark.usefixtures("eight_devices")

HW = dict(name="test", peak_flops_bf16=2e12, hbm_bytes=16 << 30, hbm_bandwidth=2e11,
          ring_bandwidth=1e10, kernel_overhead=1e-6)
BATCH, DIM, HIDDEN = 16, 64, 512


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(DIM, HIDDEN)
        self.fc2 = nn.Linear(HIDDEN, DIM)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(x)))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(2))

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


def build():
    torch.manual_seed(0)
    model = Net().to("spmd")
    x = torch.zeros(BATCH, DIM, device="spmd")
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2), (x,)


def step(model, opt, x):
    model(x).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()


@pytest.fixture(scope="module")
def result():
    return auto_shard(build, step, num_devices=8, hardware=HW, time_limit=300)


def test_classes_are_the_batch_the_residual_width_and_each_blocks_hidden_dim(result):
    classes = sorted(sorted(c) for c in result.classes)
    assert classes == sorted([
        [("inputs[0]", 0)],
        sorted([("inputs[0]", 1), ("blocks.0.fc1.weight", 1), ("blocks.0.fc2.weight", 0),
                ("blocks.0.fc2.bias", 0), ("blocks.1.fc1.weight", 1),
                ("blocks.1.fc2.weight", 0), ("blocks.1.fc2.bias", 0)]),
        # tie_blocks: both blocks' hidden dims are one decision (Megatron's column/row pair)
        sorted([("blocks.0.fc1.weight", 0), ("blocks.0.fc1.bias", 0), ("blocks.0.fc2.weight", 1),
                ("blocks.1.fc1.weight", 0), ("blocks.1.fc1.bias", 0), ("blocks.1.fc2.weight", 1)]),
    ])


def _hand_layouts():
    def spec(kind):
        def f(name, p):
            if kind == "dp":
                return (None,) * p.dim()
            if kind == "fsdp":
                return (("data", "model"),) + (None,) * (p.dim() - 1)
            other = "data" if kind == "2d" else None
            if "fc1" in name:
                return ("model", other) if p.dim() == 2 else ("model",)
            return (other, "model") if p.dim() == 2 else (None,)
        return f
    every = [(("data", "model"), None)]
    out = {"dp": ((8, 1), ("data", "model"), spec("dp"), every),
           "fsdp": ((8, 1), ("data", "model"), spec("fsdp"), every)}
    for shape in ((4, 2), (2, 4), (1, 8)):
        batch = [("data", None)] if shape[0] > 1 else [(None, None)]
        out[f"tp {shape}"] = (shape, ("data", "model"), spec("tp"), batch)
        out[f"2d {shape}"] = (shape, ("data", "model"), spec("2d"), batch)
    return out


def test_never_worse_than_the_hand_written_layouts(result):
    hand = plan_layouts(build, step, 8, _hand_layouts(), hardware=HW)
    assert all(v is not None for v in hand.values())
    best_hand = min(hand.values(), key=_rank)
    assert not result.timed_out
    assert result.best.fits
    assert result.best.predicted_step_seconds <= best_hand.predicted_step_seconds * (1 + 1e-9), \
        (result.best.describe(), {k: v.describe() for k, v in hand.items()})
    # the runners-up: the other exactly re-planned layouts, best first, then the rest of
    # what the search planned, best first
    exact = [result.best] + [l for l in result.runners_up if l.exact]
    rest = [l for l in result.runners_up if not l.exact]
    assert result.runners_up == exact[1:] + rest
    assert [_rank(l) for l in exact] == sorted(_rank(l) for l in exact)
    assert [_rank(l) for l in rest] == sorted(_rank(l) for l in rest)


def test_memory_budget_is_respected_when_a_layout_fits_it():
    hand = plan_layouts(build, step, 8, _hand_layouts(), hardware=HW)
    budget = hand["dp"].peak_bytes - 1  # data parallelism does not fit
    assert hand["fsdp"].peak_bytes <= budget
    r = auto_shard(build, step, num_devices=8, hardware=HW, memory_budget=budget, time_limit=300)
    assert r.best.fits and r.best.peak_bytes <= budget
    # nothing fits 1 KiB: the least memory wins, reported as over budget
    r = auto_shard(build, step, num_devices=8, hardware=HW, memory_budget=1024, time_limit=300,
                   mesh_shapes=[(8, 1)])
    assert not r.best.fits and "over budget" in r.best.describe()


def test_chosen_layout_executes_equal_to_cpu_with_the_planned_collectives(result):
    torch.manual_seed(0)
    cpu = Net()
    x_cpu = torch.randn(BATCH, DIM)
    model = copy.deepcopy(cpu).to("spmd")
    x = x_cpu.to("spmd")
    result.apply(model, (x,))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    opt_cpu = torch.optim.AdamW(cpu.parameters(), lr=1e-2)
    for _ in range(2):  # the second step is the steady state that was planned
        step(model, opt, x)
        xm.mark_step()
        step(cpu, opt_cpu, x_cpu)
    executed = report_last_step(HW)
    planned = result.best.report

    def colls(r):
        return sorted((c["kind"], tuple(c["axes"]), c["bytes"], c["count"]) for c in r.collectives)

    assert colls(executed) == colls(planned)
    assert executed.peak_bytes_per_device == planned.peak_bytes_per_device
    # AdamW turns rounding-level differences of near-zero gradients into steps of up to lr,
    # so the parameters agree to lr/10. The gradients are compared with CPU's at the sharded
    # model's own parameters (taken at the drifted ones, they differ by the drift times the
    # curvature, which depends on the layout's summation order): they agree to rounding.
    for (name, p), q in zip(model.named_parameters(), cpu.parameters()):
        torch.testing.assert_close(p.cpu(), q, rtol=0, atol=1e-3, msg=name)
    at_same = copy.deepcopy(cpu)
    with torch.no_grad():
        for p, q in zip(model.parameters(), at_same.parameters()):
            q.copy_(p.cpu())
            q.grad = None
    loss = model(x).pow(2).mean()
    loss.backward()
    xm.mark_step()
    loss_cpu = at_same(x_cpu).pow(2).mean()
    loss_cpu.backward()
    torch.testing.assert_close(loss.cpu(), loss_cpu, rtol=1e-5, atol=1e-6)
    for (name, p), q in zip(model.named_parameters(), at_same.parameters()):
        torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-4, atol=1e-7, msg=name)


def test_mark_sharding_lines_are_code_that_gives_the_same_layout(result):
    lines = result.mark_sharding_lines()
    if len(set(result.best.param_specs.values()) - {(None,), (None, None)}) > 0:
        assert "xs.mark_sharding(" in lines
    model, _, inputs = build()
    ns = dict(xs=xs, np=np, model=model, inputs=inputs)
    exec(lines, ns)
    model2, _, inputs2 = build()
    result.apply(model2, inputs2)
    from torch_spmd import _C
    for (n, p), q in zip(model.named_parameters(), model2.parameters()):
        assert _C._get_sharding_spec(p) == _C._get_sharding_spec(q), n
    assert _C._get_sharding_spec(inputs[0]) == _C._get_sharding_spec(inputs2[0])
    assert str(result).startswith("auto_shard: ")


def test_str_says_when_the_best_was_found_and_lists_each_runner_up_once(result):
    # the best was planned by the search before the call ended (an exact re-plan keeps the
    # time its source layout was found)
    assert 0 < result.best.found_after <= result.seconds
    text = str(result)
    assert f"(found after {result.best.found_after:.1f} s)" in text
    described = [line.split(":", 1)[1].strip() for line in text.splitlines()
                 if line.startswith("  runner-up:")]
    assert len(described) == len(set(described))
    assert result.best.describe() not in described


def test_the_ilp_is_solved_on_the_best_seeds_shapes_and_its_layout_planned(result):
    from torch_spmd.plan import auto_shard_ilp
    if not auto_shard_ilp.solver_available():
        pytest.skip("needs scipy >= 1.9")
    assert 1 <= len(result.ilp) <= 2
    for r in result.ilp:
        assert r.status == "optimal", r.describe()
        assert r.objective >= r.bound - 1e-12 and r.gap >= 0
        assert len(r.choice) == len(result.classes) + len(
            {n.replace(".0.", ".*.").replace(".1.", ".*.") for n in result.best.param_specs})
        assert r.planned_step_seconds is not None and r.planned_step_seconds > 0
        # the search ends no worse than the ILP's layout
        assert result.best.predicted_step_seconds <= r.planned_step_seconds * (1 + 1e-9) or \
            not r.planned_fits


def test_without_the_ilp_nothing_is_solved():
    r = auto_shard(build, step, num_devices=8, hardware=HW, time_limit=300, ilp=False,
                   mesh_shapes=[(2, 4)])
    assert r.ilp == []


def test_str_lists_blocks_as_one_loop():
    r = auto_shard(build, step, num_devices=8, hardware=HW, time_limit=300,
                   mesh_shapes=[(1, 8)])
    lines = r.mark_sharding_lines()
    # on 8 model-parallel devices every block's weights are sharded
    assert all(any(a is not None for a in s) for n, s in r.best.param_specs.items()
               if n.endswith("weight"))
    assert "for i in range(0, 2):" in lines and "blocks.{i}." in lines


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_devices=0), "num_devices must be a positive int, got 0"),
    (dict(num_devices=8, time_limit=0), "time_limit must be a positive number of seconds, got 0"),
    (dict(num_devices=8, memory_budget=-1), "memory_budget must be a positive number of bytes, got -1"),
    (dict(num_devices=8, mesh_shapes=[(3, 2)]), "mesh shape (3, 2) is not a (data, model) shape of 8"),
    (dict(num_devices=8, axis_names=("x", "x")), "axis_names must be two distinct names (data, model), got ('x', 'x')"),
    (dict(num_devices=8, rerank=0), "rerank must be a positive int, got 0"),
])
def test_bad_arguments_raise_value_errors_naming_them(kwargs, message):
    with pytest.raises(ValueError) as e:
        auto_shard(build, step, hardware=HW, **kwargs)
    assert message in str(e.value)


def test_build_must_return_spmd_tensors():
    def cpu_build():
        model = Net()
        return model, None, (torch.zeros(BATCH, DIM),)
    with pytest.raises(ValueError, match=r"build\(\) must return spmd tensors; blocks.0.fc1.weight is cpu"):
        auto_shard(cpu_build, step, num_devices=8, hardware=HW)


def test_clear_sharding_of_planned_data_changes_only_its_layout():
    from torch_spmd.plan import Plan
    with Plan(hardware=HW):
        t = torch.zeros(8, 4, device="spmd")
        mesh = xs.Mesh(np.arange(8), (8,), ("data",))
        xs.mark_sharding(t, mesh, ("data", None))
        xs.clear_sharding(t)
        xs.mark_sharding(t, mesh, (None, None))
        assert t.shape == (8, 4)


def test_plan_layouts_equals_a_run_marked_on_fresh_tensors():
    # Axes in both orders on one class, and a parameter left unannotated: its Adam moments are
    # made by the first step in the layout propagation gives them, not in the parameter's. The
    # exact evaluation plans it as a run has it, so memory and collectives are the executed ones.
    specs = {"fc1.weight": (("model", "data"), None), "fc1.bias": (("data", "model"),),
             "fc2.weight": (("model", "data"), None), "fc2.bias": (None,)}

    def spec(name, p):
        return specs[name.split(".", 2)[2]]

    planned = plan_layouts(build, step, 8, {"mixed": ((2, 4), ("data", "model"), spec,
                                                      [(None, None)])}, hardware=HW)["mixed"]
    assert planned.exact
    model, opt, _ = build()
    x = torch.randn(BATCH, DIM).to("spmd")
    mesh = xs.Mesh(np.arange(8), (2, 4), ("data", "model"))
    for n, p in model.named_parameters():  # a spec without axes is no annotation (as apply)
        if any(a is not None for a in spec(n, p)):
            xs.mark_sharding(p, mesh, spec(n, p))
    for _ in range(2):
        step(model, opt, x)
        xm.mark_step()
    executed = report_last_step(HW)
    assert executed.peak_bytes_per_device == planned.report.peak_bytes_per_device
    assert executed.resident_bytes_per_device == planned.report.resident_bytes_per_device
    assert sorted((c["kind"], tuple(c["axes"]), c["bytes"], c["count"]) for c in executed.collectives) == \
        sorted((c["kind"], tuple(c["axes"]), c["bytes"], c["count"]) for c in planned.report.collectives)


def _mlp_case(batch, dim, hidden):
    def build_mlp():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim)).to("spmd")
        x = torch.zeros(batch, dim, device="spmd")
        return model, torch.optim.AdamW(model.parameters()), (x,)
    return build_mlp


V5P = "tpu-v5p"


def test_rediscovers_data_parallelism_when_activations_dominate():
    # 2^20 rows through a 256 -> 1024 -> 256 MLP: ~1 ms of matmuls per device against tens
    # of microseconds to reduce 2 MB of gradients
    r = auto_shard(_mlp_case(1 << 20, 256, 1024), step, num_devices=8, hardware=V5P,
                   time_limit=300)
    # every device holds an eighth of the batch: the batch dim uses all 8 devices
    batch_axes = r.best.input_specs[0][0]
    axes = (batch_axes,) if isinstance(batch_axes, str) else batch_axes
    sizes = dict(zip(r.best.axis_names, r.best.mesh_shape))
    assert math.prod(sizes[a] for a in axes) == 8, r.best.describe()


def test_rediscovers_megatron_pairs_when_weights_dominate():
    # 8 rows of activations against 2 x 16M-parameter weights on a model axis of 8: the hidden
    # dim over 'model' on both weights (column- then row-parallel), nothing gathered
    # (the search from its seeds; with the ILP's layout among them it may end on a layout of
    # the same program and cost that leaves the first weight to propagation: compared below)
    r = auto_shard(_mlp_case(8, 2048, 8192), step, num_devices=8, hardware=V5P, time_limit=300,
                   mesh_shapes=[(1, 8)], ilp=False)
    specs = r.best.param_specs
    assert specs["0.weight"][0] == "model" and specs["2.weight"][1] == "model", specs
    kinds = {c["kind"] for c in r.best.report.collectives}
    assert "all-gather" not in kinds, r.best.report.collectives
    with_ilp = auto_shard(_mlp_case(8, 2048, 8192), step, num_devices=8, hardware=V5P,
                          time_limit=300, mesh_shapes=[(1, 8)])
    assert with_ilp.best.predicted_step_seconds == pytest.approx(r.best.predicted_step_seconds)
    assert with_ilp.best.peak_bytes == r.best.peak_bytes
    assert with_ilp.best.report.collectives == r.best.report.collectives


def test_rediscovers_fsdp_when_parameters_do_not_fit_replicated():
    build_mlp = _mlp_case(64, 2048, 8192)
    hand = plan_layouts(build_mlp, step, 8, {"dp": ((8, 1), ("data", "model"),
                                                    lambda n, p: (None,) * p.dim(),
                                                    [("data", None)])}, hardware=V5P)
    budget = hand["dp"].peak_bytes // 2  # replicated parameters and Adam state do not fit
    r = auto_shard(build_mlp, step, num_devices=8, hardware=V5P, memory_budget=budget,
                   time_limit=300, mesh_shapes=[(8, 1)])
    assert r.best.fits and r.best.peak_bytes <= budget
    # both weights are stored sharded over all 8 devices
    for name in ("0.weight", "2.weight"):
        assert any(a is not None for a in r.best.param_specs[name]), r.best.param_specs


def test_sharding_fingerprints_are_equal_exactly_when_layouts_are():
    from torch_spmd import _C
    mesh = xs.Mesh(np.arange(8), (2, 4), ("data", "model"))
    a, b, c, d = (torch.zeros(8, 8, device="spmd") for _ in range(4))
    xs.mark_sharding(a, mesh, ("data", None))
    xs.mark_sharding(b, mesh, ("data", None))
    xs.mark_sharding(c, mesh, (None, "data"))
    fa, fb, fc, fd = _C._sharding_fingerprints([a, b, c, d])
    assert fa == fb and fa != fc and fd == 0 and fa != 0


def test_a_single_mesh_shape_with_a_model_axis_is_seeded_with_tensor_parallelism():
    # (the only shape is also the flattest: it gets data parallelism, FSDP and TP seeds)
    from torch_spmd.plan.auto_shard import _seeds
    sweeps = _seeds([(2, 4)], ("data", "model"), nc=3, ng=0, batch=0, model_classes=[2],
                    options=lambda shape, i: [(), ("data",), ("model",), ("data", "model")],
                    valid=lambda choice: True)
    choices = [c for sweep in sweeps for _, c in sweep]
    assert [("data", "model"), (), ()] in choices               # data parallel
    assert [("data",), (), ("model",)] in choices               # batch / model classes


class _FakeSearch:
    """Layouts by mesh shape with given steps (all fitting): what _plan_sweep and _rerank see."""
    def __init__(self, steps):
        from torch_spmd.plan.auto_shard import Layout
        self.layouts = {s: Layout(s, ("data", "model"), {}, [], t, 1, True) for s, t in steps.items()}
        self.cache = {(s, ("data", "model"), (), False): l for s, l in self.layouts.items()}
        self.planned, self.exact = [], []

    def evaluate(self, shape, names, choice):
        self.planned.append(shape)
        return self.layouts[shape]

    def evaluate_specs(self, shape, names, specs, exact=False):
        self.exact.append(shape)
        return dataclasses.replace(self.layouts[shape], exact=True)


def test_a_sweep_stops_after_two_fitting_layouts_slower_than_its_best():
    from torch_spmd.plan.auto_shard import _plan_sweep
    shapes = [(16, 1), (8, 2), (4, 4), (2, 8), (1, 16)]
    search = _FakeSearch(dict(zip(shapes, [3.0, 2.0, 2.5, 2.6, 1.0])))
    found, timed_out = _plan_sweep(search, ("data", "model"), [(s, []) for s in shapes],
                                   lambda: False, None)
    assert search.planned == shapes[:4] and not timed_out
    assert [l.predicted_step_seconds for l, _, _ in found] == [3.0, 2.0, 2.5, 2.6]


def test_while_nothing_fits_a_sweep_goes_on():
    from torch_spmd.plan.auto_shard import _plan_sweep
    shapes = [(16, 1), (8, 2), (4, 4), (2, 8), (1, 16)]
    search = _FakeSearch(dict.fromkeys(shapes, 1.0))
    for s, peak in zip(shapes, [9, 5, 6, 7, 1]):  # none fits
        search.layouts[s] = dataclasses.replace(search.layouts[s], peak_bytes=peak, fits=False)
    found, _ = _plan_sweep(search, ("data", "model"), [(s, []) for s in shapes],
                           lambda: False, None)
    assert search.planned == shapes
    assert [l.peak_bytes for l, _, _ in found] == [9, 5, 6, 7, 1]


def test_rerank_replans_only_layouts_within_ten_percent_of_the_best():
    import time
    from torch_spmd.plan.auto_shard import _rerank
    search = _FakeSearch({(8, 1): 1.0, (4, 2): 1.08, (2, 4): 1.2, (1, 8): 1.5})
    best, runners, cut = _rerank(search, 5, time.perf_counter() + 60)
    assert search.exact == [(8, 1), (4, 2)] and best.exact and not cut
    assert [l.mesh_shape for l in runners] == [(4, 2), (2, 4), (1, 8)]
