// ReusedBuffer: requests up to the storage's size share one allocation (same data pointer),
// a larger request or another dtype allocates anew, with a quarter of headroom.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "hyperpar/core/reused_buffer.h"

using namespace hyperpar;

TEST(ReusedBuffer, SharesOneStorageUntilARequestOutgrowsIt) {
  ReusedBuffer b;
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  at::Tensor first = b.take({8, 4}, f32);  // 32 elements: storage of 40
  EXPECT_EQ(first.sizes(), at::IntArrayRef({8, 4}));
  EXPECT_TRUE(first.is_contiguous());
  void* base = first.data_ptr();
  first.fill_(1.0f);
  at::Tensor smaller = b.take({3, 4}, f32);
  at::Tensor within_headroom = b.take({10, 4}, f32);  // 40 elements: still fits
  EXPECT_EQ(smaller.data_ptr(), base);
  EXPECT_EQ(within_headroom.data_ptr(), base);
  EXPECT_EQ(smaller[0][0].item<float>(), 1.0f);  // the same memory, not a fresh tensor
  EXPECT_EQ(b.allocations(), 1);
  at::Tensor larger = b.take({11, 4}, f32);
  EXPECT_NE(larger.data_ptr(), base);
  EXPECT_EQ(b.allocations(), 2);
  at::Tensor other_dtype = b.take({2}, f32.dtype(at::kDouble));
  EXPECT_EQ(other_dtype.scalar_type(), at::kDouble);
  EXPECT_EQ(b.allocations(), 3);
  EXPECT_EQ(b.takes(), 5);
  EXPECT_EQ(b.take({0, 4}, f32.dtype(at::kDouble)).numel(), 0);
}
