"""A dropless mixture of experts on the device: torch._grouped_mm (the grouped GEMM of
torchtitan's and Hugging Face's grouped_mm experts) with its sharding rule
(csrc/partition/rules/grouped_mm.cc) and torch.histc's (the tokens per expert), in a layer
written as torchtitan writes one: top-k routing, the token slots sorted by expert, the counts'
cumulative sum as the groups' offsets, two grouped GEMMs, the outputs weighted and scattered
back. Every token is computed by its expert (none dropped), sharded over the experts, over
their hidden dim (expert tensor parallelism) or over the tokens, forward and backward equal to
CPU eager (spmd_diff: uneven shards' padding poisoned)."""
import collections
import os
import random

import pytest
import torch
import torch.nn.functional as F

from spmd_diff import check, constrain, ensure_devices, mesh_of


def _cpu_grouped_mm():
    """Whether this torch's CPU build runs torch._grouped_mm (the reference and the kernel the
    emulated devices run; torch 2.6 has no such op)."""
    try:
        offs = torch.tensor([8, 16], dtype=torch.int32)
        torch._grouped_mm(torch.zeros(16, 16), torch.zeros(2, 16, 16), offs=offs)
        return True
    except (AttributeError, RuntimeError, NotImplementedError):
        return False


pytestmark = pytest.mark.skipif(not _cpu_grouped_mm(),
                                reason=f"torch {torch.__version__} has no CPU torch._grouped_mm")

E, TOP_K = 8, 2


@pytest.fixture(scope="module", autouse=True)
def devices():
    ensure_devices()
    yield


def T(*shape, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed + 7 * sum(shape))
    return torch.randn(*shape, generator=g) * scale


def moe(x, router, w1, w2):
    """Top-k routed SwiGLU-less experts as torchtitan computes them: x [T, D], router [D, E],
    w1 [E, D, F], w2 [E, F, D]."""
    scores = (x @ router).softmax(-1)
    top_w, top_i = scores.topk(TOP_K, -1)
    slots = top_i.reshape(-1)
    order = slots.argsort(stable=True)
    offs = torch.histc(slots.float(), bins=E, min=0, max=E - 1).cumsum(0).to(torch.int32)
    rows = x[order // TOP_K]
    h = F.silu(torch._grouped_mm(rows, w1, offs=offs))
    y = torch._grouped_mm(h, w2, offs=offs) * top_w.reshape(-1)[order].unsqueeze(-1)
    return torch.zeros_like(x).index_add(0, order // TOP_K, y)


def inputs(tokens=64, d=16, f=32):
    return [T(tokens, d), T(d, E, seed=1), T(E, d, f, seed=2, scale=0.2),
            T(E, f, d, seed=3, scale=0.2)]


EXPERTS = ("x", None, None)
LAYOUTS = {
    # The experts over the devices, the tokens too: each device computes its experts' groups
    # of the gathered slots (partial sums over the experts, reduced).
    "experts": [("x", None), None, EXPERTS, EXPERTS],
    "experts-tokens-replicated": [None, None, EXPERTS, EXPERTS],
    # Each expert's hidden dim over the devices: column- then row-parallel grouped GEMMs.
    "expert-tensor-parallel": [None, None, (None, None, "x"), (None, "x", None)],
    "tokens": [("x", None), None, None, None],
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_moe_layer_equals_cpu(layout):
    r = check(moe, inputs(), LAYOUTS[layout], mesh_of((8,)), grad=[0, 2, 3])
    kinds = collections.Counter(kind for kind, _ in r.fwd + r.bwd)
    if layout == "expert-tensor-parallel":  # the row-parallel GEMM's sum, forward and back
        assert set(kinds) == {"all-reduce"}, kinds


def test_uneven_tokens_and_experts():
    # 50 tokens over 4 (tiles of 13, the last 11) and 6 experts' weights over 4 (tiles of 2,
    # the last all padding): padded rows and experts are poisoned and must be kept out of every
    # group.
    global E
    old, E = E, 6
    try:
        ins = inputs(tokens=50)
        ins[1] = T(16, 6, seed=1)
        ins[2], ins[3] = T(6, 16, 32, seed=2, scale=0.2), T(6, 32, 16, seed=3, scale=0.2)
        check(moe, ins, [("data", None), None, ("data", None, None), ("data", None, None)],
              mesh_of((4, 2)), grad=[0, 2, 3])
    finally:
        E = old


@pytest.mark.parametrize("rows,mesh_shape,specs,result", [
    # The rows (the contraction) over 'model', the experts (the result's dim 0) over 'data'.
    (64, (4, 2), [(None, "model"), ("model", None)], ("data", None, None)),
    # 60 rows over 8 (tiles of 8, the last 4: the CPU kernel takes only strides of 16 bytes).
    (60, (8,), [(None, "x"), ("x", None)], (None, None, None)),
])
def test_weight_gradient_form(rows, mesh_shape, specs, result):
    # [K, T] x [T, N] -> [E, K, N]: each device sums its rows of its experts' groups; two
    # groups are empty.
    offs = torch.tensor([3, 3, 20, 31, 40, 40, 52, rows], dtype=torch.int32)

    def fn(a, g):
        return constrain(torch._grouped_mm(a, g, offs=offs.to(a.device)), result)

    check(fn, [T(16, rows), T(rows, 16, seed=1)], specs, mesh_of(mesh_shape), grad=True)


@pytest.mark.parametrize("spec", [("x",), (None,)])
def test_histc_of_sharded_values_sums_the_partial_histograms(spec):
    # 13 values over 8 devices: the padding (poisoned) is counted nowhere.
    check(lambda v: torch.histc(v, bins=5, min=-2, max=2), [T(13)], [spec], mesh_of((8,)),
          fwd=[("all-reduce", ("x",))] if spec[0] else [])


def routed(experts, top_k):
    """`moe` with `experts` experts and top-`top_k` routing."""
    def layer(x, router, w1, w2):
        scores = (x @ router).softmax(-1)
        top_w, top_i = scores.topk(top_k, -1)
        slots = top_i.reshape(-1)
        order = slots.argsort(stable=True)
        offs = torch.histc(slots.float(), bins=experts, min=0, max=experts - 1).cumsum(0)
        rows = x[order // top_k]
        h = F.silu(torch._grouped_mm(rows, w1, offs=offs.to(torch.int32)))
        y = torch._grouped_mm(h, w2, offs=offs.to(torch.int32))
        y = y * top_w.reshape(-1)[order].unsqueeze(-1)
        return torch.zeros_like(x).index_add(0, order // top_k, y)
    return layer


@pytest.mark.parametrize("seed", range(int(os.environ.get("SPMD_FUZZ_SEED", "0")),
                                        int(os.environ.get("SPMD_FUZZ_SEED", "0")) +
                                        int(os.environ.get("SPMD_MOE_CASES", "20"))))
def test_random_moe_layouts_equal_cpu(seed):
    # Fresh sizes and layouts per seed: tokens, experts (even or not over their axis), top-k,
    # the experts, their hidden dim and the tokens each over a mesh axis or not; forward and
    # backward equal to CPU. Fuzz knobs: SPMD_MOE_CASES seeds from SPMD_FUZZ_SEED.
    rnd = random.Random(seed)
    mesh_shape = rnd.choice([(8,), (4, 2), (2, 4), (2, 2, 2)])
    axes = {(8,): ["x"], (4, 2): ["data", "model"], (2, 4): ["data", "model"],
            (2, 2, 2): ["a", "b", "c"]}[mesh_shape]
    pick = lambda: rnd.choice(axes + [None, None])  # noqa: E731
    experts, top_k = rnd.choice([2, 4, 6, 8]), rnd.choice([1, 2, 3])
    top_k = min(top_k, experts)
    tokens, d, f = rnd.randint(1, 40), rnd.choice([4, 8, 16]), rnd.choice([4, 8, 16])
    e_axis, f_axis, t_axis = pick(), pick(), pick()
    if f_axis == e_axis:
        f_axis = None
    specs = [(t_axis, None), None, (e_axis, None, f_axis), (e_axis, f_axis, None)]
    ins = [T(tokens, d), T(d, experts, seed=1), T(experts, d, f, seed=2, scale=0.3),
           T(experts, f, d, seed=3, scale=0.3)]
    check(routed(experts, top_k), ins, specs, mesh_of(mesh_shape), grad=[0, 2, 3])


def hf_moe(family):
    import transformers
    common = dict(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128, num_experts_per_tok=2)
    if family == "mixtral":
        return transformers.MixtralForCausalLM, transformers.MixtralConfig(
            intermediate_size=128, num_local_experts=8, **common)
    return transformers.Qwen2MoeForCausalLM, transformers.Qwen2MoeConfig(  # shared experts too
        intermediate_size=128, moe_intermediate_size=32, shared_expert_intermediate_size=64,
        num_experts=8, **common)


@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe"])
def test_hf_moe_trains_with_its_experts_sharded(family):
    # Hugging Face's grouped_mm experts (config._experts_implementation), every expert weight
    # [E, ...] over the 8 devices and the batch too: three SGD steps whose losses and
    # gradients equal CPU's, the experts' GEMMs recorded (no eager fallback, nothing
    # replicated for want of a rule).
    import numpy as np
    import torch_spmd
    import torch_spmd.core.xla_model as xm
    import torch_spmd.distributed.spmd as xs
    cls, config = hf_moe(family)
    config._experts_implementation = "grouped_mm"
    torch.manual_seed(0)
    cpu, dev = cls(config), cls(config)
    dev.load_state_dict(cpu.state_dict())
    dev = dev.to(torch_spmd.device())
    mesh = xs.Mesh(np.arange(8), (8,), ("ep",))
    experts = [p for p in dev.parameters() if p.dim() == 3]
    assert len(experts) == 4
    for p in experts:
        xs.mark_sharding(p, mesh, ("ep", None, None))
    opt_cpu = torch.optim.SGD(cpu.parameters(), lr=0.1)
    opt_dev = torch.optim.SGD(dev.parameters(), lr=0.1)
    for step in range(3):
        ids = torch.randint(1, 128, (8, 16), generator=torch.Generator().manual_seed(1 + step))
        opt_cpu.zero_grad()
        loss_cpu = cpu(input_ids=ids, labels=ids).loss
        loss_cpu.backward()
        opt_cpu.step()
        ids_dev = ids.to(torch_spmd.device())
        xs.mark_sharding(ids_dev, mesh, ("ep", None))
        opt_dev.zero_grad()
        loss_dev = dev(input_ids=ids_dev, labels=ids_dev).loss
        loss_dev.backward()
        opt_dev.step()
        xm.mark_step()
        stats = torch_spmd.debug.last_step_stats()
        assert not stats["replicated_fallback_ops"], stats["replicated_fallback_ops"]
        # per layer: two forward GEMMs, and in the backward two gradients of each
        assert sum(c[0] == "aten::_grouped_mm" for c in stats["op_costs"]) == 2 * 2 * 3
        torch.testing.assert_close(loss_dev.cpu(), loss_cpu.detach(), rtol=2e-5, atol=2e-5)
        for (name, p_cpu), p_dev in zip(cpu.named_parameters(), dev.parameters()):
            torch.testing.assert_close(p_dev.grad.cpu(), p_cpu.grad, rtol=2e-5, atol=2e-5,
                                       msg=lambda m: f"step {step} grad of {name}: {m}")
    for (name, p_cpu), p_dev in zip(cpu.named_parameters(), dev.parameters()):
        torch.testing.assert_close(p_dev.cpu(), p_cpu.detach(), rtol=2e-5, atol=2e-5,
                                   msg=lambda m: f"{name}: {m}")
