// ShmRing: a byte stream in shared memory from one process to another, which replaces a local
// session's socket for the frames of one direction (docs/protocol.md, "Replies through shared
// memory", "Requests through shared memory"): the worker's frames to its client (a reply ring),
// and the client's frames to its worker (a request ring).
//
// A blocking call through a socket costs the sender a sendmsg and the receiver a recvmsg (and,
// while it spins for the message, a system call per turn). Through the ring the sender copies
// the frame into memory both map and the spinning receiver sees it there: no system call on
// either side. Only a receiver that sleeps is woken, by a doorbell: one byte on the session's
// socket, which the receiver waits on in poll() (so a peer that dies is noticed at once, as
// before: the socket closes). The stream's bytes are the frames the socket would have carried,
// in the same order; in that direction the socket afterwards carries only doorbells and, for a
// request ring, the descriptors that go with requests (each one byte with SCM_RIGHTS, sent just
// before the frame it belongs to, whose header says so: proto/frame.h, kFrameFlagDescriptor).
//
// The client creates both rings: a memfd of kRingHeaderBytes + capacity, sealed against
// shrinking and growing, passed to the worker with a `replyRing` or `requestRing` request. The
// header holds the positions and wake-up flags, each on its own cache line:
//
//   0    u64 magic (kRingMagic), u64 capacity (written by the client; the worker ignores both)
//   64   u64 head: bytes written so far (the producer's; release on write)
//   128  u64 tail: bytes read so far (the consumer's)
//   192  u32 consumer_sleeping: the consumer is about to wait on the socket (doorbell wanted)
//   256  u32 producer_waiting, u32 space_seq: the producer waits for room (futex on space_seq)
//   320  u32 producer_cpu: the CPU the producer last wrote from, + 1 (0: not said; a hint only;
//        written by a request ring's producer, the client, for its worker)
//
// The bytes of stream offset x lie at kRingHeaderBytes + (x mod capacity). Neither side reads
// its own position back from shared memory (its private count is the truth), and each checks
// the other's against it: a tail behind the bytes read or ahead of those written, or a head
// behind the bytes read or more than a ring ahead of them, is a broken ring (kDataLoss), which
// ends the session and never faults either side. The consumer copies bytes out before anyone
// looks at them, so a producer that rewrites what it published changes nothing already read.
//
// Threads: one producer thread at a time (the callers serialize writers, as for a socket), one
// consumer thread at a time; Close() from any thread.
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>

#include "common/status.h"

namespace gmux::proto {

inline constexpr uint64_t kRingMagic = 0x31474E4952584D47ull;  // "GMXRING1"
inline constexpr size_t kRingHeaderBytes = 4096;
inline constexpr size_t kRingMinBytes = 64u << 10;
inline constexpr size_t kRingMaxBytes = 16u << 20;

class ShmRing {
 public:
  // The client's end of a reply ring (it consumes): creates the memfd (capacity a power of two
  // within [kRingMinBytes, kRingMaxBytes]) and maps it. `*pass_fd` receives the descriptor to
  // send with the `replyRing` request (the caller closes it once sent). `socket` is where
  // doorbells arrive.
  static Result<std::unique_ptr<ShmRing>> CreateConsumer(size_t capacity, int socket,
                                                         int* pass_fd);
  // The worker's end of a reply ring (it produces), over the client's memfd `fd` (consumed):
  // checked to be a sealed memfd of at least kRingHeaderBytes + `capacity` bytes, `capacity` a
  // power of two within the bounds, the positions at 0. Doorbells go to `socket`.
  static Result<std::unique_ptr<ShmRing>> OpenProducer(int fd, size_t capacity, int socket);
  // The same two for a request ring: the client creates it and produces, the worker opens it
  // and consumes (with the same checks; the descriptors that go with requests arrive on
  // `socket`, TakePassedFd).
  static Result<std::unique_ptr<ShmRing>> CreateProducer(size_t capacity, int socket,
                                                         int* pass_fd);
  static Result<std::unique_ptr<ShmRing>> OpenConsumer(int fd, size_t capacity, int socket);
  ~ShmRing();
  ShmRing(const ShmRing&) = delete;
  ShmRing& operator=(const ShmRing&) = delete;

  size_t capacity() const { return capacity_; }

  // Producer. Copies what fits of iov[*first...] into the ring (advancing *first and the partly
  // written entry, as a socket send would) and rings the doorbell if the consumer sleeps.
  // `wait_until`: waits for room until then (time_point::max(): until everything is written or
  // the ring is closed); with `wait_until` in the past, writes what fits now. kDataLoss for a
  // broken ring, kUnavailable once closed.
  Status Write(iovec* iov, size_t count, size_t* first,
               std::chrono::steady_clock::time_point wait_until);
  // Ends the producer's waits now and for good (the session closes). A producer waiting for
  // room also stops when the socket says the consumer is gone.
  void Close();

  // Consumer. Copies up to `n` available bytes to `to` (null: drops them) and returns how many
  // (0: nothing there). kDataLoss for a broken ring.
  Result<size_t> Read(uint8_t* to, size_t n);
  // Whether bytes are there to read.
  bool Readable() const;
  // The CPU the producer's last write came from (-1: not said, or not a CPU number). A hint the
  // producer controls: use it only to place this process's own threads.
  int ProducerCpu() const;
  // Waits for bytes: true when there are some; false when `timeout_ms` (-1: none) passed, or
  // the socket says the producer is gone (`*closed` then true; what it wrote before is still
  // readable). Drains doorbells (and keeps the descriptors that came with them).
  bool WaitReadable(int timeout_ms, bool* closed);
  // The next descriptor the producer passed on the socket for a frame (the caller owns it), or
  // -1 when none came: the producer sends it before the frame, so one whose frame was read is
  // already there. At most kMaxPassedFds wait to be taken; more are closed.
  int TakePassedFd();
  static constexpr size_t kMaxPassedFds = 64;

 private:
  struct Header;
  explicit ShmRing(const char* what) : what_(what) {}
  static Result<std::unique_ptr<ShmRing>> Create(const char* what, const char* memfd_name,
                                                 size_t capacity, int socket, int* pass_fd);
  static Result<std::unique_ptr<ShmRing>> Open(const char* what, int fd, size_t capacity,
                                               int socket);
  Header* header() const { return reinterpret_cast<Header*>(map_); }
  uint8_t* data() const { return static_cast<uint8_t*>(map_) + kRingHeaderBytes; }
  void Doorbell();
  // Reads what the socket has without waiting: doorbells are dropped, descriptors kept. False
  // when the socket says the peer is gone.
  bool DrainSocket();
  // Whether the socket says the peer is gone (a producer waiting for room looks).
  bool PeerGone() const;

  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  size_t capacity_ = 0;
  int socket_ = -1;      // not owned
  uint64_t position_ = 0;  // the producer's head, or the consumer's tail: never read back
  bool says_cpu_ = false;  // a request ring's producer: writes its CPU into the header
  int cpu_ = -1;           // the producer's CPU as last written to the header
  std::atomic<bool> closed_{false};
  const char* what_;         // "reply ring" or "request ring", for messages
  std::deque<int> passed_;   // descriptors that came on the socket, not yet taken (consumer)
};

}  // namespace gmux::proto
