"""Prints, as CMake set() commands, what code built against this interpreter's torch needs,
found the way torch.utils.cpp_extension finds it (include_paths(), library_paths(), libraries
c10, torch, torch_cpu and torch_python, the libstdc++ ABI torch was built with):

    SPMD_TORCH_INCLUDE_DIRS    SPMD_TORCH_LIBRARIES (c10, torch, torch_cpu)
    SPMD_TORCH_PYTHON_LIBRARY  SPMD_TORCH_CXX11_ABI (0 or 1)

Libraries are printed as files, searched in library_paths() as the linker searches -L/-l, so
that CMake relinks when they change.
"""
import os
import sys

import torch
from torch.utils import cpp_extension


def cmake_string(value):
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$")
    return f'"{escaped}"'


def library(name, dirs):
    for directory in dirs:
        path = os.path.join(directory, f"lib{name}.so")
        if os.path.exists(path):
            return path
    sys.exit(f"lib{name}.so is in none of torch's library paths {dirs}")


# Debian's torch 2.6 lists include/TH and include/THC, which it does not ship; the imported
# target that carries these refuses directories that do not exist.
include_dirs = [d for d in cpp_extension.include_paths() if os.path.isdir(d)]
library_dirs = cpp_extension.library_paths()
settings = {
    "SPMD_TORCH_INCLUDE_DIRS": ";".join(include_dirs),
    "SPMD_TORCH_LIBRARIES": ";".join(library(n, library_dirs) for n in ("c10", "torch", "torch_cpu")),
    "SPMD_TORCH_PYTHON_LIBRARY": library("torch_python", library_dirs),
    "SPMD_TORCH_CXX11_ABI": str(int(torch._C._GLIBCXX_USE_CXX11_ABI)),
}
for key, value in settings.items():
    print(f"set({key} {cmake_string(value)})")
