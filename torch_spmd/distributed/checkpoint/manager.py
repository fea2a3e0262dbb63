"""``CheckpointManager``: per-step sharded checkpoints under one directory.

PyTorch/XLA's ``torch_xla.experimental.distributed_checkpoint.CheckpointManager`` interface.
Step ``s`` lives in ``<path>/<s>/`` as a ``save_sharded`` checkpoint; a step is tracked once
its manifest is committed (written last, atomically), so an interrupted save never shows up as
a step and never damages an older one.
"""
import logging
import os
import shutil
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, List, Optional

from . import _storage
from ._snapshot import capture
from .api import load_sharded, write_snapshot

__all__ = ["CheckpointManager"]


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
      num_of_threads, process_group, chkpt_on_preemption: accepted for compatibility. One
        process drives every device here, so there is no process group to coordinate (PyTorch/
        XLA asserts one exists), and there is no preemption service to sync with:
        ``reached_preemption`` is always False.

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
                 chkpt_on_preemption: bool = True):
        assert save_interval > 0, "save_interval must be positive"
        assert max_pending_async > 0, "max_pending_async must be positive"
        assert max_to_keep >= 0, "max_to_keep must be non-negative"
        self.base_path = path
        self.save_interval = save_interval
        self.max_to_keep = max_to_keep
        self.num_of_threads = num_of_threads
        self.chkpt_on_preemption = chkpt_on_preemption
        os.makedirs(path, exist_ok=True)
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
        manifest = os.path.join(path, _storage.MANIFEST)
        if os.path.exists(manifest):  # untrack first: a half-deleted step is never listed
            os.unlink(manifest)
            _storage.fsync_dir(path)
        shutil.rmtree(path, ignore_errors=True)

    def _remove_uncommitted(self) -> None:
        """Deletes step directories whose first save never committed (only our own files)."""
        for name in os.listdir(self.base_path):
            path = os.path.join(self.base_path, name)
            if (name.isdigit() and os.path.isdir(path) and
                    not os.path.exists(os.path.join(path, _storage.MANIFEST)) and
                    all(_storage.is_own_file(f) for f in os.listdir(path))):
                shutil.rmtree(path, ignore_errors=True)

    def _write(self, step: int, snapshot) -> None:
        with self._save_mutex:
            write_snapshot(snapshot, self._get_path(step))
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
        self._write(step, capture(state_dict))
        return True

    def save_async(self, step: int, state_dict: Any, force: Optional[bool] = False) -> bool:
        """Like ``save``, but only the copy to the host happens now; the files are written by a
        background thread (at most ``max_pending_async`` pending; the next call waits). Write
        errors surface in ``join()``."""
        if not (self.should_save(step) or force):
            return False
        snapshot = capture(state_dict)  # host copies: training may go on changing the tensors
        self._async_sem.acquire()
        future = self._async_worker_pool.submit(self._write, step, snapshot)
        future.add_done_callback(lambda _: self._async_sem.release())
        self._async_futures.append(future)
        return True

    def restore(self, step: int, state_dict: Any) -> None:
        """Loads the checkpoint of ``step`` into ``state_dict`` in place (``load_sharded``);
        finish with ``model.load_state_dict`` / ``optimizer.load_state_dict``."""
        tracked_steps = set(self.all_steps())
        assert step in tracked_steps, \
            f'Cannot restore from untracked step {step}. Valid steps are: {tracked_steps}'
        load_sharded(state_dict, self._get_path(step))

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
        """Always False: emulated devices are never preempted."""
        return False
