"""``CheckpointManager``: per-step sharded checkpoints under one directory.

PyTorch/XLA's ``torch_xla.experimental.distributed_checkpoint.CheckpointManager`` interface.
Step ``s`` lives in ``<path>/<s>/``, as a ``save_sharded`` checkpoint (tracked once its
manifest is committed: written last, atomically) or, with ``use_dcp=True``, as a standard DCP
checkpoint written by ``save_dcp`` (tracked once its ``.metadata`` exists: the directory is
written under a hidden name and renamed to ``<s>`` when complete). Either way an interrupted
save never shows up as a step and never damages an older one.
"""
import logging
import os
import re
import shutil
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, List, Optional

from . import _storage
from ._snapshot import capture
from .api import load_sharded, write_snapshot

__all__ = ["CheckpointManager"]

# Hidden siblings of step directories that save_dcp makes (``_dcp``): ``.<step>.dcp-<token>``
# (being written) and ``.<step>.old-<token>`` (being replaced).
_DCP_SIBLING = re.compile(r"^\.(\d+)\.(dcp|old)-[0-9a-f]+$")


def _dcp():
    from . import _dcp as module  # imports torch.distributed.checkpoint: only when needed
    return module


def _is_dcp_step(path: str) -> bool:
    return os.path.isfile(os.path.join(path, ".metadata"))


def _is_uncommitted(path: str) -> bool:
    """A step directory left by a torch_spmd-format save that never committed: no manifest,
    no DCP metadata, nothing but files a save writes."""
    return (os.path.isdir(path) and not _is_dcp_step(path) and
            not os.path.exists(os.path.join(path, _storage.MANIFEST)) and
            all(_storage.is_own_file(f) for f in os.listdir(path)))


class CheckpointManager:
    """Saves a state dict every ``save_interval`` steps into ``path/<step>/`` and restores any
    tracked step.

    Args:
      path: base directory (created if needed).
      save_interval: ``should_save(step)`` is true when ``step % save_interval == 0``.
      max_to_keep: keep at most this many checkpoints, deleting the oldest (by save time)
        after each new one is committed; 0 keeps all.
      max_pending_async: how many ``save_async`` writes may be in flight before the next one
        waits.
      use_dcp: write each step as a standard ``torch.distributed.checkpoint`` checkpoint
        (``SPMDSavePlanner``; loadable by plain DCP) instead of torch_spmd's own format.
        ``restore`` reads either format, whatever this flag says.
      chkpt_on_preemption: ``should_save`` is also true at the step ``reached_preemption``
        names. Unlike PyTorch/XLA, the manager does not take over SIGTERM itself: call
        ``torch_spmd.distributed.preemption.activate()`` to have SIGTERM noted as a preemption
        (until then ``reached_preemption`` is False).
      num_of_threads, process_group: accepted for compatibility. One process drives every
        device here, so there is no process group to coordinate (PyTorch/XLA asserts one
        exists).

    Example::

      >>> mgr = CheckpointManager('/tmp/run', save_interval=10, max_to_keep=3)
      >>> if mgr.all_steps():
      ...     prime_optimizer(opt)
      ...     sd = {'model': model.state_dict(), 'optim': opt.state_dict()}
      ...     mgr.restore(max(mgr.all_steps()), sd)
      ...     model.load_state_dict(sd['model']); opt.load_state_dict(sd['optim'])
      >>> for step in range(start, steps):
      ...     train_step(); mgr.save(step, {'model': model.state_dict(), 'optim': opt.state_dict()})
    """

    def __init__(self,
                 path: str,
                 save_interval: int,
                 max_to_keep: Optional[int] = 0,
                 max_pending_async: Optional[int] = 1,
                 num_of_threads: Optional[int] = 1,
                 process_group: Any = None,
                 chkpt_on_preemption: bool = True,
                 use_dcp: bool = False):
        assert save_interval > 0, "save_interval must be positive"
        assert max_pending_async > 0, "max_pending_async must be positive"
        assert max_to_keep >= 0, "max_to_keep must be non-negative"
        self.base_path = path
        self.save_interval = save_interval
        self.max_to_keep = max_to_keep
        self.num_of_threads = num_of_threads
        self.chkpt_on_preemption = chkpt_on_preemption
        self.use_dcp = use_dcp
        os.makedirs(path, exist_ok=True)
        self._recover()
        # One writer thread: saves commit in the order they were requested.
        self._async_worker_pool = ThreadPoolExecutor(max_workers=1)
        self._async_sem = threading.Semaphore(max_pending_async)
        self._async_futures: List[Future] = []
        self._save_mutex = threading.Lock()

    # -- layout -------------------------------------------------------------------------------

    def _get_path(self, step: int) -> str:
        return os.path.join(self.base_path, str(step))

    def _tracked(self) -> List[tuple]:
        """``(created, step)`` of every committed checkpoint, oldest first."""
        tracked = []
        for name in os.listdir(self.base_path):
            if not name.isdigit():
                continue
            step_path = os.path.join(self.base_path, name)
            if _is_dcp_step(step_path):
                try:
                    tracked.append((os.path.getmtime(os.path.join(step_path, ".metadata")),
                                    int(name)))
                except FileNotFoundError:  # deleted meanwhile
                    pass
                continue
            try:
                manifest = _storage.read_manifest(os.path.join(self.base_path, name))
            except (OSError, ValueError) as e:
                if not isinstance(e, FileNotFoundError):
                    logging.warning(f"Ignoring invalid checkpoint {name}: {e}")
                continue
            tracked.append((manifest["created"], int(name)))
        return sorted(tracked)

    def _delete_step(self, step: int) -> None:
        path = self._get_path(step)
        for commit_file in (_storage.MANIFEST, ".metadata"):
            commit_path = os.path.join(path, commit_file)
            if os.path.exists(commit_path):  # untrack first: a half-deleted step is never listed
                os.unlink(commit_path)
                _storage.fsync_dir(path)
        shutil.rmtree(path, ignore_errors=True)

    def _recover(self) -> None:
        """Finishes step replacements that save_dcp started and a crash interrupted."""
        steps = {m.group(1) for m in map(_DCP_SIBLING.match, os.listdir(self.base_path))
                 if m and m.group(2) == "old"}
        for step in steps:
            _dcp().recover(os.path.join(self.base_path, step))

    def _remove_uncommitted(self) -> None:
        """Deletes step directories whose first save never committed (only our own files),
        and the directories of DCP saves that were killed while writing."""
        for name in os.listdir(self.base_path):
            path = os.path.join(self.base_path, name)
            match = _DCP_SIBLING.match(name)
            if match and match.group(2) == "dcp" and os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)
                continue
            if name.isdigit() and _is_uncommitted(path):
                shutil.rmtree(path, ignore_errors=True)

    def _save(self, step: int, snapshot) -> None:
        """Writes a ``capture`` snapshot (torch_spmd format) or a state dict / staged host
        copy (DCP) as step ``step``, then evicts."""
        with self._save_mutex:
            path = self._get_path(step)
            if self.use_dcp:
                self._recover()
                if _is_uncommitted(path):  # replaced whole: clear what cannot be kept
                    shutil.rmtree(path)
                _dcp().save_dcp(snapshot, path)
            elif _is_dcp_step(path):  # the step was saved as DCP before: replace it whole
                parent = os.path.dirname(os.path.abspath(path))
                new = os.path.join(parent, f".{step}.dcp-{os.urandom(8).hex()}")
                try:
                    write_snapshot(snapshot, new)
                    _dcp().replace_dir(new, path)
                except BaseException:
                    shutil.rmtree(new, ignore_errors=True)
                    raise
            else:
                write_snapshot(snapshot, path)
            if self.max_to_keep > 0:
                tracked = self._tracked()
                for _, old in tracked[:max(0, len(tracked) - self.max_to_keep)]:
                    self._delete_step(old)
            self._remove_uncommitted()

    # -- public API ---------------------------------------------------------------------------

    def should_save(self, step: int) -> bool:
        """Whether ``step`` is a checkpoint step (``step % save_interval == 0``)."""
        preemption_detected = self.chkpt_on_preemption and self.reached_preemption(step)
        return step % self.save_interval == 0 or preemption_detected

    def save(self, step: int, state_dict: Any, force: Optional[bool] = False) -> bool:
        """Checkpoints ``state_dict`` now if ``should_save(step)`` or ``force``; returns whether
        it did. Waits for pending ``save_async`` writes first, so saves commit in order."""
        if not (self.should_save(step) or force):
            return False
        self.join()
        self._save(step, state_dict if self.use_dcp else capture(state_dict))
        return True

    def save_async(self, step: int, state_dict: Any, force: Optional[bool] = False) -> bool:
        """Like ``save``, but only the copy to the host happens now; the files are written by a
        background thread (at most ``max_pending_async`` pending; the next call waits). Write
        errors surface in ``join()``."""
        if not (self.should_save(step) or force):
            return False
        # Host copies now: training may go on changing the tensors.
        snapshot = (_dcp().stage_state_dict(state_dict) if self.use_dcp else
                    capture(state_dict))
        self._async_sem.acquire()
        future = self._async_worker_pool.submit(self._save, step, snapshot)
        future.add_done_callback(lambda _: self._async_sem.release())
        self._async_futures.append(future)
        return True

    def restore(self, step: int, state_dict: Any) -> None:
        """Loads the checkpoint of ``step`` into ``state_dict`` in place (``load_dcp`` for a DCP
        step, else ``load_sharded``); finish with ``model.load_state_dict`` /
        ``optimizer.load_state_dict``."""
        tracked_steps = set(self.all_steps())
        assert step in tracked_steps, \
            f'Cannot restore from untracked step {step}. Valid steps are: {tracked_steps}'
        path = self._get_path(step)
        if _is_dcp_step(path):
            _dcp().load_dcp(state_dict, path)
        else:
            load_sharded(state_dict, path)

    def all_steps(self) -> List[int]:
        """The steps with a committed checkpoint, ascending."""
        return sorted(step for _, step in self._tracked())

    def latest_step(self) -> Optional[int]:
        """The most recently saved tracked step, or None (not in PyTorch/XLA's interface)."""
        tracked = self._tracked()
        return tracked[-1][1] if tracked else None

    def join(self) -> None:
        """Waits for pending ``save_async`` writes; re-raises the first one that failed."""
        futures, self._async_futures = self._async_futures, []
        errors = [f.exception() for f in futures]
        for e in errors:
            if e is not None:
                raise e

    def reached_preemption(self, step: int) -> bool:
        """Whether ``step`` is the sync point after a SIGTERM, once SIGTERM was taken as a
        preemption notice (``torch_spmd.distributed.preemption.activate()``, or PyTorch/XLA's
        ``_XLAC._activate_preemption_sync_manager()``); False otherwise."""
        from .. import preemption
        return preemption.sync_point_reached(step)
