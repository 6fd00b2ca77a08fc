#include <gtest/gtest.h>

#include <thread>

#include "hyperpar/core/device_context.h"

using hyperpar::current_device;
using hyperpar::DeviceContext;

TEST(DeviceContext, DefaultIsCpuAndNests) {
  EXPECT_EQ(current_device(), c10::Device(c10::kCPU));
  {
    DeviceContext meta(c10::kMeta);
    EXPECT_EQ(current_device(), c10::Device(c10::kMeta));
    {
      DeviceContext cpu(c10::kCPU);
      EXPECT_EQ(current_device(), c10::Device(c10::kCPU));
    }
    EXPECT_EQ(current_device(), c10::Device(c10::kMeta));
  }
  EXPECT_EQ(current_device(), c10::Device(c10::kCPU));
}

TEST(DeviceContext, IsThreadLocal) {
  DeviceContext meta(c10::kMeta);
  c10::Device seen(c10::kMeta);
  std::thread t([&] { seen = current_device(); });
  t.join();
  EXPECT_EQ(seen, c10::Device(c10::kCPU));
  EXPECT_EQ(current_device(), c10::Device(c10::kMeta));
}
