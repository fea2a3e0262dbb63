#include "sharding/sharding.h"

#include <algorithm>
#include <optional>
#include <string_view>
#include <utility>

#include "core/str_join.h"
#include "core/error.h"
#include "sharding/tiling.h"

namespace spmd {
namespace {

// A sharding may use each mesh axis once, across all dims and the partial set together.
// AxesSize enforces exactly that rule (range and uniqueness) on the concatenation.
void CheckAxisUse(const Mesh& mesh, const std::vector<AxisList>& dim_axes,
                  const AxisList& partial_axes) {
  AxisList all = partial_axes;
  for (const AxisList& axes : dim_axes) all.insert(all.end(), axes.begin(), axes.end());
  AxesSize(mesh, all);
}

void CheckMesh(const MeshPtr& mesh) { SPMD_CHECK_VALUE(mesh != nullptr, "Sharding needs a mesh"); }

void CheckRank(int64_t rank) {
  SPMD_CHECK_VALUE(rank >= 0, "Sharding rank must be non-negative, got ", rank);
}

std::string Labels(const Mesh& mesh, const AxisList& axes) {
  return StrJoin(axes, ",",
                       [&mesh](std::string* out, int axis) { *out += mesh.AxisLabel(axis); });
}

// Reads the V1 tile-assignment grammar token by token; every method returns false on a mismatch.
class TextReader {
 public:
  explicit TextReader(std::string_view text) : rest_(text) {}

  bool Consume(std::string_view token) {
    if (rest_.substr(0, token.size()) != token) return false;
    rest_.remove_prefix(token.size());
    return true;
  }

  // A non-empty comma-separated list of non-negative integers.
  bool ReadIntList(std::vector<int64_t>* out) {
    do {
      int64_t value;
      if (!ReadInt(&value)) return false;
      out->push_back(value);
    } while (Consume(","));
    return true;
  }

  bool AtEnd() const { return rest_.empty(); }

 private:
  // Up to 18 digits, so the value always fits in int64 without overflow checks.
  bool ReadInt(int64_t* value) {
    size_t n = 0;
    while (n < rest_.size() && rest_[n] >= '0' && rest_[n] <= '9') ++n;
    if (n == 0 || n > 18) return false;
    *value = 0;
    for (size_t i = 0; i < n; ++i) *value = *value * 10 + (rest_[i] - '0');
    rest_.remove_prefix(n);
    return true;
  }

  std::string_view rest_;
};

std::optional<TileAssignment> ParseSyntax(std::string_view text) {
  TileAssignment ta;
  if (text == "{replicated}") {
    ta.replicated = true;
    return ta;
  }
  if (text == "{manual}") {
    ta.manual = true;
    return ta;
  }
  TextReader reader(text);
  if (!reader.Consume("{devices=[") || !reader.ReadIntList(&ta.dims) || !reader.Consume("]") ||
      !reader.ReadIntList(&ta.devices))
    return std::nullopt;
  ta.last_tile_dim_replicate = reader.Consume(" last_tile_dim_replicate");
  if (!reader.Consume("}") || !reader.AtEnd()) return std::nullopt;
  return ta;
}

// Positive dims whose product is the device count, and each device listed once.
bool IsConsistent(const TileAssignment& ta) {
  if (ta.replicated || ta.manual) return true;
  int64_t product = 1;
  for (int64_t d : ta.dims) {
    // The bound keeps the product small, so it cannot overflow.
    if (d < 1 || product * d > static_cast<int64_t>(ta.devices.size())) return false;
    product *= d;
  }
  std::vector<int64_t> sorted = ta.devices;
  std::sort(sorted.begin(), sorted.end());
  return product == static_cast<int64_t>(ta.devices.size()) &&
         std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end();
}

// How `dim` of `global` is cut into tiles (ceil(D/k) long, trailing ones short or empty).
DimTiling TilingOf(const Sharding& sharding, const Shape& global, int64_t dim) {
  SPMD_CHECK_VALUE(static_cast<int64_t>(global.size()) == sharding.rank(), "Shape ",
                   ShapeToString(global), " does not match sharding rank ", sharding.rank());
  return DimTiling(global.at(dim), sharding.NumTiles(dim));
}

}  // namespace

std::string ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kMin:
      return "min";
  }
  SPMD_FAIL("unknown ReduceOp ", static_cast<int>(op));
}

// ---------------------------------------------------------------------------------------------
// Construction

Sharding Sharding::Replicated(MeshPtr mesh, int64_t rank) {
  CheckMesh(mesh);
  CheckRank(rank);
  Sharding s;
  s.mesh_ = std::move(mesh);
  s.dim_axes_.assign(rank, AxisList{});
  return s;
}

Sharding Sharding::Tiled(MeshPtr mesh, std::vector<AxisList> dim_axes) {
  CheckMesh(mesh);
  CheckAxisUse(*mesh, dim_axes, {});
  Sharding s;
  s.mesh_ = std::move(mesh);
  s.dim_axes_ = std::move(dim_axes);
  return s;
}

Sharding Sharding::Manual(MeshPtr mesh, int64_t rank) {
  Sharding s = Replicated(std::move(mesh), rank);
  s.manual_ = true;
  return s;
}

Sharding Sharding::WithDimAxes(int64_t dim, AxisList axes) const {
  Sharding s = *this;
  s.dim_axes_.at(dim) = std::move(axes);
  CheckAxisUse(*s.mesh_, s.dim_axes_, s.partial_axes_);
  return s;
}

Sharding Sharding::WithPartial(AxisList axes, ReduceOp op) const {
  CheckAxisUse(*mesh_, dim_axes_, axes);
  Sharding s = *this;
  std::sort(axes.begin(), axes.end());
  s.partial_axes_ = std::move(axes);
  // Without partial axes the op means nothing; keep it canonical so == and hash ignore it.
  s.partial_op_ = s.partial_axes_.empty() ? ReduceOp::kSum : op;
  return s;
}

Sharding Sharding::WithoutPartial() const { return WithPartial({}, ReduceOp::kSum); }

// ---------------------------------------------------------------------------------------------
// Queries

bool Sharding::IsReplicated() const { return !manual_ && !IsPartial() && !IsTiled(); }

bool Sharding::IsTiled() const {
  for (int64_t d = 0; d < rank(); ++d)
    if (NumTiles(d) > 1) return true;
  return false;
}

bool Sharding::UsesAxis(int axis) const {
  return DimOfAxis(axis) >= 0 ||
         std::find(partial_axes_.begin(), partial_axes_.end(), axis) != partial_axes_.end();
}

int Sharding::DimOfAxis(int axis) const {
  for (int64_t d = 0; d < rank(); ++d)
    if (std::find(dim_axes_[d].begin(), dim_axes_[d].end(), axis) != dim_axes_[d].end())
      return static_cast<int>(d);
  return -1;
}

AxisList Sharding::TiledAxes() const {
  AxisList axes;
  for (const AxisList& dim : dim_axes_) axes.insert(axes.end(), dim.begin(), dim.end());
  return axes;
}

AxisList Sharding::ReplicatedAxes() const {
  AxisList axes;
  for (int axis = 0; axis < mesh_->num_axes(); ++axis)
    if (!UsesAxis(axis)) axes.push_back(axis);
  return axes;
}

int64_t Sharding::NumTiles(int64_t dim) const { return AxesSize(*mesh_, axes(dim)); }

// IndexInGroup orders a group's members exactly as tiles are numbered, so member i of
// DeviceGroups(mesh, axes(dim)) holds tile i.
int64_t Sharding::TileIndex(int64_t dim, int64_t device) const {
  return IndexInGroup(*mesh_, axes(dim), device);
}

// ---------------------------------------------------------------------------------------------
// Geometry

Shape Sharding::ShardShape(const Shape& global) const {
  SPMD_CHECK_VALUE(static_cast<int64_t>(global.size()) == rank(), "Shape ", ShapeToString(global),
                   " does not match sharding rank ", rank());
  Shape shard(global.size());
  for (int64_t d = 0; d < rank(); ++d) shard[d] = CeilDiv(global[d], NumTiles(d));
  return shard;
}

int64_t Sharding::ShardOffset(const Shape& global, int64_t dim, int64_t device) const {
  return TilingOf(*this, global, dim).Offset(TileIndex(dim, device));
}

int64_t Sharding::ShardLength(const Shape& global, int64_t dim, int64_t device) const {
  return TilingOf(*this, global, dim).Length(TileIndex(dim, device));
}

bool Sharding::IsEven(const Shape& global) const {
  const Shape shard = ShardShape(global);
  for (int64_t d = 0; d < rank(); ++d)
    if (shard[d] * NumTiles(d) != global[d]) return false;
  return true;
}

// ---------------------------------------------------------------------------------------------
// Printing, hashing, comparison

std::string Sharding::ToString() const {
  if (!valid()) return "{invalid}";
  std::string text = ToTileAssignment(*this).ToString();
  if (IsPartial()) {
    text.insert(text.size() - 1, StrCat(" partial=", ReduceOpName(partial_op_), "(",
                                        Labels(*mesh_, partial_axes_), ")"));
  }
  return text;
}

std::string Sharding::ToNamedString() const {
  if (!valid()) return "{invalid}";
  if (manual_) return "{manual}";
  std::vector<std::string> dims;
  for (const AxisList& axes : dim_axes_) dims.push_back("{" + Labels(*mesh_, axes) + "}");
  std::string text = "[" + StrJoin(dims, ", ") + "]";
  if (IsPartial())
    text += StrCat(" partial=", ReduceOpName(partial_op_), "{", Labels(*mesh_, partial_axes_), "}");
  return text;
}

Hash Sharding::hash() const {
  if (!valid()) return HashInt(-1);
  Hash h = HashCombine(mesh_->hash(), HashInt(rank()));
  for (const AxisList& axes : dim_axes_)
    h = HashCombine(h, HashInts(std::vector<int64_t>(axes.begin(), axes.end())));
  h = HashCombine(h, HashInts(std::vector<int64_t>(partial_axes_.begin(), partial_axes_.end())));
  h = HashCombine(h, HashInt(static_cast<int64_t>(partial_op_)));
  return HashCombine(h, HashInt(manual_));
}

bool Sharding::operator==(const Sharding& other) const {
  if (valid() != other.valid()) return false;
  if (!valid()) return true;
  const bool same_mesh = mesh_ == other.mesh_ || *mesh_ == *other.mesh_;
  return same_mesh && dim_axes_ == other.dim_axes_ && partial_axes_ == other.partial_axes_ &&
         partial_op_ == other.partial_op_ && manual_ == other.manual_;
}

bool Sharding::SamePlacement(const Sharding& other) const {
  if (*this == other) return true;
  if (!valid() || !other.valid() || IsPartial() || other.IsPartial()) return false;
  return ToString() == other.ToString();
}

// ---------------------------------------------------------------------------------------------
// XLA tile assignment

TileAssignment TileAssignment::Parse(const std::string& text) {
  std::optional<TileAssignment> ta = ParseSyntax(text);
  SPMD_CHECK_VALUE(ta && IsConsistent(*ta), "sharding ", text, " is not organized as expected");
  return *ta;
}

std::string TileAssignment::ToString() const {
  if (replicated) return "{replicated}";
  if (manual) return "{manual}";
  return StrCat("{devices=[", StrJoin(dims, ","), "]", StrJoin(devices, ","),
                last_tile_dim_replicate ? " last_tile_dim_replicate" : "", "}");
}

int64_t TileAssignment::NumTensorDims() const {
  return static_cast<int64_t>(dims.size()) - (last_tile_dim_replicate ? 1 : 0);
}

// XLA transposes the logical mesh so the axes tiling dims come first (in dim order), then the
// other axes ascending, and reshapes to [tiles..., replicas]. DeviceGroups(mesh, tiled axes)
// already has that order, transposed: groups[r][t] is the device at tile t, replica r.
TileAssignment ToTileAssignment(const Sharding& sharding) {
  SPMD_CHECK(sharding.valid(), "ToTileAssignment needs a valid sharding");
  TileAssignment ta;
  if (sharding.is_manual()) {
    ta.manual = true;
    return ta;
  }
  const Mesh& mesh = sharding.mesh();
  const AxisList tiled = sharding.TiledAxes();
  const int64_t tiles = AxesSize(mesh, tiled);
  if (tiles == 1) {  // every device holds everything (also a 1-device mesh or a scalar)
    ta.replicated = true;
    return ta;
  }
  const std::vector<std::vector<int64_t>> groups = DeviceGroups(mesh, tiled);
  for (int64_t t = 0; t < tiles; ++t) {
    std::vector<int64_t> replicas;
    for (const std::vector<int64_t>& group : groups) replicas.push_back(group[t]);
    std::sort(replicas.begin(), replicas.end());  // XLA's PartialTile canonicalization
    ta.devices.insert(ta.devices.end(), replicas.begin(), replicas.end());
  }
  for (int64_t d = 0; d < sharding.rank(); ++d) ta.dims.push_back(sharding.NumTiles(d));
  if (groups.size() > 1) {
    ta.dims.push_back(static_cast<int64_t>(groups.size()));
    ta.last_tile_dim_replicate = true;
  }
  return ta;
}

}  // namespace spmd
