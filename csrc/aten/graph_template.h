// Replay of a recorded region: the nodes one call of a compiled function (a torch.compile graph)
// recorded, kept as a template and instantiated on a later call's inputs in one C++ call, instead
// of running the region's ops through Python and the dispatcher again.
//
// Capture brackets one ordinary run of the region: TemplateCapture snapshots the inputs' values,
// the run records nodes as usual, and Finish walks back from the outputs to the inputs. A node
// that depends on an input, or draws random numbers, becomes a template node; anything else the
// outputs reach (constants the region made, such as uploaded literals or an iota) is shared by
// every instantiation, since nodes are immutable. Instantiate clones the template nodes, sharing
// their args, types and shardings (ir::Node::Attrs), with their inputs rewired to the new call's
// values and fresh seeds for random ops (drawn in recording order from the default generator,
// as recording them would draw).
//
// A region is replayable only if its run did nothing but record: no eager fallback, no sync, no
// value read to the host (their results would be frozen into the template), and no pending
// value from before the call reached other than through the inputs. Otherwise Finish returns
// null with the reason, and the caller runs the region every time. An input annotated inside
// the region (mark_sharding on a parameter) is annotated again at each instantiation; an input
// written in place (a buffer's update) is written again, with the value the new nodes compute,
// as an in-place op writes it (its annotation kept).
#pragma once
#include <ATen/Tensor.h>

#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "aten/lazy_tensor.h"
#include "ir/node.h"

namespace spmd::aten {

class GraphTemplate {
 public:
  // Where a template node's operand or an output comes from.
  struct Ref {
    enum class Kind : uint8_t { kInput, kNode, kConstant };
    Kind kind = Kind::kConstant;
    int index = 0;      // the input, or the template node
    int output = 0;     // the template node's output
    ir::Value constant;  // kConstant
  };
  struct NodeSpec {
    const ir::OpInfo* op;
    std::vector<Ref> inputs;
    std::shared_ptr<const ir::Node::Attrs> attrs;  // shared by every instantiation's node
    ir::Scope scope;
    bool in_backward;
    bool random;
  };
  struct OutputSpec {
    Ref ref;
    bool functional;  // wrapped for functionalization, as the captured output was
    std::vector<int64_t> sizes, strides;
    int64_t storage_offset;
    Sharding annotation;
  };

  // The region's outputs computed from `inputs`, or nullopt when the inputs do not match the
  // captured ones (types, or which of them are the same value).
  std::optional<std::vector<at::Tensor>> Instantiate(const std::vector<at::Tensor>& inputs) const;

  // Values handed from one instantiation to another without becoming tensors: a forward's
  // activations, which only its backward reads (torch_spmd/_torch_patches/dynamo.py's lean
  // autograd function). Saves making, wrapping and unwrapping a tensor per activation.
  using Values = std::vector<ir::Value>;
  // Instantiate, returning the outputs `returned` (indices) as tensors and the values `kept`
  // refers to: an output's ({kOutput, index}) or an input's ({kInput, index}).
  enum class KeptFrom : int { kOutput = 0, kInput = 1 };
  std::optional<std::pair<std::vector<at::Tensor>, Values>> InstantiateKeeping(
      const std::vector<at::Tensor>& inputs, const std::vector<int>& returned,
      const std::vector<std::pair<KeptFrom, int>>& kept) const;
  // Instantiate, with the first inputs given as values (kept by InstantiateKeeping).
  std::optional<std::vector<at::Tensor>> InstantiateAfter(
      const Values& leading, const std::vector<at::Tensor>& inputs) const;

  int num_nodes() const { return static_cast<int>(nodes_.size()); }
  int num_outputs() const { return static_cast<int>(outputs_.size()); }

 private:
  // The inputs' values (`leading`, then the tensors'), annotated as captured; nullopt when
  // they do not match the capture's. A leading value cannot be annotated or written: nullopt.
  std::optional<Values> InputValues(const Values& leading,
                                    const std::vector<at::Tensor>& inputs) const;
  // The nodes on those values and the input writes; the outputs' values.
  Values Build(const Values& values, size_t num_leading,
               const std::vector<at::Tensor>& inputs) const;
  at::Tensor OutputTensor(const OutputSpec& out, const ir::Value& value) const;

  friend class TemplateCapture;
  std::vector<TensorType> input_types_;
  std::vector<int> input_same_as_;             // an earlier input with the same value, or -1
  std::vector<Sharding> input_annotations_;   // applied before the nodes (invalid: none)
  std::vector<std::pair<int, Ref>> writes_;    // (input, its new value), applied after them
  std::vector<NodeSpec> nodes_;
  std::vector<OutputSpec> outputs_;
};

// Brackets one run of a region (see above). While one is open on a thread, host bookkeeping
// (host_bookkeeping.h) stays off there: its ops are recorded, so the template keeps them.
class TemplateCapture {
 public:
  explicit TemplateCapture(std::vector<at::Tensor> inputs);
  ~TemplateCapture();
  TemplateCapture(const TemplateCapture&) = delete;
  TemplateCapture& operator=(const TemplateCapture&) = delete;

  // The template of the run since construction, or null (with `why_not` set) when the run
  // cannot be replayed.
  std::shared_ptr<GraphTemplate> Finish(const std::vector<at::Tensor>& outputs,
                                        std::string* why_not);

 private:
  using InputOf = std::unordered_map<ir::Value, int, ir::ValueHash>;
  // The template's inputs: their types, repeats and annotations made inside the region; fills
  // `input_of` (each input's values) and `written` (inputs written in place: (input, value)).
  void CaptureInputs(GraphTemplate& tmpl, InputOf& input_of,
                     std::vector<std::pair<int, ir::Value>>& written) const;
  // The template's nodes, in recording order: a post-order walk from `roots` that stops at
  // inputs; nodes that depend on no input are constants. Returns why the region cannot be
  // replayed, or "" (then `spec_of` maps each node reached to its template node, -1: constant).
  std::string CaptureNodes(GraphTemplate& tmpl, const std::vector<ir::Value>& roots,
                           const InputOf& input_of,
                           std::unordered_map<const ir::Node*, int>& spec_of) const;

  std::vector<at::Tensor> inputs_;
  std::vector<ir::Value> before_;
  std::vector<Sharding> annotations_before_;
  uint64_t first_node_id_;
  uint64_t host_work_before_;
  bool finished_ = false;
};

// Whether a TemplateCapture is open on this thread.
bool CapturingTemplate();

// Host work that a template cannot replay (an eager fallback, a sync, a read of values to the
// host): counted by the places that do it, compared by TemplateCapture.
void NoteHostWork();

}  // namespace spmd::aten
