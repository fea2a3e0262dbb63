"""Vocab-parallel cross entropy (Megatron's VocabParallelCrossEntropy, by sharding rules): logits
sharded over the vocabulary stay sharded through log_softmax / softmax, nll_loss and their
backward passes. Forward: each tile is normalized by the log-sum-exp of the whole row, found
from the tiles' own (an all-gather of one value per tile and row); nll_loss takes each target
on the device holding its class and the partial losses are summed. Backward: one all-reduce
of one value per row. The logits themselves are never gathered. Differential against CPU with
the shards' padding poisoned and uneven vocabularies (a tile of padding only) included."""
import pytest
import torch
import torch.nn.functional as F

from spmd_diff import check, collectives, constrain, mesh_of


def T(*shape, seed=0, scale=3.0):
    return scale * torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def ids(vocab, *shape, seed=1):
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))


def gathered_bytes(stats, kind="all-gather"):
    return max([c["bytes"] for c in stats["collectives"] if c["kind"] == kind] or [0])


def no_logit_gather(r, rows, tile):
    """No all-gather anywhere takes a tile of the logits (`rows` x `tile` classes, fp32) as its
    input: the log-sum-exp gathers one value per tile and row."""
    for stats in (r.fwd_stats, r.bwd_stats):
        if stats is not None:
            assert gathered_bytes(stats) < rows * tile * 4, collectives(stats)


@pytest.mark.parametrize("vocab,mesh_shape", [
    (16, (4, 2)),  # even tiles
    (10, (2, 4)),  # uneven: tiles of 3, the last holding 1 class
    (9, (2, 4)),   # tiles of 3: the last holds padding only
])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_over_vocab_sharded_logits_equals_cpu(vocab, mesh_shape, reduction):
    mesh = mesh_of(mesh_shape)
    target = ids(vocab, 12)
    target[3] = -100  # ignored
    r = check(lambda x, t: F.cross_entropy(x, t, reduction=reduction), [T(12, vocab), target],
              [(None, "model"), None], mesh, grad=[0])
    no_logit_gather(r, 12, -(-vocab // mesh_shape[1]))
    # The loss is summed over the class tiles: an all-reduce over 'model' (for mean, of the
    # total weight too).
    assert any(k == "all-reduce" and a == ("model",) for k, a in r.fwd), r.fwd


def test_batch_and_vocab_sharded_with_ignore_index_inside_the_vocabulary():
    # ignore_index 4 is a real class index: rows targeting it contribute nothing, and the
    # device holding class 4 must not count them.
    mesh = mesh_of((2, 4))
    target = ids(11, 8)
    target[:3] = 4
    r = check(lambda x, t: F.cross_entropy(x, t, ignore_index=4), [T(8, 11), target],
              [("data", "model"), ("data",)], mesh, grad=[0])
    no_logit_gather(r, 4, 3)


@pytest.mark.parametrize("fn", [
    lambda x: F.softmax(x, dim=-1),
    lambda x: F.log_softmax(x, dim=1),
    lambda x: F.softmax(x, dim=0),
], ids=["softmax", "log_softmax", "softmax_dim0"])
def test_softmax_family_over_a_sharded_dim_equals_cpu(fn):
    mesh = mesh_of((2, 4))
    spec = ("data", "model") if fn(torch.zeros(2, 3)).shape else None
    r = check(fn, [T(6, 10)], [spec], mesh, grad=True)
    no_logit_gather(r, 6, 3)


def test_fully_masked_rows_stay_nan_as_on_cpu():
    # A row of -inf gives NaN on CPU (0/0); sharded, the same.
    x = T(4, 8)
    x[1] = float("-inf")
    mesh = mesh_of((2, 4))
    check(lambda x: F.log_softmax(x, dim=-1), [x], [(None, "model")], mesh)


def test_column_parallel_lm_head_and_loss_keep_the_logits_sharded():
    # Megatron's output layer: hidden [N, D] @ W^T with W [V, D] sharded over the vocabulary.
    mesh = mesh_of((2, 4))
    vocab, d, n = 24, 6, 10
    h, w, t = T(n, d, scale=1.0), T(vocab, d, seed=2, scale=0.5), ids(vocab, n)
    r = check(lambda h, w, t: F.cross_entropy(h @ w.t(), t), [h, w, t],
              [("data", None), ("model", None), ("data",)], mesh, grad=[0, 1])
    no_logit_gather(r, n // 2, vocab // 4)


@pytest.mark.parametrize("weight_spec", [("model",), None])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_weighted_loss_over_vocab_sharded_logits_equals_cpu(reduction, weight_spec):
    # The class weight is tiled like the classes (uneven: 10 over 4, padding poisoned), or
    # replicated and sliced so.
    mesh = mesh_of((2, 4))
    weight = torch.rand(10, generator=torch.Generator().manual_seed(3)) + 0.5
    target = ids(10, 6)
    target[2] = -100
    r = check(lambda x, t, w: F.cross_entropy(x, t, weight=w, reduction=reduction),
              [T(6, 10), target, weight], [(None, "model"), None, weight_spec], mesh, grad=[0])
    no_logit_gather(r, 6, 3)


def test_dtype_cast_log_softmax_equals_cpu():
    mesh = mesh_of((2, 4))
    x16 = T(6, 10).to(torch.bfloat16)
    check(lambda x: torch.log_softmax(x, dim=-1, dtype=torch.float32), [x16],
          [(None, "model")], mesh)


def test_unsharded_softmax_rows_are_not_merged_across_devices():
    # Replicated over the class dim, sharded over rows: each device normalizes its rows whole.
    mesh = mesh_of((8,))
    check(lambda x: constrain(F.softmax(x, dim=0), (None, "x")), [T(5, 16)], [(None, "x")],
          mesh, grad=True)


@pytest.mark.parametrize("dims,keepdim,spec,tile", [
    ((-1,), False, (None, "model"), (6, 3)),
    ((1,), True, ("data", "model"), (3, 3)),
    ((0, 1), False, ("data", "model"), (3, 3)),  # both reduced dims sharded
    ((0,), False, ("data", None), (3, 10)),
])
def test_logsumexp_over_sharded_dims_equals_cpu(dims, keepdim, spec, tile):
    # PaLM/MaxText's z-loss reads logsumexp of vocab-sharded logits.
    mesh = mesh_of((2, 4))
    x = T(6, 10)
    x[2, 4] = float("inf")    # torch.logsumexp gives inf for this row
    x[3] = float("-inf")      # and -inf for this one
    r = check(lambda x: torch.logsumexp(x, dims, keepdim=keepdim), [x], [spec], mesh,
              grad=False)
    no_logit_gather(r, *tile)


def test_logsumexp_gradient_over_a_sharded_dim_equals_cpu():
    mesh = mesh_of((2, 4))
    r = check(lambda x: torch.logsumexp(x, -1), [T(6, 10)], [("data", "model")], mesh, grad=True)
    no_logit_gather(r, 3, 3)
