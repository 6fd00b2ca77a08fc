#pragma once
// DeviceContext: RAII, thread-local, nestable ambient device for hyperpar's own parameter
// factories (meta for deferred initialisation, cpu, later cuda).
//
//   {
//     DeviceContext meta(c10::kMeta);   // current_device() == meta
//     { DeviceContext cpu(c10::kCPU); } // nested: cpu, then meta again
//   }                                   // back to the previous device (cpu by default)
//
// Library bookkeeping (meshes, ranks, shard offsets) never consults it: see DESIGN.md
// invariant 1. Only parameter/buffer factories read current_device().
#include <c10/core/Device.h>

namespace hyperpar {

class DeviceContext {
 public:
  explicit DeviceContext(c10::Device device);
  ~DeviceContext();
  DeviceContext(const DeviceContext&) = delete;
  DeviceContext& operator=(const DeviceContext&) = delete;

 private:
  c10::Device previous_;
};

/// The innermost active DeviceContext's device on this thread; cpu when none is active.
c10::Device current_device();

}  // namespace hyperpar
