// The emulated device set: N devices, each with its own memory accounting and capacity. Data is
// physically held in host memory (a replicated value may share one host buffer between
// devices), but every device accounts for the bytes it logically holds, exactly as a real pod's
// HBM would, and refuses an allocation that would exceed its capacity.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace spmd::runtime {

struct DeviceStats {
  int64_t bytes_used = 0;
  int64_t peak_bytes_used = 0;
  int64_t bytes_limit = 0;
  int64_t num_buffers = 0;
};

class DeviceSet;

// One device's claim on `bytes` of its memory; released on destruction.
class Allocation {
 public:
  Allocation() = default;
  Allocation(const Allocation&) = delete;
  Allocation& operator=(const Allocation&) = delete;
  Allocation(Allocation&& o) noexcept { *this = std::move(o); }
  Allocation& operator=(Allocation&& o) noexcept;
  ~Allocation() { Release(); }

  int64_t device() const { return device_; }
  bool active() const { return owner_ != nullptr; }  // still counted on its device
  int64_t bytes() const { return bytes_; }
  void Release();

 private:
  friend class DeviceSet;
  DeviceSet* owner_ = nullptr;
  int64_t device_ = -1;
  int64_t bytes_ = 0;
  uint64_t id_ = 0;
};

class DeviceSet {
 public:
  // The process-wide device set, created on first use from SPMD_NUM_DEVICES (default 8) and
  // SPMD_DEVICE_MEMORY (default "16GiB"; accepts B, KiB, MiB, GiB, TiB, KB, MB, GB, TB).
  static DeviceSet& Get();
  // Replaces the configuration; only allowed while no buffer is live and no tensor is held on
  // the host for the devices (HeldOnHostCount).
  static void Configure(int64_t num_devices, int64_t bytes_per_device);
  // Tensors moved to the device but held on the host until used (DeviceData::HeldOnHost):
  // live spmd tensors as much as buffers are, so they keep the configuration too.
  static std::atomic<int64_t>& HeldOnHostCount();
  // Parses "16GiB", "512MB", "1024" (bytes). Throws std::invalid_argument on bad text.
  static int64_t ParseBytes(const std::string& text);

  int64_t num_devices() const { return num_devices_; }
  int64_t bytes_limit() const { return bytes_limit_; }
  // The hosts the devices are attached to, `devices_per_host` consecutive devices each
  // (SPMD_DEVICES_PER_HOST; default: one host for all), each with SPMD_HOST_MEMORY bytes of
  // memory (default 1TiB) that values offloaded from its devices' memory take
  // (torch_spmd.memory.offload).
  int64_t num_hosts() const { return static_cast<int64_t>(devices_.size()) - num_devices_; }
  int64_t HostOf(int64_t device) const { return device / devices_per_host_; }
  // Claims `bytes` of device `device`'s host memory, for each of `devices` under one lock.
  std::vector<Allocation> AllocateOnHostsOf(const std::vector<size_t>& devices, int64_t bytes,
                                            const std::string* interned_label);
  DeviceStats HostStats(int64_t host) const;

  // Claims `bytes` on `device`. Throws spmd::OutOfMemoryError naming the device, the bytes
  // needed, the capacity and the largest live buffers when it does not fit.
  Allocation Allocate(int64_t device, int64_t bytes, const std::string& label);
  // Same, with a label already interned by InternLabel (no string work: the executor's path).
  Allocation Allocate(int64_t device, int64_t bytes, const std::string* interned_label);
  // Claims `bytes` on each of `devices` under one lock (a replicated result's buffers).
  std::vector<Allocation> AllocateOnEach(const std::vector<size_t>& devices, int64_t bytes,
                                         const std::string* interned_label);
  // Releases every allocation in `allocs` (all of this device set) under one lock.
  static void ReleaseAll(const std::vector<Allocation*>& allocs);
  DeviceStats Stats(int64_t device) const;
  void ResetAllPeaks();  // every device's peak := its current use
  int64_t live_allocations() const;

 private:
  friend class Allocation;
  DeviceSet(int64_t num_devices, int64_t bytes_per_device);
  void Free(int64_t device, uint64_t slot, int64_t bytes);
  Allocation AllocateLocked(int64_t device, int64_t bytes, const std::string* label);

  // Live buffers per device, for the out-of-memory report: a slot table with a free list, so
  // allocating and freeing (once per buffer per device on every step) never allocates memory.
  struct Device {
    DeviceStats stats;
    std::vector<std::pair<int64_t, const std::string*>> slots;  // (bytes, interned label)
    std::vector<uint64_t> free_slots;
  };
  mutable std::mutex mu_;
  std::vector<Device> devices_;  // the devices, then their hosts
  int64_t num_devices_;
  int64_t devices_per_host_;
  int64_t bytes_limit_;
};

// Labels are interned for the life of the process (there are few distinct ones).
const std::string* InternLabel(const std::string& label);

std::string FormatBytes(int64_t bytes);  // "1.50 MiB"

}  // namespace spmd::runtime
