"""Python-side fixes for storage-less device tensors on torch 1.13.

- ``repr``/``print``: ``torch._tensor_str`` only copies xla/lazy/ipu tensors to the host first.
- pickling (``torch.save``, ``copy.deepcopy``): the functionalization wrapper has no storage
  that Python may touch; we pickle the host value and rebuild on the device, the same way
  torch pickles xla tensors.
"""
import torch

from ._device import is_spmd_tensor

_orig_repr = torch.Tensor.__repr__
_orig_reduce_ex = torch.Tensor.__reduce_ex__
_orig_deepcopy = torch.Tensor.__deepcopy__


def _spmd_repr(self, *args, **kwargs):
    if not is_spmd_tensor(self):
        return _orig_repr(self, *args, **kwargs)
    with torch.no_grad():
        host = self.detach().cpu()
    text = _orig_repr(host, *args, **kwargs)
    suffix = f", device='{self.device}'"
    if self.requires_grad:
        suffix += ", requires_grad=True"
    return text[:-1] + suffix + ")" if text.endswith(")") else text + suffix


def _rebuild_spmd_tensor(host, requires_grad):
    from ._device import device
    t = host.to(device())
    t.requires_grad_(requires_grad)
    return t


def _rebuild_spmd_parameter(host, requires_grad):
    return torch.nn.Parameter(_rebuild_spmd_tensor(host, False), requires_grad)


def _spmd_reduce_ex(self, proto):
    if not is_spmd_tensor(self):
        return _orig_reduce_ex(self, proto)
    host = self.detach().cpu()
    if isinstance(self, torch.nn.Parameter):
        return (_rebuild_spmd_parameter, (host, self.requires_grad))
    return (_rebuild_spmd_tensor, (host, self.requires_grad))


def _spmd_deepcopy(self, memo):
    if not is_spmd_tensor(self):
        return _orig_deepcopy(self, memo)
    if id(self) in memo:
        return memo[id(self)]
    with torch.no_grad():
        new = self.detach().clone()
    if isinstance(self, torch.nn.Parameter):
        new = torch.nn.Parameter(new, self.requires_grad)
    else:
        new.requires_grad_(self.requires_grad)
    if self.grad is not None:
        new.grad = _spmd_deepcopy(self.grad, memo)
    memo[id(self)] = new
    return new


def install():
    torch.Tensor.__repr__ = _spmd_repr
    torch.Tensor.__reduce_ex__ = _spmd_reduce_ex
    torch.Tensor.__deepcopy__ = _spmd_deepcopy
