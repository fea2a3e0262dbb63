"""``save_sharded`` / ``load_sharded``: sharded checkpoints that reshard on load."""
import os
from typing import Any, Dict, List, Tuple

import torch

from ... import _C
from ..._impl.device import is_spmd_tensor
from ..spmd.xla_sharding import unwrap_sharded_tensor
from . import _layout, _storage
from ._snapshot import Snapshot, capture
from ._state_dict import flatten, set_leaf


def write_snapshot(snapshot: Snapshot, path: str) -> None:
    """Writes a captured state dict as the checkpoint in directory ``path`` (created if
    needed), replacing any checkpoint there atomically: data file first, manifest last."""
    os.makedirs(path, exist_ok=True)
    data_name = _storage.new_data_name()
    data_bytes = _storage.write_data(path, data_name, snapshot.payload)
    manifest = {
        "format": _storage.FORMAT,
        "version": _storage.VERSION,
        "created": snapshot.created,
        "data_file": data_name,
        "data_bytes": data_bytes,
        "entries": snapshot.entries,
    }
    _storage.write_manifest(path, manifest)  # the commit point
    _storage.remove_leftovers(path, keep=data_name)


def save_sharded(state_dict: Any, path: str) -> None:
    """Saves ``state_dict`` (nested dicts/lists of tensors and other values, e.g.
    ``{'model': model.state_dict(), 'optim': opt.state_dict(), 'step': 7}``) into directory
    ``path``.

    A sharded spmd tensor is saved as its shards: one piece per distinct tile, unpadded, with
    its offsets, plus its global shape, dtype, sharding (XLA text), mesh and partition spec.
    Unsharded tensors are saved whole; other values are pickled. The save is atomic: if it is
    interrupted, the checkpoint previously in ``path`` (if any) stays intact and loadable.
    """
    with _storage.naming_the_checkpoint(path):
        write_snapshot(capture(state_dict), path)


def _unwrap(x: Any) -> Any:
    return unwrap_sharded_tensor(x) if isinstance(x, torch.Tensor) else x


def _saved_pieces(entry: dict, data: dict) -> List[Tuple[_layout.Box, torch.Tensor]]:
    return [((tuple(p["offsets"]), tuple(p["lengths"])), data[p["key"]]) for p in entry["pieces"]]


def _check_tensor(fqn: str, entry: dict, target: torch.Tensor) -> None:
    if entry["kind"] != "tensor":
        raise TypeError(f"checkpoint entry {fqn!r} is a {entry['kind']}, the target a tensor")
    if list(target.shape) != entry["shape"]:
        raise ValueError(f"checkpoint entry {fqn!r} has shape {entry['shape']}, the target "
                         f"{list(target.shape)}")


def load_sharded(state_dict: Any, path: str) -> None:
    """Loads the checkpoint in directory ``path`` into ``state_dict`` in place.

    Every leaf of ``state_dict`` must be in the checkpoint (KeyError otherwise; checkpoint
    entries the state dict lacks are ignored). Tensors keep their device, dtype and sharding:
    each device's shard of a sharded spmd tensor is assembled from the saved pieces that
    overlap it, whatever mesh and spec they were saved under, and loaded with
    ``load_local_shards_``; other tensors are filled with ``copy_``. Other values replace the
    leaves of ``state_dict``.

    As with PyTorch/XLA's distributed checkpoint, finish with ``model.load_state_dict(sd[...])``
    and ``optimizer.load_state_dict(sd[...])`` (``model.state_dict()`` returns copies on the
    spmd device), and prime a fresh optimizer first (``prime_optimizer``) so that its state has
    tensors to load into.
    """
    manifest = _storage.read_manifest(path)
    entries: Dict[str, dict] = manifest["entries"]
    leaves = flatten(state_dict)
    missing = [fqn for fqn in leaves if fqn not in entries]
    if missing:
        raise KeyError(f"Missing key in checkpoint state_dict: {missing[0]}. (missing: {missing})")
    for fqn, (_, value) in leaves.items():
        value = _unwrap(value)
        if isinstance(value, torch.Tensor):
            _check_tensor(fqn, entries[fqn], value)

    data = _storage.read_data(path, manifest)
    # The targets' layouts are read from their device data: run whatever is pending first
    # (e.g. the copies model.state_dict() made).
    device_targets = [_unwrap(v) for _, v in leaves.values() if is_spmd_tensor(_unwrap(v))]
    if device_targets:
        _C._sync_tensors([t.detach() for t in device_targets])
    copied = []
    for fqn, (leaf_path, value) in leaves.items():
        entry = entries[fqn]
        target = _unwrap(value)
        if not isinstance(target, torch.Tensor):
            if entry["kind"] != "object":
                raise TypeError(f"checkpoint entry {fqn!r} is a tensor, the target is not")
            set_leaf(state_dict, leaf_path, data[entry["key"]])
            continue
        pieces = _saved_pieces(entry, data)
        sharding = _C._get_sharding_spec(target) if is_spmd_tensor(target) else ""
        with torch.no_grad():
            if _layout.is_tiled(sharding):
                shards = _layout.assemble_shards(fqn, sharding, target.shape, pieces,
                                                 target.dtype)
                _C._load_local_shards(target, shards)
            else:
                full = _layout.assemble(fqn, _layout.full_box(target.shape), target.shape,
                                        pieces, target.dtype)
                target.copy_(full)
                if is_spmd_tensor(target):
                    copied.append(target)
    if copied:
        _C._sync_tensors([t.detach() for t in copied])  # upload now, not in the next step


def read_metadata(path: str) -> Dict[str, dict]:
    """The manifest entries of the checkpoint in ``path``: fqn -> metadata (``kind``, and for
    tensors ``shape``, ``dtype``, ``device``, ``sharding``, ``mesh``, ``partition_spec``,
    ``pieces``)."""
    return _storage.read_manifest(path)["entries"]
