#include "runtime/process_span.h"

#include <ATen/ATen.h>

#include <atomic>
#include <mutex>

#include "core/error.h"
#include "core/metrics.h"
#include "runtime/device_set.h"

namespace spmd::runtime {

namespace {
std::mutex& SpanMutex() {
  static std::mutex mu;
  return mu;
}
std::shared_ptr<ProcessSpan>& Installed() {
  static std::shared_ptr<ProcessSpan> span;
  return span;
}
// Whether a span is installed, read without the lock: Current() runs for every spmd op of
// every step, and one process (no span) is the common case.
std::atomic<bool> g_installed{false};
}  // namespace

ProcessSpan::ProcessSpan(int64_t process_index, int64_t process_count, int64_t local_devices)
    : process_index_(process_index), process_count_(process_count), local_devices_(local_devices) {
  SPMD_CHECK_VALUE(process_count >= 1 && process_index >= 0 && process_index < process_count,
                   "process index ", process_index, " is not in [0, ", process_count, ")");
  SPMD_CHECK_VALUE(local_devices >= 1, "each process needs at least one device, got ",
                   local_devices);
}

void ProcessSpan::NoteSent(int64_t bytes) {
  Metrics::Get().Record("CrossProcessBytes", static_cast<double>(bytes));
}

namespace {

// Several tensors' bytes in one uint8 tensor, and back (shapes and dtypes from `likes`).
at::Tensor Pack(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> bytes;
  for (const at::Tensor& t : tensors) bytes.push_back(t.contiguous().view({-1}).view(at::kByte));
  return at::cat(bytes);
}

int64_t ByteSize(const at::Tensor& t) {
  return t.numel() * static_cast<int64_t>(t.element_size());
}

std::vector<at::Tensor> Unpack(const at::Tensor& bytes, const std::vector<at::Tensor>& likes) {
  std::vector<at::Tensor> out;
  int64_t offset = 0;
  for (const at::Tensor& like : likes) {
    const int64_t length = ByteSize(like);
    out.push_back(bytes.narrow(0, offset, length).clone().view(like.scalar_type())
                      .reshape(like.sizes()));
    offset += length;
  }
  return out;
}

at::Tensor EmptyBytesFor(const std::vector<at::Tensor>& likes) {
  int64_t total = 0;
  for (const at::Tensor& like : likes) total += ByteSize(like);
  return at::empty({total}, at::kByte);
}

}  // namespace

std::vector<at::Tensor> ProcessSpan::AllGatherMany(const std::vector<at::Tensor>& locals,
                                                   const char* what) {
  if (locals.size() == 1) return {AllGather(locals[0], what)};
  at::Tensor all = AllGather(Pack(locals).unsqueeze(0), what);  // [P, total bytes]
  std::vector<at::Tensor> out;
  int64_t offset = 0;
  for (const at::Tensor& local : locals) {
    const int64_t length = ByteSize(local);
    std::vector<int64_t> shape = local.sizes().vec();
    shape[0] *= process_count_;
    out.push_back(all.narrow(1, offset, length).contiguous().view(local.scalar_type())
                      .reshape(shape));
    offset += length;
  }
  return out;
}

void ProcessSpan::SendMany(const std::vector<at::Tensor>& tensors, int64_t to, const char* what) {
  at::Tensor bytes = Pack(tensors);
  SendBytes(bytes, to, what);
  NoteSent(bytes.numel());
}

std::vector<at::Tensor> ProcessSpan::RecvMany(const std::vector<at::Tensor>& likes, int64_t from,
                                              const char* what) {
  at::Tensor bytes = EmptyBytesFor(likes);
  RecvBytes(bytes, from, what);
  return Unpack(bytes, likes);
}

std::vector<at::Tensor> ProcessSpan::BroadcastMany(const std::vector<at::Tensor>& tensors,
                                                   int64_t root, const char* what) {
  at::Tensor bytes = process_index_ == root ? Pack(tensors) : EmptyBytesFor(tensors);
  BroadcastBytes(bytes, root, what);
  if (process_index_ == root) {
    NoteSent(bytes.numel() * (process_count_ - 1));
    return tensors;
  }
  return Unpack(bytes, tensors);
}

std::shared_ptr<ProcessSpan> ProcessSpan::Current() {
  if (!g_installed.load(std::memory_order_acquire)) return nullptr;
  std::lock_guard<std::mutex> lock(SpanMutex());
  return Installed();
}

void ProcessSpan::Set(std::shared_ptr<ProcessSpan> span) {
  if (span)
    SPMD_CHECK_VALUE(DeviceSet::Get().num_devices() == span->local_devices(),
                     "the device set has ", DeviceSet::Get().num_devices(),
                     " devices but the process span gives this process ",
                     span->local_devices());
  std::lock_guard<std::mutex> lock(SpanMutex());
  g_installed.store(span != nullptr, std::memory_order_release);
  Installed() = std::move(span);
}

int64_t GlobalDeviceCount() {
  auto span = ProcessSpan::Current();
  return span ? span->global_devices() : DeviceSet::Get().num_devices();
}

int64_t FirstLocalDevice() {
  auto span = ProcessSpan::Current();
  return span ? span->first_device() : 0;
}

bool GroupsSpanProcesses(const std::vector<std::vector<int64_t>>& groups) {
  auto span = ProcessSpan::Current();
  if (!span || span->process_count() == 1) return false;
  for (const auto& g : groups)
    for (int64_t d : g)
      if (span->ProcessOf(d) != span->ProcessOf(g[0])) return true;
  return false;
}

void CheckSameProgramEverywhere(uint64_t key, const std::string& what) {
  auto span = ProcessSpan::Current();
  if (!span || span->process_count() == 1) return;
  at::Tensor mine = at::tensor({static_cast<int64_t>(key)}, at::kLong);
  at::Tensor all = span->AllGather(mine, "the program check");
  const int64_t* keys = all.data_ptr<int64_t>();
  std::vector<int64_t> differing;
  for (int64_t p = 0; p < span->process_count(); ++p)
    if (keys[p] != keys[0]) differing.push_back(p);
  SPMD_CHECK(differing.empty(), "multi-process SPMD: process ", span->process_index(), " of ",
             span->process_count(), " runs ", what, " ", static_cast<int64_t>(key),
             " but process(es) ", c10::IntArrayRef(differing), " run a different one than ",
             "process 0 (", keys[0], "): every process must record the same ops in the same ",
             "order (a script that branches on process_index() diverges here)");
}

}  // namespace spmd::runtime
