"""spmd backward passes run on the calling thread (torch_spmd/_torch_patches/autograd_thread.py), for that
backward only: the engine's multithreading setting is what it was afterwards, also after a
failed backward, and a user's own setting is kept."""
import threading

import pytest
import torch

import torch_spmd

DEV = torch_spmd.device()


class _Probe(torch.autograd.Function):
    """Identity whose backward notes the thread it runs on."""
    threads = []

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        _Probe.threads.append(threading.get_ident())
        return g


class _Fails(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        raise ValueError("backward failed on purpose")


def _backward_thread(device, use_grad=False):
    _Probe.threads.clear()
    x = torch.ones(4, device=device, requires_grad=True)
    y = _Probe.apply(x * 2).sum()
    if use_grad:
        (g,) = torch.autograd.grad(y, x)
    else:
        y.backward()
        g = x.grad
    assert g.cpu().eq(2).all()
    return _Probe.threads[0]


@pytest.mark.parametrize("use_grad", [False, True])
def test_spmd_backward_runs_on_the_calling_thread(use_grad):
    assert _backward_thread(DEV, use_grad) == threading.get_ident()
    assert torch.is_grad_enabled() and torch._C._is_multithreading_enabled()


def test_from_another_thread_too():
    seen = {}

    def run():
        seen["caller"] = threading.get_ident()
        seen["backward"] = _backward_thread(DEV)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert seen["backward"] == seen["caller"] != threading.get_ident()


def test_the_setting_is_restored_after_a_failed_backward():
    x = torch.ones(4, device=DEV, requires_grad=True)
    with pytest.raises(ValueError, match="on purpose"):
        _Fails.apply(x).sum().backward()
    assert torch._C._is_multithreading_enabled()
    assert _backward_thread(DEV) == threading.get_ident()  # (the engine still works)


def test_a_users_own_setting_is_kept():
    with torch.autograd.set_multithreading_enabled(False):
        assert _backward_thread(DEV) == threading.get_ident()
        assert not torch._C._is_multithreading_enabled()
    assert torch._C._is_multithreading_enabled()


def test_cpu_backward_is_untouched():
    calls = []
    real = torch._C._set_multithreading_enabled
    torch._C._set_multithreading_enabled = lambda mode: (calls.append(mode), real(mode))
    try:
        assert _backward_thread("cpu") == threading.get_ident()
        _backward_thread(DEV)
    finally:
        torch._C._set_multithreading_enabled = real
    assert calls == [False, True]  # (the spmd backward's only)
