#include "shm_collective.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#include "../core/simd_clones.h"
#include "env_byte_count.h"
#include "hyperpar/core/error.h"
#include "shm_arena.h"
#include "shm_peer_pages.h"

namespace hyperpar::comm {

namespace {

constexpr int64_t kSumBlock = 2048;  // 8 KiB of float32 accumulators: stays in L1

// out[i] = ((src[0][i] + src[1][i]) + src[2][i]) + ... for i < len <= kSumBlock: the rank-order
// sum, element by element (vectorising it reorders nothing), divided by `divide_by` unless 0.
HP_SIMD_CLONES
void sum_float_block(const float* const* src, int64_t n_src, int64_t len, float* out,
                     float divide_by) {
  float acc[kSumBlock];
  if (n_src == 1) {
    for (int64_t i = 0; i < len; ++i) acc[i] = src[0][i];
  } else {
    const float *a = src[0], *b = src[1];
    for (int64_t i = 0; i < len; ++i) acc[i] = a[i] + b[i];
  }
  for (int64_t p = 2; p < n_src; ++p) {
    const float* sp = src[p];
    for (int64_t i = 0; i < len; ++i) acc[i] += sp[i];
  }
  if (divide_by != 0.0f)
    for (int64_t i = 0; i < len; ++i) out[i] = acc[i] / divide_by;
  else
    for (int64_t i = 0; i < len; ++i) out[i] = acc[i];
}

// Whether anything but this operation holds lent input `t`: a handle to it beyond the
// operation's own `handles`, or another tensor on its memory (the view base that only t keeps
// alive aside).
bool held_elsewhere(const at::Tensor& t, size_t handles) {
  if (t.use_count() > handles) return true;
  size_t own = 1;
  if (t.is_view()) {
    if (t._base().use_count() > 1) return true;  // more than t's view record holds the base
    own = 2;
  }
  return t.storage().use_count() > own;
}

std::string env_or(const std::string& name, const std::string& fallback) {
  const char* v = std::getenv(name.c_str());
  return v && *v ? std::string(v) : fallback;
}

// One operation: issued when constructed (this rank's contribution is in its ring, or on its
// way over the fallback, and its note is published); completed in wait() (each peer's
// contribution read and marked read).
class ShmCollectiveWork final : public FinishingWork {
 public:
  using Kind = ShmCollectives::Kind;
  ShmCollectiveWork(ShmRing* ring, const ShmCollectives::Fallback* fallback, int64_t n, int64_t me,
                    Kind kind, at::Tensor out, at::Tensor in, uint64_t seq, int tag, bool average)
      : FinishingWork({}),
        ring_(ring),
        fallback_(fallback),
        n_(n),
        me_(me),
        kind_(kind),
        out_(std::move(out)),
        in_(std::move(in)),
        seq_(seq),
        tag_(tag),
        average_(average && kind_ != Kind::kAllGather),
        gather_(kind_ == Kind::kAllGather),
        chunk_(gather_ ? in_.numel() : out_.numel() * out_.element_size()) {
    // A reduce-scatter's input, or an out-of-place all-reduce's (tensor parallel's partial
    // sums), that autograd (or anyone) already put in this process's shared arena is lent
    // where it lies: peers read their parts from it, nothing is copied. (An in-place
    // all-reduce overwrites its input with the sum, which peers may still be reading.)
    const bool may_lend = kind_ == Kind::kReduceScatter ||
                          (kind_ == Kind::kAllReduce && out_.data_ptr() != in_.data_ptr());
    const auto lendable = may_lend ? ShmArena::lendable(in_) : std::nullopt;
    if (lendable) {
      lent_ = true;
      ring_->publish_lent(seq_, lendable->fd, lendable->id, lendable->arena_bytes, lendable->offset,
                          std::make_shared<const at::Tensor>(in_));
      return;
    }
    // Bytes this rank contributes, and where in them the part for rank p starts.
    const int64_t mine = kind_ == Kind::kReduceScatter ? chunk_ * n_ : chunk_;
    const auto region = ring_->begin(seq_, static_cast<size_t>(mine));
    if (region) {
      char* dst = ring_->data(me_) + *region;
      const char* src = static_cast<const char*>(in_.data_ptr());
      if (kind_ == Kind::kReduceScatter) {
        // Peers read only their own parts; this rank sums its part from `in_` directly, so
        // its slot in the region stays unwritten (1/n of the copy saved).
        const auto before = static_cast<size_t>(me_ * chunk_);
        const auto after = static_cast<size_t>((n_ - me_ - 1) * chunk_);
        std::memcpy(dst, src, before);
        std::memcpy(dst + before + chunk_, src + before + chunk_, after);
      } else {
        std::memcpy(dst, src, static_cast<size_t>(mine));
      }
    } else {
      const at::Tensor in_bytes = gather_ ? in_ : in_.view(at::kByte);
      for (int64_t p = 0; p < n_; ++p)
        if (p != me_)
          sends_.push_back(fallback_->send(in_bytes.narrow(0, part(p), chunk_), p, tag_));
    }
    ring_->publish(seq_, region);
    if (gather_) out_.narrow(0, me_ * chunk_, chunk_).copy_(in_);
  }
  ~ShmCollectiveWork() override { wait_unless_done(); }

 private:
  // Where the bytes for rank p start in a contribution.
  int64_t part(int64_t p) const { return kind_ == Kind::kReduceScatter ? p * chunk_ : 0; }

  void backend_wait() override {
    // Every contribution to this rank, as bytes: in its owner's ring, received over the
    // fallback, or (reductions) this rank's own input.
    std::vector<const char*> src(static_cast<size_t>(n_), nullptr);
    std::vector<bool> in_ring(static_cast<size_t>(n_), false);
    // Where a peer lent its contribution: its arena as mapped here, and the arena's size.
    std::vector<std::pair<const char*, size_t>> lent_arena(static_cast<size_t>(n_), {nullptr, 0});
    std::vector<at::Tensor> received;
    for (int64_t p = 0; p < n_; ++p) {
      if (p == me_) {
        if (!gather_) src[p] = static_cast<const char*>(in_.data_ptr()) + part(me_);
        continue;
      }
      const auto note = ring_->wait_note(p, seq_);
      in_ring[p] = note.in_ring;
      if (note.in_ring) {
        src[p] = ring_->data(p) + note.offset + part(me_);
      } else if (note.lent) {
        const char* data = ring_->lent_data(p, note);
        src[p] = data + part(me_);
        lent_arena[p] = {data - note.offset, note.arena_bytes};
      } else {
        at::Tensor buf =
            gather_ ? out_.narrow(0, p * chunk_, chunk_) : at::empty({chunk_}, at::kByte);
        fallback_->recv(buf, p, tag_);
        src[p] = static_cast<const char*>(buf.data_ptr());
        if (!gather_) received.push_back(buf);
      }
    }
    for (auto& w : sends_) w->wait();  // before an all-reduce overwrites what they send
    if (gather_) {
      for (int64_t p = 0; p < n_; ++p)
        if (in_ring[p]) out_.narrow(0, p * chunk_, chunk_).copy_(from_bytes(src[p], at::kByte));
    } else {
      sum_in_rank_order(src);
    }
    for (int64_t p = 0; p < n_; ++p)
      if (lent_arena[p].first)
        ShmPeerPages::for_process().read(lent_arena[p].first, lent_arena[p].second, src[p],
                                         static_cast<size_t>(chunk_));
    for (int64_t p = 0; p < n_; ++p)
      if (p != me_) ring_->mark_read(p, seq_);
    // Lent data the caller still holds (it may write it once this returns, as after any
    // collective) must be read by every peer first; data only this operation holds stays
    // with the ring until it is read, and this rank goes on at once.
    // (While peers may read it, the ring holds a second handle to `in_`.)
    if (lent_ && ring_->live(seq_) && held_elsewhere(in_, 2)) ring_->wait_all_read(seq_);
    ring_->reclaim();
  }

  at::Tensor from_bytes(const char* bytes, at::ScalarType dtype) const {
    return at::from_blob(const_cast<char*>(bytes),
                         {chunk_ / static_cast<int64_t>(c10::elementSize(dtype))}, dtype);
  }

  // out = src[0] + src[1] + ... in rank order (deterministic, bitwise the same on every rank).
  // Floating types in one pass over blocks that stay in cache (each element read once from
  // every source, written once); float16/bfloat16 accumulate in float32, as a reduction over
  // them would. An all-reduce's output is its own contribution: the blocks are summed before
  // any is stored, so that is safe. An average divides as the blocks are stored where the
  // sum is kept in the output's own dtype (the same rounding as dividing `out` afterwards).
  void sum_in_rank_order(const std::vector<const char*>& src) {
    switch (out_.scalar_type()) {
      case at::kFloat:
        return sum_blocks<float, float>(src, average_);
      case at::kDouble:
        return sum_blocks<double, double>(src, average_);
      case at::kHalf:
        sum_blocks<at::Half, float>(src, false);
        break;
      case at::kBFloat16:
        sum_blocks<at::BFloat16, float>(src, false);
        break;
      default: {  // integers: one tensor add per source
        const auto dtype = out_.scalar_type();
        at::Tensor acc = from_bytes(src[0], dtype).clone();
        for (int64_t p = 1; p < n_; ++p) acc.add_(from_bytes(src[p], dtype));
        out_.view({-1}).copy_(acc);
      }
    }
    if (average_) out_.div_(static_cast<double>(n_));
  }
  template <typename T, typename Acc>
  // `divide` (only where T is Acc): each stored sum divided by the group size.
  void sum_blocks(const std::vector<const char*>& src, bool divide) {
    constexpr int64_t kBlock = kSumBlock;
    const int64_t count = chunk_ / static_cast<int64_t>(sizeof(T));
    T* out = out_.data_ptr<T>();
    const Acc n = static_cast<Acc>(n_);
    if constexpr (std::is_same_v<T, float>) {  // the hot case: vectorised for the machine
      at::parallel_for(0, (count + kBlock - 1) / kBlock, 16, [&](int64_t b0, int64_t b1) {
        std::vector<const float*> at_block(src.size());
        for (int64_t b = b0; b < b1; ++b) {
          const int64_t first = b * kBlock, len = std::min(kBlock, count - first);
          for (size_t p = 0; p < src.size(); ++p)
            at_block[p] = reinterpret_cast<const float*>(src[p]) + first;
          sum_float_block(at_block.data(), n_, len, out + first, divide ? n : 0.0f);
        }
      });
      return;
    }
    at::parallel_for(0, (count + kBlock - 1) / kBlock, 16, [&](int64_t b0, int64_t b1) {
      Acc acc[kBlock];
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t first = b * kBlock, len = std::min(kBlock, count - first);
        const T* s0 = reinterpret_cast<const T*>(src[0]) + first;
        for (int64_t i = 0; i < len; ++i) acc[i] = static_cast<Acc>(s0[i]);
        for (int64_t p = 1; p < n_; ++p) {
          const T* sp = reinterpret_cast<const T*>(src[static_cast<size_t>(p)]) + first;
          for (int64_t i = 0; i < len; ++i) acc[i] += static_cast<Acc>(sp[i]);
        }
        if (divide)
          for (int64_t i = 0; i < len; ++i) out[first + i] = static_cast<T>(acc[i] / n);
        else
          for (int64_t i = 0; i < len; ++i) out[first + i] = static_cast<T>(acc[i]);
      }
    });
  }
  bool backend_test() override {
    // Completion needs this rank's own reads: done at wait().
    return false;
  }
  void on_finished() override {
    out_ = at::Tensor();
    in_ = at::Tensor();
    sends_.clear();
  }

  ShmRing* ring_;
  const ShmCollectives::Fallback* fallback_;
  int64_t n_, me_;
  Kind kind_;
  at::Tensor out_, in_;
  uint64_t seq_;
  int tag_;
  bool average_;  // reductions: divide the sum by n_
  bool gather_;
  bool lent_ = false;  // this rank's input is lent from its arena, not copied into its ring
  int64_t chunk_;
  std::vector<WorkHandle> sends_;
};

}  // namespace

ShmSettings shm_settings(const std::string& prefix) {
  ShmSettings s;
  const std::string var = "HYPERPAR_" + prefix + "_SHM";
  s.enabled = env_or(var, "1") != "0";
  if (const auto bytes = env_byte_count(var + "_BYTES")) s.ring_bytes = *bytes;
  return s;
}

ShmCollectives::ShmCollectives(std::unique_ptr<ShmRing> ring, int64_t size, int64_t rank,
                               Fallback fallback)
    : ring_(std::move(ring)), size_(size), rank_(rank), fallback_(std::move(fallback)) {}

WorkHandle ShmCollectives::start(Kind kind, at::Tensor out, at::Tensor in, uint64_t call, int tag,
                                 bool average) {
  HP_CHECK(enabled(), "ShmCollectives::start: the group's rings are disabled");
  return std::make_shared<ShmCollectiveWork>(ring_.get(), &fallback_, size_, rank_, kind,
                                             std::move(out), std::move(in), call, tag, average);
}

}  // namespace hyperpar::comm
