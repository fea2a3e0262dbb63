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


def test_a_read_syncs_along_what_depends_on_its_values():
    # A decoding loop: each iteration updates a state and a counter, and reads a flag computed
    # from the state. The read materializes the live tensors that depend on what it computes
    # (the state, the counter derived from it; not views), so no graph grows with the loop.
    dev = torch_spmd.device()
    state = torch.arange(6.0).to(dev)
    count = torch.zeros((), dtype=torch.long).to(dev)
    host_state, host_count = torch.arange(6.0), torch.zeros((), dtype=torch.long)
    lengths = []
    for _ in range(12):
        state = state * 0.5 + 1
        count = count + (state > 1.5).sum()
        host_state = host_state * 0.5 + 1
        host_count = host_count + (host_state > 1.5).sum()
        done = bool((state < 0).any())  # the read
        assert not done
        lengths.append(len(_C._graph_text([count]).splitlines()))
    assert max(lengths) == min(lengths), lengths
    assert not _pending(state) and not _pending(count)
    assert torch.equal(count.cpu(), host_count)
    torch.testing.assert_close(state.cpu(), host_state, rtol=0, atol=0)
    # A live view of the computed state stays pending (it costs nothing to take again).
    state = state * 0.5 + 1
    view = state[1:]
    assert not bool((state > 100).any())
    assert _pending(view) and not _pending(state)
    torch.testing.assert_close(view.cpu(), (host_state * 0.5 + 1)[1:], rtol=0, atol=0)
