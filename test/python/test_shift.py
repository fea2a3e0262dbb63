"""Shifts along a sharded dim stay sharded (rules/shift.cc): torch.roll and torch.flip move
slices of tiles between devices with collective-permutes, as GSPMD's pipeline shifting buffer
does, instead of gathering the dim. Differential against CPU, padding poisoned; the exact
collectives and their bytes are checked."""
import pytest
import torch

import torch_spmd
import torch_spmd.distributed.spmd as xs

from spmd_diff import check, constrain, dev, mesh_of, only


def T(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


only_permutes = only("collective-permute")


def permutes(stats):
    return [c for c in stats["collectives"] if c["kind"] == "collective-permute"]


def test_issue_reproducer_roll_of_per_stage_bmm_is_one_permute_of_a_shard_and_stays_sharded():
    # (8, 4, 16) state through per-stage weights (8, 16, 16), both sharded on the stage dim
    # over 8 devices, then shifted one stage on.
    mesh = mesh_of((8,), ("stage",))
    state, w = T(8, 4, 16), T(8, 16, 16, seed=1)
    expected = torch.roll(torch.bmm(state, w), 1, 0)
    s = state.to(dev())
    ww = w.to(dev())
    xs.mark_sharding(s, mesh, ("stage", None, None))
    xs.mark_sharding(ww, mesh, ("stage", None, None))
    torch_spmd.sync()
    out = torch.roll(torch.bmm(s, ww), 1, 0)
    torch_spmd.sync()
    stats = torch_spmd.debug.last_step_stats()
    assert [c["kind"] for c in stats["collectives"]] == ["collective-permute"], stats["collectives"]
    assert permutes(stats)[0]["bytes"] == 4 * 16 * 8  # one shard: (1, 4, 16) float64
    assert torch_spmd._C._get_sharding_spec(out) != "", "the shifted state lost its sharding"
    assert "devices=[8,1,1]" in torch_spmd._C._get_sharding_spec(out)
    torch.testing.assert_close(out.cpu(), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("shift", [1, -1, 3, 4, -4, 8, 13, -17, 0, 15])
def test_roll_of_an_evenly_sharded_dim_equals_cpu_moving_only_the_rows_that_change_device(shift):
    # 16 rows over 4 devices: tiles of 4. With shift mod 16 = 4q + r, a tile's first 4 - r rows
    # move q tiles on and its last r rows q + 1: a permute for each part that changes device
    # (a multiple of 4 moves whole tiles; a shift by 1 sends one row).
    mesh = mesh_of((4, 2))
    r = check(lambda x: torch.roll(x, shift, 0), [T(16, 6)], [("data", None)], mesh, grad=True,
              fwd=only_permutes, bwd=only_permutes)
    row_bytes = 6 * 8

    def expected(s):
        q, rows = divmod(s % 16, 4)
        parts = [(4 - rows, q), (rows, q + 1)]
        return sorted(n * row_bytes for n, moves in parts if n and moves % 4)
    assert sorted(c["bytes"] for c in permutes(r.fwd_stats)) == expected(shift), r.fwd


def test_roll_of_several_dims_sharded_and_not_on_a_2d_mesh_equals_cpu():
    mesh = mesh_of((2, 4))
    check(lambda x: torch.roll(x, (3, -1, 2), (0, 1, 2)), [T(8, 6, 12)],
          [("model", None, "data")], mesh, grad=True, fwd=only_permutes, bwd=only_permutes)


def test_roll_of_a_dim_sharded_over_two_axes_equals_cpu():
    mesh = mesh_of((2, 4))
    check(lambda x: torch.roll(x, 5, 1), [T(3, 16)], [(None, ("data", "model"))], mesh,
          grad=True, fwd=only_permutes, bwd=only_permutes)


def test_roll_of_an_unevenly_sharded_dim_equals_cpu():
    # 10 rows over 4 devices (tiles of 3, padded): the dim is gathered, rolled, and no
    # padding leaks into the result.
    mesh = mesh_of((4, 2))
    check(lambda x: torch.roll(x, 3, 0) * 2, [T(10, 5)], [("data", None)], mesh, grad=True)


def test_roll_without_dims_rolls_the_flattened_tensor_as_on_cpu():
    mesh = mesh_of((4, 2))
    check(lambda x: torch.roll(x, 3), [T(8, 6)], [("data", "model")], mesh, grad=True,
          fallback_ok=True)


@pytest.mark.parametrize("dims", [(0,), (1,), (0, 1)])
def test_flip_of_sharded_dims_is_one_permute_of_a_tile_and_equals_cpu(dims):
    mesh = mesh_of((4, 2))
    r = check(lambda x: torch.flip(x, dims), [T(8, 6)], [("data", "model")], mesh, grad=True,
              fwd=only_permutes, bwd=only_permutes)
    assert sum(c["bytes"] for c in permutes(r.fwd_stats)) == len(dims) * 2 * 3 * 8


def test_shifted_buffer_of_a_pipeline_loop_keeps_the_stage_dim_sharded():
    # The GSPMD shifting buffer: each iteration, every stage runs its layer, the state moves
    # one stage on, and stage 0 takes the next micro-batch. Gradients flow back through it.
    mesh = mesh_of((4, 2), ("stage", "data"))
    stages, micro = 4, 3

    def pipeline(x, w):
        state = torch.zeros(stages, 2, 8, dtype=x.dtype, device=x.device)
        first = (torch.arange(stages, device=x.device) == 0).view(stages, 1, 1)
        outs = []
        for t in range(micro + stages - 1):
            inp = x[t] if t < micro else torch.zeros_like(x[0])
            state = torch.where(first, inp.unsqueeze(0), state)
            state = constrain(torch.tanh(torch.bmm(state, w)), ("stage", "data", None))
            if t >= stages - 1:
                outs.append(state[stages - 1])
            state = torch.roll(state, 1, 0)
        return torch.stack(outs)

    r = check(pipeline, [T(micro, 2, 8), T(stages, 8, 8, seed=2)],
              [None, ("stage", None, None)], mesh, grad=True)
    assert any(c["kind"] == "collective-permute" for c in r.fwd_stats["collectives"])


@pytest.mark.parametrize("fn", [
    lambda x: torch.cat([x[-1:], x[:-1]]),          # shift by 1
    lambda x: torch.cat([x[3:], x[:3]]),            # by -3
    lambda x: torch.cat([x[:, 12:], x[:, :12]], 1),  # by a whole tile on dim 1
], ids=["right_1", "left_3", "tile_dim1"])
def test_a_shift_written_with_slices_and_cat_stays_sharded(fn):
    # torch.cat([x[a:], x[:a]]) is torch.roll(x, -a): the graph simplifier rewrites it, so the
    # sharded dim is never gathered.
    mesh = mesh_of((4, 2))
    check(fn, [T(16, 16)], [("data", "model")], mesh, grad=True, fwd=only_permutes)


def test_slices_and_cat_that_are_not_a_shift_still_equal_cpu():
    mesh = mesh_of((4, 2))
    check(lambda x: torch.cat([x[2:], x[:1]]), [T(16, 6)], [("data", None)], mesh, grad=True)
    check(lambda x: torch.cat([x[4:], x[:4]], 1), [T(8, 6)], [("data", None)], mesh, grad=True)


@pytest.mark.parametrize("fn", [
    lambda x: torch.nn.functional.pad(x[:-1], (0, 0, 1, 0)),           # down by 1, zeros
    lambda x: torch.nn.functional.pad(x[3:], (0, 0, 0, 3), value=-2.0),  # up by 3, fill -2
    lambda x: torch.nn.functional.pad(x[:, :-4], (4, 0)),               # a tile on dim 1
    lambda x: torch.nn.functional.pad(x[1:-1], (0, 0, 1, 1)),           # both ends
], ids=["down_1", "up_3_fill", "tile_dim1", "both_ends"])
def test_a_shift_that_fills_stays_sharded(fn):
    # F.pad(x[a:a + len], ...) as large as x is where(mask, roll(x, p - a), value): the rows
    # that wrap around are never read, even when they hold inf or NaN.
    mesh = mesh_of((4, 2))
    x = T(16, 16)
    x[0, 3] = x[-1, 5] = x[7, -1] = float("inf")
    x[-2, 0] = float("nan")
    check(fn, [x], [("data", "model")], mesh, grad=True, fwd=only_permutes)


def test_a_filled_shift_reads_its_fill_value_at_run_time():
    # The fill value is a run-time scalar: the second step reuses the compiled program with
    # the new value.
    mesh = mesh_of((4, 2))
    for value in (-2.0, 5.5):
        check(lambda x: torch.nn.functional.pad(x[:-2], (0, 0, 2, 0), value=value), [T(16, 6)],
              [("data", None)], mesh, fwd=only_permutes)
