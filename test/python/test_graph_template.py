"""Replay of recorded regions (csrc/aten/graph_template.h), the mechanism behind torch.compile's
replay: a capture around one run of a region gives a template whose instantiation on new inputs
computes what running the region's ops again would, and a run that did more than record (a
sync, an eager fallback, an in-place update of an input, a pending value from outside) is
refused with its reason."""
import numpy as np
import pytest
import torch

import torch_spmd
import torch_spmd.core.xla_model as xm
import torch_spmd.distributed.spmd as xs
from torch_spmd import _C
from conftest import ensure_devices

DEV = torch_spmd.device()


def _capture(region, *inputs):
    capture = _C._TemplateCapture(list(inputs))
    try:
        outputs = region(*inputs)
    except BaseException:
        capture.finish([])
        raise
    tmpl, why_not = capture.finish(list(outputs))
    return tmpl, why_not, outputs


def _region(x, w):
    h = torch.relu(x @ w)
    return h.sum(0), h * 0.5 + torch.arange(4, dtype=torch.float32, device=x.device)


def test_instantiation_computes_what_the_region_computes():
    ensure_devices(8)
    x, w = torch.randn(6, 5), torch.randn(5, 4)
    tmpl, why_not, first = _capture(_region, x.to(DEV), w.to(DEV))
    assert why_not == "" and tmpl.num_nodes == 5  # mm, relu, sum, mul, add (arange is shared)
    for first_out, expected in zip(first, _region(x, w)):
        torch.testing.assert_close(first_out.cpu(), expected)
    for seed in range(3):  # new data, and a pending input (computed before the call)
        g = torch.Generator().manual_seed(seed)
        x2, w2 = torch.randn(6, 5, generator=g), torch.randn(5, 4, generator=g)
        made = tmpl.instantiate([x2.to(DEV) * 1.0, w2.to(DEV)])
        assert [tuple(t.shape) for t in made] == [(4,), (6, 4)]
        for out, expected in zip(made, _region(x2, w2)):
            torch.testing.assert_close(out.cpu(), expected)


def test_instantiation_refuses_inputs_unlike_the_captured_ones():
    ensure_devices(8)
    x, w = torch.randn(6, 5).to(DEV), torch.randn(5, 4).to(DEV)
    tmpl, _, _ = _capture(_region, x, w)
    assert tmpl.instantiate([torch.randn(7, 5).to(DEV), w]) is None  # another shape
    assert tmpl.instantiate([x.double(), w]) is None  # another dtype
    assert tmpl.instantiate([x]) is None  # another count
    same = torch.randn(4, 4).to(DEV)
    square, _, _ = _capture(lambda a, b: (a @ b,), same, torch.randn(4, 4).to(DEV))
    assert square.instantiate([same, same]) is None  # one value where the capture had two
    shared, _, _ = _capture(lambda a, b: (a @ b,), same, same)
    other = torch.randn(4, 4).to(DEV)
    assert shared.instantiate([other, torch.randn(4, 4).to(DEV)]) is None
    torch.testing.assert_close(shared.instantiate([other, other])[0].cpu(),
                               other.cpu() @ other.cpu())


@pytest.mark.parametrize("case", ["sync", "host read", "outside value"])
def test_regions_that_do_more_than_record_are_refused(case):
    ensure_devices(8)
    x = torch.randn(4, 4).to(DEV)
    outside = torch.randn(4, 4).to(DEV) * 2  # a pending value the region is not given

    def region(a):
        b = a + 1
        if case == "sync":
            xm.mark_step()
        elif case == "host read":
            b = b * float(b.sum())
        elif case == "outside value":
            b = b + outside
        return (b,)

    tmpl, why_not, _ = _capture(region, x)
    assert tmpl is None
    expected = {"sync": "on the host", "host read": "on the host",
                "outside value": "from before the call"}
    assert expected[case] in why_not


def test_an_input_written_in_place_is_written_at_each_instantiation():
    """A buffer's update (AOTAutograd keeps it in the graph as copy_ into the input): each
    instantiation writes the new input, and its sharding annotation stays."""
    ensure_devices(8)
    mesh = xs.Mesh(np.arange(8), (8,), ("x",))

    def region(buf, x):
        buf.mul_(0.5).add_(x.sum(0))
        return (x * buf,)

    buf0, x0 = torch.randn(8), torch.randn(4, 8)
    buf = buf0.to(DEV)
    xs.mark_sharding(buf, mesh, ("x",))
    tmpl, why_not, _ = _capture(region, buf, x0.to(DEV))
    assert tmpl is not None, why_not
    host_buf = buf0 * 0.5 + x0.sum(0)
    for seed in range(3):
        fresh = torch.randn(4, 8, generator=torch.Generator().manual_seed(seed))
        (out,) = tmpl.instantiate([buf, fresh.to(DEV)])
        host_buf = host_buf * 0.5 + fresh.sum(0)
        torch.testing.assert_close(out.cpu(), fresh * host_buf)
        torch.testing.assert_close(buf.cpu(), host_buf)
    xm.mark_step()
    assert "devices=[8]" in _C._get_sharding_spec(buf)


def test_random_ops_draw_fresh_seeds_as_recording_would():
    ensure_devices(8)
    x = torch.ones(64).to(DEV)

    def region(a):
        return (torch.nn.functional.dropout(a, 0.5, training=True),)

    torch.manual_seed(0)
    tmpl, _, first = _capture(region, x)
    recorded = [first[0].cpu()] + [region(x)[0].cpu() for _ in range(2)]
    torch.manual_seed(0)
    _capture(region, x)
    replayed = [first[0].cpu()] + [tmpl.instantiate([x])[0].cpu() for _ in range(2)]
    for r, p in zip(recorded, replayed):
        assert torch.equal(r, p)  # the same seeds, drawn in the same order
    assert not torch.equal(replayed[1], replayed[2])  # fresh masks at every instantiation
    assert set(replayed[1].unique().tolist()) == {0.0, 2.0}


def test_an_input_annotated_inside_the_region_is_annotated_at_each_instantiation():
    ensure_devices(8)
    mesh = xs.Mesh(np.arange(8), (8,), ("x",))

    def region(a):
        xs.mark_sharding(a, mesh, ("x", None))
        return (a * 2,)

    tmpl, why_not, _ = _capture(region, torch.randn(16, 4).to(DEV))
    assert tmpl is not None, why_not
    fresh = torch.randn(16, 4)
    out = tmpl.instantiate([fresh.to(DEV)])[0]
    xm.mark_step()
    assert "devices=[8,1]" in _C._get_sharding_spec(out)
    torch.testing.assert_close(out.cpu(), fresh * 2)
