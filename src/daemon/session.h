// Session: one connected client. Its thread reads and decodes the client's requests, looks
// every id up in this session's own object tables (so a tenant can only ever name its own
// objects), creates backend objects, and turns enqueues into Commands for the scheduler.
//
// Threads: the object tables belong to the session thread. SessionCore is shared with the
// executors, which send replies (read data, finish and wait answers) through it; Send()
// serializes writers. When the client disconnects, the tables are dropped (releasing every
// backend object once no queued command uses it) and the session's queued commands are
// skipped.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/prefault.h"
#include "daemon/backend.h"
#include "daemon/command.h"
#include "daemon/config.h"
#include "daemon/residency.h"
#include "daemon/restore.h"
#include "daemon/validate.h"
#include "proto/frame.h"
#include "proto/shm_ring.h"

namespace gmux::daemon {

class RemoteCopier;  // remote_copy.h

// Host memory the daemon stages transfers in. Never zero-filled: every byte is written (by the
// client's sequential bulk data, or by the device) before it is used.
// Or a client's sealed memfd mapped shared (local clients' bulk transfers).
class HostBuffer {
 public:
  // `n` bytes of this process's memory, uninitialised (a large one may be a buffer released
  // before: see kept_ in session.cc). Throws std::bad_alloc.
  explicit HostBuffer(size_t n);
  // Maps `size` bytes of the memfd `fd` (consumed). The file must be sealed against shrinking
  // (F_SEAL_SHRINK) and at least `size` long, so the client cannot make the daemon fault.
  // `populate` faults the pages in now (a transfer's, read at once); a buffer's storage is
  // faulted in where it is first touched.
  static Result<std::shared_ptr<HostBuffer>> MapSealed(int fd, size_t size, bool populate = true);
  // Faults a mapped buffer's pages in on the process's prefaulter thread (common/prefault.h),
  // from the end backwards, while the caller goes on; stopped before the mapping goes.
  void FaultInAhead();
  // The first `size` bytes of `whole` (kept alive by the view).
  static std::shared_ptr<HostBuffer> View(std::shared_ptr<HostBuffer> whole, size_t size);
  // `size` bytes `offset` into `whole` (which must hold them).
  static std::shared_ptr<HostBuffer> View(std::shared_ptr<HostBuffer> whole, size_t offset,
                                          size_t size);
  // `n` bytes of fresh anonymous memory, page-aligned, zero (null when mmap fails): a buffer's
  // storage in this process.
  static std::shared_ptr<HostBuffer> Anonymous(size_t n);
  ~HostBuffer();
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;

  uint8_t* data() { return data_; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  // Bytes this process allocated for the buffer: the whole size for a staging copy, 0 for the
  // client's shared memory mapped here. Only staged bytes count against max_bulk_bytes.
  size_t staged() const { return heap_ ? size_ : 0; }

 private:
  HostBuffer() = default;
  std::unique_ptr<uint8_t[]> heap_;
  size_t capacity_ = 0;  // of heap_
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  bool mapped_ = false;
  std::shared_ptr<Prefaulter::Job> prefault_;  // FaultInAhead's
  std::shared_ptr<HostBuffer> whole_;  // views only
};

// What one session may hold: its share of the tenant's [limits] (docs/operations.md), which
// gmuxd divides among the tenant's sessions. 0: no limit.
struct SessionLimits {
  uint64_t max_bulk_bytes = 2ull << 30;   // staged transfer bytes and kept shared mappings
  uint64_t max_queued_commands = 0;       // commands submitted and not yet completed
  uint64_t max_events = 0;                // live event ids
  uint64_t max_objects = 0;               // live contexts, queues, buffers, programs, ...
  uint64_t memory_quota = 0;     // device memory per device, the tenant's (0: none)
  uint64_t memory_capacity = 0;  // device memory per device gmuxd manages (0: the backend's)
};

struct SessionCore {
  int fd = -1;
  uint64_t id = 0;
  TenantId tenant = 0;
  std::string tenant_name;
  bool tcp = false;  // a TCP client: bulk data only inline, never shared memory
  uint64_t pool_mask = 0;  // the pool's devices (bit i: device i); the tenant sees the lowest
  // Set when the worker may copy straight from and to the client's memory (remote_copy.h).
  std::shared_ptr<RemoteCopier> remote;
  bool data_frames = false;  // the client reads a read's data as data frames (proto/frame.h)
  uint32_t spin_us = 0;  // awake for the next request after a blocking call's answer (µs)
  proto::FrameLimits limits;
  std::atomic<bool> closed{false};
  std::atomic<uint64_t> bulk_bytes{0};  // staged upload/download bytes held for this session
  // Of those, reads' data handed to the writer thread and not yet sent: staging that frees
  // itself with no command outstanding (Session::StagingRoom waits for it).
  std::atomic<uint64_t> sending_bytes{0};

  SessionCore() = default;
  ~SessionCore();
  SessionCore(const SessionCore&) = delete;
  SessionCore& operator=(const SessionCore&) = delete;

  // Sends one Reply frame, from any thread, never waiting on the client: what its socket does
  // not take now is kept, in order, for the session's writer thread. Errors (a gone client) are
  // ignored: the reader notices the close. So a client that stops reading holds up nothing but
  // its own replies, never the worker's device loop (and so never other tenants).
  void Send(capnp::MessageBuilder& message);
  // Sends Reply{seq, status, message}.
  void SendStatus(uint64_t seq, cl_int status, const std::string& message);
  // Runs `write` on the writer thread after every reply sent before it; `write` sends with
  // SendFromWriter(). For large data that is sent from where it lies rather than copied.
  void Defer(std::function<void()> write);
  // Defer(), but only when the writer has nothing to send or sending (false otherwise, and
  // `write` is dropped): what it sends next does not wait behind a client slow to read.
  bool DeferIfIdle(std::function<void()>& write);
  // Reads being sent from their buffer's storage (Session::StorageRead): one at a time.
  std::atomic<uint32_t> storage_reads{0};
  // Sends one frame, waiting as long as the client takes: only inside a Defer()red function.
  void SendFromWriter(capnp::MessageBuilder& message);
  // Sends `n` bytes of the read `seq` answers as a data frame (proto/frame.h), from where they
  // lie: only inside a Defer()red function, for a client that reads data frames.
  void SendDataFromWriter(uint64_t seq, uint64_t offset, const uint8_t* data, size_t n,
                          bool last);
  // Marks the session closed: nothing more is sent, and a writer waiting on the client stops.
  void Close();
  // Where frames go: the socket, or the ring once UseRing's answer is sent. Under out_mu_ or on
  // the writer thread (in a Defer()red function; the writer alone changes it, under out_mu_).
  proto::Outlet outlet() const { return {fd, ring_.get()}; }
  // Answers the `replyRing` request `seq` on the socket, after every reply before it, and sends
  // every later frame through `ring` (proto/shm_ring.h).
  void UseRing(uint64_t seq, std::shared_ptr<proto::ShmRing> ring);

  // The session's share of its tenant's limits, which gmuxd changes as the tenant's sessions
  // come and go (any thread); the session picks a change up before its next request.
  void SetSessionLimits(const SessionLimits& l);
  SessionLimits SessionLimitsNow() const;
  std::atomic<uint64_t> limits_generation{0};

 private:
  struct Out {
    std::vector<uint8_t> bytes;   // the rest of a frame, or
    std::function<void()> write;  // a deferred writer
  };
  void Queue(Out out);  // out_mu_ held
  std::shared_ptr<proto::ShmRing> ring_;  // outlet()'s
  void CloseLocked();   // out_mu_ held
  void WriterLoop();

  mutable std::mutex limits_mu_;  // guards session_limits_
  SessionLimits session_limits_;
  std::mutex out_mu_;  // guards out_, queued_bytes_, writing_, stop_; a non-blocking send happens under it
  std::condition_variable out_cv_;
  std::deque<Out> out_;
  size_t queued_bytes_ = 0;  // in out_'s byte items
  bool writing_ = false;     // the writer thread is sending an item (outside the lock)
  bool stop_ = false;
  std::thread writer_;
};

// A session's buffers on shared memory still mapped, and the worker's memory limit they share
// with its private memory (Session::StorageRoom). Shared by the session and the deleters of its
// buffers' storage, which may run on other threads.
struct StorageBooks {
  std::mutex mu;
  uint64_t bytes = 0, buffers = 0;
  bool limit_read = false;  // data_limit is read before the first buffer is booked
  uint64_t data_limit = 0;  // RLIMIT_DATA as the worker started (0: none)
  // Buffers made in the worker's own memory and not released (with their sub-buffers and
  // images on them), and the private data in use (VmData) when the session began: the
  // backend may allocate a buffer's memory only at its first use, so VmData alone does not
  // show them yet.
  uint64_t private_buffers = 0;
  uint64_t base_private = 0;  // read when the session begins, if there is a limit
  // Reads data_limit once (mu held).
  void ReadLimitLocked();
  // The worker's private memory in use or promised to buffers, to count against data_limit
  // (mu held; reads /proc/self/status).
  uint64_t PrivateInUseLocked();
  // Lowers RLIMIT_DATA by what is on shared memory (mu held).
  void ApplyLocked() const;
  // Mappings of released buffers' shared memory, kept (still booked) for the next buffer on
  // the same memfd: the client's ICD gives a released buffer's memory to its next buffer of
  // that size (icd/connection.h, PoolStorage), and a new mapping of it here would have the
  // device fault every page in again, a trap into the hypervisor each on a VM
  // (docs/performance.md, "Reused buffers keep their mapping in the worker"). The client pool's
  // bounds; the oldest go first, and all of them when the memory is wanted (StorageRoom,
  // PrivateRoom).
  struct KeptMapping {
    uint64_t dev = 0, ino = 0;  // the memfd's identity (it stays open while mapped)
    std::shared_ptr<HostBuffer> mapping;
  };
  static constexpr uint64_t kKeptMappingMaxBytes = 32u << 20;
  static constexpr uint64_t kKeptMappingsBytes = 64u << 20;
  static constexpr size_t kKeptMappingsEntries = 16;
  std::deque<KeptMapping> kept;
  uint64_t kept_bytes = 0;
  bool closed = false;  // the session ended: nothing more is kept
  // Keeps `m` (mu held); those pushed out are unbooked and moved to `gone`, to be unmapped
  // by the caller after unlocking.
  void KeepLocked(KeptMapping m, std::vector<std::shared_ptr<HostBuffer>>& gone);
  // Unbooks every kept mapping and moves them to `gone` (mu held); whether there were any.
  bool DropKeptLocked(std::vector<std::shared_ptr<HostBuffer>>& gone);
  // The mapping kept for memfd (dev, ino) of `size` bytes, still booked (mu held); null: none.
  std::shared_ptr<HostBuffer> TakeKeptLocked(uint64_t dev, uint64_t ino, size_t size);
  // Unbooks a buffer's own mapping of `n` bytes (mu held).
  void UnbookLocked(uint64_t n) {
    bytes -= n;
    --buffers;
  }
};

class Session {
 public:
  Session(std::shared_ptr<SessionCore> core, const Backend& backend, CommandSink& sink,
          SessionLimits limits);
  ~Session();

  // Serves requests until the client closes or sends something malformed. Returns why it
  // stopped (kUnavailable for a clean close).
  Status Serve();

 private:
  struct ContextObj {
    Ref<cl_context> ctx;
    std::vector<uint32_t> devices;  // the pool's lowest device stands for all of them
    bool pool = false;              // on the pool: counted for the tenant's lease
  };
  struct QueueObj {
    Ref<cl_command_queue> q;
    uint32_t device = 0;
    cl_context context = nullptr;  // the backend's (the queue holds it)
    bool in_order = true;
    std::shared_ptr<EventRecord> last;     // in-order: the previous command
    std::shared_ptr<EventRecord> barrier;  // out-of-order: the latest barrier
    std::deque<std::shared_ptr<EventRecord>> outstanding;  // not known to be done
  };
  // Device memory an object holds in the broker's books (CommandSink::ReserveMemory), given
  // back when the application releases the object.
  struct MemCharge {
    CommandSink* sink = nullptr;
    std::vector<std::pair<uint32_t, uint64_t>> held;  // device, bytes
    ~MemCharge() {
      for (const auto& [d, b] : held) sink->ReleaseMemory(d, b);
    }
  };
  struct MemObj {
    Ref<cl_mem> mem;
    uint64_t size = 0;       // buffers; 0 for images, so every buffer range check fails on them
    bool image = false;
    uint32_t image_type = 0;  // cl_mem_object_type of an image
    size_t element_bytes = 0;
    std::shared_ptr<MemCharge> charge{};  // none for sub-buffers (their parent's counts)
    std::shared_ptr<Residency::Allocation> alloc{};  // its recipe, to move it off the device
    std::shared_ptr<void> private_booking{};  // in the worker's own memory (PrivateRoom)
    // A large buffer of a client that offered no storage (TCP), on devices that work in place:
    // its storage is this process's memory, which inline write data is received into.
    std::shared_ptr<HostBuffer> own_storage{};
  };
  struct ProgramObj {
    Ref<cl_program> program;
    std::vector<uint32_t> devices;
    std::string source;      // created from source: the text (split scan, kernel_scan.h)
    bool splittable = false; // built from `source` alone and ScanForSplit() allows it
    bool linked = false;     // made by clLinkProgram: not built or compiled again
    bool from_binary = false;  // made by clCreateProgramWithBinary
    bool built = false;        // clBuildProgram succeeded at least once
    bool arg_info_added = false;  // its last build or compile had kArgInfoOption appended
    // Not splittable only for the builtins a prelude restores (kernel_scan.h): its variants.
    std::shared_ptr<RestoredVariants> variants{};
    bool restore_needs_local = false;  // it uses group ids: only launches with a local size
  };
  struct KernelObj {
    Ref<cl_kernel> kernel;
    std::shared_ptr<std::mutex> mu;  // guards the backend kernel's arguments while enqueuing
    uint32_t num_args = 0;
    bool splittable = false;  // from its program: launches may run in chunks
    std::map<uint32_t, KernelLimits> limits;  // per device index, queried before any argument
    std::string name;
    std::shared_ptr<RestoredVariants> variants;  // from its program (null: none)
    bool restore_needs_local = false;
  };
  struct Bulk {
    explicit Bulk(std::shared_ptr<HostBuffer> b) : buffer(std::move(b)), bytes(*buffer) {}
    std::shared_ptr<HostBuffer> buffer;
    HostBuffer& bytes;
    uint64_t filled = 0;  // chunks arrive in order, so [0, filled) is written
    // Received in place: `buffer` is this part of that buffer's own storage (0: staged).
    uint64_t direct_mem = 0;
    uint64_t direct_offset = 0;
  };
  // An OpenCL error with a message for the client.
  struct Err {
    cl_int code = CL_SUCCESS;
    std::string message;
    bool ok() const { return code == CL_SUCCESS; }
  };

  Err Handle(proto::wire::Request::Reader req, capnp::MallocMessageBuilder& reply, bool& replied);
  Err GetInfo(proto::wire::GetInfo::Reader r, capnp::MallocMessageBuilder& reply);
  Err Enqueue(uint64_t seq, proto::wire::Enqueue::Reader r, bool& replied);
  Err Finish(uint64_t seq, uint64_t queue, bool& replied);
  // `profiled`: a success's answer carries every event's profiling times (waitEventsProfiled).
  Err WaitEvents(uint64_t seq, capnp::List<uint64_t>::Reader ids, bool& replied,
                 bool profiled = false);
  Err BeginBulk(proto::wire::BulkBegin::Reader r);
  // The tenant's view of a device's memory: the backend's, bounded by the managed capacity and
  // the tenant's quota; and the largest allocation within it.
  uint64_t MemoryView(uint32_t device) const;
  uint64_t MaxAllocView(uint32_t device) const;
  // Reserves `bytes` on every device of the context for a new object (`buffer`: larger than
  // the largest allocation is CL_INVALID_BUFFER_SIZE).
  Err ChargeMemory(const std::vector<uint32_t>& devices, uint64_t bytes, bool buffer,
                   std::shared_ptr<MemCharge>& out);
  Err RefuseBulk(uint64_t seq, uint64_t token, Err e);
  // Checks a chunk of `n` bytes at `offset` of the bulk transfer `token` (a bulkData message's
  // or a data frame's): `*out` is the transfer to fill, or null for a chunk of a refused one.
  // An unknown token is an error; a chunk out of order or outside its transfer refuses it.
  Err PlaceChunk(uint64_t seq, uint64_t token, uint64_t offset, uint64_t n, Bulk** out);
  // Whether `bytes` more can be staged within max_bulk_bytes: waits while this session's
  // commands in flight (writes not yet run, reads not yet sent) can still free staging; false
  // at once for more than the limit, or when what holds it cannot be freed without the client.
  bool StagingRoom(uint64_t bytes);
  // limits_ from the core when its generation moved (a share changed).
  void RefreshLimits();
  // The bulk data under `token`, of `expected` bytes. Data received in place (Bulk::direct_mem)
  // is only for the plain write it was announced for: `direct_ok` says the caller is one.
  Err TakeBulk(uint64_t token, uint64_t expected, std::shared_ptr<Bulk>& out,
               bool direct_ok = false);
  // Whether the data BulkBegin announces for a plain write may be received straight into the
  // buffer: its storage is this process's (MemObj::own_storage) and nothing of the session is
  // in flight or waiting to be handed over, so no command can see the bytes before the write's
  // own turn (the client sends nothing between the data and the write's command).
  std::shared_ptr<HostBuffer> DirectTarget(proto::wire::BulkBegin::Reader r);
  // Commands of writes received in place not yet finished.
  std::shared_ptr<std::atomic<uint64_t>> direct_markers_ =
      std::make_shared<std::atomic<uint64_t>>(0);
  Err CreateImage(proto::wire::CreateImage::Reader r);
  // Host memory a read of `host_bytes` lands in: the client's shared memory passed with the
  // request (`shm`), else a fresh staging buffer (zero-filled with `zero`, for layouts with gaps
  // the device does not write). Counts against the session's staging limit.
  Err StageRead(uint64_t host_bytes, bool shm, bool zero, std::shared_ptr<HostBuffer>& out);
  // The completion of a read: the data (or the error) is the reply to `seq`.
  static std::function<void(cl_int)> ReadFinished(std::shared_ptr<SessionCore> core,
                                                  std::shared_ptr<HostBuffer> staging,
                                                  uint64_t seq, bool shm);
  // A read of a buffer with this process's storage (MemObj::own_storage), answered from it:
  // the bytes go out from the buffer once the read's wait list is done, and the command
  // completes only once they are sent, so nothing after it changes them meanwhile (run and
  // finished of `cmd`).
  void StorageRead(Command& cmd, std::shared_ptr<HostBuffer> view, uint64_t seq);
  // A large buffer read answered through the stream: the device reads it in pieces and each
  // piece is sent once it is in, while the next is read (run and finished of `cmd`).
  void StreamedRead(Command& cmd, Ref<cl_mem> mem, uint64_t offset,
                    std::shared_ptr<HostBuffer> staging, uint64_t seq);
  Err EnqueueImage(uint64_t seq, proto::wire::Enqueue::Reader r, Command& cmd, bool& replied);
  Result<cl_device_id> DeviceFor(uint64_t id) const;
  // A device list as the backend needs it: the pool's other devices after the one the tenant
  // sees (so the session's objects work on whichever the lease lends).
  std::vector<uint64_t> ExpandPool(std::vector<uint64_t> devices) const;
  bool OnPool(uint64_t device) const {
    return device < 64 && (core_->pool_mask >> device & 1) != 0;
  }
  uint64_t pool_contexts_ = 0;
  void Track(QueueObj& q, const std::shared_ptr<EventRecord>& ev);

  std::shared_ptr<SessionCore> core_;
  const Backend& backend_;
  const cl_icd_dispatch& cl_;
  CommandSink& sink_;
  SessionLimits limits_;  // the core's, as of the last request
  uint64_t limits_seen_ = 0;
  std::vector<DeviceLimits> device_limits_;  // per device index
  // A limit of SessionLimits that one more object/event would pass: the error to return.
  Err CheckObjects() const;
  Err CheckEvents() const;

  std::unordered_map<uint64_t, ContextObj> contexts_;
  std::unordered_map<uint64_t, QueueObj> queues_;
  std::unordered_map<uint64_t, MemObj> mems_;
  // The session's allocations, which the worker may move off a device and back (residency.h).
  std::shared_ptr<Residency> residency_;
  std::unordered_map<uint64_t, ProgramObj> programs_;
  std::unordered_map<uint64_t, KernelObj> kernels_;
  std::unordered_map<uint64_t, std::shared_ptr<EventRecord>> events_;
  std::unordered_map<uint64_t, Ref<cl_sampler>> samplers_;
  std::unordered_map<uint64_t, std::shared_ptr<Bulk>> bulk_;
  // The last bulk transfer refused (its begin or a chunk): the command that names its token
  // gets this error, and its remaining chunks are dropped quietly. A refused transfer is not
  // reported on its own (as an unasked error it would fail the client's next clFinish too).
  uint64_t refused_bulk_ = 0;
  Err refused_bulk_err_;
  // Bulk data that arrives as data frames goes straight into its staging buffer.
  class BulkSink : public proto::DataSink {
   public:
    explicit BulkSink(Session* s) : s_(s) {}
    uint8_t* Place(const proto::DataFrame& f) override;
    void Placed(const proto::DataFrame& f, bool complete) override;

   private:
    Session* s_;
  };
  BulkSink bulk_sink_{this};
  // Commands decoded but not yet handed to the scheduler: while more requests are already
  // waiting in the socket, commands are handed over together (one hand-over per batch).
  std::vector<std::shared_ptr<Command>> to_submit_;
  void SubmitPending();
  // Blocking writes the client returned from before they ran (Enqueue.toldComplete), not known
  // to be done, with their queue: every later command of their context runs after them. The
  // latest of a context stands for its earlier ones (it runs after them): one per context.
  struct ToldComplete {
    uint64_t queue;
    cl_context context;  // alive while the write is not done (its command holds the queue)
    std::shared_ptr<EventRecord> event;
  };
  std::vector<ToldComplete> told_complete_;
  int passed_fd_ = -1;  // a descriptor that came with the request being handled (-1: none)
  bool reply_ring_ = false;  // the client's frames go through a ring (SessionCore::UseRing)
  // The client's frames come through this ring once its `requestRing` is answered (Serve).
  std::unique_ptr<proto::ShmRing> request_ring_;
  // The client's storage arenas for small buffers (docs/protocol.md, "Buffers on shared
  // memory"), by number: mapped once, for the session (each buffer on one holds it too).
  std::unordered_map<uint32_t, std::shared_ptr<HostBuffer>> arenas_;
  // Buffers from this size without the client's storage get this process's (MemObj).
  static constexpr uint64_t kOwnStorageMinBytes = 1u << 20;
  static constexpr size_t kMaxArenas = 64;
  static constexpr uint64_t kArenaMaxBytes = 64u << 20;
  static constexpr uint64_t kArenaAlign = 256;
  static constexpr uint64_t kArenaBufferMax = 64u << 10;  // buffers in arenas are smaller
  // The arena of that number, mapped from the request's descriptor the first time.
  Result<std::shared_ptr<HostBuffer>> ArenaFor(uint32_t arena);
  // The first segment of every reply's builder, zeroed (the builder zeroes what it used when it
  // is destroyed): most requests are launches that are never answered, and a builder of its own
  // would allocate and clear 8 KiB for each.
  static constexpr size_t kReplyScratchWords = 1024;
  std::unique_ptr<capnp::word[]> reply_scratch_{new capnp::word[kReplyScratchWords]()};
  // The client reuses its shared buffers, so their mappings are kept (by inode), at most
  // kMaxShmMaps of them and max_bulk_bytes_per_session bytes in all, oldest dropped first, and
  // dropped when the client says it destroyed the buffer (shmForget): a kept mapping pins the
  // client's pages.
  Result<std::shared_ptr<HostBuffer>> MapShared(int fd, size_t size);
  static constexpr size_t kMaxShmMaps = 16;
  std::vector<std::pair<uint64_t, std::shared_ptr<HostBuffer>>> shm_maps_;
  // Per backend device: whether buffers may live on the client's shared memory
  // (SharesHostMemory, asked once; -1 not yet).
  std::vector<int8_t> shares_host_;
  std::vector<int8_t> shares_host_slots_;  // the same for a small slot inside a page
  bool StorageFor(const ContextObj& ctx);
  // Whether every device of `ctx` works in place on `size` bytes `offset` into a page
  // (SharesHostMemory, asked once per device and kept in `cache`).
  bool EveryDeviceShares(const ContextObj& ctx, std::vector<int8_t>& cache, size_t offset,
                         size_t size);
  // Whether a small buffer of `size` bytes at `offset` that is not whole pages works in place
  // too (probed once per device with a 256-byte buffer 256 bytes into a page).
  bool SlotStorageFor(const ContextObj& ctx, uint64_t offset, uint64_t size);
  std::shared_ptr<StorageBooks> storage_books_ = std::make_shared<StorageBooks>();
  // Books `bytes` more on shared memory when they fit; false to make the buffer in the
  // worker's own memory.
  bool StorageRoom(uint64_t bytes, bool own_mapping = true);
  // Books `what` ("a buffer", "an image") of `bytes` in the worker's own memory when it fits the
  // worker's memory limit (worker_memory_bytes) with everything else; the booking, in
  // `*booking` (left null without a limit), ends when that handle goes. Otherwise
  // CL_MEM_OBJECT_ALLOCATION_FAILURE: PoCL allocates at a buffer's first use and aborts the
  // process when that fails, so such a buffer is refused when it is made.
  Err PrivateRoom(uint64_t bytes, const char* what, std::shared_ptr<void>* booking);
};

// Whether device `i` is a pool device the tenant does not see (every one but the lowest).
inline bool PoolHidden(uint64_t pool_mask, uint32_t i) {
  return i < 64 && (pool_mask >> i & 1) != 0 && (pool_mask & ((uint64_t{1} << i) - 1)) != 0;
}

// The hello reply: the protocol version, the tenant, the session and the backend's devices
// (the pool's as one, docs/operations.md "Device pool").
// `remote_copy`: the worker may copy straight from and to the client (remote_copy.h).
void BuildHelloReply(capnp::MessageBuilder& b, const Backend& backend, const std::string& tenant,
                     uint64_t session, uint64_t pool_mask = 0, bool remote_copy = false);

// Maps a daemon Status to the OpenCL code sent on the wire (the one place this happens).
cl_int StatusToCl(const Status& status);

}  // namespace gmux::daemon
