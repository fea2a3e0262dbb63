"""Views on the spmd device describe themselves as a strided device's views would: stride(),
storage_offset() and is_contiguous() equal CPU eager's, along view chains, when the recorder
answers from its layout cache (a training loop records the same views every step), and when the
same view with the same arguments is taken of inputs laid out differently."""
import torch
import torch_spmd
import torch_spmd.core.xla_model as xm

DEV = torch_spmd.device()

VIEWS = {
    "t": lambda x: x.t(),
    "transpose": lambda x: x.transpose(0, 1),
    "select": lambda x: x.select(1, 2),
    "slice": lambda x: x[:, 1:5:2],
    "narrow": lambda x: x.narrow(0, 1, 3),
    "unsqueeze": lambda x: x.unsqueeze(1),
    "expand": lambda x: x[:, :1].expand(-1, 3),
    "diagonal": lambda x: x.diagonal(),
    "unbind": lambda x: x.unbind(1)[3],
    "split": lambda x: x.split(2, dim=1)[1],
}
# Inputs in different layouts: the same view then has different strides and offsets.
BASES = {
    "contiguous": lambda x: x,
    "transposed": lambda x: x.t(),
    "sliced": lambda x: x[1:, 1:],
    "strided": lambda x: x.unsqueeze(0).expand(2, 6, 6)[1],
}


def layout(t):
    return tuple(t.shape), t.stride(), t.storage_offset(), t.is_contiguous()


def test_view_layouts_equal_cpu_eager_for_every_input_layout_and_again_from_the_cache():
    host = torch.arange(36.0).view(6, 6)
    device = host.to(DEV)
    for repeat in range(2):  # the second round is answered from the layout cache
        for base_name, base in BASES.items():
            for view_name, view in VIEWS.items():
                want = view(base(host))
                got = view(base(device))
                assert layout(got) == layout(want), (repeat, base_name, view_name)
                # A view of the view composes the layouts.
                assert layout(got.t() if got.dim() == 2 else got.unsqueeze(0)) == \
                    layout(want.t() if want.dim() == 2 else want.unsqueeze(0))
                torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)
        xm.mark_step()
