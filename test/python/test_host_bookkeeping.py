"""Host bookkeeping (csrc/aten/host_bookkeeping.h): integer and boolean ops on known, replicated
data run on the host, and joins of such data with pending values sync those first, so a loop
that grows its token ids keeps its graphs the same shape. Each case is checked against CPU
eager, and against what must stay in the graph (sharded data, float data, plan mode)."""
import numpy as np
import torch

import torch_spmd
import torch_spmd.core.xla_model as xm
import torch_spmd.debug.metrics as met
import torch_spmd.distributed.spmd as xs
import torch_spmd.plan as plan
from torch_spmd import _C
from conftest import ensure_devices

DEV = torch_spmd.device()


def _pending(t):
    return "aten::" in _C._graph_text([t])


def _compiles():
    data = met.metric_data("CompileTime")
    return data[0] if data else 0


def test_views_of_known_integer_data_and_ops_on_them_are_data():
    host = torch.arange(12).reshape(2, 6)
    ids = host.to(DEV)
    mask = (host % 5 != 0).to(DEV)
    last = ids[:, -1:]
    shifted = torch.nn.functional.pad(ids[:, 1:], (0, 1), value=-100)
    flags = (ids[:, -1] == 11) | mask[:, 0]   # an op on a host-made value: the host's too
    for t in (last, shifted, flags):
        assert not _pending(t)
    torch.testing.assert_close(last.cpu(), host[:, -1:])
    torch.testing.assert_close(shifted.cpu(), torch.nn.functional.pad(host[:, 1:], (0, 1), value=-100))
    torch.testing.assert_close(flags.cpu(), (host[:, -1] == 11) | (host % 5 != 0)[:, 0])
    # Integer ops on uploaded data alone are the program's, as they would be on a device.
    counted = mask.all(-1)
    assert _pending(counted)
    torch.testing.assert_close(counted.cpu(), (host % 5 != 0).all(-1))


def test_a_join_with_a_pending_value_syncs_it_and_is_data():
    torch.manual_seed(0)
    w = torch.randn(6, 6)
    ids_host = torch.arange(12).reshape(2, 6)
    ids, wd = ids_host.to(DEV), w.to(DEV)
    nxt = (ids.float() @ wd).argmax(-1)  # pending: computed from float data
    assert _pending(nxt)
    executed = met.counter_value("ExecuteGraph") or 0
    grown = torch.cat([ids, nxt[:, None]], dim=-1)
    assert not _pending(grown) and not _pending(nxt)  # the pending operand was synced
    assert (met.counter_value("ExecuteGraph") or 0) == executed + 1
    want = torch.cat([ids_host, (ids_host.float() @ w).argmax(-1)[:, None]], dim=-1)
    torch.testing.assert_close(grown.cpu(), want)


def test_a_growing_loop_compiles_its_step_once():
    """Token ids grow by one per iteration; each iteration's graph (an embedding and a matmul of
    the last token) is the same program."""
    torch.manual_seed(0)
    emb, proj = torch.randn(32, 8), torch.randn(8, 32)
    ids_host = torch.randint(0, 32, (2, 4))
    ids, emb_d, proj_d = ids_host.to(DEV), emb.to(DEV), proj.to(DEV)
    compiles = []
    for _ in range(10):
        nxt = (emb_d[ids[:, -1]] @ proj_d).argmax(-1)
        ids = torch.cat([ids, nxt[:, None]], dim=-1)
        ids_host = torch.cat([ids_host, (emb[ids_host[:, -1]] @ proj).argmax(-1)[:, None]], dim=-1)
        compiles.append(_compiles())
    torch.testing.assert_close(ids.cpu(), ids_host)
    assert compiles[-1] == compiles[1], compiles


def test_sharded_float_and_random_values_stay_in_the_graph():
    ensure_devices(8)
    mesh = xs.Mesh(np.arange(8), (8,), ("data",))
    ids = torch.arange(32).reshape(8, 4).to(DEV)
    xs.mark_sharding(ids, mesh, ("data", None))
    xm.mark_step()
    sliced = ids[:, -1:]
    assert _pending(sliced)  # a sharded layout is the program's to keep
    floats = torch.arange(8.0).to(DEV)[2:]
    assert _pending(floats)
    torch.testing.assert_close(sliced.cpu(), torch.arange(32).reshape(8, 4)[:, -1:])


def test_plan_mode_folds_known_values_and_records_joins_with_pending_ones():
    with plan.Plan(num_devices=8):
        ids = torch.arange(12).reshape(2, 6).to(DEV)
        last = ids[:, -1:]
        assert not _pending(last)
        assert last.cpu().tolist() == [[5], [11]]
        grown = torch.cat([last, last + 1], dim=-1)  # (last + 1: an op on a host-made value)
        assert not _pending(grown)
        assert grown.cpu().tolist() == [[5, 6], [11, 12]]
        w = torch.ones(6, 6).to(DEV)
        nxt = (ids.float() @ w).argmax(-1)
        joined = torch.cat([ids, nxt[:, None]], dim=-1)
        assert _pending(joined)
