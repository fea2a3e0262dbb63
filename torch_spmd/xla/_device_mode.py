"""``'xla'`` device names as the spmd device, for PyTorch/XLA scripts run through torch_spmd.xla.

PyTorch/XLA programs write ``t.to('xla')``, ``torch.randn(2, device='xla')``,
``model.to(torch.device('xla'))``. ``xla`` is a device type of torch's own (its XLA dispatch
key), which torch_spmd does not implement (its backend is PrivateUse1, named ``spmd``). This
torch function mode rewrites device arguments of type ``xla`` (strings and ``torch.device``) into
the spmd device before the call. It applies to the thread that installed it (torch function
modes are per thread), costs a Python call per torch function, and is installed only by
``torch_spmd.xla.install()`` (``map_xla_device=True``, the default).
"""
import torch
from torch.overrides import TorchFunctionMode

from torch_spmd._impl import device as _device


def _is_xla(v) -> bool:
    if isinstance(v, str):
        return v == "xla" or v.startswith("xla:")
    return isinstance(v, torch.device) and v.type == "xla"


def _map(v):
    if isinstance(v, str):
        index = v.partition(":")[2]
        return _device.device(int(index) if index else 0)
    return _device.device(0 if v.index is None else v.index)


class XlaDeviceMapping(TorchFunctionMode):
    """Maps ``xla`` device arguments to ``spmd`` ones (``'xla:0'`` -> ``spmd:0``)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if any(_is_xla(a) for a in args):
            args = tuple(_map(a) if _is_xla(a) else a for a in args)
        dev = kwargs.get("device")
        if dev is not None and _is_xla(dev):
            kwargs = dict(kwargs, device=_map(dev))
        return func(*args, **kwargs)
