"""The autograd hooks of an FSDP instance (a mixin of ``XlaFullyShardedDataParallel``).

- pre-backward (on the forward's outputs' gradients): gather the full parameters again if they
  were freed after forward, before the instance's backward runs;
- post-backward (on each full parameter's gradient accumulator): free the full parameter,
  reduce-scatter its gradient into the shard's ``.grad``;
- at the end of the whole backward (root, queued on the autograd engine): remove the hooks,
  free what is still gathered and reset every instance's state.

The "optimization barrier" bookkeeping mirrors PyTorch/XLA's; the barrier itself is a no-op
here (``xm.optimization_barrier_``).
"""
import functools
from enum import Enum, auto
from typing import Any, List

import torch
from torch.autograd import Variable
from torch.nn.parameter import Parameter

from ...core import xla_model as xm
from ...utils.checkpoint import chkpt_status
from ._tree import apply_to_tensors


class TrainingState(Enum):
    """Where an FSDP instance is in its forward/backward cycle (checked by the hooks)."""
    IDLE = auto()
    FORWARD = auto()
    BACKWARD_PRE = auto()
    BACKWARD_POST = auto()


class _BackwardHooksMixin:
    """Pre- and post-backward hooks, and the end-of-backward finalization."""

    def _try_adding_to_backward_opt_barrier_lists(self, tensor: torch.Tensor) -> None:
        if id(tensor) not in self._backward_opt_barrier_tensor_ids:
            self._backward_opt_barrier_tensor_ids.add(id(tensor))
            self._backward_opt_barrier_tensors.append(tensor)

    def _clear_backward_opt_barrier_lists(self) -> None:
        self._backward_opt_barrier_tensors.clear()
        self._backward_opt_barrier_tensor_ids.clear()

    def _register_grad_opt_barrier_hooks(self, dependency_tensors: List[torch.Tensor]) -> None:
        if not torch.is_grad_enabled():
            return

        def _grad_opt_barrier_hook(t_grad: torch.Tensor):
            self._try_adding_to_backward_opt_barrier_lists(t_grad)
            self.optimization_barrier_op([t_grad])
            return t_grad

        for t in dependency_tensors:
            if t.requires_grad:
                t.register_hook(_grad_opt_barrier_hook)

    def _register_pre_backward_hooks(self, outputs: Any) -> Any:
        """Hooks on the outputs' gradients: gather the full parameters again (if freed after
        forward) before this module's backward starts."""
        if not torch.is_grad_enabled():
            return outputs
        if self._is_root:
            self._post_backward_callback_queued = False

        def _pre_backward_hook(t_grad: torch.Tensor) -> None:
            if self._is_root:
                self._queue_wait_for_post_backward()
            if self.optimization_barrier_in_backward:
                self._try_adding_to_backward_opt_barrier_lists(t_grad)
            if self.reshard_after_forward and not chkpt_status.in_chkpt_bwd:
                dependency_tensors = []
                if self.optimization_barrier_in_backward:
                    dependency_tensors = self._backward_opt_barrier_tensors
                self._rebuild_full_params(dependency_tensors=dependency_tensors,
                                          apply_opt_barrier=self.optimization_barrier_in_backward)
                self._clear_backward_opt_barrier_lists()
            if not self._pre_backward_hook_has_run:
                self._pre_backward_hook_has_run = True
                self.assert_state([TrainingState.IDLE, TrainingState.BACKWARD_PRE])
                for p, p_shard in zip(self.full_params, self.sharded_params):
                    if p.grad is not None:
                        assert p.grad.device == p_shard.device
                        assert p.grad.size() == p_shard._orig_size
            if self.training_state == TrainingState.IDLE:
                self.training_state = TrainingState.BACKWARD_PRE
            self.assert_state([TrainingState.BACKWARD_PRE, TrainingState.BACKWARD_POST])
            if self.optimization_barrier_in_backward:
                self._try_adding_to_backward_opt_barrier_lists(t_grad)
                self.optimization_barrier_op([t_grad])
            return t_grad

        registered = 0

        def _register_hook(t: torch.Tensor) -> torch.Tensor:
            # An output an inner FSDP already hooked is only hooked again if it is the first.
            nonlocal registered
            if t.requires_grad and (registered == 0 or
                                    id(t) not in self._output_pre_backward_hook_registered):
                t.register_hook(_pre_backward_hook)
                self._output_pre_backward_hook_registered.add(id(t))
                registered += 1
            return t

        return apply_to_tensors(_register_hook, outputs)

    def _register_post_backward_hooks(self) -> None:
        """A hook on each full parameter's gradient accumulator: fires once the parameter's
        gradient is complete, to reduce-scatter it into the shard."""
        if not torch.is_grad_enabled():
            return
        self._post_backward_hooks_to_call = 0
        for p in self.full_params:
            if p.requires_grad:
                if hasattr(p, "_shard_bwd_hook"):
                    continue
                p_tmp = p.expand_as(p)  # a grad_fn whose next function is p's accumulator
                assert p_tmp.grad_fn is not None
                grad_acc = p_tmp.grad_fn.next_functions[0][0]
                handle = grad_acc.register_hook(functools.partial(self._post_backward_hook, p))
                p._shard_bwd_hook = (grad_acc, handle)
                self._post_backward_hooks_to_call += 1

    @torch.no_grad()
    def _post_backward_hook(self, param: Parameter, *unused: Any) -> None:
        """``param.grad`` holds the full local gradient: free the full parameter, then
        reduce-scatter the gradient (divided by the pre/post factors) and accumulate this
        rank's slice into the sharded parameter's ``.grad``."""
        self.assert_state([TrainingState.BACKWARD_PRE, TrainingState.BACKWARD_POST])
        self.training_state = TrainingState.BACKWARD_POST
        self._post_backward_hooks_to_call -= 1
        if param.grad is None:
            if self._post_backward_hooks_to_call == 0:
                self.reduce_scatter_op.flush()
            return
        if param.grad.requires_grad:
            raise RuntimeError("FSDP only works with gradients that don't require gradients")
        grad = param.grad
        if self._require_backward_grad_sync or self.reshard_after_forward:
            # Inside no_sync() the full parameters stay (they do not change before the next
            # forward), unless resharding is asked for anyway.
            self._free_full_params([param], dependency_tensors=[grad],
                                   apply_opt_barrier=self.optimization_barrier_in_backward)
        if not self._require_backward_grad_sync:
            if self._post_backward_hooks_to_call == 0:
                self.reduce_scatter_op.flush()
            return
        predivide = 1.0
        if self.gradient_predivide_factor > 1:
            if grad.dtype == torch.float16 and not self.fp32_reduce_scatter:
                # fp16 sums travel as fp16: divide first, as XLA does, to stay in range.
                grad.div_(self.gradient_predivide_factor)
            else:
                # Folded into the reduce-scatter's scale: the same result (the factor is a
                # power of two and the sum runs in fp32), without a gradient-sized quotient.
                predivide = self.gradient_predivide_factor
        param.grad = None
        grad_flat = self._flatten_and_pad_to_world_size(
            grad, self.world_size * self._shard_size_multiple)
        if self.optimization_barrier_in_backward:
            self.optimization_barrier_op([grad_flat])
        if grad_flat.dtype != torch.float32 and self.fp32_reduce_scatter:
            grad_flat = grad_flat.to(torch.float32)

        def reduce_scatter_done(reduced_grad):
            if reduced_grad.dtype != torch.float32:
                reduced_grad = reduced_grad.to(torch.float32)
            if self.optimization_barrier_in_backward:
                self.optimization_barrier_op([reduced_grad])
            if self.gradient_postdivide_factor > 1:
                reduced_grad.div_(self.gradient_postdivide_factor)
            self._try_adding_to_backward_opt_barrier_lists(reduced_grad)
            p_shard = param._sharded_param
            if p_shard.grad is None:
                p_shard.grad = reduced_grad
            else:
                assert p_shard.grad.shape == reduced_grad.shape
                p_shard.grad += reduced_grad

        # Not grad_flat.detach(): a detached functional *view* (flatten returns one when no
        # padding is needed) becomes a copy (backend.cc), which costs a buffer for nothing.
        # Under no_grad, with a gradient that does not require grad, there is nothing to detach.
        self.reduce_scatter_op(grad_flat, reduce_scatter_done, predivide)
        if self._post_backward_hooks_to_call == 0:
            self.reduce_scatter_op.flush()

    def _queue_wait_for_post_backward(self) -> None:
        """Root only: run ``_wait_for_post_backward`` once the whole backward is done."""
        assert self._is_root
        if not self._post_backward_callback_queued:
            self.assert_state([TrainingState.IDLE])
            self._post_backward_callback_queued = True
            Variable._execution_engine.queue_callback(self._try_wait_for_post_backward)

    def _try_wait_for_post_backward(self) -> None:
        # Exceptions raised in an autograd callback lose their message; print it first.
        try:
            self._wait_for_post_backward()
        except Exception as e:
            print(f"Exception below occurred in post-backward (_debug_msg: {self._debug_msg}). "
                  f"This is often due to some inner FSDP modules not being used "
                  f"in an outer FSDP module's forward pass. Please make sure that all inner "
                  f"FSDP modules participate in the forward pass when using nested FSDP.\n"
                  f"{type(e).__name__}: {e}")
            raise

    @torch.no_grad()
    def _wait_for_post_backward(self) -> None:
        """End of backward (root): remove the hooks, free what is still gathered (frozen
        parameters, modules whose backward did not run), reset every instance's state."""
        assert self._is_root
        if any(p.requires_grad for p in self.full_params):
            self.assert_state(TrainingState.BACKWARD_POST)
        else:
            self.assert_state(TrainingState.BACKWARD_PRE)

        def _finalize_parameters(fsdp_module) -> None:
            frozen_params = []
            for p in fsdp_module.full_params:
                if not p.requires_grad:
                    frozen_params.append(p)
                if hasattr(p, "_shard_bwd_hook"):
                    assert len(p._shard_bwd_hook) == 2, len(p._shard_bwd_hook)
                    p._shard_bwd_hook[1].remove()
                    delattr(p, "_shard_bwd_hook")
            if frozen_params:
                fsdp_module._free_full_params(
                    frozen_params, apply_opt_barrier=self.optimization_barrier_in_backward)

        for m in self.modules():
            if not isinstance(m, _BackwardHooksMixin):
                continue
            _finalize_parameters(m)
            if not m._pre_backward_hook_has_run:
                m.assert_state(TrainingState.IDLE)
                m._free_full_params(m.full_params,
                                    apply_opt_barrier=self.optimization_barrier_in_backward)
            elif any(p.requires_grad for p in m.parameters()):
                if any(p.requires_grad for p in m.full_params):
                    m.assert_state(TrainingState.BACKWARD_POST)
                else:
                    m.assert_state(TrainingState.BACKWARD_PRE)
            else:
                m.assert_state([TrainingState.BACKWARD_PRE, TrainingState.IDLE])
            m.training_state = TrainingState.IDLE
            m._pre_backward_hook_has_run = False
            if m._is_root:
                self._post_backward_callback_queued = False
                self._output_pre_backward_hook_registered.clear()
                if self.optimization_barrier_in_backward:
                    params_with_grad = [p for p in self._all_sharded_params
                                        if p.grad is not None]
                    self.optimization_barrier_op(params_with_grad +
                                                 [p.grad for p in params_with_grad] +
                                                 self._backward_opt_barrier_tensors)
                self._clear_backward_opt_barrier_lists()
        if self.sync_on_finalization:
            if self._debug_print:
                xm.master_print("`xm.mark_step()` called in FSDP _wait_for_post_backward "
                                f"(_debug_msg: {self._debug_msg})", flush=True)
            xm.mark_step()
