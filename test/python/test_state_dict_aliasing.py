"""Writes into a tensor reach its aliases, as on CPU: a detached root (a state dict of plain
tensors, an optimizer's view of them) sees in-place ops and ``_load_local_shards`` of the
tensor it was detached from, and the other way round. Differential against the same writes on
CPU where CPU has them."""
import numpy as np
import torch

import torch_spmd
import torch_spmd.distributed.spmd as xs
from torch_spmd import _C

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
