"""Every torch attribute torch_spmd replaces, why, where, and for which torch versions.

torch_spmd registers the ``spmd`` device as PyTorch's PrivateUse1 backend and needs no patch for
its ops; what it patches is Python-level behaviour that reads a storage, a device type or a
tensor's class where a storage-less device tensor breaks it. Each entry: the attribute as
``module.path.name``, the module of ours that replaces it (its ``install`` runs when
``torch_spmd`` is imported; ``when`` says where that is otherwise: only on CUDA builds of torch,
at the first ``torch.compile``, or when a torch module it patches is first imported), the reason, and the torch
versions it is needed on (this project supports torch >= 2.6; ``">= 2.6"`` means every one).
``test_torch_patches.py`` checks this table against the assignments in the source, both ways.
"""
from typing import NamedTuple


class Patch(NamedTuple):
    attribute: str
    module: str
    reason: str
    torch: str = ">= 2.6"
    when: str = "import"


PATCHES = (
    Patch("torch.Tensor.__repr__", "_torch_patches.storageless_tensors",
          "torch._tensor_str prints a functional wrapper of a view or an empty tensor as "
          "_to_functional_tensor(...); spmd tensors print their host value like any device "
          "tensor"),
    Patch("torch.Tensor.__reduce_ex__", "_torch_patches.storageless_tensors",
          "pickling (torch.save): the functionalization wrapper has no storage Python may touch; "
          "the host value is pickled, its storage tagged with the spmd location"),
    Patch("torch.Tensor.__deepcopy__", "_torch_patches.storageless_tensors",
          "copy.deepcopy of an spmd tensor: the same reason as pickling"),
    Patch("torch.load", "_torch_patches.storageless_tensors",
          "map_location applies to the spmd-tagged host values that torch.save wrote"),
    Patch("torch.nn.Module._apply", "_torch_patches.storageless_tensors",
          "Module.to('spmd') makes new Parameter objects; weights tied across modules (an "
          "embedding and an LM head) are re-tied, as with .cuda()"),
    Patch("torch.Tensor.data_ptr", "_torch_patches.storageless_tensors",
          "a wrapper's data_ptr() is 0 for every tensor; each spmd storage gets an address of "
          "its own, so code that finds tied tensors by storage (save_pretrained, safetensors) "
          "works"),
    Patch("torch.UntypedStorage.data_ptr", "_torch_patches.storageless_tensors",
          "untyped_storage().data_ptr() raises on a storage-less wrapper: the same address"),
    Patch("torch.autograd.graph.save_on_cpu", "_torch_patches.storageless_tensors",
          "its pack hook reads a saved tensor to the host at once, ending the step's graph; spmd "
          "tensors are marked to be offloaded by the compiler instead (torch_spmd.memory)"),
    Patch("torch.autograd.graph._engine_run_backward", "_torch_patches.autograd_thread",
          "the backward runs on the calling thread, where the recorder's per-thread state "
          "(scopes, the pending graph) lives"),
    Patch("torch.autograd._engine_run_backward", "_torch_patches.autograd_thread",
          "the same: torch.autograd.backward and grad call the name bound in torch.autograd"),
    Patch("torch.autograd.backward", "_torch_patches.cuda_autograd",
          "explains the CUDA build's 'autograd engine has no device for spmd' error (a PyPI CUDA "
          "wheel registers PrivateUse1 differently) in terms of what to do",
          when="import, CUDA builds"),
    Patch("torch.autograd.grad", "_torch_patches.cuda_autograd", "the same, for torch.autograd.grad",
          when="import, CUDA builds"),
    Patch("torch.compile", "_torch_patches.dynamo",
          "registers the spmd backends with dynamo at the first torch.compile"),
    Patch("torch._is_functional_tensor", "_torch_patches.dynamo",
          "while dynamo fakifies an spmd tensor only: meta_utils would describe the "
          "functionalization wrapper as a functional tensor; XLA's tensors are not",
          when="torch.compile"),
    Patch("torch._subclasses.meta_utils.MetaTensorDescriber.describe_tensor", "_torch_patches.dynamo",
          "the same fakification, for spmd tensors only", when="torch.compile"),
    Patch("torch._TorchCompileInductorWrapper.__call__", "_torch_patches.dynamo",
          "inductor on spmd tensors raises a clear error naming the backends that compile them "
          "(openxla, spmd) instead of failing inside inductor"),
    Patch("torch._dynamo.backends.registry._BACKENDS[]", "_torch_patches.dynamo",
          "the 'openxla' (PyTorch/XLA's name, where no real torch_xla is installed) and 'spmd' "
          "backends registered by name", when="torch.compile"),
    Patch("torch._dynamo.backends.registry._COMPILER_FNS[]", "_torch_patches.dynamo",
          "the same registration: the backends' compiler functions", when="torch.compile"),
    Patch("torch.distributed.checkpoint.default_planner.DefaultLoadPlanner.resolve_tensor",
          "_torch_patches.dcp_default_planner",
          "DCP's default load would copy each chunk into a detached view of an spmd tensor, a "
          "value of its own: the chunk is read into a host buffer instead",
          when="import of torch.distributed.checkpoint.default_planner"),
    Patch("torch.distributed.checkpoint.default_planner.DefaultLoadPlanner.commit_tensor",
          "_torch_patches.dcp_default_planner",
          "... and copied into the target's view when the reader commits it, which writes the "
          "base", when="import of torch.distributed.checkpoint.default_planner"),
    Patch("torch._dynamo.variables.optimizer.OptimizerVariable._set_capturable",
          "_torch_patches.dynamo",
          "a compiled optimizer step on spmd parameters runs the capturable algorithm, as dynamo "
          "makes it run on CUDA, so its step counts are spmd tensors and the graph replays",
          when="torch.compile"),
)
