#pragma once
// ShmRing: one shared-memory segment per rank of a communicator whose ranks share a host,
// mapped by every rank of the group, so that a collective's data moves by one copy between
// processes instead of through TCP sockets (two copies and the TCP stack per byte). Used by
// the gloo and MPI backends' shared-memory collectives (shm_collective.h; internal to comm/).
//
// Every operation has a sequence number, the same on every rank of the group. For it, each
// rank publishes a note in its own segment: where in its segment's data area it wrote what
// it contributes (begin() hands out the lowest free region of its data area that fits, so the
// pages in use stay about what is in flight), or that there was no room and the data goes
// over the backend instead; begin() never waits for space, so a rank never blocks on a peer
// that has not yet read. A peer waits for the note
// (a futex on the shared word: no busy wait, and a peer that exited is detected by its pid),
// reads the data from its mapping and marks it read; once every peer has, the owner reuses
// the region and the note's slot. Data that already lies in the owner's shared arena
// (shm_arena.h) is lent instead of copied (publish_lent): the note says where, peers read it
// from their mapping of that arena, and the owner holds it until every peer has.
//
//   ShmRing ring(exchange, 8, my_rank, 64 << 20);  // collective over the group
//   auto region = ring.begin(seq, bytes);           // owner
//   if (region) memcpy(ring.data(my_rank) + *region, src, bytes);
//   ring.publish(seq, region);
//   ...
//   auto note = ring.wait_note(owner, seq);         // a peer
//   if (note.in_ring) memcpy(dst, ring.data(owner) + note.offset, bytes);
//   ring.mark_read(owner, seq);
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace hyperpar::comm {

class ShmRing {
 public:
  /// Publishes this rank's string and returns every rank's, in group rank order (a blocking
  /// exchange, e.g. through the rendezvous store). Called twice per ring: identities (host,
  /// pid, segment), then whether every peer's segment could be mapped.
  using Exchange = std::function<std::vector<std::string>(const std::string& mine, int round)>;

  /// Creates this rank's segment and maps every peer's. Collective over the group. When the
  /// ranks are not all on one host, or a mapping fails anywhere, the ring is disabled on
  /// every rank alike (enabled() false; the outcome is exchanged).
  ShmRing(const Exchange& exchange, int64_t size, int64_t rank, size_t capacity_bytes);
  ~ShmRing();
  ShmRing(const ShmRing&) = delete;
  ShmRing& operator=(const ShmRing&) = delete;

  bool enabled() const { return enabled_; }
  const std::string& disabled_reason() const { return disabled_reason_; }
  char* data(int64_t r) { return data_[static_cast<size_t>(r)]; }

  /// Starts operation `seq` on this rank: the offset of the lowest free region of `bytes`
  /// in its data area (regions every peer has read are free again, in any order), or
  /// nothing when none fits now. Waits only if the note slot of the
  /// operation kSlots earlier is still being read.
  std::optional<size_t> begin(uint64_t seq, size_t bytes);
  /// Publishes this rank's note for `seq` (its data is in place) and wakes waiting peers.
  void publish(uint64_t seq, const std::optional<size_t>& region);
  /// Starts and publishes operation `seq` with its data lent instead of copied: it lies at
  /// `offset` in this rank's arena (shm_arena.h: ShmArena::Lent's fields), and
  /// `keep` holds it, unchanged, until every peer has read it.
  void publish_lent(uint64_t seq, int arena_fd, uint64_t arena_id, size_t arena_bytes,
                    size_t offset, std::shared_ptr<const void> keep);

  struct Note {
    bool in_ring;  // at `offset` in the owner's ring
    size_t offset;
    bool lent;  // at `offset` in the owner's arena: read it through lent_data()
    int arena_fd;
    uint64_t arena_id;
    size_t arena_bytes;
  };
  /// Waits for `owner`'s note for `seq`. Throws PeerError when the owner's process is gone.
  Note wait_note(int64_t owner, uint64_t seq);
  /// Where `owner`'s lent data for a note lies in this process (its arena mapped once).
  /// Throws PeerError when the arena cannot be mapped.
  const char* lent_data(int64_t owner, const Note& note);
  /// This rank is done with what `owner` published for `seq`.
  void mark_read(int64_t owner, uint64_t seq);
  /// Waits until every peer has read what this rank published for `seq` (for lent data whose
  /// owner must change it next), then lets go of whatever is read.
  void wait_all_read(uint64_t seq);
  /// Lets go of the regions and lent data every peer has read.
  void reclaim();
  /// Whether some peer may still read what this rank published for `seq`.
  bool live(uint64_t seq) const;

 private:
  static constexpr size_t kSlots = 1024;  // operations whose notes can be outstanding
  static constexpr size_t kSlotBytes = 64;
  static constexpr size_t kHeaderBytes = kSlots * kSlotBytes;
  struct Slot;  // in shared memory, one per seq % kSlots
  Slot* slot(int64_t owner, uint64_t seq);
  // Registers `seq` as this rank's next operation once its note slot is free.
  void take_slot(uint64_t seq);
  void wait_until(int64_t owner, uint32_t* word, uint32_t want, const char* what);

  int64_t size_, rank_;
  size_t capacity_;
  bool enabled_ = false;
  std::string disabled_reason_;
  int fd_ = -1;
  std::vector<char*> maps_, data_;
  std::vector<int64_t> pids_;
  struct Live {
    uint64_t seq;
    bool in_ring;
    size_t offset, bytes;
    std::shared_ptr<const void> lent;  // what keeps lent data alive until it is read
  };
  std::deque<Live> live_;  // operations whose notes peers may still read, oldest first
};

}  // namespace hyperpar::comm
