// Where in the user's program an op was recorded: the module path it ran under
// ("blocks.3.attn.qkv", "blocks.3.attn.qkv (backward)"), set by torch_spmd.debug's module
// tracker. New nodes take the current scope; the partitioner carries it to every local op and
// collective it emits for a node, so costs and collectives can be attributed to modules.
#pragma once
#include <optional>
#include <string>

namespace spmd::ir {

// Interned: equal scopes are the same pointer; nullptr is "no scope".
using Scope = const std::string*;

Scope InternScope(const std::string& name);  // "" gives nullptr
// The scope new nodes take: the backward resolver's answer while it has one (autograd is
// running a backward node on this thread), else the scope last set.
Scope CurrentScope();
void SetCurrentScope(Scope scope);

// Installed by the ATen layer (aten/backward_scope.h), which knows autograd: the scope of an op
// recorded by the backward node running on the calling thread, nullopt outside backward.
using BackwardScopeResolver = std::optional<Scope> (*)();
void SetBackwardScopeResolver(BackwardScopeResolver resolver);
inline std::string ScopeName(Scope s) { return s ? *s : std::string(); }

// Whether new nodes are recorded by a backward pass (autograd running a node on this thread,
// checkpointed recomputation included), whatever the attribution. Installed by the ATen layer;
// false until then.
using InBackwardResolver = bool (*)();
void SetInBackwardResolver(InBackwardResolver resolver);
bool InBackward();

}  // namespace spmd::ir
