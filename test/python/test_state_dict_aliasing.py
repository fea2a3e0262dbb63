"""Writes into a tensor reach its aliases, as on CPU: a detached tensor sees in-place ops and
``_load_local_shards`` of the tensor it was detached from, and the other way round; a
module's state_dict entries alias its parameters (in-place writes, DCP's load into
``model.state_dict()``). Differential against the same writes on CPU."""
import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dist_cp

import torch_spmd
import torch_spmd.distributed.spmd as xs
from torch_spmd import _C
from torch_spmd.distributed.checkpoint import SPMDLoadPlanner, SPMDSavePlanner

from spmd_diff import ensure_devices

DEV = torch_spmd.device()


def test_in_place_writes_reach_a_detached_root_both_ways():
    ensure_devices()

    def run(device):
        t = torch.arange(12.0).reshape(3, 4).to(device)
        d = t.detach()
        d.mul_(3)   # reaches t
        t.add_(1)   # reaches d
        return t.cpu(), d.cpu()

    (want_t, want_d), (got_t, got_d) = run("cpu"), run(DEV)
    assert torch.equal(got_t, want_t) and torch.equal(got_d, want_d)


def test_load_local_shards_reaches_a_detached_alias_and_keeps_the_layout():
    ensure_devices()
    t = torch.zeros(6, 8).to(DEV)
    xs.mark_sharding(t, xs.Mesh(np.arange(8), (2, 4)), (0, 1))
    alias = t.detach()
    shards = sorted(_C._local_shards(t), key=lambda s: s[0])
    _C._load_local_shards(t, [torch.full_like(data, float(device))
                              for device, data, *_ in shards])
    assert _C._get_sharding_spec(t) == _C._get_sharding_spec(alias) != ""
    for device, data, offsets, lengths, _ in _C._local_shards(alias):
        assert torch.all(data == float(device)), device
    want = torch.zeros(6, 8)
    for device, _, offsets, lengths, _ in shards:
        want[offsets[0]:offsets[0] + lengths[0], offsets[1]:offsets[1] + lengths[1]] = device
    assert torch.equal(alias.cpu(), want)


def linear(seed, spec=None):
    """A Linear on CPU and the same one on the device, its weight laid out as ``spec``."""
    torch.manual_seed(seed)
    cpu = torch.nn.Linear(5, 8)
    dev = torch.nn.Linear(5, 8).to(DEV)
    dev.load_state_dict({k: v.to(DEV) for k, v in cpu.state_dict().items()})
    if spec is not None:
        xs.mark_sharding(dev.weight, xs.Mesh(np.arange(8), (2, 4), ("data", "model")), spec)
    return cpu, dev


@pytest.mark.parametrize("spec", [None, ("data", "model"), ("model", None)])
def test_in_place_writes_into_state_dict_entries_reach_the_parameters(spec):
    ensure_devices()
    cpu, dev = linear(0, spec)
    for module in (cpu, dev):
        sd = module.state_dict()
        sd["weight"].mul_(3)
        sd["bias"].copy_(torch.arange(8.0).to(sd["bias"].device))
    for name, p in dev.named_parameters():
        assert torch.equal(p.detach().cpu(), getattr(cpu, name).detach()), name
    if spec is not None:  # the write kept the parameter's layout
        assert _C._get_sharding_spec(dev.weight) != ""


@pytest.mark.parametrize("save_spec,load_spec,planner", [
    (None, None, None),                                    # DCP's default planners
    (None, ("data", "model"), SPMDLoadPlanner),            # unsharded -> sharded
    (("data", "model"), None, SPMDLoadPlanner),            # sharded -> unsharded
    (("model", None), ("data", "model"), SPMDLoadPlanner),  # resharded
])
def test_dcp_load_into_model_state_dict_updates_the_parameters(save_spec, load_spec, planner,
                                                                tmp_path):
    ensure_devices()
    _, src = linear(1, save_spec)
    _, dst = linear(2, load_spec)
    dist_cp.save(state_dict=src.state_dict(), storage_writer=dist_cp.FileSystemWriter(tmp_path),
                 planner=SPMDSavePlanner() if save_spec else None)
    dist_cp.load(state_dict=dst.state_dict(), storage_reader=dist_cp.FileSystemReader(tmp_path),
                 planner=planner() if planner else None)
    for name, p in dst.named_parameters():
        assert torch.equal(p.detach().cpu(), getattr(src, name).detach().cpu()), name
    if load_spec is not None:
        assert _C._get_sharding_spec(dst.weight) != ""
