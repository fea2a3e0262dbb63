"""Lets torch's autograd thread for the spmd device drop its last backward pass before Python
shuts down.

torch (2.x) runs the backward of device tensors on a per-device worker thread (spmd backward
passes started by ``backward()`` or ``autograd.grad`` run on the calling thread instead,
_autograd_thread.py; one started on the engine directly, as some libraries do, or from roots
on another device, still runs there). Every backward
(``torch.autograd._engine_run_backward``) stashes a Python object in the graph task's
thread-local state; the worker may release the finished graph task (and so that object, which
needs the GIL) a moment after ``backward()`` returned. If Python is finalizing by then, taking
the GIL ends the thread with a forced unwind through a noexcept frame, and the process aborts
("terminate called without an active exception") after an otherwise successful run. CUDA has
the same race; it shows here because an emulated step is fast.

At exit (before finalization) we run one more tiny backward on the device, directly through the
engine so that it carries no Python object: the worker drops each graph task before it takes
the next one, so once this backward is done the earlier ones are gone.
"""
import atexit
import time

import torch

from .. import _C
from .._impl.device import device

def _drain_autograd_worker() -> None:
    # Only if the worker exists: starting it now would race with finalization itself.
    if not _C._recorded_off_main_thread():
        return
    try:
        if torch._C._is_key_in_tls("context"):
            torch._C._remove_obj_from_tls("context")
        with torch.enable_grad():
            for _ in range(2):  # the second makes the worker drop the first
                x = torch.zeros((), device=device()).requires_grad_()
                y = x * 1.0
                torch.autograd.Variable._execution_engine.run_backward(
                    (y,), (torch.ones((), device=device()),), False, False, (x,), True, False)
        # The worker drops the last one right after finishing it: give it the GIL meanwhile.
        time.sleep(0.02)
    except Exception:  # never fail a process at exit over this
        pass


atexit.register(_drain_autograd_worker)
