"""torch_spmd.distributed.pipeline: N identical blocks run as a GSPMD-style pipeline over a
mesh axis (stacked stage weights, micro-batches, a shifting buffer moved by collective-permutes).
Differential: a GPT trained with the pipeline equals the unpipelined model on CPU; the
collectives are the buffer's permutes (no gathers of the stage dim); the planned bubble matches
(S - 1) / (R M + S - 1)."""
import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torch_spmd
import torch_spmd.distributed.spmd as xs
from torch_spmd.distributed.pipeline import Pipeline, last_schedules

from spmd_diff import ensure_devices, mesh_of

VOCAB, D, SEQ = 32, 16, 6


class Block(nn.Module):
    def __init__(self, d=D):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        # No qkv bias: the key bias's gradient is 0 up to rounding, which Adam would scale up
        # to +-lr steps of arbitrary sign on either side.
        self.qkv, self.proj = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        q, k, v = self.qkv(self.ln1(x)).chunk(3, -1)
        s = q @ k.transpose(-1, -2) / x.shape[-1] ** 0.5
        mask = torch.ones(x.shape[-2], x.shape[-2], dtype=torch.bool, device=x.device).tril()
        a = s.masked_fill(~mask, float("-inf")).softmax(-1) @ v
        x = x + self.proj(a)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, blocks, d=D):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, d)
        self.blocks = blocks
        self.head = nn.Linear(d, VOCAB)

    def forward(self, ids):
        h = self.emb(ids)
        if isinstance(self.blocks, nn.ModuleList):
            for b in self.blocks:
                h = b(h)
        else:
            h = self.blocks(h)
        return F.cross_entropy(self.head(h).flatten(0, 1), ids.roll(-1, 1).flatten())


def make_blocks(n=8):
    torch.manual_seed(0)
    return [Block() for _ in range(n)]


def train(model, batches, device):
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for ids in batches:
        loss = model(ids.to(device))
        loss.backward()
        opt.step()
        opt.zero_grad()
        if device.type == "spmd":
            torch_spmd.sync()
        losses.append(loss.item())
    return losses


def batches(n=5, batch=8):
    g = torch.Generator().manual_seed(3)
    return [torch.randint(0, VOCAB, (batch, SEQ), generator=g) for _ in range(n)]


@pytest.mark.parametrize("microbatches,repeats,checkpoint", [
    (4, 1, False), (8, 1, False), (4, 2, False), (4, 1, True)])
def test_pipelined_gpt_trains_equal_to_the_unpipelined_model_on_cpu(microbatches, repeats,
                                                                    checkpoint):
    # 8 blocks over 4 stages x 2-way data parallel (8 devices), 5 Adam steps.
    ensure_devices()
    mesh = mesh_of((4, 2), ("stage", "data"))
    blocks = make_blocks()
    cpu = GPT(nn.ModuleList(copy.deepcopy(blocks)))
    pipe = Pipeline(blocks, mesh, "stage", num_microbatches=microbatches, repeats=repeats,
                    activation_spec=("data", None, None), checkpoint=checkpoint)
    dev_model = GPT(pipe)
    dev_model.emb.load_state_dict(cpu.emb.state_dict())
    dev_model.head.load_state_dict(cpu.head.state_dict())
    dev_model.to(torch.device("spmd"))
    data = batches()
    expected = train(cpu, data, torch.device("cpu"))
    got = train(dev_model, data, torch.device("spmd"))
    assert got == pytest.approx(expected, rel=1e-4, abs=1e-5)
    want = {f"{i}.{k}": v for i, b in enumerate(cpu.blocks) for k, v in b.state_dict().items()}
    have = pipe.unstacked_state_dict()
    assert set(have) == set(want)
    for k in want:
        torch.testing.assert_close(have[k].cpu(), want[k], rtol=2e-4, atol=2e-5, msg=k)
    sched = last_schedules()["blocks"]
    assert (sched.stages, sched.microbatches, sched.repeats) == (4, microbatches, repeats)
    assert sched.bubble_fraction == pytest.approx(pipe.bubble_fraction)
    assert pipe.bubble_fraction == pytest.approx(3 / (repeats * microbatches + 3))


def test_the_stage_dim_is_never_gathered_and_the_buffer_moves_by_permutes():
    ensure_devices()
    mesh = mesh_of((4, 2), ("stage", "data"))
    pipe = Pipeline(make_blocks(), mesh, "stage", num_microbatches=4,
                    activation_spec=("data", None, None)).to(torch.device("spmd"))
    x = torch.randn(8, SEQ, D).to(torch.device("spmd"))
    xs.mark_sharding(x, mesh, ("data", None, None))
    torch_spmd.sync()
    pipe(x).sum().backward()
    torch_spmd.sync()
    stats = torch_spmd.debug.last_step_stats()
    kinds = {(c["kind"], tuple(c["axes"])) for c in stats["collectives"]}
    permutes = [c for c in stats["collectives"] if c["kind"] == "collective-permute"]
    # 7 iterations forward, 7 backward: one permute of one stage's slot each (a micro-batch
    # of 8 / 4 = 2 rows, split over 'data': 1 row x SEQ x D floats).
    assert len(permutes) == 14, kinds
    assert {c["bytes"] for c in permutes} == {1 * SEQ * D * 4}
    assert not any(k == "all-gather" and "stage" in a for k, a in kinds), kinds
    for p in pipe.parameters():
        assert "devices=[4,1" in torch_spmd._C._get_sharding_spec(p), \
            torch_spmd._C._get_sharding_spec(p)


def test_bad_configurations_raise_clear_errors():
    ensure_devices()
    mesh = mesh_of((4, 2), ("stage", "data"))
    with pytest.raises(ValueError, match="cannot be split into 4 stages"):
        Pipeline(make_blocks(6), mesh, "stage")
    with pytest.raises(ValueError, match="'pipe' is not an axis"):
        Pipeline(make_blocks(), mesh, "pipe")
    with pytest.raises(ValueError, match="at least as many micro-batches as stages"):
        Pipeline(make_blocks(), mesh, "stage", num_microbatches=2, repeats=2)
    blocks = make_blocks()
    blocks[3].fc = nn.Linear(D, 2 * D)
    with pytest.raises(ValueError, match="block 3 is not identical"):
        Pipeline(blocks, mesh, "stage")
    pipe = Pipeline(make_blocks(), mesh, "stage", num_microbatches=3)
    with pytest.raises(ValueError, match="multiple of num_microbatches=3"):
        pipe(torch.randn(8, SEQ, D))


def _tensor_parallel(name, shape):  # Megatron's column / row split over 'data'
    if name.endswith(("qkv.weight", "fc.weight")):
        return ("data", None)
    return (None, "data") if name.endswith(("proj.weight", "out.weight")) else (None,) * len(shape)


@pytest.mark.parametrize("microbatches,param_spec", [(4, None), (8, None),
                                                     (4, _tensor_parallel)])
def test_plan_reports_the_bubble_the_permutes_and_the_per_stage_peak(microbatches, param_spec):
    # Planned (no data) at a size where the blocks' compute, not latency, sets the time.
    import torch_spmd.core.xla_model as xm
    import torch_spmd.plan as plan
    d, seq, batch = 1024, 512, 64
    with plan.Plan(num_devices=8, hardware="tpu-v5p", mesh_shape=(4, 2),
                   axis_names=("stage", "data")) as p:
        mesh = xs.get_global_mesh()
        with torch.device("spmd"):
            blocks = [Block(d) for _ in range(8)]
        model = GPT(Pipeline(blocks, mesh, "stage", num_microbatches=microbatches,
                             activation_spec=("data", None, None), param_spec=param_spec),
                    d).to("spmd")
        opt = torch.optim.Adam(model.parameters())
        xm.mark_step()
        ids = torch.zeros(batch, seq, dtype=torch.long, device="spmd")
        xs.mark_sharding(ids, mesh, ("data", None))
        model(ids).backward()
        opt.step()
        xm.mark_step()
        r = p.report()
    [q] = r.pipeline
    iterations = microbatches + 3
    assert (q["module"], q["stages"], q["microbatches"], q["iterations"]) == \
        ("blocks", 4, microbatches, iterations)
    # The bubble from the planned time of each iteration (forward and backward) matches the
    # formula within 2 points.
    assert abs(q["bubble_fraction"] - 3 / iterations) < 0.02, q
    assert q["bubble_fraction_formula"] == pytest.approx(3 / iterations)
    assert 0 < q["bubble_seconds"] < q["loop_seconds"] <= r.predicted_step_seconds
    # One permute of a slot (batch / M rows over 'data' halves, seq x d floats) per iteration
    # and direction; a tensor-parallel block's own permutes (collective matmul windows its
    # gathers on the TPU) are the blocks' work, not the shift's.
    if param_spec:
        block_permutes = [c for c in r.collectives if c["kind"] == "collective-permute"
                          and c["bytes"] != (batch // microbatches // 2) * seq * d * 4]
        assert block_permutes, r.collectives
    assert q["permutes"] == 2 * iterations
    assert q["permute_bytes"] == 2 * iterations * (batch // microbatches // 2) * seq * d * 4
    assert q["peak_bytes_per_stage"] == r.peak_bytes_per_device[0]
    assert "pipeline blocks: 4 stages" in str(r)
