"""Builds torch_spmd's C++ core with CMake against the torch of the interpreter running pip.

    pip install --no-build-isolation .        # or: pip install --no-build-isolation -e .

``--no-build-isolation`` matters: torch_spmd compiles against the torch you already have
(its headers and libraries), and an isolated build environment would download another torch
(a CUDA build is several GB). Needs a C++20 compiler, CMake >= 3.18 and ninja (or make) in
that environment; CMake takes torch's headers and libraries from this interpreter's torch
(cmake/TorchFromPython.cmake), so a CUDA build of torch needs no CUDA toolkit.
"""
import os
import pathlib
import shutil
import subprocess
import sys

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext


def _torch():
    try:
        import torch
    except ImportError:
        sys.exit("torch_spmd builds against an installed torch (>= 2.6), and none is importable "
                 "here. Install torch first, then run pip with --no-build-isolation so that the "
                 "build sees it: pip install --no-build-isolation .")
    major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    if (major, minor) < (2, 6):
        sys.exit(f"torch_spmd needs torch >= 2.6, found {torch.__version__}")
    return torch


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        torch = _torch()
        out_dir = os.path.abspath(os.path.dirname(self.get_ext_fullpath(ext.name)))
        build_dir = os.path.abspath(os.path.join(self.build_temp, "cmake"))
        generator = ["-G", "Ninja"] if _has("ninja") else []
        # pip builds in ./build, shared by every venv of one Python version: reuse the build
        # directory only when a configure for this interpreter, torch and generator succeeded
        # there; start afresh otherwise (CMake would keep its cached answers, or refuse a
        # generator change).
        config = f"{sys.executable}|{torch.__file__}|{torch.__version__}|{generator}"
        stamp = pathlib.Path(build_dir, ".spmd_config")
        if not stamp.is_file() or stamp.read_text() != config:
            shutil.rmtree(build_dir, ignore_errors=True)
        os.makedirs(build_dir, exist_ok=True)
        subprocess.check_call(
            ["cmake", "-S", os.path.dirname(os.path.abspath(__file__)), "-B", build_dir,
             *generator, "-DCMAKE_BUILD_TYPE=Release", "-DSPMD_BUILD_TESTS=OFF",
             f"-DPython3_EXECUTABLE={sys.executable}", f"-DSPMD_PY_OUTPUT_DIR={out_dir}"])
        stamp.write_text(config)
        jobs = os.environ.get("MAX_JOBS", str(os.cpu_count() or 1))
        subprocess.check_call(["cmake", "--build", build_dir, "--target", "_C", "-j", jobs])


def _has(tool):
    return shutil.which(tool) is not None


setup(
    name="torch_spmd",
    version="0.2.0",
    description="GSPMD-style automatic parallelization for PyTorch on an emulated device mesh",
    packages=find_packages(include=["torch_spmd", "torch_spmd.*"]),
    ext_modules=[CMakeExtension("torch_spmd._C")],
    cmdclass={"build_ext": CMakeBuild},
    python_requires=">=3.9",
    install_requires=["numpy"],
    zip_safe=False,
)
