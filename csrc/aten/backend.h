// Registration of the spmd device with the PyTorch dispatcher.
#pragma once

namespace spmd::aten {

// Routes every ATen op that would reach the spmd device through a CompositeExplicitAutograd
// decomposition to the recorder instead, so the IR sees `add`, `mm`, `transpose_copy` rather
// than `empty` + `add.out`, `as_strided`, ... Idempotent; called when torch_spmd is imported.
void RegisterBackend();

// Registers the PrivateUse1 hooks torch 2.x requires (hooks.cc). Called by RegisterBackend.
void RegisterHooks();

// Registers torch's CUDA autocast policy for the spmd device, so torch.autocast("spmd") works
// (autocast.cc). Called by RegisterBackend.
void RegisterAutocast();

// Gives spmd:0 its autograd worker queue even when a backward ran before torch_spmd was
// imported (autograd_queue.cc). Called by RegisterBackend.
void EnsureAutogradDeviceQueue();

// Records torch.matmul of same-batch >= 3-D operands as one node (matmul_autograd.cc).
void RegisterBatchedMatmul();

// Lets scaled_dot_product_attention on the device take torch's fused CPU kernel wherever CPU
// eager does (attention.cc). Called by RegisterBackend.
void RegisterFusedAttention();

// Lets histc count integer tensors, as CUDA's does (integer_histc.cc). Called by
// RegisterBackend.
void RegisterIntegerHistc();

// Gives torch.library custom ops with a composite kernel (Python functions of ATen ops) a
// device kernel that runs them with functionalization on (custom_ops.cc); registered once,
// and for ops registered later before the next op is recorded (RegisterPendingCustomOps).
void RegisterCustomOpListener();
void RegisterPendingCustomOps();

// Number of ops captured that way (for diagnostics).
int NumCapturedOps();

}  // namespace spmd::aten
