#include "aten/storage_address.h"

#include <c10/core/Device.h>

#include <algorithm>
#include <mutex>

namespace spmd::aten {

namespace {

// Addresses are handed out upwards from here, far above where the host maps memory, each
// storage's range rounded up to a page and followed by a guard page (so a storage that grows a
// little still does not reach the next one).
constexpr uintptr_t kFirstAddress = uintptr_t{1} << 56;
constexpr uintptr_t kPage = 4096;

}  // namespace

uintptr_t StorageAddress(c10::StorageImpl* storage) {
  static std::mutex mu;
  static uintptr_t next = kFirstAddress;
  std::lock_guard<std::mutex> lock(mu);
  if (const void* data = storage->data_ptr().get()) return reinterpret_cast<uintptr_t>(data);
  const uintptr_t address = next;
  const uintptr_t bytes = static_cast<uintptr_t>(std::max<int64_t>(storage->nbytes(), 1));
  next += (bytes + kPage - 1) / kPage * kPage + kPage;
  // No deleter: there is nothing to free.
  storage->set_data_ptr_noswap(
      c10::DataPtr(reinterpret_cast<void*>(address), storage->device()));
  return address;
}

}  // namespace spmd::aten
