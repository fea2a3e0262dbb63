"""pytest setup for the torch_spmd Python suite: makes the repository root importable (the
extension is built into torch_spmd/) and the helper module next to this file."""
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(os.path.dirname(_HERE))
for p in (_ROOT, _HERE):
    if p not in sys.path:
        sys.path.insert(0, p)

import torch  # noqa: E402,F401  (torch before the extension)
import torch_spmd  # noqa: E402,F401
