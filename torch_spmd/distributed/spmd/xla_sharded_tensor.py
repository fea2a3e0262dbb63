"""``XLAShardedTensor`` (a torch.Tensor wrapper carrying a sharded spmd tensor) and ``XLAShard``.

As in PyTorch/XLA 2.x, ``XLAShardedTensor`` subclasses ``torch.distributed.tensor.DTensor``
(``isinstance(t, DTensor)``; ``placements``, ``_spec`` and ``device_mesh`` describe the annotation
``mark_sharding`` / ``distribute_tensor`` gave it) while keeping the XLAShardedTensor RFC's
behaviour: a ``_make_wrapper_subclass`` whose ``__torch_dispatch__`` runs every op on the wrapped
``global_tensor`` and wraps tensor results again. None of DTensor's own machinery (sharding
propagation, ``_local_tensor``, ``to_local``) is used: the global tensor is the data.
"""
import contextlib
from dataclasses import dataclass
from typing import Iterator, List, Optional, Union

import torch
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.placement_types import Partial, Placement, Replicate, Shard
from torch.utils._pytree import tree_flatten, tree_map

from ... import _C
from ..._impl import process_span as _process_span
from ..._impl.device import is_spmd_tensor
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


def _unwrap(t):
    """The plain tensor behind ``t``: a wrapper's ``global_tensor``, also through the functional
    tensor that functionalization puts around a wrapper an op mixing wrappers with plain spmd
    tensors returned (functionalization runs before ``__torch_dispatch__``)."""
    if isinstance(t, XLAShardedTensor):
        return t.global_tensor
    inner = _wrapper_inside(t)
    return inner.global_tensor if inner is not None else t


def _wrapper_inside(t) -> Optional["XLAShardedTensor"]:
    """The XLAShardedTensor a functional tensor wraps (see ``_unwrap``), else None."""
    if isinstance(t, torch.Tensor) and not isinstance(t, XLAShardedTensor) and \
            torch._is_functional_tensor(t):
        inner = torch._from_functional_tensor(t)
        if isinstance(inner, XLAShardedTensor):
            return inner
    return None


def _rewrap_global(t: torch.Tensor) -> torch.Tensor:
    """The global tensor for the wrapper ``_rewrap_result`` makes of ``t``.

    For a functional tensor around an XLAShardedTensor: that wrapper's global tensor, made
    functional again (it was computed by ``__torch_dispatch__`` while functionalization was
    running, and so excluded, so it is the bare device value; spmd tensors outside are always
    functional). For a host tensor: ``t`` (detached: the wrapper carries the autograd history).
    """
    inner = _wrapper_inside(t)
    if inner is None:
        return t.detach()
    g = inner.global_tensor
    if not torch._is_functional_tensor(g):
        g = torch._to_functional_tensor(g)
    return g


class _Rewrap(torch.autograd.Function):
    """``t`` as an XLAShardedTensor (see ``_rewrap_result``), on the autograd graph: the gradient
    passes through unchanged, as a plain tensor."""

    @staticmethod
    def forward(ctx, t):
        return XLAShardedTensor(_rewrap_global(t))

    @staticmethod
    def backward(ctx, grad):
        # As a plain (functional) spmd tensor, like the gradients of the plain tensors the op
        # mixed in: a wrapper's global tensor computed by ``__torch_dispatch__`` is bare.
        grad = _unwrap(grad)
        if is_spmd_tensor(grad) and not torch._is_functional_tensor(grad):
            grad = torch._to_functional_tensor(grad)
        return grad


def _rewrap_result(out, args, kwargs):
    """``__torch_function__``'s results, as PyTorch/XLA's XLAShardedTensor returns them: tensor
    results of a call on a wrapper are wrappers (keeping their autograd history).

    ``__torch_dispatch__`` already wraps the spmd results of ops on wrappers alone. Two kinds are
    wrapped here: host results (``t.cpu()``; wrapped here rather than in ``__torch_dispatch__``
    so that plain tensors that functionalization made around a wrapper keep giving plain host
    tensors), and the functional tensors functionalization puts around the wrapper an op that
    mixed wrappers with plain spmd tensors returned. Inputs handed back (in-place and ``out=``
    ops) and every other value are returned as they are.
    """
    flat = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
    if not any(isinstance(a, XLAShardedTensor) for a in flat):
        return out
    inputs = {id(a) for a in flat}

    def rewrap(r):
        if not isinstance(r, torch.Tensor) or isinstance(r, XLAShardedTensor) or id(r) in inputs:
            return r
        if _wrapper_inside(r) is None and is_spmd_tensor(r):
            return r
        return _Rewrap.apply(r) if r.requires_grad else XLAShardedTensor(_rewrap_global(r))

    if isinstance(out, torch.Tensor):
        return rewrap(out)
    if isinstance(out, (tuple, list)):
        return tree_map(rewrap, out)
    return out


# Tensor methods that read host memory directly (not through an op): on a wrapper they run on
# ``global_tensor`` (a wrapper has no storage of its own), so ``t.cpu().numpy()`` works.
_HOST_METHODS = (torch.Tensor.numpy, torch.Tensor.tolist, torch.Tensor.__array__)


class XLAShardedTensor(DTensor):
    """A tensor with a sharding annotation, returned by ``mark_sharding``.

    It behaves like the (global, unpartitioned) tensor it wraps: ops run on ``global_tensor``
    and tensor results come back wrapped (also host results: ``t.cpu()`` is an XLAShardedTensor
    around a CPU tensor, as in PyTorch/XLA). ``mesh_shape`` and ``partition_spec`` record the
    annotation that produced it (None for op results); from them ``placements`` / ``_spec`` /
    ``device_mesh`` give the DTensor view (a ``DeviceMesh`` of device type ``'xla'``).

    An op mixing a wrapper with plain spmd tensors (``model(sharded_input)``) returns an
    XLAShardedTensor too, with its autograd history.
    """

    global_tensor: torch.Tensor
    mesh_shape: Optional[tuple]
    partition_spec: Optional[tuple]

    @staticmethod
    def __new__(cls, elem: torch.Tensor, mesh_shape=None, partition_spec=None, *args, **kwargs):
        source = elem if isinstance(elem, XLAShardedTensor) else _wrapper_inside(elem)
        elem = _unwrap(elem)
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
        # As PyTorch/XLA: wrapping a wrapper keeps its annotation unless a new one is given.
        if source is not None:
            mesh_shape = source.mesh_shape if mesh_shape is None else mesh_shape
            partition_spec = source.partition_spec if partition_spec is None else partition_spec
        r.mesh_shape = mesh_shape
        r.partition_spec = partition_spec
        r._mesh = source._mesh if source is not None and mesh_shape is None else None
        r._device_mesh = source._device_mesh if source is not None and mesh_shape is None \
            else None
        r._cached_spec = None
        return r

    def __init__(self, *args, **kwargs):
        # DTensor.__init__ (export/dynamo bookkeeping for DTensor's own constructor) is not run.
        pass

    @property
    def sharding_spec(self) -> str:
        """The sharding in XLA text form (``""`` when the tensor has none, or is on the host)."""
        if not is_spmd_tensor(self.global_tensor):
            return ""
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
        mine = _process_span.local_devices()  # global ids
        by_device = {_device_index(s.shard_device): s.data for s in shards}
        if len(shards) != len(mine) or sorted(by_device) != list(mine):
            raise RuntimeError(
                "Shards must be provided for all local devices: got devices "
                f"{sorted(_device_index(s.shard_device) for s in shards)}, expected "
                f"{mine.start}..{mine.stop - 1}")
        _C._load_local_shards(self.global_tensor, [by_device[i] for i in mine])
        self.invalidate_spec_cache()

    def __repr__(self) -> str:
        return f"XLAShardedTensor({self.global_tensor})"

    # -----------------------------------------------------------------------------------------
    # The DTensor view of the annotation.

    def _mesh_axis(self, entry) -> int:
        """A partition-spec entry (axis index or name) as a mesh axis index."""
        if isinstance(entry, str):
            names = tuple(self._mesh.axis_names or ()) if self._known_mesh() else ()
            if entry not in names:
                raise ValueError(f"partition_spec entry {entry!r} names a mesh axis, but the "
                                 "mesh's axis names are not known")
            return names.index(entry)
        return int(entry)

    def _known_mesh(self) -> bool:
        return self._mesh is not None and tuple(self._mesh.mesh_shape) == tuple(self.mesh_shape)

    def _device_mesh_for_spec(self):
        from torch.distributed.device_mesh import DeviceMesh
        dm = self._device_mesh
        if dm is not None and tuple(dm.mesh.size()) == tuple(self.mesh_shape):
            return dm
        if self._known_mesh():
            ids = [int(d) for d in self._mesh.device_ids]
            names = tuple(self._mesh.axis_names) if self._mesh.axis_names else None
        else:
            from ...runtime import global_runtime_device_count
            ids, names = list(range(global_runtime_device_count())), None
        return DeviceMesh("xla", torch.tensor(ids).reshape(tuple(self.mesh_shape)),
                          mesh_dim_names=names)

    @property
    def _spec(self):
        """The annotation as a DTensor ``DTensorSpec``: the mesh (a ``DeviceMesh`` of device
        type ``'xla'``: the one ``distribute_tensor`` was given, else the ``Mesh``'s devices)
        and one placement per mesh axis, ``Shard(dim)`` for the tensor dim(s) it tiles, else
        ``Replicate()``. ValueError when the tensor has no recorded annotation (op results);
        NotImplementedError for a dim tiled over mesh axes out of increasing order on a torch
        whose DTensorSpec has no ``shard_order`` (2.6). Cached until ``invalidate_spec_cache()`` (``wrap_as_sharded_tensor`` calls it)."""
        from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
        if self._cached_spec is not None:
            return self._cached_spec
        if self.mesh_shape is None:
            raise ValueError(
                "mesh_shape must be specified to create DTensorSpec. "
                "If this tensor was created through torch operations, it may be auto-wrapped. "
                "Use wrap_as_sharded_tensor() to set mesh_shape before accessing _spec. ")
        if self.partition_spec is None:
            raise ValueError(
                "partition_spec must be specified to create DTensorSpec. "
                "If this tensor was created through torch operations, it may be auto-wrapped. "
                "Use wrap_as_sharded_tensor() to set partition_spec before accessing _spec. ")
        placements, shard_order, needs_order = self._placements_and_order()
        kwargs = {}
        if needs_order:
            try:
                from torch.distributed.tensor._dtensor_spec import ShardOrderEntry
            except ImportError:
                raise NotImplementedError(
                    f"partition_spec {self.partition_spec} tiles a dim over mesh axes "
                    f"{[m for _, m in shard_order]} out of increasing order, which this torch's "
                    "DTensorSpec cannot express (it has no shard_order; newer torches do)"
                ) from None
            kwargs["shard_order"] = tuple(ShardOrderEntry(d, m) for d, m in shard_order)
        g = self.global_tensor
        self._cached_spec = DTensorSpec(
            mesh=self._device_mesh_for_spec(), placements=placements,
            tensor_meta=TensorMeta(shape=g.shape, stride=g.stride(), dtype=g.dtype), **kwargs)
        return self._cached_spec

    def _placements_and_order(self):
        """The annotation's DTensor placements (``Shard(dim)`` on each mesh axis that tiles
        ``dim``, else ``Replicate()``), each sharded dim's mesh axes major first, and whether
        any dim lists them out of DTensor's default (increasing) order."""
        placements: List[Placement] = [Replicate() for _ in self.mesh_shape]
        shard_order = []
        needs_order = False
        for tensor_dim, entry in enumerate(self.partition_spec):
            if entry is None:
                continue
            axes = [self._mesh_axis(e) for e in (entry if isinstance(entry, (tuple, list))
                                                 else (entry,))]
            for axis in axes:
                placements[axis] = Shard(tensor_dim)
            # DTensor's default order tiles a dim over its mesh axes in increasing order; a
            # partition-spec tuple lists them most major first.
            needs_order |= axes != sorted(axes)
            shard_order.append((tensor_dim, tuple(axes)))
        return tuple(placements), shard_order, needs_order

    @property
    def placements(self) -> tuple:
        """The DTensor placements of the annotation (see ``_spec``, whose cache they share);
        ValueError without one."""
        if self.mesh_shape is None or self.partition_spec is None:
            raise ValueError(
                "Placements not available: XLAShardedTensor requires mesh_shape and "
                "partition_spec to be set. Use mark_sharding() to properly initialize sharding "
                "information.")
        try:
            return self._spec.placements  # cached with the spec, as PyTorch/XLA caches it
        except NotImplementedError:  # torch 2.6: no shard_order for out-of-order mesh axes
            return self._placements_and_order()[0]

    def invalidate_spec_cache(self) -> None:
        """Forgets the cached ``_spec`` (after the annotation changed)."""
        self._cached_spec = None

    def redistribute(self, device_mesh, placements, *, async_op: bool = False):
        """A copy of the tensor sharded per ``placements`` on ``device_mesh`` (a ``Mesh``, or a
        ``DeviceMesh`` of device type ``'xla'``/``'spmd'``), as DTensor's ``redistribute``:
        the values are the same, ``self`` keeps its own sharding (PyTorch/XLA re-annotates the
        same tensor unless ``async_op``). ``Partial`` placements raise NotImplementedError."""
        from . import _partition_spec
        from .mesh import Mesh
        if not isinstance(device_mesh, Mesh):  # a DeviceMesh (api.convert_to_xla_mesh)
            device_mesh = Mesh(device_mesh.mesh.flatten().tolist(),
                               tuple(device_mesh.mesh.size()), device_mesh.mesh_dim_names)
        if len(placements) != len(device_mesh.mesh_shape):
            raise ValueError(
                f"Number of placements ({len(placements)}) must match mesh dimensions "
                f"({len(device_mesh.mesh_shape)})")
        for placement in placements:
            if isinstance(placement, Partial):
                raise NotImplementedError(
                    "Partial placement is not yet implemented and may have unexpected "
                    "behavior. Use Shard or Replicate placements instead.")
        rank = len(self.global_tensor.shape)
        partition_spec = [None] * rank
        for mesh_dim, placement in enumerate(placements):
            if isinstance(placement, Shard):
                if not -rank <= placement.dim < rank:
                    raise IndexError(
                        f"Shard dimension {placement.dim} is out of bounds for tensor with "
                        f"{rank} dimensions")
                dim = placement.dim % rank
                if partition_spec[dim] is None:
                    partition_spec[dim] = mesh_dim
                else:
                    prev = partition_spec[dim]
                    partition_spec[dim] = (prev if isinstance(prev, tuple) else (prev,)) + \
                        (mesh_dim,)
            elif not isinstance(placement, Replicate):
                raise ValueError(f"Unsupported placement type: {type(placement).__name__}")
        # A pending copy: the annotation (as mark_sharding's) is a sharding constraint the
        # partitioner lays it out by.
        partition_spec = _partition_spec.normalize(tuple(partition_spec))
        result = self.global_tensor.clone()
        _C._mark_sharding(result, *device_mesh._sharding_args(partition_spec))
        out = XLAShardedTensor(result, device_mesh.mesh_shape, partition_spec)
        out._mesh = device_mesh
        return out

    # -----------------------------------------------------------------------------------------
    # Dispatch.

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        """Runs ``func`` as plain torch does (down to ``__torch_dispatch__``), then hands
        results of ops that mixed wrappers with plain spmd tensors back as XLAShardedTensors
        (see ``_rewrap_result``)."""
        kwargs = kwargs or {}
        if func in _HOST_METHODS and args and isinstance(args[0], XLAShardedTensor):
            return func(args[0].global_tensor, *args[1:], **kwargs)
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **kwargs)
        return _rewrap_result(out, args, kwargs)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        """Runs ``func`` on the wrapped tensors; spmd tensor results are wrapped (an in-place
        op's result is the wrapper it was called on; host results are wrapped by
        ``__torch_function__``)."""
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
