"""mark_step executes every pending value: a regression test for the live-tensor registry, whose
compaction once emptied live entries (a self-move of std::weak_ptr) so mark_step skipped them."""
import gc

import torch

import torch_spmd
import torch_spmd.core.xla_model as xm
from torch_spmd import _C


def _pending(t):
    return "aten::" in _C._graph_text([t])


def test_mark_step_executes_every_live_pending_tensor():
    dev = torch_spmd.device()
    x = torch.ones(4).to(dev)
    before = x + 1            # registered before a tensor that dies
    dead = x * 2
    del dead
    gc.collect()
    after = x + 3             # registered after it
    assert _pending(before) and _pending(after)
    xm.mark_step()
    assert not _pending(before) and not _pending(after)
    torch.testing.assert_close(before.cpu(), torch.full((4,), 2.0))
    torch.testing.assert_close(after.cpu(), torch.full((4,), 4.0))
