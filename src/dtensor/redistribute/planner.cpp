#include "hyperpar/dtensor/redistribute/planner.h"

#include <mutex>
#include <unordered_map>

#include "hyperpar/core/error.h"

namespace hyperpar::dtensor {
namespace {

bool touches(const Placement& p, int64_t d) { return d >= 0 && shard_dim(p) == d; }

bool safe(const Placements& cur, size_t i, const Placement& to) {
  const int64_t a = shard_dim(cur[i]), b = shard_dim(to);
  for (size_t k = i + 1; k < cur.size(); ++k)
    if (touches(cur[k], a) || touches(cur[k], b)) return false;
  return true;
}

struct Key {
  DTensorSpec src;
  Placements dst;
  bool operator==(const Key& o) const { return src == o.src && dst == o.dst; }
};
struct KeyHash {
  size_t operator()(const Key& k) const { return k.src.hash() ^ (hash_value(k.dst) * 7); }
};

std::mutex cache_mutex;
std::unordered_map<Key, std::shared_ptr<const RedistributePlan>, KeyHash>& cache() {
  static std::unordered_map<Key, std::shared_ptr<const RedistributePlan>, KeyHash> c;
  return c;
}
size_t plans_computed = 0;

std::shared_ptr<const RedistributePlan> compute(const DTensorSpec& src, const Placements& dst) {
  auto plan = std::make_shared<RedistributePlan>();
  Placements cur = src.placements();
  auto push = [&](size_t i, const Placement& to) {
    plan->steps.push_back({static_cast<int64_t>(i), cur[i], to, cur, &find_transition(cur[i], to)});
    cur[i] = to;
  };
  const size_t n = cur.size();
  for (size_t i = n; i-- > 0;)
    if (!(cur[i] == dst[i]) && safe(cur, i, dst[i])) push(i, dst[i]);
  if (cur != dst) {
    size_t m = 0;
    while (cur[m] == dst[m]) ++m;
    for (size_t i = n; i-- > m;)
      if (!is_replicate(cur[i])) push(i, Replicate{});
    for (size_t i = m; i < n; ++i)
      if (!is_replicate(dst[i])) push(i, dst[i]);
  }
  return plan;
}

}  // namespace

std::shared_ptr<const RedistributePlan> plan_redistribute(const DTensorSpec& src,
                                                          const Placements& dst) {
  HP_CHECK(static_cast<int64_t>(dst.size()) == src.mesh().ndim(), "redistribute: ", dst.size(),
           " target placements ", to_string(dst), " for a ", src.mesh().ndim(), "-D mesh");
  DTensorSpec check_dst = src.with_placements(dst);  // validates the target
  (void)check_dst;
  std::lock_guard<std::mutex> lock(cache_mutex);
  Key key{src, dst};
  auto it = cache().find(key);
  if (it != cache().end()) return it->second;
  ++plans_computed;
  auto plan = compute(src, dst);
  cache().emplace(std::move(key), plan);
  return plan;
}

size_t redistribute_plans_computed() {
  std::lock_guard<std::mutex> lock(cache_mutex);
  return plans_computed;
}

}  // namespace hyperpar::dtensor
