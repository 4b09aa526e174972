// Connection: the ICD's one session with gmuxd.
//
// Opened lazily on the first platform query (GMUX_SOCKET, else GMUX_ADDRESS "host:port" over
// TLS — "tcp://host:port" for plain TCP — with the token GMUX_TOKEN, else the default socket
// path; read once, at that moment). TLS runs in a relay thread (tls/tls.h, ClientConnect): this
// class speaks plaintext on the relay's socketpair.
// Over TCP bulk data always travels inline. Connecting and the handshake are bounded by
// timeouts, so a missing or stuck daemon yields "no devices", never a hang. A caller waiting
// for its reply reads the socket itself when no other thread does (the reply wakes it straight
// from the kernel); a receiver thread reads while requests with callbacks are outstanding and
// nobody waits. Whoever reads copies read data into the application's memory, hands other
// replies to their waiters, and records unasked error reports (seq 0), which the next blocking
// call returns. If the daemon goes away every waiter is woken with CL_DEVICE_NOT_AVAILABLE.
// Thread-safe.
#pragma once

#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "proto/spin_wait.h"
#include "proto/frame.h"
#include "proto/shm_ring.h"

namespace gmux::icd {

struct DeviceDesc {
  uint32_t index = 0;
  std::string name;
  cl_device_type type = 0;
};

// Numbers an enqueue in its queue's order when it enters the stream (under the send lock):
// every command of the queue numbered lower went before it (icd/objects.h, `enqueued`).
struct StreamOrder {
  std::atomic<uint64_t>* counter = nullptr;
  uint64_t* number = nullptr;
  std::atomic<int64_t>* in_flight = nullptr;  // also counted here, first (the context's)
};

// A sealed memfd mapped read-write, for one transfer at a time (pooled by the Connection).
struct ShmBuffer {
  int fd = -1;
  void* map = nullptr;
  size_t capacity = 0;
  uint64_t inode = 0;  // names it to the daemon, which keeps its mapping until told to forget
  bool valid() const { return fd >= 0; }
};

class Connection {
 public:
  // The process's connection, or nullptr when no daemon could be reached (retried on each call
  // until one is).
  static Connection* Get();

  const std::vector<DeviceDesc>& devices() const { return devices_; }
  const std::string& tenant() const { return tenant_; }

  uint64_t NextId() { return next_id_.fetch_add(1); }

  // Sends a request without waiting (its seq is left 0). Small requests are batched: they leave
  // with the next request that waits for a reply, at Flush(), or when the batch fills.
  cl_int Post(capnp::MallocMessageBuilder& request, StreamOrder order = {});
  // Sends the batch now (clFlush).
  cl_int Flush();

  // Sends a request with a fresh seq and waits for its reply; `reply` receives it on success.
  // With `pass_fd`, that descriptor goes with the request (the caller keeps it).
  cl_int Call(capnp::MallocMessageBuilder& request, std::optional<proto::Message>* reply = nullptr,
              std::string* error_message = nullptr, int pass_fd = -1);

  // Starts a request whose reply is waited for later (Wait) or handed to `on_reply` on the
  // receiver's callback thread. For reads, `dst`/`size` receive the data.
  // With `shm` (taken over), the reply is a plain status, the data is copied from the buffer to
  // `dst` when it arrives, and the buffer goes back to the pool; its descriptor goes with the
  // request. With `keep_shm` the reply leaves the buffer alone (no copy, not released): the
  // caller reads the data in place (a mapping backed by the buffer) and releases it itself.
  // With `release` (a buffer whose data the request consumes, already sent by SendBulk), the
  // reader gives it back when the reply comes (or the connection is lost), on its own thread,
  // never behind the application's callbacks.
  uint64_t Begin(capnp::MallocMessageBuilder& request, void* dst = nullptr, size_t size = 0,
                 std::function<void(cl_int)> on_reply = nullptr, ShmBuffer shm = {},
                 bool keep_shm = false, ShmBuffer release = {}, StreamOrder order = {});
  cl_int Wait(uint64_t seq);

  // Sends `size` bytes as bulk data under a new token and returns the token (0 on failure).
  // Large transfers go through a pooled memfd passed over the socket; `*held` then receives the
  // buffer, which the daemon may read until the request consuming the token is answered: the
  // caller gives it back with ReleaseShm() then.
  // `dest_mem`/`dest_offset` (inline data only) name the plain buffer write the data is for:
  // the worker may receive it in place. The caller then holds the stream (StreamHold) until
  // that write's command is sent.
  uint64_t SendBulk(const void* data, size_t size, ShmBuffer* held, uint64_t dest_mem = 0,
                    uint64_t dest_offset = 0);
  // Whether a buffer write of `size` bytes should announce its buffer (SendBulk's dest_mem): its
  // data goes inline (TCP, GMUX_SHM=0) and is large enough for the copy to matter.
  // GMUX_DIRECT_WRITES=0 says never.
  bool DirectWrite(size_t size) const {
    return direct_writes_ && !UseShm(size) && size >= kDirectWriteMinBytes;
  }
  static constexpr size_t kDirectWriteMinBytes = 1u << 20;
  // Holds the stream for the calling thread while it lives: other threads' requests wait, so
  // what this thread sends meanwhile (a write's announced data, then its command) reaches the
  // worker with nothing between.
  class StreamHold {
   public:
    explicit StreamHold(Connection* c);
    ~StreamHold() { Release(); }
    StreamHold(const StreamHold&) = delete;
    StreamHold& operator=(const StreamHold&) = delete;
    void Release();

   private:
    Connection* c_;
  };
  // Sends the first `size` bytes already in `buffer` as bulk data, without copying; the caller
  // keeps the buffer until the consuming request is answered, as with SendBulk.
  uint64_t SendShm(const ShmBuffer& buffer, size_t size);

  // Whether a transfer of `size` bytes should use shared memory.
  bool UseShm(size_t size) const { return shm_enabled_ && size >= kShmMinBytes; }
  // A pooled buffer of at least `size` bytes (invalid on failure); ReleaseShm returns it.
  // When none is free but requests in flight hold one that would fit (given back by the reader
  // when their replies come), it waits for it rather than create one: a stream of writes that
  // outruns its worker then reuses a few buffers, which stay in the worker's cache of mappings,
  // instead of populating a new one per write (which costs more than the write's copy) and
  // cycling through more than the worker keeps mapped. It waits as long as creating one took
  // last time; with kShmInFlightMax in flight, eight times that (5 ms to 2 s), so that a stream
  // progressing at any pace reuses its buffers, while one stuck behind a long kernel (or a
  // user event) costs a few milliseconds per buffer, not a stall.
  ShmBuffer AcquireShm(size_t size);
  void ReleaseShm(ShmBuffer buffer, bool in_flight = false);

  static constexpr size_t kShmMinBytes = 1u << 20;
  static constexpr size_t kShmInFlightMax = 8;  // below the worker's 16 kept mappings

  // Whether a buffer read or write of `size` bytes should name the application's memory for
  // the worker to copy straight to or from (daemon/remote_copy.h): the worker said it may, and
  // the transfer is large enough to gain. A blocking write below kRemoteWriteMinBytes returns
  // sooner through the stream or shared memory (copied out, it need not wait for the device).
  // A read always waits: one copy wins over the stream from 64 KiB, but from 1 MiB up to
  // kRemoteReadShmBelowBytes the two memcpy of shared memory beat one process_vm_writev, which
  // copies at a third of memcpy's speed on one thread and costs more wake-ups (parallel
  // copies win above; docs/performance.md, "One copy").
  bool UseRemote(size_t size, bool write) {
    if (write ? size < kRemoteWriteMinBytes
              : size < kRemoteReadMinBytes || (UseShm(size) && size < kRemoteReadShmBelowBytes)) {
      return false;
    }
    return remote_copy_.load(std::memory_order_relaxed) && StillRemote();
  }
  // The worker may no longer copy (the application changed its uid or dumpability): every
  // later transfer takes the copying paths.
  void DisableRemote() { remote_copy_ = false; }
  // The worker sends the events' profiling times with a wait's answer (waitEventsProfiled).
  bool profiled_waits() const { return profiled_waits_; }
  static constexpr size_t kRemoteReadMinBytes = 64u << 10;
  static constexpr size_t kRemoteReadShmBelowBytes = 8u << 20;
  static constexpr size_t kRemoteWriteMinBytes = 4u << 20;

  // Buffers on shared memory (docs/protocol.md, "Buffers on shared memory"): whether a buffer
  // of `size` bytes should be offered a memfd as its storage. Local connections with shared
  // memory whose worker knows them, from kStorageMinBytes (smaller ones cost more to map than
  // their transfers take), and not with GMUX_BUFFER_STORAGE=0. (A context whose devices do not
  // work on host memory in place is not offered again: _cl_context::storage_declined.)
  bool UseStorage(size_t size) const {
    return storage_enabled_ && shm_enabled_ && size >= kStorageMinBytes && !Lost();
  }
  // A new sealed memfd of `size` bytes mapped read-write here (invalid on failure); the
  // mapping is the buffer's until it is destroyed, the descriptor goes to the worker.
  static ShmBuffer CreateStorage(size_t size);
  static constexpr size_t kStorageMinBytes = 64u << 10;
  // Memory of released buffers on shared memory, kept for the next buffer of the same size
  // (docs/protocol.md, "Buffers on shared memory"): a new memfd costs its creation, seals and
  // mappings, and every page's first touch costs more on shared memory than on the anonymous
  // memory a native allocator reuses (docs/performance.md). Like the C library's allocator,
  // which reuses freed memory up to 32 MiB and gives larger blocks back at once: buffers up to
  // kStoragePoolMaxBytes, at most kStoragePoolEntries and kStoragePoolBytes together (the
  // oldest go first). A buffer keeps its memfd's descriptor for this while the connection has
  // room for it (KeepStorageFd: at most an eighth of RLIMIT_NOFILE, at most 256, so an
  // application's own descriptors keep their room). Not in a forked child (the parent's).
  ShmBuffer TakeStorage(size_t size);           // invalid: none of that size kept
  bool PoolStorage(ShmBuffer storage);          // false: not kept (the caller unmaps, closes)
  bool KeepStorageFd(size_t size);              // a live buffer may keep its descriptor
  void DropStorageFd();                         // one kept by a live buffer was closed
  static constexpr size_t kStoragePoolMaxBytes = 32u << 20;
  static constexpr size_t kStoragePoolBytes = 64u << 20;
  static constexpr size_t kStoragePoolEntries = 16;
  // Small buffers' storage (docs/protocol.md, "Buffers on shared memory"): buffers under
  // kStorageMinBytes share memfds of kArenaBytes ("arenas"), one slot each, a power of two
  // from kArenaSlotMin bytes aligned to its size (carved from the arena 64 KiB at a time);
  // freed slots are reused by size. At most kArenaMax arenas: past them, small buffers have
  // no storage (their transfers take the copying paths). Not with GMUX_STORAGE_ARENAS=0 (nor
  // where buffers have no storage at all), nor in a forked child.
  struct ArenaSlot {
    uint32_t arena = 0;  // 0: no slot
    uint64_t offset = 0;
    uint8_t* at = nullptr;
    // A duplicate of the arena's descriptor while the worker has not taken the arena: sent
    // with the request, then closed by the caller (-1 once the worker has it).
    int pass_fd = -1;
  };
  bool UseArena(size_t size) const {
    return arenas_enabled_.load(std::memory_order_relaxed) && UseStorage(kStorageMinBytes) &&
           size > 0 && size < kStorageMinBytes;
  }
  ArenaSlot TakeArenaSlot(size_t size);
  void ArenaTaken(uint32_t arena);  // the worker has mapped it: its descriptor is closed
  // `last`: taken after every other free slot of its size (one the worker put no buffer on).
  void FreeArenaSlot(uint32_t arena, uint64_t offset, size_t size, bool last = false);
  // The worker refused an arena it was offered (it could not map it): no more arenas.
  void DisableArenas() { arenas_enabled_.store(false, std::memory_order_relaxed); }
  static constexpr size_t kArenaBytes = 2u << 20;
  static constexpr size_t kArenaMax = 32;
  static constexpr size_t kArenaSlotMin = 256;
  // Whether the daemon is gone (every call fails from now on).
  bool Lost() const { return dead_.load(std::memory_order_relaxed) || Forked(); }

  // Whether this process is a fork()ed child of the one that connected: then every call fails
  // (CL_DEVICE_NOT_AVAILABLE) without touching the connection, which is the parent's.
  static bool Forked();

  // The first asynchronous error the daemon reported since the last call (CL_SUCCESS if none).
  cl_int TakeAsyncError();

 private:
  Connection() = default;
  static Connection* Connect();
  // Asks the worker to send its frames through a shared-memory ring (proto/shm_ring.h) on the
  // socket `fd`, during the handshake: kOpen (ring_ set), kRefused (the socket it is), kLost
  // (the connection broke).
  enum class RingOutcome { kOpen, kRefused, kLost };
  RingOutcome OpenReplyRing(int fd);
  // The same for the client's frames to the worker (before the reply ring: that request and
  // every later one then go through it).
  RingOutcome OpenRequestRing(int fd);
  // Sends a ring's request `b` with its memfd `pass_fd` (closed) and reads the answer on the
  // socket; `what` names the direction in a refusal's message.
  RingOutcome AskForRing(int fd, capnp::MallocMessageBuilder& b, int pass_fd, const char* what);
  static constexpr size_t kReplyRingBytes = 1u << 20;
  static constexpr size_t kRequestRingBytes = 1u << 20;
  std::unique_ptr<proto::ShmRing> ring_;  // set at connection, for the process's life
  // The requests' ring: set at connection, for the process's life (null: the socket).
  std::unique_ptr<proto::ShmRing> request_ring_;
  // Where requests go (under send_mu_).
  proto::Outlet out() const { return {fd_, request_ring_.get()}; }
  // Reads and dispatches one reply; false once the connection is gone (every waiter then has
  // CL_DEVICE_NOT_AVAILABLE). Called by the one thread that holds `reading_`.
  bool ReadOne();
  void Disconnected();
  // A read's data arriving as data frames (proto/frame.h) goes straight to its destination.
  class ReadSink : public proto::DataSink {
   public:
    explicit ReadSink(Connection* c) : c_(c) {}
    uint8_t* Place(const proto::DataFrame& f) override;
    void Placed(const proto::DataFrame& f, bool complete) override;

   private:
    Connection* c_;
  };
  ReadSink read_sink_{this};
  // Sends one chunk of bulk data as a data frame, in stream order (after any batch).
  cl_int PostData(uint64_t token, uint64_t offset, const uint8_t* data, size_t n);
  // Waits (mu_ held) until the reply to `seq` came, reading the socket meanwhile if no other
  // thread does.
  void AwaitReply(std::unique_lock<std::mutex>& lock, uint64_t seq);
  void ReceiveLoop();
  void CallbackLoop();
  cl_int SendLocked(capnp::MallocMessageBuilder& request, bool may_batch, int pass_fd = -1,
                    StreamOrder order = {});

  struct Pending {
    bool done = false;
    cl_int status = CL_SUCCESS;
    std::optional<proto::Message> reply;
    std::string message;
    uint8_t* dst = nullptr;
    size_t size = 0;
    std::function<void(cl_int)> on_reply;
    ShmBuffer shm;  // a buffer to copy from (into dst) and release when the reply comes
    ShmBuffer release;  // a buffer the request consumed, released when the reply comes
    bool receiving = false;  // a data frame is being read into dst: nobody returns meanwhile
  };
  // The reply to `it` is all there (mu_ held): done, its callback (if any) into `*cb`.
  void CompleteLocked(std::map<uint64_t, Pending>::iterator it, std::function<void(cl_int)>* cb,
                      cl_int* cb_status);
  // Hands a reply's callback to the callback thread (mu_ not held).
  void Deliver(std::function<void(cl_int)> cb, cl_int status);
  // A buffer now goes with a request in flight; the reader releases it (ReleaseShm(b, true)).
  void HeldInFlight(const ShmBuffer& buffer);
  // Pooled shared memory kept for reuse: the most recently released buffers up to
  // kShmPoolBytes, and always the last released one up to kShmKeepOneBytes, so an application
  // repeating transfers larger than the pool reuses one buffer (creating and populating a
  // memfd per transfer costs more than the copy).
  static constexpr size_t kShmPoolBytes = 512u << 20;
  static constexpr size_t kShmKeepOneBytes = 2ull << 30;
  std::mutex shm_mu_;                 // guards shm_pool_ and shm_forget_ (after mu_ and send_mu_)
  std::vector<ShmBuffer> shm_pool_;   // oldest first
  std::vector<uint64_t> shm_forget_;  // inodes of destroyed buffers the daemon still maps
  std::condition_variable shm_cv_;    // a buffer came back to the pool
  std::multiset<size_t> shm_in_flight_;  // capacities of the buffers requests in flight hold
  double shm_create_ns_per_byte_ = 0; // what creating the last new buffer cost
  void DestroyShmLocked(ShmBuffer buffer);
  std::mutex storage_mu_;                  // guards storage_pool_
  std::vector<ShmBuffer> storage_pool_;    // released buffers' memory, oldest first
  std::atomic<int> storage_fds_{0};        // descriptors live buffers keep
  int storage_fds_max_ = 0;                // set at connection
  ShmBuffer CreateShm(size_t size);  // a new memfd of at least `size` bytes, mapped
  struct Arena {
    int fd = -1;  // closed once the worker has mapped the arena
    uint8_t* map = nullptr;
    size_t carved = 0;  // bytes handed to the slot lists so far
  };
  static constexpr size_t kArenaClasses = 9;  // slots of 256 B to 64 KiB
  static constexpr size_t kArenaBlock = 64u << 10;
  std::mutex arena_mu_;       // guards arenas_ and arena_free_
  std::vector<Arena> arenas_;  // arena n is arenas_[n - 1]; mapped for the process's life
  std::vector<std::pair<uint32_t, uint64_t>> arena_free_[kArenaClasses];
  std::atomic<bool> arenas_enabled_{true};

  int fd_ = -1;
  bool shm_enabled_ = true;  // GMUX_SHM=0 turns shared-memory transfers off
  // The worker takes bulk data as data frames (and sends a read's so); GMUX_DATA_FRAMES=0 says no.
  bool data_frames_ = false;
  bool profiled_waits_ = false;  // the worker answers waitEventsProfiled
  // The worker knows buffers on shared memory; GMUX_BUFFER_STORAGE=0 turns them off.
  bool storage_enabled_ = false;
  // Whether the worker may still copy for this process: not once the process forked (a child
  // would have the worker copy to and from its parent, whose pid the worker holds) nor once it
  // made itself not dumpable or changed its uid (which makes it so): the worker's copies would
  // fail, and a non-blocking transfer that fails cannot be done again by the ICD.
  bool StillRemote();
  pid_t hello_pid_ = 0;
  std::atomic<bool> remote_copy_{false};  // the worker read the hello's probe;
                                          // GMUX_REMOTE_COPY=0 says no
  std::vector<DeviceDesc> devices_;
  std::string tenant_;
  std::atomic<uint64_t> next_id_{1};
  std::atomic<uint64_t> next_seq_{2};  // 1 is the handshake's
  std::mutex send_mu_;                 // serializes frames on fd_; guards batch_
  // A StreamHold's: taken before send_mu_ by every sender but the holder.
  std::mutex hold_mu_;
  std::atomic<std::thread::id> hold_owner_{};
  std::unique_lock<std::mutex> WaitForHold();
  bool direct_writes_ = true;
  std::vector<uint8_t> batch_;         // encoded frames not yet sent
  // guards pending_, dead_, async_error_, callbacks_, and who reads the socket
  std::mutex mu_;
  std::condition_variable cv_;         // a reply came, or the socket has no reader
  // One thread at a time reads replies: a caller waiting for its own (AwaitReply), or the
  // receiver thread while requests with callbacks are outstanding and no caller waits.
  bool reading_ = false;
  bool reader_is_waiter_ = false;
  proto::SpinWait spin_ = proto::SpinWait::FromEnvironment();  // used by the waiter that reads
  // The replies, read through a buffer: one recvmsg takes a reply whole (header and payload)
  // and every later one already there. Used by the one thread that reads (reading_).
  std::unique_ptr<proto::FrameReader> replies_;
  int waiters_ = 0;               // callers in AwaitReply
  size_t async_pending_ = 0;      // pending requests with an on_reply callback
  std::condition_variable reader_cv_;  // wakes the receiver thread
  std::map<uint64_t, Pending> pending_;
  std::atomic<bool> dead_{false};  // set under mu_; read without it by AcquireShm
  cl_int async_error_ = CL_SUCCESS;
  std::vector<std::function<void()>> callbacks_;
  std::condition_variable callbacks_cv_;
};

}  // namespace gmux::icd
