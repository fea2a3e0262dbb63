"""PyTorch/XLA's ``torch_xla.core`` for torch_spmd: ``xla_model`` (``xm``)."""
from . import xla_model  # noqa: F401
