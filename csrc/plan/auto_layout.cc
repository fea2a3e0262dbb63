#include "plan/auto_layout.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <exception>
#include <numeric>
#include <optional>

#include "core/error.h"
#include "partition/partitioner.h"
#include "plan/cost_model.h"
#include "plan/dim_classes.h"

namespace spmd::plan {

using partition::PartitionGraph;
using partition::PartitionOptions;

namespace {

// Every ordered tuple of distinct mesh axes of size > 1, the empty one first.
std::vector<AxisList> AxisTuples(const Mesh& mesh) {
  AxisList axes;
  for (int a = 0; a < mesh.num_axes(); ++a)
    if (mesh.axis_size(a) > 1) axes.push_back(a);
  std::vector<AxisList> out{{}};
  for (size_t r = 1; r <= axes.size(); ++r) {
    // every r-permutation of `axes`: each r-subset (by mask), each of its orders
    for (uint32_t mask = 0; mask < (1u << axes.size()); ++mask) {
      if (static_cast<size_t>(__builtin_popcount(mask)) != r) continue;
      AxisList pick;
      for (size_t i = 0; i < axes.size(); ++i)
        if (mask & (1u << i)) pick.push_back(axes[i]);
      do out.push_back(pick);
      while (std::next_permutation(pick.begin(), pick.end()));
    }
  }
  return out;
}

int64_t TilesOf(const Mesh& mesh, const AxisList& axes) {
  int64_t n = 1;
  for (int a : axes) n *= mesh.axis_size(a);
  return n;
}

struct Candidate {
  double step_seconds = 0;
  int64_t peak_bytes = 0;
  bool fits = false;
};

// Fitting first, then the shorter step (equal to 1e-12 s: the lower peak); then by peak.
bool Better(const Candidate& a, const Candidate& b) {
  if (a.fits != b.fits) return a.fits;
  if (!a.fits) return a.peak_bytes < b.peak_bytes;
  if (std::abs(a.step_seconds - b.step_seconds) > 1e-12) return a.step_seconds < b.step_seconds;
  return a.peak_bytes < b.peak_bytes;
}

class Search {
 public:
  Search(const ir::Graph& graph, const AutoLayoutRequest& request)
      : graph_(graph), request_(request), classes_(ComputeDimClasses(graph)),
        options_(AxisTuples(*request.mesh)) {
    // The classes some decided parameter has a dim of, by the bytes of those parameters.
    std::vector<int64_t> bytes(classes_.num_classes, 0);
    std::vector<int64_t> smallest(classes_.num_classes, INT64_MAX);
    for (size_t p = 0; p < graph.params.size(); ++p) {
      if (!request.decide.at(p)) continue;
      const TensorType& t = graph.params[p]->output(0);
      for (size_t d = 0; d < classes_.param_dims[p].size(); ++d) {
        int c = classes_.param_dims[p][d];
        if (c < 0) continue;
        bytes[c] += t.bytes();
        smallest[c] = std::min(smallest[c], t.shape[d]);
      }
    }
    for (int c = 0; c < classes_.num_classes; ++c)
      if (bytes[c] > 0) order_.push_back(c);
    std::stable_sort(order_.begin(), order_.end(),
                     [&](int a, int b) { return bytes[a] > bytes[b]; });
    smallest_ = std::move(smallest);
    choice_.assign(classes_.num_classes, 0);  // option 0: replicated
  }

  AutoLayout Run() {
    std::optional<Candidate> best = Evaluate(choice_);
    if (!best) return Result(Candidate{}, /*valid=*/false);
    bool improved = true;
    while (improved && evaluations_ < request_.max_evaluations) {
      improved = false;
      for (int c : order_) {
        for (size_t o = 0; o < options_.size(); ++o) {
          if (static_cast<int>(o) == choice_[c] || evaluations_ >= request_.max_evaluations)
            continue;
          // a dim smaller than the tiles is not worth sharding
          if (TilesOf(*request_.mesh, options_[o]) > smallest_[c]) continue;
          std::vector<int> trial = choice_;
          trial[c] = static_cast<int>(o);
          std::optional<Candidate> got = Evaluate(trial);
          if (got && Better(*got, *best)) {
            best = got;
            choice_ = std::move(trial);
            improved = true;
          }
        }
      }
    }
    return Result(*best, /*valid=*/true);
  }

 private:
  // The decided parameters' layouts under `choice`; nullopt when one would use an axis twice.
  std::optional<ParamLayouts> LayoutsOf(const std::vector<int>& choice) const {
    ParamLayouts out;
    for (size_t p = 0; p < graph_.params.size(); ++p) {
      if (!request_.decide[p]) continue;
      std::vector<AxisList> dim_axes;
      AxisList used;
      for (int c : classes_.param_dims[p]) {
        dim_axes.push_back(c >= 0 ? options_[choice[c]] : AxisList{});
        used.insert(used.end(), dim_axes.back().begin(), dim_axes.back().end());
      }
      std::sort(used.begin(), used.end());
      if (std::adjacent_find(used.begin(), used.end()) != used.end()) return std::nullopt;
      out.emplace(graph_.params[p]->data().get(), Sharding::Tiled(request_.mesh, dim_axes));
    }
    return out;
  }

  std::optional<Candidate> Evaluate(const std::vector<int>& choice) {
    std::optional<ParamLayouts> layouts = LayoutsOf(choice);
    if (!layouts) return std::nullopt;
    ++evaluations_;
    PartitionOptions options;
    options.defer_output_reductions = request_.defer_output_reductions;
    options.executor_traits = false;
    options.param_layouts = &*layouts;
    try {
      Program program = PartitionGraph(graph_, request_.mesh->size(), options);
      Candidate c;
      c.step_seconds = EstimateStep(program.stats, request_.hardware).step_seconds;
      c.peak_bytes = program.stats.peak_bytes_per_device;
      c.fits = request_.memory_budget <= 0 || c.peak_bytes <= request_.memory_budget;
      return c;
    } catch (const std::exception&) {
      return std::nullopt;  // a layout the step cannot be partitioned in
    }
  }

  AutoLayout Result(const Candidate& c, bool valid) const {
    AutoLayout out;
    out.evaluations = evaluations_;
    if (!valid) return out;  // (nothing could be planned: every parameter as it is)
    out.layouts = *LayoutsOf(choice_);
    out.step_seconds = c.step_seconds;
    out.peak_bytes = c.peak_bytes;
    out.fits = c.fits;
    return out;
  }

  const ir::Graph& graph_;
  const AutoLayoutRequest& request_;
  DimClasses classes_;
  std::vector<AxisList> options_;
  std::vector<int> order_;
  std::vector<int64_t> smallest_;  // per class, its smallest dim among decided parameters
  std::vector<int> choice_;        // per class, an index into options_
  int evaluations_ = 0;
};

}  // namespace

AutoLayout ChooseParamLayouts(const ir::Graph& graph, const AutoLayoutRequest& request) {
  SPMD_CHECK(request.mesh, "ChooseParamLayouts needs a mesh");
  SPMD_CHECK(request.decide.size() == graph.params.size(), "ChooseParamLayouts: ",
             request.decide.size(), " decide flags for ", graph.params.size(), " parameters");
  return Search(graph, request).Run();
}

}  // namespace spmd::plan
