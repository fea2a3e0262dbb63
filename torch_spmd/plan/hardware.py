"""``torch_spmd.plan.hardware``: the hardware presets, their sources and ``resolve``. The module
is ``torch_spmd._impl.hardware`` (it lives below ``torch_spmd.runtime``, whose
``use_spmd(auto=True, hardware=...)`` resolves a preset); this name is the same module."""
import sys

from .._impl import hardware as _hardware

sys.modules[__name__] = _hardware
