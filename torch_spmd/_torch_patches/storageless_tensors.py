"""Python-side fixes for storage-less device tensors (still needed on torch 2.x).

- ``repr``/``print``: ``torch._tensor_str`` formats functional wrappers of views and empty
  tensors as ``_to_functional_tensor(...)``; we format the host value like any device tensor.
- ``Module.to(spmd)`` / ``Module._apply``: a CPU parameter cannot become an spmd tensor in place
  (``param.data = ...`` needs compatible tensor types), so torch creates new ``Parameter``
  objects; weights tied across modules (an embedding and an LM head) would silently come
  apart. The patch re-ties them: every module slot that held one parameter object holds one
  new object afterwards, as with ``.cuda()``.
- pickling (``torch.save``, ``copy.deepcopy``): the functionalization wrapper has no storage
  that Python may touch; we pickle the host value and rebuild on the device, the way torch
  pickles xla tensors. Unlike xla's, the host value's storage is tagged with the spmd device's
  location, so ``torch.load(..., map_location="cpu")`` (or any map_location) applies to it.
- ``torch.autograd.graph.save_on_cpu``: its pack hook reads a saved tensor to the host at once
  (``tensor.cpu()``), which for a lazy spmd tensor would end the step's graph in the middle of
  the forward; for spmd tensors it marks them to be offloaded instead (``torch_spmd.memory``),
  and the compiler moves them to host memory and back (torch 2.6 and later).
- ``data_ptr``: the wrapper's storage has no data pointer, so ``untyped_storage().data_ptr()``
  raises and ``data_ptr()`` is 0 for every tensor, and code that finds tied or shared tensors by
  storage (Hugging Face's ``save_pretrained``, safetensors) fails. Each spmd storage gets an
  address of its own when first asked (``csrc/aten/storage_address.h``): distinct, non-zero,
  shared by views and tied weights, never dereferenced.
"""
import copy
import functools
import weakref

import torch

from .._impl.device import is_spmd_tensor

_orig_repr = torch.Tensor.__repr__
_orig_reduce_ex = torch.Tensor.__reduce_ex__
_orig_deepcopy = torch.Tensor.__deepcopy__


def _is_fake(t) -> bool:
    from torch._subclasses.fake_tensor import is_fake
    return is_fake(t)


def _spmd_repr(self, *, tensor_contents=None):
    """Formats an spmd tensor the way torch formats a tensor on a non-default device (cuda,
    xla): the values of its host copy, then ``device=...``, dtype/size and autograd suffixes.
    Functionalization wrappers would otherwise print as ``_to_functional_tensor(...)``."""
    if not is_spmd_tensor(self) or _is_fake(self):
        # (dynamo's and AOTAutograd's fake tensors report the device they stand for)
        return _orig_repr(self, tensor_contents=tensor_contents)
    from torch import _tensor_str as ts
    with torch.no_grad():
        # (not self.detach(): a detached view no longer aliases its base; see backend.cc)
        host = self.cpu()
    prefix = "tensor("
    indent = len(prefix)
    suffixes = ["device='" + str(self.device) + "'"]
    default_complex = torch.cdouble if torch.get_default_dtype() == torch.double else torch.cfloat
    has_default_dtype = host.dtype in (torch.get_default_dtype(), default_complex, torch.int64,
                                       torch.bool)
    if host.numel() == 0:
        if host.dim() != 1:
            suffixes.append("size=" + str(tuple(host.shape)))
        if host.dtype != torch.get_default_dtype():
            suffixes.append("dtype=" + str(host.dtype))
        tensor_str = "[]"
    else:
        if not has_default_dtype:
            suffixes.append("dtype=" + str(host.dtype))
        tensor_str = ts._tensor_str(host, indent)
    if tensor_contents is not None:
        tensor_str = tensor_contents
    if self.grad_fn is not None:
        name = type(self.grad_fn).__name__
        if name == "CppFunction":
            name = self.grad_fn.name().rsplit("::", 1)[-1]
        suffixes.append("grad_fn=<{}>".format(name))
    elif self.requires_grad:
        suffixes.append("requires_grad=True")
    return ts._add_suffixes(prefix + tensor_str, suffixes, indent, force_newline=False)


_LOCATION = "spmd:0"
# data_ptr -> host copy being pickled now (their storages are tagged _LOCATION by _spmd_tag).
_saving = {}
# data_ptrs of storages that torch.load restored for the spmd device (see _load_to_device).
_restored_for_device = set()


def _spmd_tag(storage):
    ref = _saving.get(storage.data_ptr())
    if ref is not None and ref() is not None:
        return _LOCATION
    return None


def _spmd_deserialize(storage, location):
    """Storages saved from the device (or mapped to it with ``map_location="spmd"``) stay host
    storages while torch rebuilds the tensors over them; ``torch.load`` then moves those
    tensors to the device. ``privateuseone`` is the location checkpoints saved on torch 1.13 carry."""
    if location.startswith("spmd") or location.startswith("privateuseone"):
        _restored_for_device.add(storage.data_ptr())
        return storage
    return None


def _spmd_reduce_ex(self, proto):
    """Pickles an spmd tensor as the plain tensor record of its host value (rebuilt by torch's
    own ``_rebuild_tensor_v2``, which ``weights_only`` loading allows) whose storage is tagged
    with the device's location, as a CUDA tensor's is: ``map_location`` applies to it, and
    without torch_spmd it loads with ``map_location="cpu"``."""
    if not is_spmd_tensor(self):
        return _orig_reduce_ex(self, proto)
    with torch.no_grad():
        host = self.cpu().clone()  # its own storage, offset 0: the storage is the tensor
    host.requires_grad_(self.requires_grad)
    reduced = _orig_reduce_ex(host, proto)
    if host.numel() > 0:
        # The record holds the storage object the pickler tags later; the host tensor may be
        # gone by then, so remember the storage.
        storage = reduced[1][0]
        for ptr in [p for p, r in _saving.items() if r() is None]:
            del _saving[ptr]
        _saving[host.data_ptr()] = weakref.ref(storage)
    return reduced


def _to_device_tree(obj, memo):
    """The loaded object with every tensor over a storage restored for the device moved there
    (Parameters stay Parameters, shared tensors stay shared)."""
    if id(obj) in memo:
        return memo[id(obj)]
    result = obj
    if isinstance(obj, torch.Tensor):
        if obj.device.type == "cpu" and (obj.untyped_storage().data_ptr() in _restored_for_device
                                         or (obj.numel() == 0 and _restored_for_device)):
            from .._impl.device import device
            with torch.no_grad():
                moved = obj.detach().to(device())
            if isinstance(obj, torch.nn.Parameter):
                result = torch.nn.Parameter(moved, obj.requires_grad)
            else:
                result = moved.requires_grad_(obj.requires_grad)
    elif isinstance(obj, dict):
        items = [(k, _to_device_tree(v, memo)) for k, v in obj.items()]
        if any(v is not obj[k] for k, v in items):
            result = copy.copy(obj)  # keeps the type and attributes (a state_dict's _metadata)
            for k, v in items:
                result[k] = v
    elif isinstance(obj, (list, tuple)):
        items = [_to_device_tree(v, memo) for v in obj]
        if any(a is not b for a, b in zip(items, obj)):
            if hasattr(obj, "_fields"):  # a namedtuple
                result = type(obj)(*items)
            else:
                result = type(obj)(items)
    memo[id(obj)] = result
    return result


_orig_load = torch.load


@functools.wraps(_orig_load)
def _load_to_device(*args, **kwargs):
    _restored_for_device.clear()
    try:
        loaded = _orig_load(*args, **kwargs)
        if _restored_for_device:
            loaded = _to_device_tree(loaded, {})
        return loaded
    finally:
        _restored_for_device.clear()


def _spmd_deepcopy(self, memo):
    if not is_spmd_tensor(self):
        return _orig_deepcopy(self, memo)
    if id(self) in memo:
        return memo[id(self)]
    with torch.no_grad():
        new = self.clone()
    if isinstance(self, torch.nn.Parameter):
        new = torch.nn.Parameter(new, self.requires_grad)
    else:
        new.requires_grad_(self.requires_grad)
    if self.grad is not None:
        new.grad = _spmd_deepcopy(self.grad, memo)
    memo[id(self)] = new
    return new


_orig_apply = torch.nn.Module._apply


def _apply_keeping_ties(self, fn, recurse=True):
    """Module._apply that keeps parameters shared between modules shared (see module doc)."""
    slots = {}  # id(original parameter) -> [(module, name), ...]
    originals = {}
    for module in self.modules():
        for name, p in module._parameters.items():
            if p is not None:
                slots.setdefault(id(p), []).append((module, name))
                originals[id(p)] = p  # keep the objects alive: ids stay unique meanwhile
    shared = {key: places for key, places in slots.items() if len(places) > 1}
    if not shared:
        return _orig_apply(self, fn, recurse)
    # Convert each shared parameter once: later slots see the first slot's result.
    memo = {}

    def convert_once(t):
        if id(t) in shared:
            if id(t) not in memo:
                memo[id(t)] = fn(t)
            return memo[id(t)]
        return fn(t)

    result = _orig_apply(self, convert_once, recurse)
    for key, places in shared.items():
        first_module, first_name = places[0]
        tied = first_module._parameters[first_name]
        for module, name in places[1:]:
            module._parameters[name] = tied
    del originals
    return result


_orig_storage_data_ptr = torch.UntypedStorage.data_ptr
_orig_tensor_data_ptr = torch.Tensor.data_ptr


def _spmd_storage_data_ptr(self):
    if self.device.type == "spmd":
        from .. import _C
        return _C._storage_address(self._cdata)
    return _orig_storage_data_ptr(self)


def _spmd_tensor_data_ptr(self):
    if self.device.type == "spmd" and torch._is_functional_tensor(self):
        from .. import _C
        _C._storage_address(self.untyped_storage()._cdata)  # the offset is torch's to add
    return _orig_tensor_data_ptr(self)


_orig_save_on_cpu = torch.autograd.graph.save_on_cpu


class _SaveOnCpu(_orig_save_on_cpu):
    """``torch.autograd.graph.save_on_cpu`` that offloads spmd tensors to their hosts' memory
    as the compiler moves them (``torch_spmd.memory``): its own pack hook would read each
    saved spmd tensor to the host at once (``tensor.cpu()``), ending the step's graph. Other
    tensors are packed as torch packs them."""

    def __init__(self, pin_memory: bool = False, device_type: str = "cuda") -> None:
        super().__init__(pin_memory=pin_memory, device_type=device_type)
        pack, unpack = self.pack_hook, self.unpack_hook

        def pack_hook(t):
            if is_spmd_tensor(t):
                from ..memory import _pack_for_host
                return (_SaveOnCpu, _pack_for_host(t))
            return pack(t)

        def unpack_hook(packed):
            if isinstance(packed, tuple) and len(packed) == 2 and packed[0] is _SaveOnCpu:
                return packed[1]
            return unpack(packed)

        self.pack_hook, self.unpack_hook = pack_hook, unpack_hook


def install():
    torch.autograd.graph.save_on_cpu = _SaveOnCpu
    torch.UntypedStorage.data_ptr = _spmd_storage_data_ptr
    torch.Tensor.data_ptr = _spmd_tensor_data_ptr
    torch.nn.Module._apply = _apply_keeping_ties
    # Before the CPU tagger (priority 10): our host copies' storages are CPU storages.
    torch.serialization.register_package(5, _spmd_tag, _spmd_deserialize)
    torch.Tensor.__repr__ = _spmd_repr
    torch.Tensor.__reduce_ex__ = _spmd_reduce_ex
    torch.load = _load_to_device
    torch.Tensor.__deepcopy__ = _spmd_deepcopy
