#include "hyperpar/core/device_context.h"

namespace hyperpar {
namespace {
thread_local c10::Device ambient_device{c10::kCPU};
}

DeviceContext::DeviceContext(c10::Device device) : previous_(ambient_device) {
  ambient_device = device;
}
DeviceContext::~DeviceContext() { ambient_device = previous_; }

c10::Device current_device() { return ambient_device; }

}  // namespace hyperpar
