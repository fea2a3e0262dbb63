"""A process that ran a backward pass on the device exits cleanly (see torch_spmd/_torch_patches/autograd_exit.py:
without the drain, torch's autograd device thread aborted about every other such process at
interpreter shutdown). backward() runs spmd backward passes on the calling thread
(_autograd_thread.py); one started on the engine directly still uses the device thread."""
import os
import subprocess
import sys

import pytest

# Minutes of work (processes, examples, sweeps): scripts/test.sh runs it, plain pytest does not.
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

BACKWARD = """
import torch, torch_spmd
x = torch.ones(10, device="spmd", requires_grad=True)
(x * 3).sum().backward()
assert x.grad.cpu().eq(3).all()
"""
ENGINE_BACKWARD = """
import torch, torch_spmd
x = torch.ones(10, device="spmd", requires_grad=True)
y = (x * 3).sum()
torch.autograd.Variable._execution_engine.run_backward(
    (y,), (torch.ones((), device="spmd"),), False, False, (), True, True)
assert x.grad.cpu().eq(3).all()
assert torch_spmd._C._recorded_off_main_thread()  # (the device thread ran it)
"""
# No backward: the exit path must not start torch's autograd device thread itself (a thread
# starting during finalization aborts the same way).
FORWARD_ONLY = """
import torch, torch_spmd
x = torch.arange(20.).view(5, 4).to("spmd")
assert (x * 2).sum().item() == 380.0
"""


def _exit_codes(script, runs):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    codes = []
    for _ in range(runs):
        r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                           text=True, timeout=120)
        codes.append((r.returncode, r.stderr[-300:]))
    return codes


def test_backward_then_exit_never_aborts():
    codes = _exit_codes(BACKWARD, 10)
    assert all(code == 0 for code, _ in codes), codes


def test_engine_backward_then_exit_never_aborts():
    codes = _exit_codes(ENGINE_BACKWARD, 10)
    assert all(code == 0 for code, _ in codes), codes


def test_forward_only_exit_never_aborts():
    codes = _exit_codes(FORWARD_ONLY, 10)
    assert all(code == 0 for code, _ in codes), codes
