"""A clear error where PyTorch's autograd cannot run CUDA backward passes next to torch_spmd.

Registering the spmd device (PyTorch's PrivateUse1 backend, which every out-of-tree device
uses) makes it the process's "accelerator" for PyTorch >= 2.8 (``at::getAccelerator`` prefers a
registered PrivateUse1 backend to CUDA). The autograd engine then finds no stream for CUDA
nodes and fails with an internal assert, ``opt_ready_stream && opt_parent_stream`` (upstream:
pytorch/pytorch#161129; torch 2.6 and 2.7 are not affected). Nothing outside PyTorch can give
those nodes their streams back, so we say what happened and what to do instead. CUDA forward
passes, moving tensors between cuda and spmd, and spmd's own backward passes are unaffected.
"""
import functools

import torch

_ASSERT = "opt_ready_stream && opt_parent_stream"


def explain(error: RuntimeError) -> RuntimeError:
    """The error to raise for ``error``: a clear one for the known CUDA-autograd conflict,
    ``error`` itself for anything else."""
    if _ASSERT not in str(error):
        return error
    return RuntimeError(
        f"a CUDA backward pass cannot run in a process that imported torch_spmd on torch "
        f"{torch.__version__}: registering the spmd device (PyTorch's PrivateUse1 backend) "
        "makes PyTorch's autograd engine look for every node's stream on that device, and it "
        "then has none for CUDA nodes (pytorch/pytorch#161129, torch >= 2.8). Run the CUDA "
        "training in a process that does not import torch_spmd (a subprocess, say), or compare "
        "the spmd program against CPU eager; CUDA forward passes and copies between cuda and "
        "spmd work here")


def _explaining(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except RuntimeError as e:
            clear = explain(e)
            if clear is e:
                raise
            raise clear from e
    wrapper._spmd_explaining = True
    return wrapper


def install():
    for name in ("backward", "grad"):
        fn = getattr(torch.autograd, name)
        if not getattr(fn, "_spmd_explaining", False):
            setattr(torch.autograd, name, _explaining(fn))
