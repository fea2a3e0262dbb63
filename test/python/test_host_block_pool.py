"""The executor's pool of host blocks (csrc/runtime/host_block_pool.h): the emulated devices
keep the memory a step freed for the next step, as an accelerator's caching allocator does.
The pool must change where bytes come from, never what a step computes, and must leave every
allocation outside the executor to torch's allocator."""
import os
import subprocess
import sys

import torch

import torch_spmd.core.xla_model as xm
import torch_spmd.distributed.spmd as xs
from torch_spmd import _C
from spmd_diff import assert_same, dev, ensure_devices, mesh_of

N = 8


def _mlp_steps(steps, stats_after=None):
    """`steps` SGD steps of an FSDP-sharded 2-layer MLP (blocks of 256 KiB and more) on 8
    devices and on CPU; returns both final weights and the pool's stats after each step."""
    ensure_devices(N)
    mesh = mesh_of((N,), ("fsdp",))
    g = torch.Generator().manual_seed(0)
    w1, w2 = torch.randn(256, 512, generator=g) * 0.05, torch.randn(512, 256, generator=g) * 0.05
    xs_ = [torch.randn(64, 256, generator=g) for _ in range(steps)]

    def train(device, shard):
        a = w1.clone().to(device).requires_grad_()
        b = w2.clone().to(device).requires_grad_()
        if shard:
            xs.mark_sharding(a, mesh, ("fsdp", None))
            xs.mark_sharding(b, mesh, ("fsdp", None))
        opt = torch.optim.SGD([a, b], lr=0.1)
        stats = []
        for x in xs_:
            x = x.to(device)
            if shard:
                xs.mark_sharding(x, mesh, ("fsdp", None))
            loss = ((x @ a).relu() @ b).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            if shard:
                xm.mark_step()
                stats.append(_C._host_pool_stats())
        return a.detach().cpu(), b.detach().cpu(), stats

    got = train(dev(), True)
    want = train("cpu", False)
    return got, want


def test_steps_reuse_the_blocks_the_previous_step_freed_and_equal_cpu():
    (a, b, stats), (ea, eb, _) = _mlp_steps(4)
    assert_same(a, ea, "w1")
    assert_same(b, eb, "w2")
    # From the second step on the step's buffers come from the pool: nothing new is taken
    # from the host, and every step reuses blocks.
    assert stats[-1]["blocks_created"] == stats[1]["blocks_created"], stats
    for before, after in zip(stats[1:], stats[2:]):
        assert after["blocks_reused"] > before["blocks_reused"], stats
    # What the pool caches stays within its high-water mark plus its 64 MiB of slack.
    assert stats[-1]["bytes_cached"] <= stats[-1]["high_water"] + (64 << 20), stats


def test_allocations_outside_the_executor_are_torchs():
    _mlp_steps(1)  # the pool is installed
    before = _C._host_pool_stats()
    big = [torch.empty(1 << 20) for _ in range(4)]  # 4 MiB each, on this thread, outside a step
    during = _C._host_pool_stats()
    del big
    assert during["bytes_in_use"] == before["bytes_in_use"], (before, during)
    assert during["blocks_reused"] == before["blocks_reused"], (before, during)
    assert during["blocks_created"] == before["blocks_created"], (before, during)


def test_released_blocks_leave_live_values_intact():
    (a, b, _), (ea, eb, _) = _mlp_steps(2)
    _C._release_cached_host_blocks()
    assert _C._host_pool_stats()["bytes_cached"] == 0
    assert_same(a, ea, "w1")  # a copy the step handed back, still readable
    # and the next steps, on fresh blocks, are still right
    (a2, b2, _), (ea2, eb2, _) = _mlp_steps(2)
    assert_same(b2, eb2, "w2")


def test_spmd_host_pool_0_leaves_torchs_allocator_alone():
    code = (
        "import sys; sys.path[:0] = {path!r}\n"
        "import test_host_block_pool as t\n"
        "from torch_spmd import _C\n"
        "(a, b, stats), (ea, eb, _) = t._mlp_steps(2)\n"
        "t.assert_same(a, ea, 'w1')\n"
        "assert stats[-1]['blocks_created'] == 0 and stats[-1]['blocks_reused'] == 0, stats\n"
        "print('ok')\n"
    ).format(path=sys.path)
    env = dict(os.environ, SPMD_HOST_POOL="0")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       cwd=os.path.dirname(os.path.abspath(__file__)), timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr
