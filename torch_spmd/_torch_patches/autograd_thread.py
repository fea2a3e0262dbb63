"""spmd backward passes run on the thread that calls ``backward()``/``autograd.grad``.

PyTorch's autograd engine runs the nodes of every device but CPU, Meta and Lazy on a worker
thread of their own, so that a GPU's kernels are launched beside the CPU's work. An spmd
backward pass launches nothing: it records the step's nodes (or instantiates a compiled
region's template), host work like Lazy's, which the engine runs on the calling thread. On a
worker it only pays the hand-over there and back and a thread whose caches are cold: 10-20% of
a backward's host time on the benchmark GPT (benchmarks/compiled_overhead.py). So a backward
whose roots include an spmd tensor runs with the engine's multithreading off (as
``torch.autograd.set_multithreading_enabled(False)`` would), for that backward only; other
devices' backward passes are untouched. A backward started on the engine directly
(``Variable._execution_engine.run_backward``) still uses the worker (see _autograd_exit).
"""
import torch
import torch.autograd.graph

_MARK = "_spmd_on_calling_thread"


def _on_calling_thread(run_backward):
    def run(t_outputs, *args, **kwargs):
        if not torch._C._is_multithreading_enabled() or not any(
                isinstance(t, torch.Tensor) and t.device.type == "spmd" for t in t_outputs):
            return run_backward(t_outputs, *args, **kwargs)
        torch._C._set_multithreading_enabled(False)
        try:
            return run_backward(t_outputs, *args, **kwargs)
        finally:
            torch._C._set_multithreading_enabled(True)

    setattr(run, _MARK, True)
    return run


def install() -> None:
    # torch.autograd.backward and grad call the name bound in torch.autograd; others import it
    # from torch.autograd.graph.
    run_backward = torch.autograd.graph._engine_run_backward
    if getattr(run_backward, _MARK, False):
        return
    wrapped = _on_calling_thread(run_backward)
    torch.autograd.graph._engine_run_backward = wrapped
    torch.autograd._engine_run_backward = wrapped
