"""The ops aten treats by name (csrc/aten/named_ops.cc) are ops of this torch.

A misspelt or renamed name would silently drop its treatment: a transfer recorded as a plain
op, a shape function not used, a functionalization fix applied where it must not be.
"""
import torch

import torch_spmd  # noqa: F401  (loads the extension)
from torch_spmd import _C
from helpers import missing_from_this_torch


def test_every_named_op_is_an_op_of_this_torch():
    ops = set(torch._C._dispatch_get_all_op_names())
    names = _C._aten_named_op_names()
    assert len(names) > 30 and names == sorted(set(names))
    missing = [name for name in names if name not in ops and not missing_from_this_torch(name)]
    assert not missing, f"named ops torch {torch.__version__} does not have: {missing}"


def test_named_op_treatments_take_effect():
    # One of each kind of entry, seen from Python: a transfer kernel (copy to the host), a
    # metadata answer (no sync), a hidden write (batch norm's running stats), a recorded-as
    # op (_reshape_alias as view) and an in-place view left to functionalization (t_).
    x = torch.arange(6.0).reshape(2, 3)
    d = x.to("spmd")
    assert torch.equal(d.cpu(), x)
    assert d.is_same_size(d)
    bn = torch.nn.BatchNorm1d(3).to("spmd")
    bn(d)
    ref = torch.nn.BatchNorm1d(3)
    ref(x)
    torch.testing.assert_close(bn.running_mean.cpu(), ref.running_mean)
    torch.testing.assert_close(bn.running_var.cpu(), ref.running_var)
    a = torch.ops.aten._reshape_alias(d, [3, 2], [2, 1])
    assert torch.equal(a.cpu(), x.reshape(3, 2))
    t = d.clone()
    t.t_()
    assert t.shape == (3, 2) and torch.equal(t.cpu(), x.t())
