"""scaled_dot_product_attention on the device: torch's fused CPU flash kernel recorded as one op,
forward and backward, wherever CPU eager takes it (csrc/aten/attention.cc), partitioned by its
sharding rule (csrc/partition/rules/attention.cc) and compared with CPU eager (spmd_diff: the
padding of uneven shards is poisoned); the math decomposition where the fused kernel does not
apply; plan mode pricing attention as the fused kernel (no S x S buffer, 4*b*h*s_q*s_kv*d
FLOPs forward)."""
import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import torch_spmd
import torch_spmd.core.xla_model as xm
import torch_spmd.distributed.spmd as xs
import torch_spmd.plan as plan
from torch_spmd.debug import graph_text
from spmd_diff import check, dev, ensure_devices, mesh_of

FUSED = "aten::_scaled_dot_product_flash_attention_for_cpu"
FUSED_BACKWARD = FUSED + "_backward"
BH = ("data", "model", None, None)  # batch over 'data', heads over 'model'


@pytest.fixture(scope="module", autouse=True)
def devices():
    ensure_devices()
    yield


def randn(*shape, dtype=torch.float64, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def qkv(b, h, l, s, d, hk=None, dtype=torch.float64):
    hk = hk or h
    return [randn(b, h, l, d, dtype=dtype, seed=1), randn(b, hk, s, d, dtype=dtype, seed=2),
            randn(b, hk, s, d, dtype=dtype, seed=3)]


def check_attention(inputs, specs, mesh, fused=True, grad=(0, 1, 2), fwd=(), bwd=(), **sdpa_args):
    """spmd_diff.check of F.scaled_dot_product_attention(*inputs, **sdpa_args) with the gradients
    of `grad`, and whether the device recorded the fused op or the math decomposition."""
    graphs = []

    def fn(q, k, v, *mask):
        out = F.scaled_dot_product_attention(q, k, v, *mask, **sdpa_args)
        if torch_spmd.is_spmd_tensor(out):
            graphs.append(graph_text([out]))
        return out

    r = check(fn, inputs, specs, mesh, grad=list(grad), fwd=fwd, bwd=bwd)
    assert (FUSED in graphs[0]) == fused, graphs[0]
    assert ("softmax" in graphs[0]) != fused, graphs[0]
    return r


def test_one_fused_op_forward_and_backward():
    q, k, v = (t.to(dev()).requires_grad_() for t in qkv(2, 3, 16, 16, 8))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    forward = graph_text([out])
    assert FUSED in forward and "softmax" not in forward and "matmul" not in forward
    grads = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    backward = graph_text(list(grads))
    assert FUSED_BACKWARD in backward and "softmax" not in backward and "matmul" not in backward


@pytest.mark.parametrize("causal", [False, True])
def test_batch_and_heads_sharded_unevenly(causal):
    # 6 batch rows over 4 ('data': the last device holds only padding), 3 heads over 2.
    check_attention(qkv(6, 3, 5, 5, 8), [BH] * 3, mesh_of((4, 2)), is_causal=causal)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_low_precision(dtype):
    check_attention(qkv(4, 4, 9, 9, 16, dtype=dtype), [BH] * 3, mesh_of((4, 2)), is_causal=True)


def test_three_axis_mesh():
    spec = (("a", "b"), "c", None, None)
    check_attention(qkv(5, 2, 6, 7, 8), [spec] * 3, mesh_of((2, 2, 2)))


def test_masks_bool_and_float_sharded_with_batch_and_heads():
    mesh = mesh_of((4, 2))
    inputs = qkv(6, 3, 5, 7, 8)
    keep = randn(5, 7, seed=4) > -0.5
    keep[:, 0] = True  # every query reads a key
    check_attention(inputs + [keep], [BH] * 3 + [None], mesh)
    check_attention(inputs + [randn(6, 1, 5, 7, seed=5)], [BH] * 3 + [("data", None, None, None)], mesh)
    check_attention(inputs + [randn(6, 3, 5, 7, seed=6)], [BH] * 4, mesh)


def test_query_length_sharded_key_value_gradients_are_summed():
    # The query rows are independent in the forward; in the backward grad_k and grad_v add up
    # over them: one all-reduce each. 13 rows over 8 devices: padded rows poisoned (NaN) must
    # read 0 there, or they would reach every key's gradient.
    rows = (None, None, "x", None)
    check_attention(qkv(2, 2, 13, 6, 8) + [randn(13, 6, seed=4)], [rows, None, None, ("x", None)],
                    mesh_of((8,)), bwd=[("all-reduce", ("x",))] * 2)


def test_causal_query_rows_sharded_are_masked_by_their_global_positions():
    # The kernel's causal mask is relative to local rows: each device masks its tile of rows by
    # their global positions instead, and nothing is gathered.
    check_attention(qkv(2, 2, 12, 12, 8), [(None, None, "x", None), None, None], mesh_of((8,)),
                    fwd=[], bwd=[("all-reduce", ("x",))] * 2, is_causal=True)


def test_key_length_sharded_is_gathered():
    # Softmax normalizes over every key: no ring attention, the key length is made whole.
    kv = (None, None, "x", None)
    r = check_attention(qkv(2, 2, 6, 16, 8), [None, kv, kv], mesh_of((8,)), fwd=None, bwd=None)
    assert r.fwd.count(("all-gather", ("x",))) == 2


@pytest.mark.parametrize("kv_heads", [2, 3])
def test_grouped_query_attention_sharded_over_kv_heads(kv_heads):
    # 6 query heads read the kv heads in groups (of 3 for 2 kv heads, of 2 for 3). Sharding the
    # kv heads over 'model' takes their groups of query heads along: 2 kv heads over 2 devices
    # is the user's query layout (3 query heads each), no communication. 3 kv heads over 2
    # (tiles of 2, i.e. 4 query heads) do not line up with the query tiles (3 heads each): all
    # three are gathered. torch 2.6's CPU kernel has no grouped-query attention: the math
    # path there.
    inputs = qkv(5, 6, 5, 5, 8, hk=kv_heads)
    fused = torch._fused_sdp_choice(*inputs, enable_gqa=True) == SDPBackend.FLASH_ATTENTION.value
    gathers = [] if kv_heads == 2 else [("all-gather", ("model",))] * 3
    check_attention(inputs, [BH] * 3, mesh_of((4, 2)), fused=fused,
                    fwd=gathers if fused else None, bwd=None, enable_gqa=True, is_causal=True)


# Where CPU eager takes the math path, so does the device, and the results stay CPU's.

def test_three_dim_mask_takes_the_math_path():
    inputs = qkv(4, 2, 5, 5, 8) + [randn(2, 5, 5, seed=4)]  # [heads, l, s]
    check_attention(inputs, [BH] * 3 + [("model", None, None)], mesh_of((4, 2)), fused=False,
                    fwd=None, bwd=None)


def test_mask_needing_a_gradient_takes_the_math_path():
    inputs = qkv(4, 2, 5, 5, 8) + [randn(5, 5, seed=4)]
    check_attention(inputs, [BH] * 3 + [None], mesh_of((4, 2)), fused=False, grad=(0, 1, 2, 3),
                    fwd=None, bwd=None)


def test_user_selected_math_backend_is_honoured():
    with sdpa_kernel(SDPBackend.MATH):
        check_attention(qkv(4, 2, 5, 5, 8), [BH] * 3, mesh_of((4, 2)), fused=False, fwd=None,
                        bwd=None)


def test_dropout_takes_the_math_path():
    q, k, v = (t.to(dev()) for t in qkv(2, 2, 8, 8, 4))
    out = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    graph = graph_text([out])
    assert FUSED not in graph and "dropout" in graph
    assert out.cpu().isfinite().all()


# Plan mode prices attention as the fused kernel.

B, H, S, D = 8, 16, 4096, 64  # per device (batch over 8): one sequence, 16 heads


def planned_attention(causal, backward, math=False):
    """Plans F.scaled_dot_product_attention over [B, H, S, D] bf16 batch-sharded on 8 devices
    (one step; with `backward`, a second step for the input gradients); returns the reports."""
    reports = []
    with plan.Plan(hardware="tpu-v4") as p, sdpa_kernel(
            [SDPBackend.MATH] if math else [SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]):
        mesh = xs.Mesh(np.arange(8), (8,), ("data",))
        q, k, v, grad_out = (torch.empty(B, H, S, D, dtype=torch.bfloat16, device="spmd")
                             for _ in range(4))
        for t in (q, k, v, grad_out):
            xs.mark_sharding(t, mesh, ("data", None, None, None))
        for t in (q, k, v):
            t.requires_grad_(backward)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        xm.mark_step()
        reports.append(p.report())
        if backward:
            grads = torch.autograd.grad(out, (q, k, v), grad_out)
            xm.mark_step()
            reports.append(p.report())
            del grads
    return reports


def test_plan_flops_are_the_fused_kernels():
    full = 4 * B * H * S * S * D  # q.k^T and p.v: 2 FLOPs per (b, h, i, j, d) each
    forward, backward = planned_attention(causal=False, backward=True)
    assert forward.model_flops == full and forward.flops_per_device == full / 8
    assert backward.model_flops == 2.5 * full  # 5 matmuls (recomputed q.k^T, dv, dp, dq, dk)
    # Causal: only the (i, j <= i) pairs are computed, (S + 1) / (2 S) of them.
    forward, backward = planned_attention(causal=True, backward=True)
    assert forward.model_flops == pytest.approx(full * (S + 1) / (2 * S), rel=1e-12)
    assert backward.model_flops == pytest.approx(2.5 * full * (S + 1) / (2 * S), rel=1e-12)


def test_plan_peak_has_no_scores_buffer():
    scores = (B // 8) * H * S * S * 2  # one device's [b, h, S, S] in bf16: 512 MiB
    inputs = 3 * (B // 8) * H * S * D * 2  # its q, k, v: 24 MiB
    for backward in (False, True):
        fused = planned_attention(causal=True, backward=backward)
        math = planned_attention(causal=True, backward=backward, math=True)
        for f, m in zip(fused, math):
            assert f.peak_bytes_per_device[0] < 3 * inputs < scores
            assert m.peak_bytes_per_device[0] > scores


class Block(nn.Module):
    """A pre-norm transformer block with causal self-attention through SDPA."""

    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (u.view(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for u in self.qkv(self.ln1(x)).split(d, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


def planned_training_step(math, layers=12, d=768, heads=12, seq=8192, batch=8):
    """A GPT-2-small-shaped model at sequence 8192, bf16, data parallel over 8 tpu-v4: one
    training step (forward and backward), planned."""
    with plan.Plan(hardware="tpu-v4") as p, sdpa_kernel(
            [SDPBackend.MATH] if math else [SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]):
        mesh = xs.Mesh(np.arange(8), (8,), ("data",))
        with torch.device("spmd"):
            model = nn.Sequential(*(Block(d, heads) for _ in range(layers))).to(torch.bfloat16)
        x = torch.empty(batch, seq, d, dtype=torch.bfloat16, device="spmd")
        xs.mark_sharding(x, mesh, ("data", None, None))
        xm.mark_step()
        model(x).float().square().mean().backward()
        xm.mark_step()
        return p.report()


def test_plan_long_sequence_model_fits_with_the_fused_kernel():
    # The math path keeps each layer's [1, 12, 8192, 8192] attention probabilities (1.5 GiB in
    # bf16 per device) for the backward: 12 of them alone are 18 GiB, and the step does not fit
    # a 32 GiB tpu-v4 (44.9 GiB). Fused, the step needs 2.8 GiB.
    probabilities = 12 * 1 * 12 * 8192 * 8192 * 2
    math, fused = planned_training_step(math=True), planned_training_step(math=False)
    assert not math.fits and fused.fits
    assert math.peak_bytes_per_device[0] - fused.peak_bytes_per_device[0] > probabilities
    # The math path peaks on the scores (their matmul or softmax, by where the schedule puts the
    # backward's), the fused one never on a softmax.
    assert any(op in math.peak_op for op in ("softmax", "matmul")), math.peak_op
    assert "softmax" not in fused.peak_op
