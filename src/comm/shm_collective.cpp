#include "shm_collective.h"

#include <ATen/ATen.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "hyperpar/core/error.h"

namespace hyperpar::comm {

namespace {

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
                    Kind kind, at::Tensor out, at::Tensor in, uint64_t seq, int tag,
                    std::function<void()> on_done)
      : FinishingWork(std::move(on_done)),
        ring_(ring),
        fallback_(fallback),
        n_(n),
        me_(me),
        kind_(kind),
        out_(std::move(out)),
        in_(std::move(in)),
        seq_(seq),
        tag_(tag),
        gather_(kind_ == Kind::kAllGather),
        chunk_(gather_ ? in_.numel() : out_.numel() * out_.element_size()) {
    // Bytes this rank contributes, and where in them the part for rank p starts.
    const int64_t mine = kind_ == Kind::kReduceScatter ? chunk_ * n_ : chunk_;
    const auto region = ring_->begin(seq_, static_cast<size_t>(mine));
    if (region) {
      std::memcpy(ring_->data(me_) + *region, in_.data_ptr(), static_cast<size_t>(mine));
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
    // float16/bfloat16 sums accumulate in float32, as a reduction over them would. An
    // all-reduce sums beside its tensor, which holds this rank's contribution until the end.
    const auto dtype = out_.scalar_type();
    const bool reduced = !gather_ && (dtype == at::kHalf || dtype == at::kBFloat16);
    at::Tensor acc;
    if (kind_ == Kind::kReduceScatter && !reduced)
      acc = out_;
    else if (!gather_)
      acc = at::empty(out_.sizes(), reduced ? at::kFloat : dtype);
    for (int64_t p = 0; p < n_; ++p) {
      at::Tensor src;  // bytes: peer p's contribution to this rank, or this rank's own
      bool in_ring = false;
      if (p == me_) {
        if (gather_) continue;
        src = in_.view(at::kByte).narrow(0, part(me_), chunk_);
      } else {
        const auto note = ring_->wait_note(p, seq_);
        in_ring = note.in_ring;
        if (in_ring) {
          src = at::from_blob(ring_->data(p) + note.offset + part(me_), {chunk_}, at::kByte);
        } else {
          src = gather_ ? out_.narrow(0, p * chunk_, chunk_) : at::empty({chunk_}, at::kByte);
          fallback_->recv(src, p, tag_);
        }
      }
      if (gather_) {
        if (in_ring) out_.narrow(0, p * chunk_, chunk_).copy_(src);
      } else if (p == 0) {
        acc.copy_(src.view(dtype));
      } else {
        acc.add_(src.view(dtype));
      }
      if (p != me_) ring_->mark_read(p, seq_);
    }
    for (auto& w : sends_) w->wait();  // before an all-reduce overwrites its tensor
    if (acc.defined() && !acc.is_same(out_)) out_.copy_(acc);
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
  bool gather_;
  int64_t chunk_;
  std::vector<WorkHandle> sends_;
};

}  // namespace

ShmSettings shm_settings(const std::string& prefix) {
  ShmSettings s;
  const std::string var = "HYPERPAR_" + prefix + "_SHM";
  s.enabled = env_or(var, "1") != "0";
  const std::string bytes = env_or(var + "_BYTES", "");
  if (!bytes.empty()) {
    const bool digits = bytes.find_first_not_of("0123456789") == std::string::npos;
    unsigned long long n = 0;
    try {
      if (digits) n = std::stoull(bytes);
    } catch (const std::exception&) {
      n = 0;  // out of range
    }
    HP_CHECK(n > 0, var, "_BYTES must be a positive byte count, got '", bytes, "'");
    s.ring_bytes = static_cast<size_t>(n);
  }
  return s;
}

ShmCollectives::ShmCollectives(std::unique_ptr<ShmRing> ring, int64_t size, int64_t rank,
                               Fallback fallback)
    : ring_(std::move(ring)), size_(size), rank_(rank), fallback_(std::move(fallback)) {}

WorkHandle ShmCollectives::start(Kind kind, at::Tensor out, at::Tensor in, uint64_t call, int tag,
                                 std::function<void()> on_done) {
  HP_CHECK(enabled(), "ShmCollectives::start: the group's rings are disabled");
  return std::make_shared<ShmCollectiveWork>(ring_.get(), &fallback_, size_, rank_, kind,
                                             std::move(out), std::move(in), call, tag,
                                             std::move(on_done));
}

}  // namespace hyperpar::comm
