"""Prints (CMake list) the pybind11 ABI tags torch < 2.7 names, as -D flags; nothing otherwise."""
import torch

flags = []
for key in ("COMPILER_TYPE", "STDLIB", "BUILD_ABI"):
    value = getattr(torch._C, "_PYBIND11_" + key, None)
    if value:
        flags.append(f'-DPYBIND11_{key}="{value}"')
print(";".join(flags), end="")
