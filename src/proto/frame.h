// Framing and bounds-checked encode/decode of gmux wire messages (no sockets are opened here).
//
// A frame is a 16-byte header followed by a payload. All header fields are little-endian:
//
//   offset  size  field
//   0       4     magic "GMUX" (0x58554D47 as a little-endian u32)
//   4       2     protocol version (kProtocolVersion)
//   6       2     kind: 1 = Request (client to daemon), 2 = Reply (daemon to client), 3 = Data
//                 (either way; only to a peer that said it reads them, see DataFrame)
//   8       4     payload length in bytes: a multiple of 8, at most FrameLimits::max_payload_bytes
//   12      4     flags: bit 0 (kFrameFlagDescriptor) says a descriptor goes with the frame on
//                 the socket while the frame itself travels a ring (proto/shm_ring.h); the
//                 other bits must be 0
//
// The payload is one Cap'n Proto message in the standard flat (segment table + segments)
// encoding, whose root is gmux.capnp's Request or Reply. Decoding trusts nothing: the header is
// checked before any allocation, the payload's segment table is checked against the payload
// length, and the whole message is traversed once under a traversal and nesting limit, so later
// field accesses cannot run outside the payload. All functions are thread-compatible.
#pragma once

#include <capnp/message.h>
#include <capnp/serialize.h>

#include <chrono>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "common/status.h"
#include "proto/gmux.capnp.h"

namespace gmux::proto {

inline constexpr uint32_t kMagic = 0x58554D47;  // "GMUX"
inline constexpr uint16_t kProtocolVersion = 1;
inline constexpr size_t kHeaderBytes = 16;
inline constexpr uint32_t kDefaultMaxPayloadBytes = 32u << 20;
// Bulk data is split into chunks of at most this size so a frame stays far below the limit.
inline constexpr size_t kBulkChunkBytes = 4u << 20;

enum class FrameKind : uint16_t { kRequest = 1, kReply = 2, kData = 3 };

// Header flag: a descriptor went on the socket for this frame, which travels a ring.
inline constexpr uint32_t kFrameFlagDescriptor = 1;

// A data frame carries the raw bytes of one chunk of a bulk transfer, without a Cap'n Proto
// message, so that its reader can receive them straight where they belong (a write's staging
// buffer in the worker, a read's destination in the application) instead of into a message
// and then copying them. Its payload: u64 id (a request's bulk token, or the seq of the read a
// reply answers), u64 offset (into the transfer), u32 length, u32 flags (bit 0: the transfer's
// last chunk; the other bits 0), then the bytes, zero-padded to a multiple of 8.
inline constexpr size_t kDataPrefixBytes = 24;
struct DataFrame {
  uint64_t id = 0;
  uint64_t offset = 0;
  uint32_t bytes = 0;
  bool last = false;
};

// Where a FrameReader puts the bytes of data frames. Called on the reading thread, one frame at
// a time, Place before any of its bytes is read and, when Place gave memory, Placed after.
class DataSink {
 public:
  virtual ~DataSink() = default;
  // Writable memory for `f.bytes` bytes, or nullptr to drop them (the sink itself answers for
  // a frame it refuses: an unknown id, an offset outside its transfer).
  virtual uint8_t* Place(const DataFrame& f) = 0;
  // The bytes are in (`complete`), or the stream broke after part of them (the reader then
  // returns the error): either way the memory is the sink's again.
  virtual void Placed(const DataFrame& f, bool complete) = 0;
};


struct FrameLimits {
  uint32_t max_payload_bytes = kDefaultMaxPayloadBytes;  // larger frames are rejected unread
  int nesting_limit = 16;                                // Cap'n Proto pointer nesting depth
  // Traversal budget as a multiple of the payload's size in words (the first full traversal
  // spends about 1x; the rest is left for the reader's own accesses).
  uint32_t traversal_factor = 8;

  Status Validate() const;
};

struct FrameHeader {
  uint16_t version = kProtocolVersion;
  FrameKind kind = FrameKind::kRequest;
  uint32_t payload_bytes = 0;
  uint32_t flags = 0;
};

// Writes the 16 header bytes.
void EncodeHeader(const FrameHeader& header, uint8_t out[kHeaderBytes]);

// Parses and checks a header: magic (kDataLoss), version (kFailedPrecondition, the message names
// both versions), kind (kInvalidArgument), payload length (kResourceExhausted when over the
// limit, kDataLoss when not a multiple of 8 or zero), flags (unknown bits: kDataLoss). The
// version is checked after the magic, so a peer speaking another version can be told so.
Result<FrameHeader> DecodeHeader(std::span<const uint8_t> bytes, const FrameLimits& limits);

// A decoded, fully validated message. Owns its words; root<T>() is safe to call repeatedly.
class Message {
 public:
  Message(kj::Array<capnp::word> words, const FrameLimits& limits);
  Message(Message&&) = default;
  Message& operator=(Message&&) = default;

  template <typename T>
  typename T::Reader root() { return reader_->getRoot<T>(); }

 private:
  friend Result<Message> DecodePayload(kj::Array<capnp::word>, FrameKind, const FrameLimits&);
  kj::Array<capnp::word> words_;
  std::unique_ptr<capnp::FlatArrayMessageReader> reader_;
};

// Validates a payload of `kind` (segment table, pointers, limits). kDataLoss on any malformation.
Result<Message> DecodePayload(kj::Array<capnp::word> words, FrameKind kind,
                              const FrameLimits& limits);

// A whole frame in memory (header + payload), e.g. for tests and fuzzing. Trailing bytes after
// the frame are an error.
Result<Message> DecodeFrame(std::span<const uint8_t> bytes, FrameKind kind,
                            const FrameLimits& limits);

// Encodes a message as one frame. kResourceExhausted if it exceeds the payload limit.
Result<std::vector<uint8_t>> EncodeFrame(FrameKind kind, capnp::MessageBuilder& message,
                                         const FrameLimits& limits = {});

class ShmRing;   // proto/shm_ring.h
class SpinWait;  // proto/spin_wait.h

// Where a writer's frames go: the socket, or the shared-memory ring that replaced the socket for
// the worker's frames to a local client (proto/shm_ring.h; the socket then carries doorbells).
struct Outlet {
  Outlet(int socket) : fd(socket) {}  // NOLINT: a socket is an outlet
  Outlet(int socket, ShmRing* r) : fd(socket), ring(r) {}
  int fd = -1;
  ShmRing* ring = nullptr;
};

// Blocking frame I/O on a connected stream socket (or the ring an Outlet names: the same bytes,
// and the same waits for room). WriteFrame sends header and segments with one
// sendmsg (MSG_NOSIGNAL: a closed peer is kUnavailable, never SIGPIPE); callers serialize writers.
// `pass_fd` >= 0 is sent with the frame as SCM_RIGHTS (Unix sockets; shared-memory transfers).
Status WriteFrame(Outlet out, FrameKind kind, capnp::MessageBuilder& message,
                  const FrameLimits& limits = {}, int pass_fd = -1);

// Sends what the socket takes of the frame now, without waiting (MSG_DONTWAIT), and returns
// the bytes that did not fit (empty: all sent), for a writer that must never wait on a slow
// reader and sends the rest later, in order.
Result<std::vector<uint8_t>> WriteFrameNow(Outlet out, FrameKind kind, capnp::MessageBuilder& message,
                                           const FrameLimits& limits = {});
// Sends one byte with `fd` attached (SCM_RIGHTS) on the socket `socket`: how a descriptor for
// a frame that travels a ring goes (proto/shm_ring.h); WriteFrame sends it so.
Status SendDescriptor(int socket, int fd);
// Sends `bytes` whole (blocking; MSG_NOSIGNAL).
Status WriteAll(Outlet out, std::span<const uint8_t> bytes);
// Sends a data frame of `f.bytes` bytes from `data` (blocking; MSG_NOSIGNAL, no copy of the
// bytes). kResourceExhausted when it would exceed `limits`.
Status WriteDataFrame(Outlet out, const DataFrame& f, const uint8_t* data,
                      const FrameLimits& limits = {});

// WriteDataFrame that waits for room in the socket only until `deadline`. What the socket has
// not taken by then (the rest of the header and of `data`, and the padding) is copied into
// `*rest`, for the caller to send after it with WriteAll: `data` is then no longer read.
Status WriteDataFrameUntil(Outlet out, const DataFrame& f, const uint8_t* data,
                           std::chrono::steady_clock::time_point deadline,
                           std::vector<uint8_t>* rest, const FrameLimits& limits = {});

// Reads one frame. kUnavailable when the peer closed cleanly between frames, kDataLoss when it
// closed mid-frame, and DecodeHeader/DecodePayload's errors otherwise. `header_out`, when given,
// receives the header even when the payload is rejected (so a version mismatch can be answered).
// `fd_out`, when given, receives a file descriptor passed with the frame (-1 if none; the caller
// owns it); descriptors passed when `fd_out` is null, or beyond the first, are closed.
Result<Message> ReadFrame(int fd, FrameKind kind, const FrameLimits& limits = {},
                          FrameHeader* header_out = nullptr, int* fd_out = nullptr);

// Reads frames from a stream socket through a buffer: one recvmsg takes every frame that has
// arrived (a batch of small requests costs one system call, not two per frame), larger payloads
// are read straight into their message. A descriptor passed with a frame (SCM_RIGHTS) belongs to
// the last frame that begins in the bytes of the read that brought it: the kernel attaches it to
// the frame's first byte, may join earlier bytes to that read, and ends the read after the bytes
// it came with. Waits in poll() (see WaitReadable in frame.cc), within the socket's SO_RCVTIMEO
// as it was when the reader was made (the rest of a frame larger than the buffer is read with
// read(), within the socket's timeout as it is then). Thread-compatible.
class FrameReader {
 public:
  FrameReader(int fd, FrameKind kind, const FrameLimits& limits);
  ~FrameReader();
  FrameReader(const FrameReader&) = delete;
  FrameReader& operator=(const FrameReader&) = delete;

  // The next frame, with ReadFrame's errors. `fd_out` as ReadFrame's. `before_wait` runs once
  // each time no whole frame is buffered and the socket has nothing more: before sleeping.
  // Data frames go to the sink on the way (without a sink they are an unexpected kind).
  Result<Message> Next(int* fd_out, const std::function<void()>& before_wait = nullptr);
  // As Next, but returns nullopt after each data frame, for a reader that must look at what
  // the sink did before it waits for more.
  Result<std::optional<Message>> NextOrData(int* fd_out,
                                            const std::function<void()>& before_wait = nullptr);
  // Data frames are accepted from here on and their bytes given to `sink` (not owned; it
  // outlives the reader's use).
  void SetDataSink(DataSink* sink) { sink_ = sink; }
  // Whether Next() has a whole frame (or a header it will refuse) without reading the socket.
  bool HasFrame() const;
  // The peer is expected to send nothing until it has an answer (it waits for one): the next
  // read that finds too little buffered waits (in poll) at once rather than first trying a read
  // that would find the socket empty (one system call fewer per blocking call). `before_wait`
  // still runs first; a peer that did send costs a poll that returns at once.
  void ExpectQuiet() {
    expect_quiet_ = true;
    spin_next_wait_ = true;
  }
  // After ExpectQuiet, the next wait first spins by `spin`'s policy (proto/spin_wait.h): the
  // peer that waited for an answer often sends again within microseconds, and a thread that is
  // awake takes the request without being woken. Not owned; it outlives the reader's use.
  // `others_need_cpu` (optional), asked at each look: whether threads this one woke may be
  // waiting for a CPU (the spin then yields at every look instead of pausing).
  void SpinAfterAnswers(SpinWait* spin, std::function<bool()> others_need_cpu = {}) {
    spin_ = spin;
    others_need_cpu_ = others_need_cpu ? std::move(others_need_cpu) : [] { return false; };
  }
  // From here on the frames come through `ring` (not owned; it outlives the reader's use) and
  // the socket only rings its doorbell and brings the descriptors of frames flagged
  // kFrameFlagDescriptor (proto/shm_ring.h). kDataLoss (and nothing changes) when bytes of the
  // socket are buffered: the peer sent more before the ring was agreed.
  Status ReadFromRing(ShmRing* ring);
  ShmRing* ring() const { return ring_; }

 private:
  struct Passed {
    int fd;
    uint64_t from, to;  // the stream offsets of the read that brought it
  };
  // Reads what the socket has into the buffer (waiting for it if `wait`: called so only after a
  // read without waiting found nothing, it waits before it reads); false on EOF, an error (in
  // `error`) or, without `wait`, nothing there.
  bool Fill(bool wait, Status& error, bool& eof);
  size_t buffered() const { return end_ - begin_; }
  // The descriptor for the frame at stream offset `at` spanning `bytes`, or -1; stale ones closed.
  int TakeFd(uint64_t at, uint64_t bytes);
  // The descriptor of the frame at stream offset `at` spanning `bytes`, whose header has
  // `flags`: from the ring's socket (flagged frames) or TakeFd; -1 when it has none.
  int FrameFd(uint32_t flags, uint64_t at, uint64_t bytes);
  // Moves the next `n` bytes of the stream (the buffered ones first) to `to`, or drops them
  // when `to` is null; false with `error` (or at the end of the stream) when they did not come.
  bool Take(uint8_t* to, size_t n, Status& error, bool& told,
            const std::function<void()>& before_wait);
  // The data frame whose header (`payload_bytes` long) is buffered.
  Status TakeData(uint32_t payload_bytes, bool& told, const std::function<void()>& before_wait);

  int fd_;
  FrameKind kind_;
  FrameLimits limits_;
  int timeout_ms_;  // the socket's SO_RCVTIMEO when the reader was made (-1: none), read once
  std::vector<uint8_t> buf_;
  size_t begin_ = 0, end_ = 0;
  uint64_t offset_ = 0;  // stream offset of buf_[begin_]
  std::vector<Passed> passed_;
  DataSink* sink_ = nullptr;
  ShmRing* ring_ = nullptr;
  bool expect_quiet_ = false;
  SpinWait* spin_ = nullptr;
  std::function<bool()> others_need_cpu_;
  bool spin_next_wait_ = false;  // set by ExpectQuiet, taken by the next wait (with a spin_)
};

}  // namespace gmux::proto
