"""``SPMDSavePlanner`` / ``SPMDLoadPlanner``: spmd tensors through ``torch.distributed.checkpoint``.

PyTorch/XLA's planners (``torch_xla.experimental.distributed_checkpoint``), for one process
driving every device::

  >>> import torch.distributed.checkpoint as dist_cp
  >>> dist_cp.save(state_dict, storage_writer=dist_cp.FileSystemWriter(path),
  ...              planner=SPMDSavePlanner())
  >>> dist_cp.load(state_dict, storage_reader=dist_cp.FileSystemReader(path),
  ...              planner=SPMDLoadPlanner())

The checkpoint is a standard DCP checkpoint: every tensor is a ``TensorStorageMetadata`` with
its global size and one ``ChunkStorageMetadata`` per saved chunk, every other value a
``BytesStorageMetadata`` (``torch.save``), keys are DCP's flattened names
(``optim.state.0.exp_avg``) and ``planner_data`` holds DCP's flattening map. So plain DCP loads
it into CPU tensors (the default planner reassembles the chunks), and ``SPMDLoadPlanner`` loads
plain DCP checkpoints (one chunk per tensor) into sharded tensors.

Saving: a tiled spmd tensor is written as one chunk per distinct tile (the unpadded data of
``local_shards``; replicas of a tile once, empty tiles of uneven dims not at all); an
unsharded or replicated spmd tensor and a CPU tensor as one chunk; anything else as bytes.

Loading: every target keeps its device, dtype and sharding. Each distinct tile of a sharded
target (computed from the target's own sharding, ``_layout.device_shards``) is filled from the
saved chunks that overlap it, whatever layout they were saved under; whole tensors likewise.
All reads go into host staging buffers, and the targets are only written once every read item
has arrived (``_load_local_shards`` for sharded targets, ``copy_`` otherwise): a load that fails
(a bad key or shape, a damaged or incomplete checkpoint, a read error) changes no tensor.

One process drives all devices, so there is no process group: ``dist_cp.save``/``load`` run in
their single-process (``no_dist``) mode, and the ``is_coordinator`` plan covers every chunk.
Through ``dist_cp`` the planners' errors arrive wrapped in DCP's ``CheckpointException``
(its ``failures`` hold the original exception); ``save_dcp``/``load_dcp`` re-raise the
original ``ValueError``/``RuntimeError``.
"""
import dataclasses
import io
import math
import threading
from collections import ChainMap
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch.distributed.checkpoint._nested_dict import flatten_state_dict
from torch.distributed.checkpoint.default_planner import create_default_global_save_plan
from torch.distributed.checkpoint.metadata import (ChunkStorageMetadata, Metadata,
                                                   MetadataIndex, STATE_DICT_TYPE, StorageMeta,
                                                   TensorProperties, TensorStorageMetadata)
from torch.distributed.checkpoint.planner import (LoadItemType, LoadPlan, LoadPlanner, ReadItem,
                                                  SavePlan, SavePlanner, TensorWriteData,
                                                  WriteItem, WriteItemType)

from ... import _C
from ..._impl import process_span as _process_span
from ..._impl.device import is_spmd_tensor
from ..spmd.xla_sharding import unwrap_sharded_tensor
from . import _layout

__all__ = ["SPMDSavePlanner", "SPMDLoadPlanner", "HostShards", "stage_state_dict"]

Box = _layout.Box


def _unwrap(x: Any) -> Any:
    return unwrap_sharded_tensor(x) if isinstance(x, torch.Tensor) else x


def _volume(sizes: Sequence[int]) -> int:
    return math.prod(int(s) for s in sizes)


def _chunk(box: Box) -> ChunkStorageMetadata:
    return ChunkStorageMetadata(offsets=torch.Size(box[0]), sizes=torch.Size(box[1]))


def _box(chunk: ChunkStorageMetadata) -> Box:
    return tuple(int(o) for o in chunk.offsets), tuple(int(s) for s in chunk.sizes)


def _properties(dtype: torch.dtype, requires_grad: bool = False) -> TensorProperties:
    # Not TensorProperties.create_from_tensor: it asks the tensor is_pinned(), which a device
    # tensor of a backend without host pinning need not answer.
    return TensorProperties(dtype=dtype, requires_grad=bool(requires_grad))


def _sharding(t: torch.Tensor) -> str:
    return _C._get_sharding_spec(t) if is_spmd_tensor(t) else ""


def _tile_boxes(sharding: str, shape: Sequence[int]) -> List[Box]:
    """The distinct non-empty tiles of a tensor laid out as ``sharding`` (tiled) that this
    process saves, in the order of the first device holding each: a tile is saved by the
    process of the first device holding it (all of them with one process)."""
    boxes: List[Box] = []
    seen = set()
    mine = _process_span.local_devices()
    for s in _layout.device_shards(sharding, shape):
        if s.box not in seen and _volume(s.box[1]) > 0:
            seen.add(s.box)
            if s.device in mine:
                boxes.append(s.box)
    return boxes


def _saves_whole_values() -> bool:
    """Whether this process saves the values every process holds alike (untiled tensors,
    objects): the first process of a multi-process SPMD world, or the only one."""
    span = _C._process_span()
    return span is None or span[0] == 0


def _sync_device_tensors(values) -> None:
    """Runs whatever is pending for the spmd tensors among ``values`` as one graph, so that
    their data and layouts can be read."""
    device_tensors = [v.detach() for v in values if is_spmd_tensor(v)]
    if device_tensors:
        _C._sync_tensors(device_tensors)


class HostShards:
    """A host copy of a sharded spmd tensor, saved by ``SPMDSavePlanner`` exactly as the tensor
    itself would be: ``pieces`` are ``(box, data)`` with ``box = (offsets, lengths)`` of each
    distinct non-empty tile and ``data`` its unpadded host tensor (PyTorch/XLA's ``_CpuShards``).

    ``stage_state_dict`` makes them, so that a save can be written later (on another thread)
    while training goes on changing the device tensors.
    """

    def __init__(self, shape: Sequence[int], dtype: torch.dtype,
                 pieces: Sequence[Tuple[Box, torch.Tensor]], requires_grad: bool = False):
        self.shape = torch.Size(shape)
        self.dtype = dtype
        self.requires_grad = requires_grad
        self.pieces = list(pieces)

    @staticmethod
    def from_tensor(t: torch.Tensor) -> "HostShards":
        """The distinct tiles of the tiled spmd tensor ``t`` (pending work must have run)."""
        t = _unwrap(t)
        by_box = {}
        for _device, data, offsets, lengths, _replica in _C._local_shards(t):
            box = (tuple(int(o) for o in offsets), tuple(int(n) for n in lengths))
            if box not in by_box and _volume(lengths) > 0:
                by_box[box] = data[tuple(slice(0, n) for n in lengths)].clone()
        pieces = [(box, by_box[box]) for box in _tile_boxes(_C._get_sharding_spec(t), t.shape)]
        return HostShards(t.shape, t.dtype, pieces, t.requires_grad)

    def __repr__(self) -> str:
        return (f"HostShards(shape={list(self.shape)}, dtype={self.dtype}, "
                f"pieces={[list(b[1]) for b, _ in self.pieces]})")


def is_tiled_value(value: Any) -> bool:
    """Whether a state-dict value is saved as tiles: ``HostShards`` or a tiled spmd tensor (a
    replicated one, annotated or not, is saved whole)."""
    if isinstance(value, HostShards):
        return True
    return isinstance(value, torch.Tensor) and _layout.is_tiled(_sharding(_unwrap(value)))


class _SplitByTiling:
    """PyTorch/XLA's planners' views of the flattened state dict (``self.state_dict``): the
    entries saved as tiles, and the rest."""

    @property
    def sharded_state_dict(self) -> Dict[str, Any]:
        return {k: v for k, v in self.state_dict.items() if is_tiled_value(v)}

    @property
    def unsharded_state_dict(self) -> Dict[str, Any]:
        return {k: v for k, v in self.state_dict.items() if not is_tiled_value(v)}


def stage_state_dict(state_dict: STATE_DICT_TYPE) -> STATE_DICT_TYPE:
    """A host copy of ``state_dict`` that ``SPMDSavePlanner`` saves exactly like the original:
    tiled spmd tensors become ``HostShards``, other spmd tensors CPU copies, CPU tensors
    clones; other values are kept (by reference). Nesting follows DCP's flattening (dict keys
    become strings), so the saved names and ``planner_data`` are the same."""
    from torch.distributed.checkpoint._nested_dict import unflatten_state_dict

    flat, mappings = flatten_state_dict(state_dict)
    flat = {k: _unwrap(v) for k, v in flat.items()}
    _sync_device_tensors(flat.values())
    staged = {}
    for fqn, value in flat.items():
        if isinstance(value, torch.Tensor):
            value = value.detach()
            if _layout.is_tiled(_sharding(value)):
                value = HostShards.from_tensor(value)
            elif is_spmd_tensor(value):
                value = value.cpu()
            else:
                value = value.clone()
        staged[fqn] = value
    return unflatten_state_dict(staged, mappings)


def _find_path(root: Any, path: Tuple[Any, ...]) -> Tuple[Any, Any]:
    """The container holding the leaf at DCP ``path`` inside ``root``, and the leaf's key in
    it. DCP paths name dict keys by ``str(key)``; the original key is looked up, so that an
    int key stays an int (``optim.state.0``)."""
    container: Any = root
    for i, step in enumerate(path):
        if isinstance(container, dict):
            key = step
            if key not in container:
                matches = [k for k in container if str(k) == str(step)]
                if len(matches) != 1:
                    raise KeyError(f"state_dict path {'.'.join(map(str, path))!r}: no key "
                                   f"{step!r}")
                key = matches[0]
        else:
            key = int(step)
        if i == len(path) - 1:
            return container, key
        container = container[key]
    raise KeyError("empty state_dict path")


def _set_leaf(root: Any, path: Tuple[Any, ...], value: Any) -> None:
    container, key = _find_path(root, path)
    if isinstance(container, tuple):
        raise TypeError(f"state_dict path {'.'.join(map(str, path))!r} is inside a tuple, "
                        "which cannot be updated in place")
    container[key] = value


def _check_chunks(fqn: str, md: TensorStorageMetadata) -> None:
    """The chunks of a tensor lie inside it, do not overlap and cover it."""
    size = tuple(int(s) for s in md.size)
    boxes = [_box(c) for c in md.chunks]
    for offsets, lengths in boxes:
        if len(offsets) != len(size) or any(
                o < 0 or n < 0 or o + n > d for o, n, d in zip(offsets, lengths, size)):
            raise ValueError(f"state_dict entry {fqn!r} of shape {list(size)}: chunk "
                             f"offsets={list(offsets)} sizes={list(lengths)} is out of bounds")
    if len(size) == 0:
        if len(boxes) != 1:
            raise ValueError(f"state_dict entry {fqn!r}: a 0-dim tensor needs exactly one "
                             f"chunk, got {len(boxes)}")
        return
    for i in range(len(boxes)):
        for j in range(i + 1, len(boxes)):
            if _layout._intersect(boxes[i], boxes[j]) is not None:
                raise ValueError(f"state_dict entry {fqn!r}: chunks {boxes[i]} and "
                                 f"{boxes[j]} overlap")
    covered = sum(_volume(b[1]) for b in boxes)
    if covered != _volume(size):
        raise ValueError(f"state_dict entry {fqn!r} of shape {list(size)}: its chunks cover "
                         f"{covered} of {_volume(size)} elements")


class SPMDSavePlanner(_SplitByTiling, SavePlanner):
    """Plans a DCP save of a state dict holding spmd tensors (sharded or not), CPU tensors,
    ``HostShards`` and other values (see the module docstring for what is written).

    Device data is read lazily, one tensor at a time, when the storage writer asks for it
    (``resolve_data``); pending work runs once, as one graph, in ``set_up_planner``.
    """

    def __init__(self):
        self.is_coordinator = False
        self.mappings: Dict[str, Tuple[Any, ...]] = {}
        self.state_dict: Dict[str, Any] = {}
        self.plan: Optional[SavePlan] = None
        self._pending: Dict[str, int] = {}        # fqn -> chunks not resolved yet
        self._host: Dict[str, Dict[Box, torch.Tensor]] = {}  # fqn -> box -> host data
        self._lock = threading.Lock()  # writers may resolve from several threads

    def set_up_planner(self, state_dict: STATE_DICT_TYPE,
                       storage_meta: Optional[StorageMeta] = None,
                       is_coordinator: bool = False) -> None:
        flat, self.mappings = flatten_state_dict(state_dict)
        self.state_dict = {k: _unwrap(v) for k, v in flat.items()}
        self.is_coordinator = is_coordinator
        _sync_device_tensors(self.state_dict.values())

    def _write_items(self, fqn: str, value: Any) -> List[WriteItem]:
        if isinstance(value, HostShards):
            shape, props, boxes = value.shape, _properties(value.dtype, value.requires_grad), \
                [b for b, _ in value.pieces]
            kind = WriteItemType.SHARD
        elif isinstance(value, torch.Tensor):
            shape, props = value.shape, _properties(value.dtype, value.requires_grad)
            sharding = _sharding(value)
            if _layout.is_tiled(sharding):
                boxes, kind = _tile_boxes(sharding, value.shape), WriteItemType.SHARD
            elif _saves_whole_values():
                boxes, kind = [_layout.full_box(value.shape)], WriteItemType.TENSOR
            else:
                return []
        elif _saves_whole_values():
            return [WriteItem(index=MetadataIndex(fqn), type=WriteItemType.BYTE_IO)]
        else:
            return []
        self._pending[fqn] = len(boxes)
        return [WriteItem(index=MetadataIndex(fqn, torch.Size(box[0]), i), type=kind,
                          tensor_data=TensorWriteData(chunk=_chunk(box), properties=props,
                                                      size=torch.Size(shape)))
                for i, box in enumerate(boxes)]

    def create_local_plan(self) -> SavePlan:
        items: List[WriteItem] = []
        for fqn, value in self.state_dict.items():
            items.extend(self._write_items(fqn, value))
        self.plan = SavePlan(items, planner_data=self.mappings)
        return self.plan

    def create_global_plan(self, all_plans: List[SavePlan]) -> Tuple[List[SavePlan], Metadata]:
        global_plan, metadata = create_default_global_save_plan(all_plans)
        mappings = dict(ChainMap(*[p.planner_data or {} for p in global_plan]))
        metadata = dataclasses.replace(metadata, planner_data=mappings)
        for fqn, md in metadata.state_dict_metadata.items():
            if isinstance(md, TensorStorageMetadata):
                _check_chunks(fqn, md)
        return global_plan, metadata

    def finish_plan(self, new_plan: SavePlan) -> SavePlan:
        self.plan = new_plan
        return new_plan

    def _tile(self, fqn: str, value: Any, box: Box) -> torch.Tensor:
        if isinstance(value, HostShards):
            for b, data in value.pieces:
                if b == box:
                    return data.contiguous()
            raise RuntimeError(f"state_dict entry {fqn!r}: HostShards has no piece {box}")
        with self._lock:
            if fqn not in self._host:  # one device -> host copy per tensor, not per tile
                staged = HostShards.from_tensor(value)
                self._host[fqn] = {b: data for b, data in staged.pieces}
            data = self._host[fqn][box]
            self._pending[fqn] -= 1
            if self._pending[fqn] <= 0:  # every tile handed out: free the host copies
                del self._host[fqn]
                self._pending[fqn] = len(_tile_boxes(_sharding(value), value.shape))
            return data

    def resolve_data(self, write_item: WriteItem) -> Any:
        fqn = write_item.index.fqn
        value = self.state_dict[fqn]
        if write_item.type == WriteItemType.BYTE_IO:
            buffer = io.BytesIO()
            torch.save(value, buffer)
            buffer.seek(0)
            return buffer
        box = _box(write_item.tensor_data.chunk)
        if isinstance(value, HostShards) or _layout.is_tiled(_sharding(value)):
            return self._tile(fqn, value, box)
        value = value.detach()
        return value.cpu() if is_spmd_tensor(value) else value


class _Target:
    """The staging of one tensor target: a host buffer per distinct tile (or one for the
    whole tensor), filled by the reads, and how it goes back into the target."""

    def __init__(self, fqn: str, tensor: torch.Tensor, sharding: str):
        self.fqn = fqn
        self.tensor = tensor
        self.tiled = _layout.is_tiled(sharding)
        if self.tiled:
            shards = _layout.device_shards(sharding, tensor.shape)
            self.boxes: List[Box] = []
            self.buffers: List[torch.Tensor] = []
            self.device_tile: List[int] = []  # this process's devices -> index into boxes
            mine = _process_span.local_devices()
            for s in shards:
                if s.device not in mine:
                    continue
                if s.box not in self.boxes:
                    self.boxes.append(s.box)
                    self.buffers.append(torch.zeros(s.padded_shape, dtype=tensor.dtype))
                self.device_tile.append(self.boxes.index(s.box))
        else:
            self.boxes = [_layout.full_box(tensor.shape)]
            self.buffers = [torch.empty(tuple(tensor.shape), dtype=tensor.dtype)]

    def commit(self) -> bool:
        """Writes the buffers into the target; returns whether it was a device copy."""
        if self.tiled:
            _C._load_local_shards(self.tensor, [self.buffers[i] for i in self.device_tile])
            return False
        if is_spmd_tensor(self.tensor):
            # Upload first, then a device-side copy_ that keeps the target's layout (some
            # torch 2.x builds refused copy_ from a host tensor of dim > 0 into an spmd tensor).
            self.tensor.copy_(self.buffers[0].to(self.tensor.device))
            return True
        self.tensor.copy_(self.buffers[0])
        return False


def _read_items(fqn: str, md: TensorStorageMetadata, boxes: Sequence[Box]) -> List[ReadItem]:
    """The reads that fill each of ``boxes`` from the saved chunks; RuntimeError when the
    chunks do not cover a box exactly (a damaged or incomplete checkpoint)."""
    items = []
    saved = [_box(c) for c in md.chunks]
    if len(md.size) == 0:
        saved = saved[:1]
    for dest_index, dest in enumerate(boxes):
        needed = _volume(dest[1])
        if needed == 0:
            continue
        covered = 0
        for storage_index, src in enumerate(saved):
            # A 0-dim tensor is one element: its one saved chunk covers it.
            overlap = _layout._intersect(dest, src) if len(dest[0]) else ([], [])
            if overlap is None:
                continue
            in_dest, in_src = overlap
            lengths = [s.stop - s.start for s in in_dest]
            covered += _volume(lengths)
            items.append(ReadItem(
                type=LoadItemType.TENSOR,
                dest_index=MetadataIndex(fqn, torch.Size(dest[0]), dest_index),
                dest_offsets=torch.Size(s.start for s in in_dest),
                storage_index=MetadataIndex(fqn, torch.Size(src[0]), storage_index),
                storage_offsets=torch.Size(s.start for s in in_src),
                lengths=torch.Size(lengths)))
        if covered != needed:
            raise RuntimeError(
                f"checkpoint entry {fqn!r}: the saved chunks cover {covered} of the {needed} "
                f"elements of region offsets={list(dest[0])} sizes={list(dest[1])}; the "
                "checkpoint is damaged or incomplete")
    return items


class SPMDLoadPlanner(_SplitByTiling, LoadPlanner):
    """Plans a DCP load into a state dict holding spmd tensors (sharded or not), CPU tensors
    and other values, in place; each target keeps its device, dtype and layout.

    Args:
      allow_partial_load: skip the targets the checkpoint lacks instead of raising
        RuntimeError ("Missing key in checkpoint state_dict", as DCP's default planner).

    Errors, raised before anything is read: a missing key (RuntimeError), a shape mismatch or
    a tensor/non-tensor mismatch between a target and its checkpoint entry (ValueError naming
    the key and both shapes), chunks that do not cover a target tile (RuntimeError). Nothing is
    written to the targets until every read has arrived.
    """

    def __init__(self, allow_partial_load: bool = False):
        self.allow_partial_load = allow_partial_load
        self.metadata: Optional[Metadata] = None
        self.is_coordinator = False
        self.original_state_dict: STATE_DICT_TYPE = {}
        self.mappings: Dict[str, Tuple[Any, ...]] = {}
        self.state_dict: Dict[str, Any] = {}
        self._targets: Dict[str, _Target] = {}
        self._objects: Dict[str, Any] = {}
        self._remaining = 0

    def set_up_planner(self, state_dict: STATE_DICT_TYPE, metadata: Optional[Metadata] = None,
                       is_coordinator: bool = False) -> None:
        self.original_state_dict = state_dict
        flat, self.mappings = flatten_state_dict(state_dict)
        self.state_dict = {k: _unwrap(v) for k, v in flat.items()}
        self.metadata = metadata
        self.is_coordinator = is_coordinator
        # The targets' layouts are read from their device data: run what is pending first
        # (e.g. the copies model.state_dict() made).
        _sync_device_tensors(self.state_dict.values())

    def create_local_plan(self) -> LoadPlan:
        if self.metadata is None:
            raise RuntimeError("SPMDLoadPlanner: set_up_planner got no checkpoint metadata")
        saved = self.metadata.state_dict_metadata
        items: List[ReadItem] = []
        targets: Dict[str, _Target] = {}
        for fqn, value in self.state_dict.items():
            if fqn not in saved:
                if self.allow_partial_load:
                    continue
                raise RuntimeError(f"Missing key in checkpoint state_dict: {fqn}.")
            md = saved[fqn]
            if isinstance(value, torch.Tensor):
                if not isinstance(md, TensorStorageMetadata):
                    raise ValueError(f"checkpoint entry {fqn!r} is not a tensor (it was saved "
                                     f"as an object), the target is a tensor of shape "
                                     f"{list(value.shape)}")
                if tuple(md.size) != tuple(value.shape):
                    raise ValueError(f"checkpoint entry {fqn!r} has shape {list(md.size)}, the "
                                     f"target {list(value.shape)}")
                target = _Target(fqn, value, _sharding(value))
                items.extend(_read_items(fqn, md, target.boxes))
                targets[fqn] = target
            else:
                if isinstance(md, TensorStorageMetadata):
                    raise ValueError(f"checkpoint entry {fqn!r} is a tensor of shape "
                                     f"{list(md.size)}, the target is a "
                                     f"{type(value).__name__}; give a tensor to load it into")
                items.append(ReadItem(type=LoadItemType.BYTE_IO, dest_index=MetadataIndex(fqn),
                                      dest_offsets=torch.Size((0,)),
                                      storage_index=MetadataIndex(fqn),
                                      storage_offsets=torch.Size((0,)),
                                      lengths=torch.Size((0,))))
        self._targets, self._objects, self._remaining = targets, {}, len(items)
        return LoadPlan(items)

    def create_global_plan(self, global_plan: List[LoadPlan]) -> List[LoadPlan]:
        return global_plan

    def finish_plan(self, central_plan: LoadPlan) -> LoadPlan:
        self._remaining = len(central_plan.items)
        return central_plan

    def resolve_tensor(self, read_item: ReadItem) -> torch.Tensor:
        target = self._targets[read_item.dest_index.fqn]
        view = target.buffers[read_item.dest_index.index]
        for dim, (start, length) in enumerate(zip(read_item.dest_offsets, read_item.lengths)):
            view = view.narrow(dim, start, length)
        return view

    def commit_tensor(self, read_item: ReadItem, tensor: torch.Tensor) -> None:
        self._arrived()

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        self._objects[read_item.dest_index.fqn] = torch.load(value, weights_only=False)
        self._arrived()

    def _arrived(self) -> None:
        self._remaining -= 1
        if self._remaining == 0:
            self._commit()

    def _commit(self) -> None:
        """Every read arrived: write the staged data into the targets."""
        copied = []
        with torch.no_grad():
            for target in self._targets.values():
                if target.commit():
                    copied.append(target.tensor)
        for fqn, value in self._objects.items():
            _set_leaf(self.original_state_dict, self.mappings[fqn], value)
        self._targets, self._objects = {}, {}
        if copied:
            _C._sync_tensors([t.detach() for t in copied])  # upload now, not in the next step
