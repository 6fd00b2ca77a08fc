#pragma once
// nn::Module: hyperpar's module base (PyTorch's nn.Module semantics, C++ ownership).
//
// A module owns named parameters (nn::Parameter: plain or distributed), buffers made by a
// factory (so they can be rebuilt on another device), and named children; fully qualified
// names join the path with "." ("layers.0.attention.wq.weight"). Forward is Tensor ->
// Tensor; operator() runs the forward pre-hooks (which may replace the input), forward,
// then the forward hooks (which may replace the output). Parallel styles are such hooks.
//
//   DeviceContext meta(c10::kMeta);
//   auto model = std::make_shared<models::Transformer>(cfg);  // no parameter memory
//   ... parallelize ...
//   model->to_empty(c10::kCPU);    // allocate local shards only
//   model->init_weights(seed);     // each shard gets its part of the unsharded init
#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "hyperpar/nn/checkpoint.h"
#include "hyperpar/nn/parameter.h"

namespace hyperpar::nn {

class Module {
 public:
  using PreHook = std::function<at::Tensor(Module&, const at::Tensor&)>;
  using PostHook = std::function<at::Tensor(Module&, const at::Tensor& in, const at::Tensor& out)>;
  using BufferFactory = std::function<at::Tensor(c10::Device)>;

  explicit Module(std::string type_name) : type_name_(std::move(type_name)) {}
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  virtual at::Tensor forward(const at::Tensor& x) = 0;
  at::Tensor operator()(const at::Tensor& x);

  const std::string& type_name() const { return type_name_; }
  Parameter& param(const std::string& name);
  const Parameter& param(const std::string& name) const;
  bool has_param(const std::string& name) const { return params_.count(name) > 0; }
  /// What forward uses for a parameter (Parameter::value()).
  at::Tensor value(const std::string& name) const { return param(name).value(); }
  const at::Tensor& buffer(const std::string& name) const;
  std::shared_ptr<Module> child(const std::string& name) const;

  /// (FQN, parameter) for this module and all descendants, in registration order.
  std::vector<std::pair<std::string, Parameter*>> named_parameters(const std::string& prefix = "");
  /// (FQN, module) including this one (FQN "" or `prefix`), depth first.
  std::vector<std::pair<std::string, Module*>> named_modules(const std::string& prefix = "");
  void apply(const std::function<void(const std::string& fqn, Module&)>& fn);

  void add_forward_pre_hook(PreHook hook) { pre_hooks_.push_back(std::move(hook)); }
  /// Activation checkpointing of this module (nn/checkpoint.h): kWhole checkpoints the whole
  /// call (hooks included); kPointwise is for modules that implement it in their forward.
  void set_checkpoint(CheckpointMode mode) { checkpoint_mode_ = mode; }
  CheckpointMode checkpoint_mode() const { return checkpoint_mode_; }
  void add_forward_hook(PostHook hook) { post_hooks_.push_back(std::move(hook)); }
  bool has_forward_pre_hooks() const { return !pre_hooks_.empty(); }
  /// The forward hooks on (input, output), as operator() runs them after forward: for callers
  /// that compute several modules' forward at once (nn/shared_input_linear.h).
  at::Tensor run_forward_hooks(const at::Tensor& in, at::Tensor out);

  /// Replaces every parameter and buffer by an uninitialised one of the same local shape
  /// on `device` (parameters keep requires_grad and their specs).
  void to_empty(c10::Device device);
  /// Initialises every parameter from its scheme, shard-consistently (dtensor/random.h).
  void init_weights(uint64_t seed);
  /// Names, global and local shapes, dtypes, devices and placements, one line each.
  std::string summary();
  /// Sum of local parameter bytes (what this rank holds).
  int64_t local_parameter_bytes();
  /// Names of parameters whose data is on the meta device.
  std::vector<std::string> meta_parameter_names();

 protected:
  Parameter& register_parameter(const std::string& name, std::vector<int64_t> shape,
                                dtensor::InitScheme init, c10::ScalarType dtype = c10::kFloat);
  void register_buffer(const std::string& name, BufferFactory factory);
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    children_.push_back({name, m});
    return m;
  }

 private:
  std::string type_name_;
  std::vector<std::string> param_order_;
  std::map<std::string, Parameter> params_;
  std::vector<std::pair<std::string, BufferFactory>> buffer_factories_;
  std::map<std::string, at::Tensor> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  std::vector<PreHook> pre_hooks_;
  std::vector<PostHook> post_hooks_;
  CheckpointMode checkpoint_mode_ = CheckpointMode::kNone;
  at::Tensor call(const at::Tensor& x);  // hooks and forward
};

/// Throws if any parameter of `m` is still on meta, listing their names.
void check_materialized(Module& m, const std::string& what);

}  // namespace hyperpar::nn
