#include "hyperpar/dtensor/shard_math.h"

#include <algorithm>

#include "hyperpar/core/error.h"

namespace hyperpar::dtensor {

IndexRange chunk_range(int64_t n, int64_t parts, int64_t index) {
  HP_CHECK(parts > 0 && n >= 0 && index >= 0 && index < parts, "chunk_range(", n, ", ", parts, ", ",
           index, "): expected n >= 0, parts > 0 and 0 <= index < parts");
  const int64_t c = (n + parts - 1) / parts;
  const int64_t start = std::min(index * c, n);
  const int64_t end = std::min(start + c, n);
  return {start, end - start};
}

int64_t max_chunk_size(int64_t n, int64_t parts) { return (n + parts - 1) / parts; }

int64_t total_size(const IndexRanges& ranges) {
  int64_t t = 0;
  for (const auto& r : ranges) t += r.size;
  return t;
}

IndexRanges select_positions(const IndexRanges& ranges, int64_t start, int64_t size) {
  IndexRanges out;
  int64_t pos = 0;
  for (const auto& r : ranges) {
    const int64_t lo = std::max(start, pos), hi = std::min(start + size, pos + r.size);
    if (hi > lo) {
      IndexRange piece{r.start + (lo - pos), hi - lo};
      if (!out.empty() && out.back().start + out.back().size == piece.start)
        out.back().size += piece.size;
      else
        out.push_back(piece);
    }
    pos += r.size;
  }
  return out;
}

IndexRanges held_positions(int64_t n, const Placement& p, int64_t k, int64_t coord) {
  if (const auto* ss = std::get_if<StridedShard>(&p)) {
    HP_CHECK(ss->split_factor > 0, "StridedShard split_factor must be positive, got ",
             ss->split_factor);
    IndexRanges out;
    for (int64_t piece = 0; piece < ss->split_factor; ++piece) {
      const IndexRange pr = chunk_range(n, ss->split_factor, piece);
      const IndexRange mine = chunk_range(pr.size, k, coord);
      if (mine.size > 0) out.push_back({pr.start + mine.start, mine.size});
    }
    return out;
  }
  HP_CHECK(is_shard(p), "held_positions needs a Shard or StridedShard placement, got ",
           to_string(p));
  const IndexRange r = chunk_range(n, k, coord);
  return r.size > 0 ? IndexRanges{r} : IndexRanges{};
}

std::vector<IndexRanges> local_ranges(const std::vector<int64_t>& global_shape,
                                      const std::vector<int64_t>& mesh_shape,
                                      const std::vector<int64_t>& coord,
                                      const Placements& placements) {
  HP_CHECK(mesh_shape.size() == placements.size() && coord.size() == mesh_shape.size(),
           "local_ranges: ", placements.size(), " placements and a ", coord.size(),
           "-D coordinate for a ", mesh_shape.size(), "-D mesh");
  std::vector<IndexRanges> out;
  for (int64_t n : global_shape) out.push_back(n > 0 ? IndexRanges{{0, n}} : IndexRanges{});
  const int64_t nd = static_cast<int64_t>(global_shape.size());
  for (size_t m = 0; m < placements.size(); ++m) {
    const int64_t d = shard_dim(placements[m]);
    if (d < 0) continue;
    HP_CHECK(d < nd, "placement ", to_string(placements[m]), " on mesh dim ", m, " shards dim ", d,
             " of a ", nd, "-D tensor");
    const IndexRanges pos =
        held_positions(total_size(out[d]), placements[m], mesh_shape[m], coord[m]);
    IndexRanges next;
    for (const auto& p : pos)
      for (const auto& r : select_positions(out[d], p.start, p.size)) {
        if (!next.empty() && next.back().start + next.back().size == r.start)
          next.back().size += r.size;
        else
          next.push_back(r);
      }
    out[d] = std::move(next);
  }
  return out;
}

std::vector<int64_t> local_shape(const std::vector<int64_t>& global_shape,
                                 const std::vector<int64_t>& mesh_shape,
                                 const std::vector<int64_t>& coord, const Placements& placements) {
  std::vector<int64_t> shape;
  for (const auto& r : local_ranges(global_shape, mesh_shape, coord, placements))
    shape.push_back(total_size(r));
  return shape;
}

}  // namespace hyperpar::dtensor
