// Bindings for sharding annotations (used by torch_spmd.distributed.spmd).
#include "aten/lazy_tensor.h"
#include "aten/memory_api.h"
#include "aten/named_ops.h"
#include "aten/sharding_api.h"
#include "bindings.h"
#include "partition/rules/rule.h"

namespace py = pybind11;

namespace spmd {

namespace {
Sharding MakeSharding(const std::vector<int64_t>& device_ids, const std::vector<int64_t>& mesh_shape,
                      const std::vector<std::string>& axis_names,
                      const std::vector<std::vector<int>>& dim_axes) {
  MeshPtr mesh = aten::InternMesh(device_ids, mesh_shape, axis_names);
  return Sharding::Tiled(mesh, dim_axes);
}
}  // namespace

void BindSharding(py::module_& m) {
  // An annotation call taking the sharding as (device ids, mesh shape, axis names, dim axes).
  auto def_annotation = [&m](const char* name, void (*annotate)(const at::Tensor&, const Sharding&),
                             const char* doc) {
    m.def(
        name,
        [annotate](const at::Tensor& t, const std::vector<int64_t>& device_ids,
                   const std::vector<int64_t>& mesh_shape,
                   const std::vector<std::string>& axis_names,
                   const std::vector<std::vector<int>>& dim_axes) {
          annotate(t, MakeSharding(device_ids, mesh_shape, axis_names, dim_axes));
        },
        py::arg("tensor"), py::arg("device_ids"), py::arg("mesh_shape"), py::arg("axis_names"),
        py::arg("dim_axes"), doc);
  };
  def_annotation("_mark_sharding", &aten::MarkSharding,
                 "Annotates an spmd tensor in place: dim_axes[d] lists the mesh axes tiling dim d.");
  def_annotation("_constrain_sharding", &aten::ConstrainSharding,
                 "Annotates an spmd tensor in place with a sharding constraint on its current "
                 "value (device data keeps its layout until the step reshards it).");
  // A search's relayout of many tensors on one mesh (auto_shard): the device ids are converted
  // and the mesh interned once, not per tensor (2048 ids per call cost 6% of a 70B search).
  m.def(
      "_set_shardings",
      [](const std::vector<at::Tensor>& tensors, const std::vector<int64_t>& device_ids,
         const std::vector<int64_t>& mesh_shape, const std::vector<std::string>& axis_names,
         const std::vector<std::optional<std::vector<std::vector<int>>>>& dim_axes) {
        TORCH_CHECK(tensors.size() == dim_axes.size(), "_set_shardings: ", tensors.size(),
                    " tensors but ", dim_axes.size(), " dim axes");
        MeshPtr mesh = aten::InternMesh(device_ids, mesh_shape, axis_names);
        for (size_t i = 0; i < tensors.size(); ++i) {
          aten::ClearSharding(tensors[i]);
          if (dim_axes[i]) aten::MarkSharding(tensors[i], Sharding::Tiled(mesh, *dim_axes[i]));
        }
      },
      py::arg("tensors"), py::arg("device_ids"), py::arg("mesh_shape"), py::arg("axis_names"),
      py::arg("dim_axes"),
      "Clears each tensor's annotation, then marks those whose dim_axes are not None.");
  m.def(
      "_sharding_spec_for",
      [](const std::vector<int64_t>& device_ids, const std::vector<int64_t>& mesh_shape,
         const std::vector<std::string>& axis_names,
         const std::vector<std::vector<int>>& dim_axes) {
        return MakeSharding(device_ids, mesh_shape, axis_names, dim_axes).ToString();
      },
      "The XLA text form of a sharding, without a tensor.");
  m.def(
      "_upload_sharded",
      [](const at::Tensor& host, const std::vector<int64_t>& device_ids,
         const std::vector<int64_t>& mesh_shape, const std::vector<std::string>& axis_names,
         const std::vector<std::vector<int>>& dim_axes) {
        Sharding sharding = MakeSharding(device_ids, mesh_shape, axis_names, dim_axes);
        return aten::UploadSharded(host, sharding);
      },
      py::arg("host"), py::arg("device_ids"), py::arg("mesh_shape"), py::arg("axis_names"),
      py::arg("dim_axes"),
      "A new spmd tensor with a CPU tensor's data laid out directly in the given sharding.");
  m.def("_clear_sharding", &aten::ClearSharding);
  m.def("_sharding_rule_names", &partition::RegisteredRuleNames);
  m.def("_aten_named_op_names", &aten::NamedOpNames);
  // The sharding in named form ("[{fsdp}, {model}]"), "" when none: short for any mesh size.
  m.def("_named_sharding", [](const at::Tensor& t) {
    Sharding s = aten::GetSharding(t);
    return s.valid() ? s.WithoutPartial().ToNamedString() : std::string();
  });
  // The user's annotation (mark_sharding) in named form, "" when none: the layout the tensor
  // keeps through in-place updates, unlike the one its current data happens to have (which,
  // for a tensor nobody annotated, is whatever the last step produced).
  m.def("_annotated_sharding", [](const at::Tensor& t) {
    std::lock_guard<aten::GraphLock> lock(aten::GraphMutex());
    const Sharding& s = aten::GetLazyImpl(t, "_annotated_sharding")->slot()->annotation;
    return s.valid() ? s.ToNamedString() : std::string();
  });
  // The (padded) shape each device holds of `t`: its whole shape when it has no sharding.
  m.def("_shard_shape", [](const at::Tensor& t) {
    Sharding s = aten::GetSharding(t);
    Shape shape(t.sizes().begin(), t.sizes().end());
    return s.valid() ? s.ShardShape(shape) : shape;
  });
  m.def("_spmd_full_to_shard_shape", &aten::FullToShard);
  m.def("_offload", &aten::Offload, py::arg("tensor"), py::arg("to_host"));
  m.def(
      "_spmd_shard_to_full_shape",
      [](const at::Tensor& t, const std::vector<int64_t>& device_ids,
         const std::vector<int64_t>& mesh_shape, const std::vector<std::string>& axis_names,
         const std::vector<std::vector<int>>& dim_axes, const std::vector<int64_t>& full_shape) {
        return aten::ShardToFull(t, MakeSharding(device_ids, mesh_shape, axis_names, dim_axes),
                                 full_shape);
      },
      py::arg("tensor"), py::arg("device_ids"), py::arg("mesh_shape"), py::arg("axis_names"),
      py::arg("dim_axes"), py::arg("full_shape"));
  m.def("_mark_manual_sharding", &aten::MarkManualSharding);
  m.def("_get_sharding_spec", &aten::GetShardingSpec);
  m.def("_held_on_host", &aten::HeldOnHost);
  m.def("_get_sharding_specs", [](const std::vector<at::Tensor>& ts) {
    std::vector<std::string> out;
    for (const at::Tensor& t : ts) out.push_back(aten::GetShardingSpec(t));
    return out;
  });
  // One number per tensor for its layout (0: none), equal exactly when the layouts are: a
  // cheap way to see whether a step handed its state back as it got it (the auto-sharding
  // search compares thousands of optimizer states per planned step; their spec strings name
  // every device).
  m.def("_sharding_fingerprints", [](const std::vector<at::Tensor>& ts) {
    std::vector<uint64_t> out;
    out.reserve(ts.size());
    for (const at::Tensor& t : ts) {
      Sharding s = aten::GetSharding(t);
      out.push_back(s.valid() ? s.WithoutPartial().hash() : 0);
    }
    return out;
  });
  m.def("_local_shards", [](const at::Tensor& t) {
    py::list out;
    for (const aten::LocalShard& s : aten::GetLocalShards(t))
      out.append(py::make_tuple(s.device, s.data, s.offsets, s.lengths, s.replica_id));
    return out;
  });
  m.def("_load_local_shards", &aten::LoadLocalShards);
  m.def(
      "_get_sharding_axes",
      [](const at::Tensor& t) -> py::object {
        Sharding s = aten::GetSharding(t);
        if (!s.valid() || s.is_manual()) return py::none();
        s = s.WithoutPartial();  // users never see pending partial sums
        py::dict d;
        d["device_ids"] = s.mesh().device_ids();
        d["mesh_shape"] = s.mesh().shape();
        d["axis_names"] = s.mesh().axis_names();
        d["dim_axes"] = s.dim_axes();
        return std::move(d);
      },
      py::arg("tensor"),
      "The named-axis form of a tensor's sharding (dict with device_ids, mesh_shape, "
      "axis_names, dim_axes), or None when it has none (or is manual). Inverse of the "
      "arguments of _mark_sharding; sharded checkpoints record it as the mesh and spec.");
  m.def(
      "_parse_sharding_spec",
      [](const std::string& text) {
        TileAssignment ta = TileAssignment::Parse(text);
        py::dict d;
        d["replicated"] = ta.replicated;
        d["manual"] = ta.manual;
        d["dims"] = ta.dims;
        d["devices"] = ta.devices;
        d["last_tile_dim_replicate"] = ta.last_tile_dim_replicate;
        return d;
      },
      py::arg("text"),
      "Parses the XLA text form of a sharding into its tile assignment (dict with replicated, "
      "manual, dims, devices, last_tile_dim_replicate); ValueError when malformed.");
}

}  // namespace spmd
