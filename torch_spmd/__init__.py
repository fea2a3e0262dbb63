"""torch_spmd: GSPMD-style automatic parallelization for PyTorch programs.

Put tensors on the spmd device (``torch_spmd.device()``), annotate a few with
``torch_spmd.distributed.spmd.mark_sharding`` and call ``torch_spmd.sync()`` once per step:
the recorded graph is partitioned over the emulated device mesh and executed.
"""
import torch

from . import _C  # noqa: F401  (registers the backend with the dispatcher)
from ._impl.device import device, is_spmd_tensor, sync
from ._torch_patches import (autograd_thread, cuda_autograd, dcp_default_planner, dynamo,
                             storageless_tensors)
from . import debug  # noqa: F401
from . import memory  # noqa: F401  (registers torch.ops.spmd.offload and checkpoint_name)
from ._torch_patches import autograd_exit  # noqa: F401  (see its docstring)
from ._impl import threads as _threads

_C._init()
storageless_tensors.install()
autograd_thread.install()
dynamo.install()
dcp_default_planner.install()
if torch.backends.cuda.is_built():  # CUDA builds of torch only (see cuda_autograd)
    cuda_autograd.install()
_threads.configure_threads()  # intra-op threads = this process's cores (SPMD_NUM_THREADS)

__all__ = ["device", "sync", "is_spmd_tensor"]
