// Registration of the spmd device with the PyTorch dispatcher.
#pragma once

namespace spmd::aten {

// Routes every ATen op that would reach the spmd device through a CompositeExplicitAutograd
// decomposition to the recorder instead, so the IR sees `add`, `mm`, `transpose_copy` rather
// than `empty` + `add.out`, `as_strided`, ... Idempotent; called when torch_spmd is imported.
void RegisterBackend();

// Number of ops captured that way (for diagnostics).
int NumCapturedOps();

// Drains torch 1.13's functionalization update queue right after every in-place / out= op, as
// torch >= 2.0 does, so superseded values of tensors updated in place are released
// (inplace_updates.cc). Called by RegisterBackend.
void RegisterInplaceUpdateFolding();

}  // namespace spmd::aten
