#pragma once
// Tensor parallel: PyTorch's parallel styles on hyperpar modules, applied by FQN pattern.
//
//   parallelize_module(*model, world_mesh["tp"], {
//       {"layers.*.attention", std::make_shared<PrepareModuleInput>(Replicate{}, Replicate{})},
//       {"layers.*.attention.wq", std::make_shared<ColwiseParallel>(std::nullopt)},
//       {"layers.*.attention.wo", std::make_shared<RowwiseParallel>()}, ...});
//
// Parameters become distributed on the tp mesh: colwise weight Shard(0) (bias Shard(0)),
// rowwise weight Shard(1) (bias Replicate), vocab-parallel embedding Shard(0), colwise
// embedding Shard(1), experts w1/w3 Shard(1) and w2 Shard(2); every parameter no style
// touched becomes Replicate. Activations stay plain local tensors; the styles' hooks convert
// their layouts with redistribute_local, whose gradient rules (redistribute.h) make the
// backward right: a Replicate input consumed by sharded compute is declared with a Partial
// gradient (all-reduced or reduce-scattered in backward, Megatron's "f"), a Partial output
// is reduced in forward with an identity (or all-gather) backward ("g").
//
// Layout arguments use tensor dims of the activation; Shard(-1) means its last dim.
// A pattern's "*" matches one FQN component; a pattern that matches nothing is an error.
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "hyperpar/dtensor/placement.h"
#include "hyperpar/mesh/device_mesh.h"
#include "hyperpar/nn/module.h"
#include "hyperpar/nn/moe.h"

namespace hyperpar::parallel {

using dtensor::Placement;

class ParallelStyle {
 public:
  virtual ~ParallelStyle() = default;
  virtual std::string name() const = 0;
  virtual void apply(nn::Module& m, const std::string& fqn, const mesh::DeviceMesh& tp) const = 0;
};

/// Linear: weight Shard(0) (output features). Embedding: weight Shard(1).
/// input_layout nullopt: the input was already prepared by a PrepareModuleInput on the
/// parent (several colwise layers sharing one input then all-reduce its gradient once).
class ColwiseParallel : public ParallelStyle {
 public:
  explicit ColwiseParallel(std::optional<Placement> input_layout = dtensor::Replicate{},
                           Placement output_layout = dtensor::Shard{-1})
      : input_layout_(input_layout), output_layout_(output_layout) {}
  std::string name() const override { return "ColwiseParallel"; }
  void apply(nn::Module& m, const std::string& fqn, const mesh::DeviceMesh& tp) const override;

 private:
  std::optional<Placement> input_layout_;
  Placement output_layout_;
};

/// Linear: weight Shard(1) (input features), bias Replicate, output reduced.
/// Embedding: weight Shard(0) (vocab-parallel), output reduced.
class RowwiseParallel : public ParallelStyle {
 public:
  explicit RowwiseParallel(std::optional<Placement> input_layout = dtensor::Shard{-1},
                           Placement output_layout = dtensor::Replicate{})
      : input_layout_(input_layout), output_layout_(output_layout) {}
  std::string name() const override { return "RowwiseParallel"; }
  void apply(nn::Module& m, const std::string& fqn, const mesh::DeviceMesh& tp) const override;

 private:
  std::optional<Placement> input_layout_;
  Placement output_layout_;
};

/// RMSNorm on sequence-sharded activations (Shard(1)): weight Replicate with its partial
/// gradient all-reduced.
class SequenceParallel : public ParallelStyle {
 public:
  std::string name() const override { return "SequenceParallel"; }
  void apply(nn::Module& m, const std::string& fqn, const mesh::DeviceMesh& tp) const override;
};

/// Converts a module's input from `input_layout` to `desired_layout`. The gradient of the
/// result is declared Partial when desired is Replicate (its consumers are sharded layers).
class PrepareModuleInput : public ParallelStyle {
 public:
  PrepareModuleInput(Placement input_layout, Placement desired_layout)
      : input_(input_layout), desired_(desired_layout) {}
  std::string name() const override { return "PrepareModuleInput"; }
  void apply(nn::Module& m, const std::string& fqn, const mesh::DeviceMesh& tp) const override;

 private:
  Placement input_, desired_;
};

/// Converts a module's output from `output_layout` to `desired_layout`.
class PrepareModuleOutput : public ParallelStyle {
 public:
  PrepareModuleOutput(Placement output_layout, Placement desired_layout)
      : output_(output_layout), desired_(desired_layout) {}
  std::string name() const override { return "PrepareModuleOutput"; }
  void apply(nn::Module& m, const std::string& fqn, const mesh::DeviceMesh& tp) const override;

 private:
  Placement output_, desired_;
};

/// MoE: experts split on their hidden dim (w1/w3 Shard(1), w2 Shard(2)) with the routed
/// output reduced over tp; router replicated. The routed experts' input gradient is a partial
/// sum: all-reduced here, unless `input_grad_partial` says a PrepareModuleInput on the MoE
/// already treats the layer's input gradient as partial (sequence parallel); then the
/// router's replicated share is counted once instead.
class MoETensorParallel : public ParallelStyle {
 public:
  explicit MoETensorParallel(bool input_grad_partial = false)
      : input_grad_partial_(input_grad_partial) {}
  std::string name() const override { return "MoETensorParallel"; }
  void apply(nn::Module& m, const std::string& fqn, const mesh::DeviceMesh& tp) const override;

 private:
  bool input_grad_partial_;
};

using ParallelizePlan = std::vector<std::pair<std::string, std::shared_ptr<ParallelStyle>>>;

/// Applies `plan` to the modules of `root` whose FQN matches; then every parameter that is
/// still not distributed becomes Replicate on `tp`. Works under DeviceContext(meta).
void parallelize_module(nn::Module& root, const mesh::DeviceMesh& tp, const ParallelizePlan& plan);

/// Applies each style of `plan` (with `mesh`) to the modules whose FQN matches; a pattern
/// that matches nothing is an error. Leaves other parameters alone (expert parallel uses it).
void apply_plan(nn::Module& root, const mesh::DeviceMesh& mesh, const ParallelizePlan& plan);

/// The activation hooks of MoETensorParallel on an MoE whose experts are already split on
/// their hidden dim over `tp` (alone or inside a 2-D ("ep", "tp") mesh): expert output
/// reduced over tp, partial routing-weight and expert-input gradients all-reduced (or, with
/// `input_grad_partial`, the router's input gradient counted once).
void install_expert_tp_hooks(nn::MoE& moe, const mesh::DeviceMesh& tp, const std::string& fqn,
                             bool input_grad_partial);

/// For an MoE whose input gradient is treated as a partial sum over `tp` while the router runs
/// replicated: keeps the router's share of that gradient on tp coordinate 0 only.
void count_router_grad_once(nn::MoE& moe, const mesh::DeviceMesh& tp);

/// The Transformer plan (torchtitan's): vocab-parallel embedding, attention heads and MLP
/// hidden split colwise/rowwise, MoE experts split on hidden, output head colwise with the
/// logits gathered for the loss, or with `loss_parallel` left split over the vocabulary
/// (Shard(-1): the loss is then parallel/loss_parallel.h's). With `sequence_parallel`, norms
/// run on sequence-sharded activations and the block inputs are all-gathered / outputs
/// reduce-scattered. Checks that heads, kv heads divide by the tp size. `moe_experts` false
/// leaves the routed experts to expert parallel (the plan still lays out the MoE input/output
/// and the shared expert).
ParallelizePlan transformer_tp_plan(int64_t n_heads, int64_t n_kv_heads, bool has_dense,
                                    bool has_moe, bool shared_expert, int64_t tp_size,
                                    bool sequence_parallel, bool moe_experts = true,
                                    bool loss_parallel = false);

/// The traffic scope (comm/traffic.h) of a relayout tagged "<fqn> ...": "tp " and the block,
/// e.g. "layers.3.attention.wo output" -> "tp layers.3", "output input" -> "tp output".
std::string tp_traffic_scope(const std::string& tag);

/// Whether `fqn` matches `pattern` ("*" = one component).
bool fqn_matches(const std::string& pattern, const std::string& fqn);

/// Converts a local activation between layouts on the 1-D mesh `tp` (even shards assumed
/// for the global shape), with the given gradient layout (default: the target's). Its
/// communication (forward and gradient) counts under tp_traffic_scope(tag).
at::Tensor relayout(const at::Tensor& x, const mesh::DeviceMesh& tp, Placement from, Placement to,
                    std::optional<Placement> grad = std::nullopt, const std::string& tag = "");

}  // namespace hyperpar::parallel
