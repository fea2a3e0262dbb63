"""``python -m torch_spmd.xla script.py [args]`` / ``python -m torch_spmd.xla -m module [args]``:
runs a PyTorch/XLA program unmodified on torch_spmd (``import torch_xla`` resolves to torch_spmd;
see ``torch_spmd.xla``), as ``python script.py [args]`` / ``python -m module [args]`` would:
``sys.argv``, ``__name__ == "__main__"`` and ``sys.path[0]`` (the script's directory; the current
directory for ``-m``) are set the same way.
"""
import os
import runpy
import sys

USAGE = ("usage: python -m torch_spmd.xla script.py [args ...]\n"
         "       python -m torch_spmd.xla -m module [args ...]\n"
         "Runs a PyTorch/XLA program with `import torch_xla` resolved to torch_spmd.")


def main(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, file=sys.stderr if not argv else sys.stdout)
        sys.exit(2 if not argv else 0)

    import torch_spmd.xla
    try:
        torch_spmd.xla.install()
    except RuntimeError as e:
        print(f"torch_spmd.xla: {e}", file=sys.stderr)
        sys.exit(1)

    if argv[0] == "-m":
        if len(argv) < 2:
            print("torch_spmd.xla: -m needs a module name\n" + USAGE, file=sys.stderr)
            sys.exit(2)
        module = argv[1]
        # run_module(alter_sys=True) replaces sys.argv[0] with the module's file.
        sys.argv = [module] + argv[2:]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        return

    script = argv[0]
    if not os.path.exists(script):
        print(f"torch_spmd.xla: can't open file {script!r}: no such file", file=sys.stderr)
        sys.exit(2)
    sys.argv = argv
    # `python script.py` puts the script's directory first on the path (not the cwd that
    # `python -m` put there).
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
