"""``save_dcp`` / ``load_dcp``: DCP checkpoints of spmd state dicts in one call, written so
that an interrupted save never damages the checkpoint it replaces.

``torch.distributed.checkpoint``'s ``FileSystemWriter`` writes into the checkpoint directory
itself: its data files (``__0_0.distcp``) have fixed names and are overwritten in place, and
``.metadata`` is renamed into place last. Saving over an existing checkpoint and dying half way
therefore leaves the old ``.metadata`` describing a half-written data file. ``save_dcp``
instead writes the whole checkpoint into a fresh sibling directory ``.<name>.dcp-<token>``
(data files fsync'ed by the writer, ``.metadata`` last) and only then moves it to ``<name>``:
with one ``rename`` when ``<name>`` does not exist, otherwise ``<name>`` -> ``.<name>.old-<token>``
then the new directory -> ``<name>`` (and the old one is deleted). A crash between those two
renames leaves ``<name>`` missing and the previous checkpoint intact in ``.<name>.old-*``;
``recover`` (run by ``save_dcp``, ``load_dcp`` and ``CheckpointManager``) moves it back.
Leftover ``.<name>.dcp-*`` directories of killed saves are removed by the next successful save.

Single writer per checkpoint path.
"""
import inspect
import os
import shutil
import uuid
import warnings
from typing import Any, List

import torch.distributed.checkpoint as dist_cp
from torch.distributed.checkpoint.api import CheckpointException

from . import _storage
from .planners import SPMDLoadPlanner, SPMDSavePlanner, stage_state_dict  # noqa: F401

METADATA = ".metadata"  # DCP's metadata file: present iff the DCP checkpoint is complete
_NEW_TAG = ".dcp-"
_OLD_TAG = ".old-"


def is_dcp_checkpoint(path: str) -> bool:
    """Whether ``path`` holds a complete DCP checkpoint (its ``.metadata``)."""
    return os.path.isfile(os.path.join(path, METADATA))


def _is_committed(path: str) -> bool:
    return is_dcp_checkpoint(path) or os.path.isfile(os.path.join(path, _storage.MANIFEST))


def _split(path: str):
    parent, name = os.path.split(os.path.abspath(path))
    return parent, name


def _siblings(path: str, tag: str) -> List[str]:
    """Our hidden sibling directories of ``path`` with ``tag`` (``.<name><tag><token>``)."""
    parent, name = _split(path)
    prefix = f".{name}{tag}"
    if not os.path.isdir(parent):
        return []
    return sorted(os.path.join(parent, f) for f in os.listdir(parent) if f.startswith(prefix))


def _new_sibling(path: str, tag: str) -> str:
    parent, name = _split(path)
    return os.path.join(parent, f".{name}{tag}{uuid.uuid4().hex[:16]}")


def recover(path: str) -> None:
    """Finishes a replacement of the checkpoint ``path`` that was interrupted between its two
    renames: puts the previous checkpoint back if ``path`` is missing, else drops it."""
    olds = [p for p in _siblings(path, _OLD_TAG) if _is_committed(p)]
    if not olds:
        return
    if not os.path.lexists(path):
        newest = max(olds, key=os.path.getmtime)
        os.rename(newest, path)
        olds.remove(newest)
    for old in olds:
        shutil.rmtree(old, ignore_errors=True)
    _storage.fsync_dir(_split(path)[0])


def _unwrap_failure(e: CheckpointException) -> BaseException:
    """The planner's or storage layer's own exception inside DCP's CheckpointException (one
    process: one failure), so that callers see the ValueError/RuntimeError itself."""
    failures = [exc for exc, _trace in e.failures.values()]
    if len(failures) == 1 and isinstance(failures[0], BaseException):
        return failures[0]
    return e


def _single_process_entry(name: str):
    """DCP's ``save``/``load`` where they take ``no_dist`` (torch >= 2.7). torch 2.6's do not
    (they assume one process only while torch.distributed is uninitialized, which multi-process
    mode is not); its ``save_state_dict``/``load_state_dict`` take it and the same keywords."""
    fn = getattr(dist_cp, name)
    if "no_dist" in inspect.signature(fn).parameters:
        return fn
    return getattr(dist_cp, f"{name}_state_dict")


def _single_process(name: str, *args, **kwargs) -> Any:
    """Runs DCP's ``save`` or ``load`` in its single-process mode (one process drives every
    spmd device), without DCP's warnings about it, re-raising the original error."""
    fn = _single_process_entry(name)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        warnings.filterwarnings("ignore", message=f"`{name}_state_dict` is deprecated")
        try:
            return fn(*args, no_dist=True, **kwargs)
        except CheckpointException as e:
            original = _unwrap_failure(e)
            if original is e:
                raise
            raise original from None


def replace_dir(new: str, path: str) -> None:
    """Moves the complete checkpoint directory ``new`` to ``path``, replacing the checkpoint
    there (if any) so that ``path`` always holds one complete checkpoint (see the module
    docstring)."""
    parent = _split(path)[0]
    _storage.fsync_dir(new)
    if os.path.lexists(path):
        old = _new_sibling(path, _OLD_TAG)
        os.rename(path, old)
        os.rename(new, path)  # a crash before this line: recover() moves `old` back
        _storage.fsync_dir(parent)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(new, path)
        _storage.fsync_dir(parent)


def _check_replaceable(path: str) -> None:
    if os.path.isdir(path) and os.listdir(path) and not _is_committed(path):
        raise ValueError(f"save_dcp: {path!r} is a non-empty directory that holds no "
                         "checkpoint; refusing to replace it")
    if os.path.lexists(path) and not os.path.isdir(path):
        raise ValueError(f"save_dcp: {path!r} exists and is not a directory")


def save_dcp(state_dict: Any, path: str, *, thread_count: int = 1) -> None:
    """Saves ``state_dict`` (nested dicts/lists of spmd tensors, sharded or not, CPU tensors and
    other values; or a ``stage_state_dict`` host copy) as a standard DCP checkpoint in
    directory ``path`` with ``SPMDSavePlanner``, replacing any checkpoint there atomically.

    The result loads with ``torch.distributed.checkpoint.load`` alone into CPU tensors, or with
    ``load_dcp`` / ``SPMDLoadPlanner`` into spmd tensors under any mesh and partition spec.
    Errors are the planner's own (ValueError/RuntimeError), not DCP's CheckpointException; an
    OSError (a full disk) names ``path``.
    """
    with _storage.naming_the_checkpoint(path):
        if _process_count() > 1:
            return _save_dcp_across_processes(state_dict, path, thread_count)
        _save_dcp_here(state_dict, path, thread_count)


def _save_dcp_here(state_dict: Any, path: str, thread_count: int) -> None:
    """save_dcp with every device in this process."""
    parent = _split(path)[0]
    os.makedirs(parent, exist_ok=True)
    recover(path)
    _check_replaceable(path)
    new = _new_sibling(path, _NEW_TAG)
    try:
        writer = dist_cp.FileSystemWriter(new, sync_files=True, thread_count=thread_count)
        _single_process("save", state_dict, storage_writer=writer,
                        planner=SPMDSavePlanner())
        replace_dir(new, path)
    except BaseException:
        shutil.rmtree(new, ignore_errors=True)
        raise
    for stale in _siblings(path, _NEW_TAG):  # what killed saves left behind
        shutil.rmtree(stale, ignore_errors=True)


def _process_count() -> int:
    """Processes of the multi-process SPMD world (1 outside one)."""
    from ... import _C
    span = _C._process_span()
    return 1 if span is None else span[1]


def _save_dcp_across_processes(state_dict: Any, path: str, thread_count: int) -> None:
    """save_dcp in multi-process SPMD (docs/multihost_spmd.md): every process writes the tiles
    it saves (SPMDSavePlanner: each tile once, by the process of its first device; untiled
    values by process 0) into one fresh directory that process 0 names, DCP's coordinator
    (process 0) writes ``.metadata`` last, and process 0 moves the directory into place once
    every process is done. The processes share the file system that holds ``path``."""
    import torch.distributed as dist
    first = dist.get_rank() == 0
    decided = [None]
    if first:
        try:
            os.makedirs(_split(path)[0], exist_ok=True)
            recover(path)
            _check_replaceable(path)
            decided[0] = ("ok", _new_sibling(path, _NEW_TAG))
        except Exception as e:  # every process raises it, not only the first
            decided[0] = ("error", f"{type(e).__name__}: {e}")
    dist.broadcast_object_list(decided, src=0)
    status, value = decided[0]
    if status != "ok":
        raise RuntimeError(f"save_dcp({path!r}) across processes: process 0 failed: {value}")
    new = value
    try:
        writer = dist_cp.FileSystemWriter(new, sync_files=True, thread_count=thread_count)
        try:
            dist_cp.save(state_dict, storage_writer=writer, planner=SPMDSavePlanner())
        except CheckpointException as e:
            original = _unwrap_failure(e)
            if original is e:
                raise
            raise original from None
        dist.barrier()  # every process's files are written
        if first:
            replace_dir(new, path)
            for stale in _siblings(path, _NEW_TAG):
                shutil.rmtree(stale, ignore_errors=True)
        dist.barrier()  # the checkpoint is in place before anyone goes on
    except BaseException:
        if first:
            shutil.rmtree(new, ignore_errors=True)
        raise


def _check_intact(path: str) -> None:
    """RuntimeError naming ``path`` and the file when the checkpoint is damaged (a truncated or
    garbled ``.metadata``, a data file shorter than the metadata says): DCP itself would fail
    with a bare EOFError/UnpicklingError or an assertion that names neither."""
    try:
        metadata = dist_cp.FileSystemReader(path).read_metadata()
    except Exception as e:
        raise RuntimeError(f"damaged DCP checkpoint {path!r}: its {METADATA} cannot be read "
                           f"({type(e).__name__}: {e})") from None
    needed = {}
    for info in (getattr(metadata, "storage_data", None) or {}).values():
        end = info.offset + info.length
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), end)
    for name, end in sorted(needed.items()):
        file = os.path.join(path, name)
        size = os.path.getsize(file) if os.path.isfile(file) else None
        if size is None or size < end:
            held = "is missing" if size is None else f"holds {size} bytes"
            raise RuntimeError(f"damaged DCP checkpoint {path!r}: data file {name!r} {held}, "
                               f"its {METADATA} expects at least {end}")


def load_dcp(state_dict: Any, path: str, *, allow_partial_load: bool = False) -> None:
    """Loads the DCP checkpoint in directory ``path`` (saved by ``save_dcp``, by
    ``dist_cp.save`` with ``SPMDSavePlanner``, or by plain DCP from CPU tensors) into
    ``state_dict`` in place with ``SPMDLoadPlanner``: every target keeps its device, dtype and
    sharding, non-tensor values are replaced. A failed load changes nothing.

    Raises FileNotFoundError when ``path`` holds no complete DCP checkpoint, RuntimeError for a
    key the checkpoint lacks (unless ``allow_partial_load``) or a damaged checkpoint, and
    ValueError for a shape or kind mismatch, naming the key.
    """
    recover(path)
    if not is_dcp_checkpoint(path):
        raise FileNotFoundError(f"no DCP checkpoint in {path!r} ({METADATA} is missing)")
    _check_intact(path)
    _single_process("load", state_dict, storage_reader=dist_cp.FileSystemReader(path),
                    planner=SPMDLoadPlanner(allow_partial_load=allow_partial_load))
