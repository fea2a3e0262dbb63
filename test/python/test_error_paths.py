"""Every user error raises a Python exception, never a signal: each case runs a script in a
child process that lets the error propagate, and the child must exit through Python's own
uncaught-exception path (status 1) with the expected type and message, and no C++ backtrace.

pip_smoke.sh runs this file against the installed package on PyPI's CUDA build of torch, and the
main suite runs it on the machine's own torch, so every supported torch is covered."""
import os
import re
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PRELUDE = """
import numpy as np
import torch
import torch_spmd
import torch_spmd.core.xla_model as xm
import torch_spmd.distributed.spmd as xs
dev = torch_spmd.device()
def mesh():
    return xs.Mesh(np.arange(8), (4, 2), ("data", "model"))
"""

# (name, extra environment, script, exception type, message fragment)
CASES = [
    ("bad_mesh", {}, "xs.Mesh(np.arange(3), (2, 2), ('data', 'model'))",
     "AssertionError", "Number of device IDs (3) must match"),
    ("spec_of_wrong_length", {},
     "xs.mark_sharding(torch.randn(8, 4, device=dev), mesh(), ('data',))",
     "AssertionError", "Partition spec length (1) should be equal to the input rank (2)"),
    ("unknown_axis", {}, "xs.mark_sharding(torch.randn(8, 4, device=dev), mesh(), ('nope', None))",
     "ValueError", "Axis name nope is not defined"),
    ("shape_error_at_record_time", {},
     "torch.ones(2, 3, device=dev) + torch.ones(4, 3, device=dev)",
     "RuntimeError", "must match the size of tensor b (4)"),
    ("impossible_view", {}, "torch.ones(2, 3, device=dev).view(5)",
     "RuntimeError", "aten::view"),
    ("matmul_mismatch", {}, "torch.ones(2, 3, device=dev) @ torch.ones(4, 5, device=dev)",
     "RuntimeError", "aten::mm"),
    # Only the kernel can tell that an index is out of range: the error comes at mark_step.
    ("error_at_mark_step", {}, """
        a = torch.arange(6.0, device=dev)
        bad = a[torch.tensor([0, 9]).to(dev)]
        xm.mark_step()
     """, "IndexError", "out of bounds"),
    ("reading_after_a_failed_step", {}, """
        a = torch.arange(6.0, device=dev)
        good = a * 2
        bad = a[torch.tensor([0, 9]).to(dev)]
        try:
            xm.mark_step()
        except IndexError:
            pass
        assert torch.equal(good.cpu(), torch.arange(6.0) * 2)   # the rest is intact
        bad.cpu()
     """, "IndexError", "out of bounds"),
    ("bad_num_devices", {"SPMD_NUM_DEVICES": "zero"}, "torch.ones(2, device=dev).sum().item()",
     "RuntimeError", "SPMD_NUM_DEVICES must be a positive integer, got 'zero'"),
    ("bad_device_memory", {"SPMD_DEVICE_MEMORY": "lots"}, "torch.ones(2, device=dev).sum().item()",
     "RuntimeError", "SPMD_DEVICE_MEMORY: expected a size"),
    ("out_of_memory", {"SPMD_DEVICE_MEMORY": "8KiB", "SPMD_NUM_DEVICES": "2"}, """
        big = torch.zeros(64, 64, device=dev) + 1
        xm.mark_step()
     """, "RuntimeError", "Out of memory"),
    ("truncated_dcp_checkpoint", {}, """
        import os, sys, tempfile
        import torch_spmd.distributed.checkpoint as ckpt
        path = os.path.join(tempfile.mkdtemp(), "ck")
        ckpt.save_dcp({"w": torch.randn(16, 4, device=dev)}, path)
        data = [f for f in os.listdir(path) if f.endswith(".distcp")][0]
        with open(os.path.join(path, data), "r+b") as f:
            f.truncate(100)
        ckpt.load_dcp({"w": torch.zeros(16, 4, device=dev)}, path)
     """, "RuntimeError", "damaged DCP checkpoint"),
    ("truncated_dcp_metadata", {}, """
        import os, tempfile
        import torch_spmd.distributed.checkpoint as ckpt
        path = os.path.join(tempfile.mkdtemp(), "ck")
        ckpt.save_dcp({"w": torch.randn(16, 4, device=dev)}, path)
        with open(os.path.join(path, ".metadata"), "r+b") as f:
            f.truncate(10)
        ckpt.load_dcp({"w": torch.zeros(16, 4, device=dev)}, path)
     """, "RuntimeError", "its .metadata cannot be read"),
    ("truncated_sharded_checkpoint", {}, """
        import os, tempfile
        import torch_spmd.distributed.checkpoint as ckpt
        path = os.path.join(tempfile.mkdtemp(), "ck")
        ckpt.save_sharded({"w": torch.randn(16, 4, device=dev)}, path)
        with open(os.path.join(path, "manifest.json"), "r+b") as f:
            f.truncate(20)
        ckpt.load_sharded({"w": torch.zeros(16, 4, device=dev)}, path)
     """, "RuntimeError", "the checkpoint is damaged"),
]


@pytest.mark.parametrize("name,env,body,exc_type,fragment", CASES, ids=[c[0] for c in CASES])
def test_user_error_is_a_python_exception(name, env, body, exc_type, fragment):
    script = PRELUDE + textwrap.dedent(body)
    child_env = dict(os.environ, **env)
    child_env["PYTHONPATH"] = ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")
    for var in ("SPMD_NUM_DEVICES", "SPMD_DEVICE_MEMORY"):
        if var not in env:
            child_env.pop(var, None)
    r = subprocess.run([sys.executable, "-c", script], env=child_env, capture_output=True,
                       text=True, timeout=180)
    assert r.returncode == 1, f"{name}: exit status {r.returncode} (negative: a signal)\n" + r.stderr[-3000:]
    # The traceback's last entry, then the exception: "Type: message" (messages may span lines).
    tail = r.stderr.rsplit("Traceback (most recent call last):", 1)[-1]
    assert re.search(rf"^{exc_type}: ", tail, re.M) and fragment in tail, r.stderr[-3000:]
    assert "frame #" not in r.stderr and "Exception raised from" not in r.stderr, r.stderr[-3000:]
