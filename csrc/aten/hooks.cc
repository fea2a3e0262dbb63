// The PrivateUse1 hooks torch 2.x asks every out-of-tree backend for (generators, device of a
// pointer, pinned memory, primary context). Without them `tensor.to("spmd")`, `torch.manual_seed`
// and autograd's device checks fail with "Please register PrivateUse1HooksInterface".
//
// Methods are declared without `override`: the interface grew between torch 2.6 and 2.13, and a
// method that a given torch does not declare is then simply unused instead of a compile error.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/CPUAllocator.h>

#include "aten/backend.h"
#include "aten/lazy_tensor.h"

namespace spmd::aten {
namespace {

struct SpmdHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const { return true; }
  bool isAvailable() const { return true; }
  void init() const {}
  void initPrivateUse1() const {}

  // Random ops on the device draw their seeds from the default CPU generator at record time
  // (recorder.cc), so torch.manual_seed makes device randomness reproducible. The device's
  // default generator is therefore that generator.
  const at::Generator& getDefaultGenerator(c10::DeviceIndex) const {
    return at::detail::getDefaultCPUGenerator();
  }
  at::Generator getNewGenerator(c10::DeviceIndex) const {
    return at::detail::createCPUGenerator();
  }

  // Device buffers are not addressable from the host: a pointer never belongs to the device.
  at::Device getDeviceFromPtr(void*) const { return c10::Device(c10::DeviceType::CPU); }
  bool isPinnedPtr(const void*) const { return false; }
  // Host memory is already as close to the emulated devices as it gets.
  at::Allocator* getPinnedMemoryAllocator() const { return c10::GetCPUAllocator(); }
  at::Allocator* getPinnedMemoryAllocator() { return c10::GetCPUAllocator(); }
  bool hasPrimaryContext(c10::DeviceIndex) const { return true; }
  c10::DeviceIndex deviceCount() const { return 1; }
  c10::DeviceIndex getCurrentDevice() const { return 0; }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex) const { return 0; }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex) const { return 0; }
  void resizePrivateUse1Bytes(const c10::Storage&, size_t) const {
    TORCH_CHECK(false, "spmd tensors have no host-visible storage to resize");
  }
};

}  // namespace

void RegisterHooks() {
  static SpmdHooks* hooks = new SpmdHooks();
  if (!at::isPrivateUse1HooksRegistered()) at::RegisterPrivateUse1HooksInterface(hooks);
}

}  // namespace spmd::aten
