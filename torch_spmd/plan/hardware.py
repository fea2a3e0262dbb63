# ``torch_spmd.plan.hardware``: the hardware presets, their sources and ``resolve``, as
# ``torch_spmd._impl.hardware`` defines them (they live below ``torch_spmd.runtime``, whose
# ``use_spmd(auto=True, hardware=...)`` resolves a preset). This module re-exports them: the
# same objects under their public name, and the same docstring (each preset's sources).
from .._impl import hardware as _hardware
from .._impl.hardware import (ALIASES, DOMAIN_FIELDS, GB, GIB, PLACEHOLDER_EFFICIENCY,  # noqa: F401
                              PRESETS, REQUIRED, TPU_COLLECTIVE_MATMUL_BYTES, measure_host,
                              resolve)

__doc__ = _hardware.__doc__
