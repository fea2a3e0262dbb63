"""Auto-wrap policies for nested FSDP, at PyTorch/XLA's path
(``torch_xla.distributed.fsdp.wrap``). The implementation is shared with FSDPv2 and lives in
``torch_spmd.distributed.wrap``."""
from ..wrap import (  # noqa: F401
    always_wrap_policy,
    lambda_auto_wrap_policy,
    recursive_wrap,
    size_based_auto_wrap_policy,
    transformer_auto_wrap_policy,
)

__all__ = [
    "always_wrap_policy",
    "lambda_auto_wrap_policy",
    "transformer_auto_wrap_policy",
    "size_based_auto_wrap_policy",
    "recursive_wrap",
]
