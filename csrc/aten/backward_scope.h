// Module attribution of the backward (torch_spmd.debug.module_scope): an op that autograd
// records while running a backward node takes the scope its forward op was recorded under, with
// " (backward)" appended ("blocks.3.attn.qkv (backward)"; " (backward)" for the outermost
// module and for ops outside any module). No hooks on tensors: autograd numbers the nodes it
// creates per thread (sequence_nr, with the creating thread's id), so each scope change in the
// forward notes the next number, and a node's forward scope is the one noted last before its
// number.
#pragma once
#include <string>

namespace spmd::aten {

// The scope forward ops are recorded under from now on ("" for none), noted for their backward.
void SetForwardScope(const std::string& name);

// Lets the IR tell ops recorded by a backward pass (autograd running a node on the recording
// thread) from forward ops: ir::InBackward. Called by RegisterBackend.
void InstallInBackwardResolver();

// Forgets the forward scopes noted so far (attribution turned off): the backward is then
// recorded under the current scope, as any op.
void ClearForwardScopes();

}  // namespace spmd::aten
