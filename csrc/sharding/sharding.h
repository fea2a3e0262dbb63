// How a tensor is laid out over a mesh, in named-axis form (Shardy-style, see DESIGN.md):
// dim_axes[d] lists the mesh axes that tile tensor dim d, most major first. An axis used by no
// dim is replicated, unless it is listed in partial_axes: then every device holds a partial
// result that still needs a reduction (partial_op) over those axes. Manual means the value is
// already per-device and the partitioner leaves it alone.
//
// Uneven dims: a dim of size D tiled k ways has shard size ceil(D/k); tile i covers
// [min(i*s, D), min((i+1)*s, D)); every device holds an s-long buffer whose tail is padding.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/hash.h"
#include "core/shape.h"
#include "sharding/mesh.h"

namespace spmd {

enum class ReduceOp : int8_t { kSum = 0, kMax = 1, kMin = 2 };
std::string ReduceOpName(ReduceOp op);  // "sum", "max", "min"

using AxisList = std::vector<int>;

class Sharding {
 public:
  Sharding() = default;  // an empty (invalid) sharding; valid() is false

  static Sharding Replicated(MeshPtr mesh, int64_t rank);
  // Throws std::invalid_argument if an axis index is out of range or used twice.
  static Sharding Tiled(MeshPtr mesh, std::vector<AxisList> dim_axes);
  static Sharding Manual(MeshPtr mesh, int64_t rank);

  bool valid() const { return mesh_ != nullptr; }
  const Mesh& mesh() const { return *mesh_; }
  const MeshPtr& mesh_ptr() const { return mesh_; }
  int64_t rank() const { return static_cast<int64_t>(dim_axes_.size()); }
  const std::vector<AxisList>& dim_axes() const { return dim_axes_; }
  const AxisList& axes(int64_t dim) const { return dim_axes_.at(dim); }
  const AxisList& partial_axes() const { return partial_axes_; }
  ReduceOp partial_op() const { return partial_op_; }
  bool is_manual() const { return manual_; }

  bool IsReplicated() const;  // no tiled dim, not partial, not manual
  bool IsTiled() const;       // at least one tiled dim (one split into more than one tile)
  bool IsPartial() const { return !partial_axes_.empty(); }
  bool UsesAxis(int axis) const;     // tiles some dim or is partial
  int DimOfAxis(int axis) const;     // the dim tiled by `axis`, or -1
  AxisList TiledAxes() const;        // all axes tiling some dim, in dim order
  AxisList ReplicatedAxes() const;   // axes neither tiling a dim nor partial, ascending

  int64_t NumTiles(int64_t dim) const;                   // product of the dim's axis sizes
  int64_t TileIndex(int64_t dim, int64_t device) const;  // which tile of dim the device holds

  // Geometry for a tensor of shape `global` (rank must match).
  Shape ShardShape(const Shape& global) const;  // padded: ceil(D / tiles) per dim
  int64_t ShardOffset(const Shape& global, int64_t dim, int64_t device) const;
  int64_t ShardLength(const Shape& global, int64_t dim, int64_t device) const;  // unpadded
  bool IsEven(const Shape& global) const;  // no tiled dim needs padding

  // Copies with one thing changed.
  Sharding WithDimAxes(int64_t dim, AxisList axes) const;
  Sharding WithPartial(AxisList axes, ReduceOp op) const;  // replaces the partial set
  Sharding WithoutPartial() const;

  // PyTorch/XLA text form: "{devices=[4,2]0,1,2,3,4,5,6,7}",
  // "{devices=[2,1,4]0,2,4,6,1,3,5,7 last_tile_dim_replicate}" (device ids sorted inside each
  // replication group), "{replicated}" (also for a 1-device mesh), "{manual}". A partial
  // sharding prints its tiling plus " partial=sum(axes)" (never seen by users: outputs are
  // reduced before they leave a program).
  std::string ToString() const;
  // Named form for program dumps: "[{data}, {}]", "[{data}] partial=sum{model}", "[]",
  // "{manual}".
  std::string ToNamedString() const;

  Hash hash() const;
  bool operator==(const Sharding& other) const;
  bool operator!=(const Sharding& other) const { return !(*this == other); }
  // Whether both place the same tiles on the same devices, even when named differently
  // (mesh (8,1): ('data',) and (('data','model'),) tile alike): equal XLA text forms.
  bool SamePlacement(const Sharding& other) const;

 private:
  MeshPtr mesh_;
  std::vector<AxisList> dim_axes_;
  AxisList partial_axes_;  // ascending
  ReduceOp partial_op_ = ReduceOp::kSum;
  bool manual_ = false;
};

// XLA's tile-assignment form, used to parse sharding strings (visualize_sharding) and to print.
struct TileAssignment {
  bool replicated = false;
  bool manual = false;
  std::vector<int64_t> dims;     // tiles per tensor dim, plus the replication dim if present
  std::vector<int64_t> devices;  // row-major over dims
  bool last_tile_dim_replicate = false;

  // Parses "{replicated}", "{manual}", "{devices=[a,b,...]d0,d1,... [last_tile_dim_replicate]}".
  // Throws std::invalid_argument("sharding <text> is not organized as expected") otherwise.
  static TileAssignment Parse(const std::string& text);
  std::string ToString() const;
  int64_t NumTensorDims() const;  // dims.size() minus the replication dim
};

TileAssignment ToTileAssignment(const Sharding& sharding);

}  // namespace spmd
