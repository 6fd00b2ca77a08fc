#include "hyperpar/parallel/loss_parallel.h"

#include <ATen/ATen.h>

#include "hyperpar/comm/traffic.h"
#include "hyperpar/core/error.h"
#include "hyperpar/dtensor/shard_math.h"
#include "hyperpar/nn/cross_entropy.h"
#include "hyperpar/parallel/tensor_parallel.h"

namespace hyperpar::parallel {

at::Tensor vocab_parallel_cross_entropy(const at::Tensor& local_logits, const at::Tensor& targets,
                                        const mesh::DeviceMesh& tp, int64_t vocab_size,
                                        int64_t ignore_index) {
  HP_CHECK(tp.ndim() == 1, "vocab_parallel_cross_entropy: needs a 1-D tp mesh, got ",
           tp.to_string());
  const auto coord = tp.get_coordinate();
  HP_CHECK(coord.has_value(), "vocab_parallel_cross_entropy: this rank is not in the tp mesh ",
           tp.to_string());
  const auto shard = dtensor::chunk_range(vocab_size, tp.size(), (*coord)[0]);
  const int64_t chunk = local_logits.size(-1);
  HP_CHECK(chunk == shard.size, "vocab_parallel_cross_entropy: logits of this rank have ", chunk,
           " vocabulary entries, expected ", shard.size, " (chunk ", (*coord)[0], " of ",
           vocab_size, " over ", tp.size(), " tp ranks)");
  auto group = tp.get_group(0);
  nn::VocabColumns columns;
  columns.start = shard.start;
  columns.vocab = vocab_size;
  columns.combine_max = [&group](at::Tensor& row_max) {
    comm::TrafficScope traffic(tp_traffic_scope("output loss"));
    group->all_reduce(row_max, comm::ReduceOp::kMax, {"output loss max"});
  };
  columns.combine_sums = [&group](at::Tensor& sums) {
    comm::TrafficScope traffic(tp_traffic_scope("output loss"));
    group->all_reduce(sums, comm::ReduceOp::kSum, {"output loss sums"});
  };
  return nn::fused_cross_entropy(local_logits, targets, columns, ignore_index);
}

}  // namespace hyperpar::parallel
