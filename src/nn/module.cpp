#include "hyperpar/nn/module.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <sstream>

#include "hyperpar/core/device_context.h"
#include "hyperpar/core/error.h"

namespace hyperpar::nn {

at::Tensor Module::operator()(const at::Tensor& x) {
  if (checkpoint_mode_ == CheckpointMode::kWhole)
    return checkpoint([this](const std::vector<at::Tensor>& in) { return call(in[0]); }, {x},
                      type_name_.c_str());
  return call(x);
}

at::Tensor Module::call(const at::Tensor& x) {
  at::Tensor in = x;
  for (auto& h : pre_hooks_) in = h(*this, in);
  return run_forward_hooks(in, forward(in));
}

at::Tensor Module::run_forward_hooks(const at::Tensor& in, at::Tensor out) {
  for (auto& h : post_hooks_) out = h(*this, in, out);
  return out;
}

Parameter& Module::param(const std::string& name) {
  auto it = params_.find(name);
  HP_CHECK(it != params_.end(), type_name_, " has no parameter '", name, "'");
  return it->second;
}

const Parameter& Module::param(const std::string& name) const {
  auto it = params_.find(name);
  HP_CHECK(it != params_.end(), type_name_, " has no parameter '", name, "'");
  return it->second;
}

const at::Tensor& Module::buffer(const std::string& name) const {
  auto it = buffers_.find(name);
  HP_CHECK(it != buffers_.end(), type_name_, " has no buffer '", name, "'");
  return it->second;
}

std::shared_ptr<Module> Module::child(const std::string& name) const {
  for (const auto& [n, m] : children_)
    if (n == name) return m;
  throw Error(detail::concat(type_name_, " has no child module '", name, "'"));
}

Parameter& Module::register_parameter(const std::string& name, std::vector<int64_t> shape,
                                      dtensor::InitScheme init, c10::ScalarType dtype) {
  HP_CHECK(!params_.count(name), type_name_, ": parameter '", name, "' registered twice");
  param_order_.push_back(name);
  return params_.emplace(name, make_parameter(std::move(shape), init, dtype)).first->second;
}

void Module::register_buffer(const std::string& name, BufferFactory factory) {
  buffers_[name] = factory(current_device());
  buffer_factories_.push_back({name, std::move(factory)});
}

std::vector<std::pair<std::string, Parameter*>> Module::named_parameters(
    const std::string& prefix) {
  std::vector<std::pair<std::string, Parameter*>> out;
  for (const auto& n : param_order_) out.push_back({prefix + n, &params_.at(n)});
  for (auto& [n, m] : children_) {
    auto sub = m->named_parameters(prefix + n + ".");
    out.insert(out.end(), sub.begin(), sub.end());
  }
  return out;
}

std::vector<std::pair<std::string, Module*>> Module::named_modules(const std::string& prefix) {
  std::vector<std::pair<std::string, Module*>> out = {{prefix, this}};
  for (auto& [n, m] : children_) {
    auto sub = m->named_modules(prefix.empty() ? n : prefix + "." + n);
    out.insert(out.end(), sub.begin(), sub.end());
  }
  return out;
}

void Module::apply(const std::function<void(const std::string&, Module&)>& fn) {
  for (auto& [fqn, m] : named_modules()) fn(fqn, *m);
}

void Module::to_empty(c10::Device device) {
  for (auto& [fqn, m] : named_modules()) {
    for (auto& [name, p] : m->params_) {
      at::Tensor t = at::empty(p.data.sizes(), p.data.options().device(device));
      p.data = t.requires_grad_(true);
    }
    for (auto& [name, f] : m->buffer_factories_) m->buffers_[name] = f(device);
  }
}

void Module::init_weights(uint64_t seed) {
  at::NoGradGuard no_grad;
  for (auto& [fqn, p] : named_parameters()) {
    HP_CHECK(!p->data.is_meta(), "init_weights: parameter ", fqn,
             " is on meta; call to_empty(device) first");
    dtensor::init_shard(p->data, p->shape, p->local_ranges(), p->init, seed,
                        dtensor::stream_of(fqn));
  }
}

std::string Module::summary() {
  std::ostringstream os;
  int64_t total = 0, local = 0;
  for (auto& [fqn, p] : named_parameters()) {
    int64_t n = 1;
    for (int64_t s : p->shape) n *= s;
    total += n;
    local += p->data.numel();
    os << fqn << "  global " << c10::IntArrayRef(p->shape) << "  local " << p->data.sizes() << "  "
       << p->data.scalar_type() << "  " << p->data.device() << "  " << p->placements_string()
       << "\n";
  }
  os << "parameters: " << total << " global, " << local << " local\n";
  return os.str();
}

int64_t Module::local_parameter_bytes() {
  int64_t b = 0;
  for (auto& [fqn, p] : named_parameters()) b += p->data.numel() * p->data.element_size();
  return b;
}

std::vector<std::string> Module::meta_parameter_names() {
  std::vector<std::string> out;
  for (auto& [fqn, p] : named_parameters())
    if (p->data.is_meta()) out.push_back(fqn);
  return out;
}

void check_materialized(Module& m, const std::string& what) {
  auto names = m.meta_parameter_names();
  if (names.empty()) return;
  std::string list;
  for (size_t i = 0; i < names.size() && i < 20; ++i) list += (i ? ", " : "") + names[i];
  if (names.size() > 20) list += ", ... (" + std::to_string(names.size()) + " in all)";
  throw Error(what +
              ": parameters still on the meta device (call to_empty and init_weights "
              "first): " +
              list);
}

}  // namespace hyperpar::nn
