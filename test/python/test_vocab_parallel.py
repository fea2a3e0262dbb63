"""Vocab-parallel embedding (Megatron's VocabParallelEmbedding, by sharding rule): a table sharded
over its rows stays sharded. Forward: each device looks up the indices in its rows and the
partial results are all-reduced (no all-gather of the table); backward: each device sums the
gradient of its own rows (no gradient of the whole table is formed or all-reduced). Differential
against CPU with the shards' padding poisoned, uneven vocabularies (a tile of padding only)
and padding_idx included."""
import pytest
import torch
import torch.nn.functional as F

from spmd_diff import check, collectives, mesh_of


def T(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def ids(vocab, *shape, seed=1, dtype=torch.int64):
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def kinds(stats):
    return [k for k, _ in collectives(stats)]


@pytest.mark.parametrize("vocab,mesh_shape", [
    (16, (4, 2)),  # even: 8 rows per 'model' member
    (10, (2, 4)),  # uneven: tiles of 3, the last holding 1 row
    (9, (2, 4)),   # tiles of 3: the last holds padding only
])
def test_vocab_sharded_embedding_equals_cpu_without_gathering_the_table(vocab, mesh_shape):
    mesh = mesh_of(mesh_shape)
    r = check(lambda w, i: F.embedding(i, w), [T(vocab, 6), ids(vocab, 4, 5)],
              [("model", None), ("data", None)], mesh, grad=[0])
    assert "all-gather" not in kinds(r.fwd_stats), collectives(r.fwd_stats)
    assert "all-gather" not in kinds(r.bwd_stats), collectives(r.bwd_stats)
    # The forward's partial lookups are summed over 'model': one all-reduce of the output.
    assert ("all-reduce", ("model",)) in collectives(r.fwd_stats), collectives(r.fwd_stats)


def test_padding_idx_rows_get_no_gradient_and_int32_indices():
    mesh = mesh_of((2, 4))
    i = ids(12, 4, 6, dtype=torch.int32)
    i[0, :3] = 5  # padding_idx, on the member holding rows 3..5
    r = check(lambda w, i: F.embedding(i, w, padding_idx=5), [T(12, 8), i],
              [("model", None), ("data", None)], mesh, grad=[0])
    assert r.dev_grads[0][5].abs().max() == 0
    assert "all-gather" not in kinds(r.bwd_stats), collectives(r.bwd_stats)


def test_scale_grad_by_freq_still_equals_cpu():
    # Frequencies count every position: the table's gradient is formed whole there.
    mesh = mesh_of((4, 2))
    check(lambda w, i: F.embedding(i, w, scale_grad_by_freq=True), [T(16, 6), ids(16, 4, 5)],
          [("model", None), ("data", None)], mesh, grad=[0])


def test_embedding_of_a_replicated_table_is_unchanged():
    mesh = mesh_of((4, 2))
    r = check(lambda w, i: F.embedding(i, w), [T(16, 6), ids(16, 4, 5)],
              [None, ("data", None)], mesh, grad=[0])
    assert not collectives(r.fwd_stats), collectives(r.fwd_stats)
