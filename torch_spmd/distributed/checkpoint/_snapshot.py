"""The save side: a state dict captured as host pieces plus metadata (no files involved).

Capturing is the only part of a save that touches the device; what it returns is plain host
data, so writing it can happen later or on another thread (``CheckpointManager.save_async``).
"""
import time
from typing import Any, Dict, List

import torch

from ... import _C
from ..._impl.device import is_spmd_tensor
from ..spmd.xla_sharding import unwrap_sharded_tensor
from . import _layout
from ._state_dict import flatten


class Snapshot:
    """Host copy of a state dict: ``entries`` (fqn -> JSON-able metadata) and ``payload``
    (piece key -> host tensor or Python object)."""

    def __init__(self, entries: Dict[str, dict], payload: Dict[str, Any]):
        self.entries = entries
        self.payload = payload
        self.created = time.time()


def _json_key(k: Any) -> Any:
    return k if isinstance(k, (str, int)) and not isinstance(k, bool) else str(k)


def _mesh_and_spec(t: torch.Tensor) -> Dict[str, Any]:
    """The mesh and partition spec behind ``t``'s sharding (named axes where the mesh has
    names), as recorded in the manifest; empty when ``t`` has no sharding."""
    axes = _C._get_sharding_axes(t)
    if axes is None:
        return {}
    names = axes["axis_names"]

    def label(a: int) -> Any:
        return names[a] if names else a

    spec: List[Any] = []
    for dim in axes["dim_axes"]:
        spec.append(None if not dim else label(dim[0]) if len(dim) == 1 else
                    [label(a) for a in dim])
    mesh = {"device_ids": axes["device_ids"], "mesh_shape": axes["mesh_shape"],
            "axis_names": names or None}
    return {"mesh": mesh, "partition_spec": spec}


def _spmd_pieces(t: torch.Tensor, sharding: str) -> List[tuple]:
    """``(offsets, lengths, host data)`` of each distinct non-empty shard of a device tensor:
    one per tile (replicas skipped), unpadded; the whole tensor when it is not tiled."""
    if not _layout.is_tiled(sharding):
        return [((0,) * t.dim(), tuple(t.shape), t.detach().cpu())]
    pieces = []
    for _device, data, offsets, lengths, replica_id in _C._local_shards(t):
        if replica_id != 0 or any(n == 0 for n in lengths):
            continue
        region = tuple(slice(0, n) for n in lengths)
        pieces.append((tuple(offsets), tuple(lengths), data[region].clone()))
    return pieces


def capture(state_dict: Any) -> Snapshot:
    """Copies every leaf of ``state_dict`` to the host: sharded device tensors as their shards
    (from ``local_shards``, padding removed, one copy per tile), other tensors whole, anything
    else as a Python object (pickled with the data)."""
    leaves = flatten(state_dict)

    def unwrap(x: Any) -> Any:
        return unwrap_sharded_tensor(x) if isinstance(x, torch.Tensor) else x

    device_tensors = [unwrap(v).detach() for _, v in leaves.values() if is_spmd_tensor(unwrap(v))]
    if device_tensors:
        _C._sync_tensors(device_tensors)  # everything pending runs as one graph
    entries: Dict[str, dict] = {}
    payload: Dict[str, Any] = {}
    for index, (fqn, (path, value)) in enumerate(leaves.items()):
        value = unwrap(value)
        entry: Dict[str, Any] = {"path": [_json_key(k) for k in path]}
        if not isinstance(value, torch.Tensor):
            key = f"{index}"
            payload[key] = value
            entry.update(kind="object", key=key)
            entries[fqn] = entry
            continue
        entry.update(kind="tensor", shape=list(value.shape), dtype=str(value.dtype),
                     requires_grad=bool(value.requires_grad))
        if is_spmd_tensor(value):
            sharding = _C._get_sharding_spec(value)
            entry.update(device="spmd", sharding=sharding, **_mesh_and_spec(value))
            pieces = _spmd_pieces(value, sharding)
        else:
            entry.update(device=str(value.device))
            pieces = [((0,) * value.dim(), tuple(value.shape), value.detach().cpu().clone())]
        entry["pieces"] = []
        for p, (offsets, lengths, data) in enumerate(pieces):
            key = f"{index}.{p}"
            payload[key] = data.contiguous()
            entry["pieces"].append({"key": key, "offsets": list(offsets),
                                    "lengths": list(lengths)})
        entries[fqn] = entry
    return Snapshot(entries, payload)
