"""Crash-safe files of one checkpoint directory.

A checkpoint directory holds a data file ``data-<token>.pt`` (every saved piece) and the
manifest ``manifest.json`` that describes the entries and names the data file. Each file is
written to a temporary file in the same directory, flushed, fsync'ed and renamed over its
final name (atomic on POSIX), and the directory is fsync'ed so that the rename itself is
durable. The manifest is written last: it is the commit point. A save interrupted at any
moment therefore leaves either the previous manifest (still naming the previous, untouched
data file) or the new one; leftovers (temporary files, unreferenced data files) are removed by
the next successful save.

Single writer per directory: concurrent saves into the same directory are not supported.
"""
import contextlib
import json
import os
import tempfile
import uuid
from typing import Any, Callable, IO, Optional

import torch

MANIFEST = "manifest.json"
FORMAT = "torch_spmd.sharded_checkpoint"
VERSION = 1
_DATA_PREFIX, _DATA_SUFFIX = "data-", ".pt"
_TMP_SUFFIX = ".tmp"


@contextlib.contextmanager
def naming_the_checkpoint(path: str):
    """An OSError while saving into ``path`` (a full disk, a file-size limit, permissions)
    re-raised naming the checkpoint, and that the one previously there is intact (what a save
    writes is only moved into place at its end)."""
    try:
        yield
    except OSError as e:
        raise type(e)(e.errno, f"saving the checkpoint {path!r} failed: {e.strerror or e}; the "
                      "checkpoint previously there, if any, is intact", e.filename) from e


def fsync_dir(path: str) -> None:
    """Makes renames and deletions inside ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str, write: Callable[[IO[bytes]], None]) -> None:
    """Writes ``path`` all-or-nothing: ``write(f)`` fills a temporary file next to it, which
    is fsync'ed and renamed over ``path``. On any exception the temporary file is removed and
    ``path`` keeps its previous content (or stays absent)."""
    directory, name = os.path.split(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=_TMP_SUFFIX, dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    fsync_dir(directory)


def new_data_name() -> str:
    """A fresh data file name: never the name of the committed one, so writing it cannot
    damage the previous checkpoint."""
    return f"{_DATA_PREFIX}{uuid.uuid4().hex[:16]}{_DATA_SUFFIX}"


def write_data(directory: str, name: str, payload: Any) -> int:
    """``torch.save(payload)`` into ``directory/name`` atomically; returns the file size."""
    path = os.path.join(directory, name)
    atomic_write(path, lambda f: torch.save(payload, f))
    return os.path.getsize(path)


def write_manifest(directory: str, manifest: dict) -> None:
    """Commits the checkpoint: atomically replaces ``manifest.json``."""
    text = json.dumps(manifest, indent=1, sort_keys=True).encode()
    atomic_write(os.path.join(directory, MANIFEST), lambda f: f.write(text))


def read_manifest(directory: str) -> dict:
    """The committed manifest of ``directory``; FileNotFoundError if there is none (nothing
    was ever committed there), ValueError if it is not a torch_spmd checkpoint manifest,
    RuntimeError if it is damaged."""
    path = os.path.join(directory, MANIFEST)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no committed checkpoint in {directory!r} ({MANIFEST} is "
                                "missing: never saved, or the first save was interrupted)")
    with open(path, "rb") as f:
        try:
            manifest = json.loads(f.read().decode())
        except ValueError as e:  # truncated or garbled: JSONDecodeError, UnicodeDecodeError
            raise RuntimeError(f"{path} cannot be read ({e}); the checkpoint is damaged") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ValueError(f"{path} is not a torch_spmd sharded checkpoint manifest")
    if manifest.get("version") != VERSION:
        raise ValueError(f"{path}: unsupported checkpoint version {manifest.get('version')!r} "
                         f"(this torch_spmd reads version {VERSION}; a DCP checkpoint, "
                         "save_dcp, loads across versions)")
    return manifest


def read_data(directory: str, manifest: dict) -> dict:
    """The pieces of the committed checkpoint (host tensors and objects by key)."""
    path = os.path.join(directory, manifest["data_file"])
    size = os.path.getsize(path)
    if size != manifest["data_bytes"]:
        raise RuntimeError(f"{path} has {size} bytes, the manifest says "
                           f"{manifest['data_bytes']}; the checkpoint is damaged")
    return torch.load(path, map_location="cpu")


def is_own_file(name: str) -> bool:
    """Whether ``name`` is a file a save writes (manifest, data file, or a temporary one)."""
    if name.startswith(".") and name.endswith(_TMP_SUFFIX):  # atomic_write's ".<name>.*.tmp"
        name = name[1:].split(".tmp")[0]
        return name.startswith(MANIFEST) or name.startswith(_DATA_PREFIX)
    return name == MANIFEST or (name.startswith(_DATA_PREFIX) and name.endswith(_DATA_SUFFIX))


def remove_leftovers(directory: str, keep: Optional[str]) -> None:
    """Deletes the temporary files and the data files other than ``keep`` (the committed
    one): what interrupted or superseded saves left behind."""
    removed = False
    for name in os.listdir(directory):
        if name == MANIFEST or name == keep or not is_own_file(name):
            continue
        try:
            os.unlink(os.path.join(directory, name))
            removed = True
        except FileNotFoundError:
            pass
    if removed:
        fsync_dir(directory)
