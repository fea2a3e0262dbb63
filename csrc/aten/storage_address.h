// Storage identity for spmd tensors. Their storage (functionalization's FunctionalStorageImpl)
// has no data pointer, so `untyped_storage().data_ptr()` raises and `data_ptr()` is 0 for
// every tensor; code that finds shared or tied tensors by storage (Hugging Face's
// save_pretrained, safetensors) then fails or merges unrelated tensors. We give each storage,
// on first ask, an address of its own: non-zero, distinct from every other storage's range,
// never reused, and shared by the views and tied weights that share the storage. It names
// the storage only: nothing is ever read or written through it (the values live on the
// emulated devices, reached through the IR).
#pragma once
#include <c10/core/StorageImpl.h>

#include <cstdint>

namespace spmd::aten {

// The storage's address, assigning one if it has none. Storages that have a data pointer
// (any real one) keep theirs.
uintptr_t StorageAddress(c10::StorageImpl* storage);

}  // namespace spmd::aten
