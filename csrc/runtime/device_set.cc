#include "runtime/device_set.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <unordered_set>

#include "core/error.h"
#include "runtime/process_span.h"

namespace spmd::runtime {

namespace {
std::unique_ptr<DeviceSet>& Instance() {
  static std::unique_ptr<DeviceSet>* instance = new std::unique_ptr<DeviceSet>();
  return *instance;
}
std::mutex& InstanceMutex() {
  static std::mutex* mu = new std::mutex();
  return *mu;
}
}  // namespace

Allocation& Allocation::operator=(Allocation&& o) noexcept {
  if (this != &o) {
    Release();
    owner_ = o.owner_;
    device_ = o.device_;
    bytes_ = o.bytes_;
    id_ = o.id_;
    o.owner_ = nullptr;
  }
  return *this;
}

void Allocation::Release() {
  if (owner_) owner_->Free(device_, id_, bytes_);
  owner_ = nullptr;
}

std::string FormatBytes(int64_t bytes) {
  char buf[64];
  double b = static_cast<double>(bytes);
  if (bytes >= (int64_t{1} << 30)) std::snprintf(buf, sizeof(buf), "%.2f GiB", b / (1 << 30));
  else if (bytes >= (1 << 20)) std::snprintf(buf, sizeof(buf), "%.2f MiB", b / (1 << 20));
  else if (bytes >= (1 << 10)) std::snprintf(buf, sizeof(buf), "%.2f KiB", b / (1 << 10));
  else std::snprintf(buf, sizeof(buf), "%lld B", static_cast<long long>(bytes));
  return buf;
}

int64_t DeviceSet::ParseBytes(const std::string& text) {
  size_t pos = 0;
  while (pos < text.size() && (std::isdigit(static_cast<unsigned char>(text[pos])) || text[pos] == '.'))
    ++pos;
  SPMD_CHECK_VALUE(pos > 0, "SPMD_DEVICE_MEMORY: expected a size such as '16GiB' or '512MB', got '",
                   text, "'");
  double value = std::atof(text.substr(0, pos).c_str());
  std::string unit = text.substr(pos);
  unit.erase(std::remove(unit.begin(), unit.end(), ' '), unit.end());
  static const std::pair<const char*, double> kUnits[] = {
      {"", 1},          {"B", 1},         {"KiB", 1024.0},   {"MiB", 1048576.0},
      {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}, {"KB", 1e3}, {"MB", 1e6},
      {"GB", 1e9},      {"TB", 1e12},     {"K", 1024.0},     {"M", 1048576.0},
      {"G", 1073741824.0}};
  for (const auto& [name, scale] : kUnits)
    if (unit == name) return static_cast<int64_t>(value * scale);
  SPMD_CHECK_VALUE(false, "SPMD_DEVICE_MEMORY: unknown unit '", unit, "' in '", text,
                   "' (expected B, KiB, MiB, GiB, TiB, KB, MB, GB or TB)");
  return 0;
}

DeviceSet& DeviceSet::Get() {
  std::lock_guard<std::mutex> lock(InstanceMutex());
  auto& inst = Instance();
  if (!inst) {
    int64_t n = 8;
    if (const char* env = std::getenv("SPMD_NUM_DEVICES")) {
      char* end = nullptr;
      n = std::strtoll(env, &end, 10);
      SPMD_CHECK_VALUE(end && *end == '\0' && n >= 1,
                       "SPMD_NUM_DEVICES must be a positive integer, got '", env, "'");
    }
    int64_t bytes = int64_t{16} << 30;
    if (const char* env = std::getenv("SPMD_DEVICE_MEMORY")) bytes = ParseBytes(env);
    inst.reset(new DeviceSet(n, bytes));
  }
  return *inst;
}

void DeviceSet::Configure(int64_t num_devices, int64_t bytes_per_device) {
  SPMD_CHECK_VALUE(num_devices >= 1, "num_devices must be >= 1, got ", num_devices);
  SPMD_CHECK_VALUE(bytes_per_device >= 1, "bytes per device must be >= 1, got ", bytes_per_device);
  if (auto span = ProcessSpan::Current())
    SPMD_CHECK(num_devices == span->local_devices(), "cannot make the device set ",
               num_devices, " devices: this process owns ", span->local_devices(), " of the ",
               span->global_devices(), " devices of a multi-process SPMD world (",
               span->process_count(), " processes); leave it (shutdown_spmd_processes) first");
  std::lock_guard<std::mutex> lock(InstanceMutex());
  auto& inst = Instance();
  if (inst) {
    const int64_t held = HeldOnHostCount().load();
    SPMD_CHECK(inst->live_allocations() + held == 0, "cannot reconfigure the device set while ",
               inst->live_allocations() + held, " buffers are live on it (", held,
               " of them held on the host until used); configure it before creating spmd "
               "tensors");
  }
  inst.reset(new DeviceSet(num_devices, bytes_per_device));
}

DeviceSet::DeviceSet(int64_t num_devices, int64_t bytes_per_device)
    : num_devices_(num_devices), devices_per_host_(num_devices), bytes_limit_(bytes_per_device) {
  if (const char* env = std::getenv("SPMD_DEVICES_PER_HOST")) {
    char* end = nullptr;
    const int64_t per_host = std::strtoll(env, &end, 10);
    SPMD_CHECK_VALUE(end && *end == '\0' && per_host >= 1,
                     "SPMD_DEVICES_PER_HOST must be a positive integer, got '", env, "'");
    devices_per_host_ = std::min(per_host, num_devices);
  }
  int64_t host_bytes = int64_t{1} << 40;
  if (const char* env = std::getenv("SPMD_HOST_MEMORY")) host_bytes = ParseBytes(env);
  const int64_t hosts = (num_devices + devices_per_host_ - 1) / devices_per_host_;
  devices_.resize(num_devices + hosts);
  for (int64_t i = 0; i < static_cast<int64_t>(devices_.size()); ++i)
    devices_[i].stats.bytes_limit = i < num_devices ? bytes_per_device : host_bytes;
}

Allocation DeviceSet::Allocate(int64_t device, int64_t bytes, const std::string& label) {
  return Allocate(device, bytes, InternLabel(label));
}

Allocation DeviceSet::Allocate(int64_t device, int64_t bytes, const std::string* label) {
  std::lock_guard<std::mutex> lock(mu_);
  return AllocateLocked(device, bytes, label);
}

std::vector<Allocation> DeviceSet::AllocateOnEach(const std::vector<size_t>& devices,
                                                  int64_t bytes, const std::string* label) {
  std::vector<Allocation> out;
  out.reserve(devices.size());
  std::unique_lock<std::mutex> lock(mu_);
  try {
    for (size_t d : devices) out.push_back(AllocateLocked(static_cast<int64_t>(d), bytes, label));
  } catch (...) {
    lock.unlock();  // the allocations made so far release the lock-taking Free on unwind
    throw;
  }
  return out;
}

std::vector<Allocation> DeviceSet::AllocateOnHostsOf(const std::vector<size_t>& devices,
                                                     int64_t bytes, const std::string* label) {
  std::vector<Allocation> out;
  out.reserve(devices.size());
  std::unique_lock<std::mutex> lock(mu_);
  try {
    for (size_t d : devices)
      out.push_back(AllocateLocked(num_devices_ + HostOf(static_cast<int64_t>(d)), bytes, label));
  } catch (...) {
    lock.unlock();
    throw;
  }
  return out;
}

DeviceStats DeviceSet::HostStats(int64_t host) const {
  std::lock_guard<std::mutex> lock(mu_);
  SPMD_CHECK_VALUE(host >= 0 && host < num_hosts(), "host index ", host,
                   " out of range: the spmd devices have ", num_hosts(), " hosts");
  return devices_[num_devices_ + host].stats;
}

Allocation DeviceSet::AllocateLocked(int64_t device, int64_t bytes, const std::string* label) {
  SPMD_CHECK(device >= 0 && device < static_cast<int64_t>(devices_.size()), "device index ",
             device, " out of range for ", num_devices(), " devices");
  Device& d = devices_[device];
  if (d.stats.bytes_used + bytes > d.stats.bytes_limit && device >= num_devices_) {
    const int64_t host = device - num_devices_;
    throw OutOfMemoryError(StrCat(
        "Out of host memory on the host of spmd devices ", host * devices_per_host_, "..",
        std::min(num_devices_, (host + 1) * devices_per_host_) - 1, ": offloading ", bytes,
        " bytes (", FormatBytes(bytes), ") of ", *label, " needs ", d.stats.bytes_used + bytes,
        " bytes but the host has ", d.stats.bytes_limit, " bytes (",
        FormatBytes(d.stats.bytes_limit), "). Raise SPMD_HOST_MEMORY or offload less."));
  }
  if (d.stats.bytes_used + bytes > d.stats.bytes_limit) {
    std::vector<std::pair<int64_t, std::string>> live;
    for (const auto& [b, l] : d.slots)
      if (l) live.emplace_back(b, *l);
    std::sort(live.begin(), live.end(),
              [](const auto& a, const auto& b) { return a.first > b.first; });
    std::string largest;
    for (size_t i = 0; i < live.size() && i < 5; ++i)
      largest += StrCat("\n  ", FormatBytes(live[i].first), "  ", live[i].second);
    throw OutOfMemoryError(StrCat(
        "Out of memory on spmd device ", device, ": allocating ", bytes, " bytes (",
        FormatBytes(bytes), ") for ", *label, " needs ", d.stats.bytes_used + bytes,
        " bytes but the device capacity is ", d.stats.bytes_limit, " bytes (",
        FormatBytes(d.stats.bytes_limit), "); ", d.stats.bytes_used, " bytes are in use by ",
        d.stats.num_buffers, " buffers. Largest live buffers:", largest.empty() ? " none" : largest,
        "\nRaise SPMD_DEVICE_MEMORY or shard the large tensors over more devices."));
  }
  Allocation a;
  a.owner_ = this;
  a.device_ = device;
  a.bytes_ = bytes;
  if (d.free_slots.empty()) {
    a.id_ = d.slots.size();
    d.slots.emplace_back(bytes, label);
  } else {
    a.id_ = d.free_slots.back();
    d.free_slots.pop_back();
    d.slots[a.id_] = {bytes, label};
  }
  d.stats.bytes_used += bytes;
  d.stats.num_buffers += 1;
  d.stats.peak_bytes_used = std::max(d.stats.peak_bytes_used, d.stats.bytes_used);
  return a;
}

void DeviceSet::Free(int64_t device, uint64_t slot, int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  Device& d = devices_[device];
  d.stats.bytes_used -= bytes;
  d.stats.num_buffers -= 1;
  d.slots[slot] = {0, nullptr};
  d.free_slots.push_back(slot);
}

const std::string* InternLabel(const std::string& label) {
  static std::mutex mu;
  static auto* labels = new std::unordered_set<std::string>();
  std::lock_guard<std::mutex> lock(mu);
  return &*labels->insert(label).first;
}

void DeviceSet::ReleaseAll(const std::vector<Allocation*>& allocs) {
  DeviceSet* owner = nullptr;
  for (Allocation* a : allocs)
    if (a->owner_) owner = a->owner_;
  if (!owner) return;
  std::lock_guard<std::mutex> lock(owner->mu_);
  for (Allocation* a : allocs) {
    if (!a->owner_) continue;
    Device& d = owner->devices_[a->device_];
    d.stats.bytes_used -= a->bytes_;
    d.stats.num_buffers -= 1;
    d.slots[a->id_] = {0, nullptr};
    d.free_slots.push_back(a->id_);
    a->owner_ = nullptr;
  }
}

DeviceStats DeviceSet::Stats(int64_t device) const {
  std::lock_guard<std::mutex> lock(mu_);
  SPMD_CHECK_VALUE(device >= 0 && device < num_devices(), "device index ", device,
                   " out of range: there are ", num_devices(), " spmd devices");
  return devices_[device].stats;
}

void DeviceSet::ResetAllPeaks() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& d : devices_) d.stats.peak_bytes_used = d.stats.bytes_used;
}

std::atomic<int64_t>& DeviceSet::HeldOnHostCount() {
  static std::atomic<int64_t> count{0};
  return count;
}

int64_t DeviceSet::live_allocations() const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t n = 0;
  for (const auto& d : devices_) n += d.stats.num_buffers;
  return n;
}

}  // namespace spmd::runtime
