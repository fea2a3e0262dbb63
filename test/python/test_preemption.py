"""SIGTERM as a preemption notice (PyTorch/XLA's preemption sync manager): once activated, a
SIGTERM makes the next step a sync point (once), CheckpointManager saves there, deactivating
gives SIGTERM back, and a second SIGTERM still ends the process."""
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from torch_spmd.distributed import preemption
from torch_spmd.distributed.checkpoint import CheckpointManager


@pytest.fixture
def active():
    before = signal.getsignal(signal.SIGTERM)
    preemption.activate()
    yield
    preemption.deactivate()
    assert signal.getsignal(signal.SIGTERM) == before


def test_sigterm_makes_the_next_step_a_sync_point_once(active):
    assert not any(preemption.sync_point_reached(step) for step in range(5))
    os.kill(os.getpid(), signal.SIGTERM)  # the handler runs before the next bytecode
    assert preemption.sync_point_reached(5)
    assert preemption.sync_point_reached(5)  # asked again at the same step
    assert not preemption.sync_point_reached(6)


def test_checkpoint_manager_saves_at_the_sync_point(active, tmp_path):
    mgr = CheckpointManager(str(tmp_path), save_interval=100)
    assert not mgr.should_save(7)
    os.kill(os.getpid(), signal.SIGTERM)
    assert mgr.should_save(8) and not mgr.should_save(9)
    assert not CheckpointManager(str(tmp_path), 100, chkpt_on_preemption=False).should_save(8)


def test_inactive_never_reaches_a_sync_point_and_rejects_a_bad_step():
    assert not preemption.is_active()
    assert not preemption.sync_point_reached(3)
    with pytest.raises(TypeError, match="step must be an int"):
        preemption.sync_point_reached("3")


def test_a_second_sigterm_ends_the_process():
    code = textwrap.dedent("""
        import os, signal, time
        from torch_spmd.distributed import preemption
        preemption.activate()
        os.kill(os.getpid(), signal.SIGTERM)
        print("noted", preemption.sync_point_reached(0), flush=True)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
        print("still alive", flush=True)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == -signal.SIGTERM, (proc.returncode, proc.stdout, proc.stderr)
    assert "noted True" in proc.stdout and "still alive" not in proc.stdout
