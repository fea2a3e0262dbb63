#include "runtime/device_data.h"

#include <ATen/ATen.h>

#include <chrono>
#include <map>

#include "core/error.h"
#include "core/metrics.h"
#include "runtime/plan_mode.h"
#include "runtime/process_span.h"

namespace spmd::runtime {

c10::ScalarType ToScalarType(DType dtype) { return static_cast<c10::ScalarType>(dtype); }
DType FromScalarType(c10::ScalarType type) { return static_cast<DType>(type); }

TensorType TypeOf(const at::Tensor& t) {
  return TensorType{FromScalarType(t.scalar_type()), Shape(t.sizes().begin(), t.sizes().end())};
}

BufferPtr MakeBuffer(int64_t device, at::Tensor tensor, const std::string& label) {
  return MakeBuffer(device, std::move(tensor), InternLabel(label));
}

BufferPtr MakeBuffer(int64_t device, at::Tensor tensor, const std::string* label) {
  auto buf = std::make_shared<DeviceBuffer>();
  int64_t bytes = tensor.numel() * static_cast<int64_t>(tensor.element_size());
  buf->alloc = DeviceSet::Get().Allocate(device, bytes, label);
  buf->tensor = std::move(tensor);
  return buf;
}

std::vector<BufferPtr> MakeReplicatedBuffers(const at::Tensor& tensor, const std::string& label) {
  int64_t n = DeviceSet::Get().num_devices();
  std::vector<BufferPtr> out;
  out.reserve(n);
  for (int64_t d = 0; d < n; ++d) out.push_back(MakeBuffer(d, tensor, label));
  return out;
}

DeviceData::DeviceData(TensorType type, Sharding sharding, std::vector<BufferPtr> shards,
                       Stacked stacked)
    : type_(std::move(type)),
      sharding_(std::move(sharding)),
      shards_(std::move(shards)),
      stacked_(std::move(stacked)) {}

DeviceData::~DeviceData() {
  if (held_on_host()) DeviceSet::HeldOnHostCount().fetch_sub(1);
}

const Stacked& DeviceData::stacked() const {
  if (planned_) throw PlannedDataError("read its shards");
  Upload();
  std::call_once(stack_once_, [this] {
    if (!stacked_.defined()) stacked_ = StackOf(shards_);
  });
  return stacked_;
}

std::shared_ptr<DeviceData> DeviceData::Planned(TensorType type, Sharding sharding,
                                                at::Tensor known) {
  auto data = std::make_shared<DeviceData>(std::move(type), std::move(sharding),
                                           std::vector<BufferPtr>{});
  data->planned_ = true;
  data->known_ = std::move(known);
  return data;
}

bool DeviceData::KeepsKnownValue(const TensorType& type) {
  switch (type.dtype) {
    case DType::kBool: case DType::kUInt8: case DType::kInt8: case DType::kInt16:
    case DType::kInt32: case DType::kInt64:
      return type.bytes() <= kKnownValueBytes;
    default:
      return false;
  }
}

std::shared_ptr<DeviceData> DeviceData::Materialized() const {
  // (Immutable: sharing it without const is safe.)
  if (!planned_) return std::const_pointer_cast<DeviceData>(shared_from_this());
  if (!known_.defined()) throw PlannedDataError("run a step that reads it");
  PlanningPaused real;  // FromHost makes real data
  return FromHost(known_, sharding_);
}

const at::Tensor& DeviceData::shard(int64_t device) const {
  if (planned_) throw PlannedDataError("read a device's shard");
  Upload();
  return shards_.at(device)->tensor;
}

int64_t DeviceData::BytesPerDevice() const {
  if (!sharding_.valid()) return type_.bytes();
  return TensorType{type_.dtype, sharding_.ShardShape(type_.shape)}.bytes();
}

void ExtractShardInto(const at::Tensor& global, const Sharding& sharding, int64_t device,
                      at::Tensor out) {
  Shape global_shape(global.sizes().begin(), global.sizes().end());
  at::Tensor piece = global;
  bool padded = false;
  for (int64_t d = 0; d < sharding.rank(); ++d) {
    if (sharding.NumTiles(d) == 1) continue;
    int64_t off = sharding.ShardOffset(global_shape, d, device);
    int64_t len = sharding.ShardLength(global_shape, d, device);
    piece = piece.narrow(d, off, len);
    padded |= len != out.size(d);
  }
  if (padded) {
    out.zero_();
    for (int64_t d = 0; d < sharding.rank(); ++d) out = out.narrow(d, 0, piece.size(d));
  }
  out.copy_(piece);
}

namespace {
// Set while Relayout moves data between devices through the host: that round trip emulates a
// move on the devices, not a transfer from or to the host, so the transfer metrics
// (OutboundData, InboundData) leave it out.
thread_local bool t_relaying = false;

// A transfer to the devices, recorded when done: its bytes (PyTorch/XLA's OutboundData, once
// per transfer) and the time laying it out took (TransferToDeviceTime). Relayouts are moves on
// the devices, not transfers.
class TransferToDevice {
 public:
  void Done(const TensorType& type) const {
    if (t_relaying) return;
    Metrics& m = Metrics::Get();
    m.Record("OutboundData", static_cast<double>(type.bytes()));
    m.Record("TransferToDeviceTime",
             std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
  }

 private:
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

// A private copy of the caller's host tensor (contiguous), which the caller may mutate later.
at::Tensor OwnedCopy(const at::Tensor& host) {
  at::Tensor global = host.contiguous();
  return global.is_same(host) ? global.clone() : global;
}
}  // namespace

std::shared_ptr<DeviceData> DeviceData::HeldOnHost(const at::Tensor& host) {
  if (Planning()) return FromHost(host, Sharding());
  Count("VirtualDeviceUsage");  // (PyTorch/XLA's counter of the same meaning)
  auto data = std::make_shared<DeviceData>(TypeOf(host), Sharding(), std::vector<BufferPtr>{});
  data->held_ = OwnedCopy(host);
  DeviceSet::HeldOnHostCount().fetch_add(1);
  return data;
}

void DeviceData::Upload() const {
  if (!held_.defined() || uploaded_.load(std::memory_order_acquire)) return;
  std::call_once(upload_once_, [this] {
    TransferToDevice transfer;
    shards_ = MakeReplicatedBuffers(held_, "tensor " + type_.ToString());
    uploaded_.store(true, std::memory_order_release);
    DeviceSet::HeldOnHostCount().fetch_sub(1);
    transfer.Done(type_);
  });
}

std::shared_ptr<DeviceData> DeviceData::FromHost(const at::Tensor& host,
                                                 const Sharding& sharding) {
  TensorType type = TypeOf(host);
  if (Planning())  // the values are never read, but for ids and masks (KeepsKnownValue)
    return Planned(type, sharding, KeepsKnownValue(type) ? host.contiguous().clone() : at::Tensor());
  TransferToDevice transfer;
  std::string label = "tensor " + type.ToString();
  if (!sharding.valid() || sharding.IsReplicated()) {
    auto data = std::make_shared<DeviceData>(type, sharding,
                                             MakeReplicatedBuffers(OwnedCopy(host), label));
    transfer.Done(type);
    return data;
  }
  at::Tensor global = host.contiguous();
  int64_t n = DeviceSet::Get().num_devices();
  const int64_t global_count = GlobalDeviceCount(), first = FirstLocalDevice();
  SPMD_CHECK(sharding.mesh().size() == global_count, "sharding mesh has ",
             sharding.mesh().size(), " devices but the device set has ", global_count);
  // Replicas of a tile share one row of the stack: key each device by its tile coordinates.
  // (With several processes, each lays out the same global value and keeps its own devices'.)
  std::vector<int64_t> keys;
  keys.reserve(n * (sharding.rank() + 1));
  for (int64_t dev = 0; dev < n; ++dev) {
    keys.push_back(0);  // a key of width >= 1 also for rank 0
    for (int64_t d = 0; d < sharding.rank(); ++d)
      keys.push_back(sharding.TileIndex(d, first + dev));
  }
  std::vector<int64_t> first_device;
  RowMapPtr map = MapOfKeys(keys, sharding.rank() + 1, &first_device);
  Shape shard_shape = sharding.ShardShape(type.shape);
  Shape rows_shape{map->rows};
  rows_shape.insert(rows_shape.end(), shard_shape.begin(), shard_shape.end());
  // A fresh tensor: never an alias of the caller's, whose later writes must not show here.
  at::Tensor rows = at::empty(rows_shape, global.options());
  for (int64_t r = 0; r < map->rows; ++r)
    ExtractShardInto(global, sharding, first + first_device[r], rows[r]);
  Stacked stacked{rows, std::move(map)};
  PerDevice shards = BuffersOf(stacked, InternLabel(label + " shard"));
  auto data = std::make_shared<DeviceData>(type, sharding, std::move(shards), std::move(stacked));
  transfer.Done(type);
  return data;
}

at::Tensor DeviceData::ToHost() const {
  if (planned_ && known_.defined()) return known_;
  if (planned_) throw PlannedDataError("read its values");
  if (held_on_host()) return held_;  // no transfer: it never left the host
  if (!t_relaying) Metrics::Get().Record("InboundData", static_cast<double>(type_.bytes()));
  if (is_replicated()) return shards_.at(0)->tensor;
  SPMD_CHECK(!sharding_.is_manual(), "cannot read a manually sharded value back to the host");
  const Shape& global_shape = type_.shape;
  // Every global device's shard: with several processes, gathered from all of them (every
  // process reads the value: a sync is collective, as on a multi-host pod).
  std::vector<at::Tensor> shard_of;
  if (auto span = ProcessSpan::Current(); span && span->process_count() > 1) {
    std::vector<at::Tensor> mine;
    for (const BufferPtr& b : shards_) mine.push_back(b->tensor);
    at::Tensor all = span->AllGather(at::stack(mine), "reading a sharded value");
    for (int64_t g = 0; g < all.size(0); ++g) shard_of.push_back(all[g]);
  } else {
    for (const BufferPtr& b : shards_) shard_of.push_back(b->tensor);
  }
  at::Tensor out = at::zeros(global_shape, shard_of.at(0).options());
  // One device per distinct tile (and, for partial sums, every device of a reduction group).
  std::map<std::vector<int64_t>, std::vector<int64_t>> devices_of_tile;
  for (int64_t dev = 0; dev < static_cast<int64_t>(shard_of.size()); ++dev) {
    std::vector<int64_t> tile;
    for (int64_t d = 0; d < sharding_.rank(); ++d) tile.push_back(sharding_.TileIndex(d, dev));
    devices_of_tile[tile].push_back(dev);
  }
  for (const auto& [tile, devs] : devices_of_tile) {
    at::Tensor dst = out;
    std::vector<int64_t> lengths;
    for (int64_t d = 0; d < sharding_.rank(); ++d) {
      int64_t off = sharding_.ShardOffset(global_shape, d, devs[0]);
      int64_t len = sharding_.ShardLength(global_shape, d, devs[0]);
      dst = dst.narrow(d, off, len);
      lengths.push_back(len);
    }
    auto unpadded = [&](int64_t dev) {
      at::Tensor s = shard_of[dev];
      for (int64_t d = 0; d < sharding_.rank(); ++d) s = s.narrow(d, 0, lengths[d]);
      return s;
    };
    if (!sharding_.IsPartial()) {
      dst.copy_(unpadded(devs[0]));
      continue;
    }
    // Partial: the value is the reduction over the partial axes. Devices sharing a tile also
    // differ along replicated axes; reduce over one representative per partial-group member.
    std::vector<std::vector<int64_t>> groups = DeviceGroups(sharding_.mesh(), sharding_.partial_axes());
    std::vector<int64_t> members;
    for (const auto& g : groups)
      if (std::find(g.begin(), g.end(), devs[0]) != g.end()) members = g;
    at::Tensor acc = unpadded(members[0]).clone();
    for (size_t m = 1; m < members.size(); ++m) {
      at::Tensor v = unpadded(members[m]);
      switch (sharding_.partial_op()) {
        case ReduceOp::kSum: acc.add_(v); break;
        case ReduceOp::kMax: acc = at::maximum(acc, v); break;
        case ReduceOp::kMin: acc = at::minimum(acc, v); break;
      }
    }
    dst.copy_(acc);
  }
  return out;
}

std::shared_ptr<DeviceData> DeviceData::Relayout(const Sharding& target) const {
  if (planned_) return Planned(type_, target, known_);
  if (held_on_host()) return FromHost(held_, target);  // its first transfer: only the shards
  struct Relaying {
    Relaying() { t_relaying = true; }
    ~Relaying() { t_relaying = false; }
  } relaying;
  return FromHost(ToHost(), target);
}

}  // namespace spmd::runtime
