"""A process that ran a backward pass on the device exits cleanly (see torch_spmd/_autograd_exit.py:
without the drain, torch's autograd device thread aborted about every other such process at
interpreter shutdown)."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCRIPT = """
import torch, torch_spmd
x = torch.ones(10, device="spmd", requires_grad=True)
(x * 3).sum().backward()
assert x.grad.cpu().eq(3).all()
"""


def test_backward_then_exit_never_aborts():
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    codes = []
    for _ in range(10):
        r = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                           text=True, timeout=120)
        codes.append((r.returncode, r.stderr[-300:]))
    assert all(code == 0 for code, _ in codes), codes
