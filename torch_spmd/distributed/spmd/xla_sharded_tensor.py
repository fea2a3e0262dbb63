"""``XLAShardedTensor`` (a torch.Tensor wrapper carrying a sharded spmd tensor) and ``XLAShard``.

As in PyTorch/XLA (not a DTensor), the wrapper follows the XLAShardedTensor RFC: a
``_make_wrapper_subclass`` whose ``__torch_dispatch__`` runs every op on the wrapped
``global_tensor`` and wraps spmd tensor results again.
"""
import contextlib
from dataclasses import dataclass
from typing import Iterator, List, Optional, Union

import torch
from torch.utils._pytree import tree_map

from ... import _C
from ..._device import is_spmd_tensor
from ...runtime import device_type
from ._sharding_type import ShardingType, sharding_type_of_spec


@dataclass
class XLAShard:
    """One device's piece of a sharded tensor (a host snapshot).

    ``data`` includes the padding of uneven shards; ``indices`` are the unpadded slices of the
    global tensor it covers (clamped to the shape, so possibly empty), or ``Ellipsis`` when the
    tensor is replicated; ``shard_device`` names the device (``'SPMD:3'``); ``replica_id`` is 0
    for tiled, the device ordinal for replicated, and the position within the replication group
    for partially replicated tensors.
    """
    data: torch.Tensor
    indices: Union[type(Ellipsis), List[slice]]
    shard_device: str
    replica_id: int

    def _unpadded_index(self):
        if self.indices is Ellipsis:
            return Ellipsis
        return tuple(slice(0, s.stop - s.start) for s in self.indices)

    @property
    def unpadded_data(self) -> torch.Tensor:
        """``data`` without the padding (a view of ``data``)."""
        return self.data[self._unpadded_index()]

    @unpadded_data.setter
    def unpadded_data(self, t: torch.Tensor) -> None:
        self.data[self._unpadded_index()] = t


@contextlib.contextmanager
def no_dispatch() -> Iterator[None]:
    """Disables ``__torch_dispatch__`` while ops run on the unwrapped tensors."""
    guard = torch._C._DisableTorchDispatch()  # type: ignore[attr-defined]
    try:
        yield
    finally:
        del guard


def _device_index(shard_device: str) -> int:
    """``'SPMD:3'`` -> 3 (only the ordinal matters; an int is accepted too)."""
    if isinstance(shard_device, int):
        return shard_device
    index = str(shard_device).rpartition(":")[2]
    if not index.isdigit():
        raise RuntimeError(f"Invalid shard device {shard_device!r}: expected "
                           f"'{device_type()}:<ordinal>'")
    return int(index)


class XLAShardedTensor(torch.Tensor):
    """A tensor with a sharding annotation, returned by ``mark_sharding``.

    It behaves like the (global, unpartitioned) tensor it wraps: ops run on ``global_tensor``
    and spmd results come back wrapped. ``mesh_shape`` and ``partition_spec`` record the
    annotation that produced it (None for op results).
    """

    global_tensor: torch.Tensor
    mesh_shape: Optional[tuple]
    partition_spec: Optional[tuple]

    # Python-level ops dispatch straight to __torch_dispatch__ (no subclass conversion of
    # results by the default __torch_function__, which would lose global_tensor).
    __torch_function__ = torch._C._disabled_torch_function_impl

    @staticmethod
    def __new__(cls, elem: torch.Tensor, mesh_shape=None, partition_spec=None, *args, **kwargs):
        r = torch.Tensor._make_wrapper_subclass(  # type: ignore[attr-defined]
            cls,
            elem.size(),
            strides=elem.stride(),
            storage_offset=elem.storage_offset(),
            dtype=elem.dtype,
            layout=elem.layout,
            device=elem.device,
            requires_grad=kwargs.get("requires_grad", False))
        r.global_tensor = elem.detach() if r.requires_grad else elem
        r.mesh_shape = mesh_shape
        r.partition_spec = partition_spec
        return r

    @property
    def sharding_spec(self) -> str:
        """The sharding in XLA text form (``""`` when the tensor has none)."""
        return _C._get_sharding_spec(self.global_tensor)

    @property
    def sharding_type(self) -> Optional[ShardingType]:
        """The kind of the current sharding; None when the tensor has none."""
        return sharding_type_of_spec(self.sharding_spec)

    @property
    def local_shards(self) -> List[XLAShard]:
        """One host snapshot per device, in device order (runs pending work first)."""
        shards = _C._local_shards(self.global_tensor)
        replicated = self.sharding_type in (None, ShardingType.REPLICATED)
        out = []
        for device, data, offsets, lengths, replica_id in shards:
            indices = Ellipsis if replicated else [
                slice(o, o + n, 1) for o, n in zip(offsets, lengths)
            ]
            out.append(XLAShard(data, indices, f"{device_type()}:{device}", replica_id))
        return out

    def load_local_shards_(self, shards: List[XLAShard]) -> None:
        """Replaces the data in place with ``shards`` (one per device, padded shapes, any order)
        in the current sharding."""
        if self.sharding_type in (None, ShardingType.REPLICATED):
            raise RuntimeError(
                "Replicated tensor should not be loaded from _load_local_shards - use copy_")
        n = _C._num_devices()
        by_device = {_device_index(s.shard_device): s.data for s in shards}
        if len(shards) != n or sorted(by_device) != list(range(n)):
            raise RuntimeError(
                "Shards must be provided for all local devices: got devices "
                f"{sorted(_device_index(s.shard_device) for s in shards)}, expected 0..{n - 1}")
        _C._load_local_shards(self.global_tensor, [by_device[i] for i in range(n)])

    def __repr__(self) -> str:
        return f"XLAShardedTensor({self.global_tensor})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        """Runs ``func`` on the wrapped tensors; spmd tensor results are wrapped (an in-place
        op's result is the wrapper it was called on)."""
        wrappers = {}

        def unwrap(e):
            if isinstance(e, XLAShardedTensor):
                wrappers[id(e.global_tensor)] = e
                return e.global_tensor
            return e

        def wrap(e):
            if isinstance(e, torch.Tensor) and not isinstance(e, XLAShardedTensor) and \
                    is_spmd_tensor(e):
                wrapper = wrappers.get(id(e))
                return wrapper if wrapper is not None else XLAShardedTensor(e)
            return e

        with no_dispatch():
            result = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs or {}))
        return tree_map(wrap, result)
