// bench_collectives: time of all_gather, reduce_scatter and all_reduce for 1, 16 and 64 MiB
// (per-rank input of all_reduce / reduce_scatter, per-rank output of all_gather) through
// hyperpar's Communicator and through the raw MPI call, with their ratio. Run on 8 ranks:
//   build/tools/hyperpar-run --worker_num 8 -- build/bench/bench_collectives
#include <ATen/ATen.h>
#include <mpi.h>

#include <chrono>
#include <cstdio>

#include "hyperpar/comm/world.h"
#include "hyperpar/mesh/device_mesh.h"

using namespace hyperpar;

namespace {
template <typename F>
double time_ms(F&& f, int iters) {
  f();
  MPI_Barrier(MPI_COMM_WORLD);
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) f();
  MPI_Barrier(MPI_COMM_WORLD);
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() /
         iters;
}
}  // namespace

int main() {
  auto world = comm::World::from_env();
  auto m = mesh::DeviceMesh::init(world, {world->size()}, {"dp"});
  auto g = m.get_group(0);
  const int64_t n = world->size();
  if (world->rank() == 0)
    std::printf("%-16s %8s %12s %12s %8s\n", "collective", "MiB", "hyperpar ms", "raw MPI ms",
                "ratio");
  for (int64_t mib : {1, 16, 64}) {
    const int64_t elems = mib * 1024 * 1024 / 4;
    const int iters = mib >= 64 ? 3 : 10;
    at::Tensor big = at::ones({elems}), gathered = at::empty({elems * n});
    at::Tensor rs_out = at::empty({elems / n});
    struct Row {
      const char* name;
      double hp, raw;
    };
    Row rows[] = {
        {"all_gather", time_ms([&] { g->all_gather_into_tensor(gathered, big); }, iters),
         time_ms(
             [&] {
               MPI_Allgather(big.data_ptr(), elems, MPI_FLOAT, gathered.data_ptr(), elems,
                             MPI_FLOAT, MPI_COMM_WORLD);
             },
             iters)},
        {"reduce_scatter",
         time_ms([&] { g->reduce_scatter_tensor(rs_out, big, comm::ReduceOp::kSum); }, iters),
         time_ms(
             [&] {
               MPI_Reduce_scatter_block(big.data_ptr(), rs_out.data_ptr(), elems / n, MPI_FLOAT,
                                        MPI_SUM, MPI_COMM_WORLD);
             },
             iters)},
        {"all_reduce", time_ms([&] { g->all_reduce(big, comm::ReduceOp::kSum); }, iters),
         time_ms(
             [&] {
               MPI_Allreduce(MPI_IN_PLACE, big.data_ptr(), elems, MPI_FLOAT, MPI_SUM,
                             MPI_COMM_WORLD);
             },
             iters)},
    };
    if (world->rank() == 0)
      for (auto& r : rows)
        std::printf("%-16s %8lld %12.2f %12.2f %8.3f\n", r.name, (long long)mib, r.hp, r.raw,
                    r.hp / r.raw);
  }
  return 0;
}
