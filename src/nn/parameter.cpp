#include "hyperpar/nn/parameter.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "hyperpar/core/device_context.h"
#include "hyperpar/dtensor/dtensor.h"

namespace hyperpar::nn {

std::vector<dtensor::IndexRanges> Parameter::local_ranges() const {
  if (spec) return spec->local_ranges();
  std::vector<dtensor::IndexRanges> r;
  for (int64_t n : shape) r.push_back(n > 0 ? dtensor::IndexRanges{{0, n}} : dtensor::IndexRanges{});
  return r;
}

std::string Parameter::placements_string() const {
  return spec ? dtensor::to_string(spec->placements()) + " on " + spec->mesh().to_string()
              : "(not distributed)";
}

Parameter make_parameter(std::vector<int64_t> shape, dtensor::InitScheme init,
                         c10::ScalarType dtype) {
  const c10::Device device = current_device();
  auto opts = at::TensorOptions().dtype(dtype).device(device);
  at::Tensor t = device.is_meta() ? at::empty(shape, opts) : at::zeros(shape, opts);
  t.requires_grad_(true);
  Parameter p;
  p.data = t;
  p.shape = std::move(shape);
  p.init = init;
  return p;
}

void distribute_parameter(Parameter& p, const mesh::DeviceMesh& mesh,
                          const dtensor::Placements& placements) {
  HP_CHECK(!p.spec, "distribute_parameter: the parameter is already distributed as ",
           p.placements_string());
  dtensor::DTensorSpec spec(mesh, placements, p.shape);
  at::Tensor local;
  {
    at::NoGradGuard no_grad;
    local = p.data.is_meta() ? at::empty(spec.local_shape(), p.data.options())
                             : dtensor::take_ranges(p.data, spec.local_ranges());
  }
  p.data = local.detach().requires_grad_(true);
  p.spec = spec;
}

}  // namespace hyperpar::nn
