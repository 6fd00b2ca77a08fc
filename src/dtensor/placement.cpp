#include "hyperpar/dtensor/placement.h"

#include <sstream>

namespace hyperpar::dtensor {

int64_t shard_dim(const Placement& p) {
  if (const auto* s = std::get_if<Shard>(&p)) return s->dim;
  if (const auto* s = std::get_if<StridedShard>(&p)) return s->dim;
  return -1;
}

Placement grad_placement_of(const Placement& p) {
  return is_partial(p) ? Placement{Replicate{}} : p;
}

std::string to_string(const Placement& p) {
  std::ostringstream os;
  if (const auto* s = std::get_if<Shard>(&p)) os << "Shard(" << s->dim << ")";
  if (const auto* s = std::get_if<StridedShard>(&p))
    os << "StridedShard(" << s->dim << ", sf=" << s->split_factor << ")";
  if (is_replicate(p)) os << "Replicate()";
  if (const auto* s = std::get_if<Partial>(&p)) os << "Partial(" << comm::to_string(s->op) << ")";
  return os.str();
}

std::string to_string(const Placements& ps) {
  std::string s = "(";
  for (size_t i = 0; i < ps.size(); ++i) s += (i ? ", " : "") + to_string(ps[i]);
  return s + ")";
}

size_t hash_value(const Placement& p) {
  size_t h = p.index() * 0x9e3779b97f4a7c15ull;
  if (const auto* s = std::get_if<Shard>(&p)) h ^= std::hash<int64_t>()(s->dim) + 1;
  if (const auto* s = std::get_if<StridedShard>(&p))
    h ^= std::hash<int64_t>()(s->dim * 1000003 + s->split_factor) + 2;
  if (const auto* s = std::get_if<Partial>(&p)) h ^= static_cast<size_t>(s->op) + 3;
  return h;
}

size_t hash_value(const Placements& ps) {
  size_t h = ps.size();
  for (const auto& p : ps) h = h * 1000003u ^ hash_value(p);
  return h;
}

}  // namespace hyperpar::dtensor
