"""SIGTERM as a preemption notice: PyTorch/XLA's preemption sync manager
(``torch_xla._XLAC._activate_preemption_sync_manager`` / ``_sync_point_reached`` /
``_deactivate_preemption_sync_manager``), which ``CheckpointManager`` asks whether to save now.

A cloud VM (a spot instance, a preemptible TPU host) gets SIGTERM some seconds before it goes
away. Once ``activate()`` is called, SIGTERM no longer ends the process: it is noted, and the
next ``sync_point_reached(step)`` returns True for that step (exactly once), so a training
loop checkpoints and exits on its own. With several processes (torch.distributed initialized)
every process learns of a SIGTERM any of them got at the same step: each call takes the
maximum of the flags over the world, so every process must call it at every step, as
``CheckpointManager.should_save`` does.

Opt-in: unlike PyTorch/XLA's ``CheckpointManager(chkpt_on_preemption=True)``, constructing a
manager does not take over SIGTERM. A second SIGTERM goes to the handler that was there before
(by default: the process ends), so a stuck process can still be stopped.
"""
import signal
import threading
from typing import Optional

_lock = threading.RLock()  # (the SIGTERM handler may run while the main thread holds it)
_state = {"active": False, "previous": None, "signalled": 0, "sync_step": None}


def _on_sigterm(signum, frame) -> None:
    _state["signalled"] += 1
    if _state["signalled"] > 1:  # a second notice: let it do what it did before
        previous = _state["previous"]
        deactivate()
        if callable(previous):
            previous(signum, frame)
        else:
            signal.raise_signal(signum)


def activate() -> None:
    """Takes SIGTERM as a preemption notice (from the main thread, where Python runs signal
    handlers). Idempotent."""
    with _lock:
        if _state["active"]:
            return
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("activate_preemption_sync_manager: call it from the main thread "
                               "(Python delivers signals there)")
        _state.update(previous=signal.signal(signal.SIGTERM, _on_sigterm), active=True,
                      signalled=0, sync_step=None)


def deactivate() -> None:
    """Gives SIGTERM back to the handler that was there before ``activate()``. Idempotent."""
    with _lock:
        if not _state["active"]:
            return
        previous = _state["previous"]
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
        _state.update(active=False, previous=None, sync_step=None)


def is_active() -> bool:
    return _state["active"]


def _agreed(flag: int) -> int:
    """The maximum of ``flag`` over the processes of torch.distributed's default group, or
    ``flag`` itself when there is no such group or it has one process."""
    import torch
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return flag
    t = torch.tensor([flag], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def sync_point_reached(step: int) -> bool:
    """True at the first step at or after a SIGTERM (in any process), and only then; always
    False when not active."""
    if not isinstance(step, int) or isinstance(step, bool):
        raise TypeError(f"sync_point_reached: step must be an int, got {step!r}")
    if not _state["active"]:
        return False
    sync_step: Optional[int] = _state["sync_step"]
    if sync_step is not None:
        return step == sync_step
    if _agreed(1 if _state["signalled"] else 0):
        _state["sync_step"] = step
        return True
    return False
