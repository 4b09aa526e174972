#include "daemon/session.h"

#include "common/cpu_apart.h"
#include "common/sealed_memfd.h"
#include "common/stage_trace.h"

#include "daemon/remote_copy.h"

#include "proto/event_profile.h"
#include "proto/image_layout.h"
#include "proto/spin_wait.h"

#include "daemon/kernel_scan.h"
#include "daemon/splitter.h"

#include <kj/exception.h>

#include <fcntl.h>
#include <ftw.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <array>
#include <condition_variable>
#include <deque>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <system_error>
#include <thread>

#include <spdlog/spdlog.h>

namespace gmux::daemon {

namespace {
// Reads from this size sent through the stream run as device reads of kReadPieceBytes each,
// every piece sent as soon as it is in (Session::StreamedRead).
constexpr size_t kReadPieceBytes = 8u << 20;
constexpr size_t kStreamedReadBytes = 2 * kReadPieceBytes;
}  // namespace

namespace wire = proto::wire;

SessionCore::~SessionCore() {
  Close();
  if (writer_.joinable()) writer_.join();
  if (fd >= 0) ::close(fd);
}

namespace {

// The -I directories of one build, recreated from the headers the client sent (src/icd/includes.h)
// in a private directory that lives as long as the build. Only names that stay below their
// directory are written, and nothing outside this worker's own temporary directory.
class IncludeTree {
 public:
  IncludeTree() = default;
  IncludeTree(const IncludeTree&) = delete;
  IncludeTree& operator=(const IncludeTree&) = delete;
  ~IncludeTree() {
    if (!root_.empty()) {
      ::nftw(root_.c_str(), [](const char* path, const struct stat*, int, struct FTW*) {
        return ::remove(path);
      }, 16, FTW_DEPTH | FTW_PHYS);
    }
  }

  // An error message, or "" when the tree is ready.
  std::string Make(uint32_t dirs, capnp::List<proto::wire::IncludeFile>::Reader files) {
    if (dirs == 0 && files.size() == 0) return "";
    if (dirs > 256) return "more than 256 -I directories";
    const char* tmp = std::getenv("TMPDIR");
    std::string tmpl = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") +
                       "/gmux-include-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) return std::string("mkdtemp: ") + std::strerror(errno);
    root_ = tmpl;
    dirs_ = dirs;
    for (uint32_t d = 0; d < dirs; ++d) {
      if (::mkdir(Dir(d).c_str(), 0700) != 0) return std::string("mkdir: ") + std::strerror(errno);
    }
    for (auto f : files) {
      const std::string name = f.getName().cStr();
      if (f.getDir() >= dirs) return "include file '" + name + "' names no -I directory";
      if (!Safe(name)) return "include file name '" + name + "' is absolute or leaves its directory";
      std::string path = Dir(f.getDir());
      for (size_t slash = name.find('/'); slash != std::string::npos;
           slash = name.find('/', slash + 1)) {
        std::string sub = path + "/" + name.substr(0, slash);
        if (::mkdir(sub.c_str(), 0700) != 0 && errno != EEXIST) {
          return "mkdir " + name.substr(0, slash) + ": " + std::strerror(errno);
        }
      }
      path += "/" + name;
      int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
      if (fd < 0) return "include file '" + name + "': " + std::strerror(errno);
      auto data = f.getData();
      size_t done = 0;
      while (done < data.size()) {
        ssize_t w = ::write(fd, data.begin() + done, data.size() - done);
        if (w <= 0) break;
        done += static_cast<size_t>(w);
      }
      ::close(fd);
      if (done != data.size()) return "include file '" + name + "': short write";
    }
    return "";
  }

  // The -I options that replace the client's, in its order.
  std::string Options() const {
    std::string out;
    for (uint32_t d = 0; d < dirs_; ++d) out += "-I" + Dir(d) + " ";
    return out;
  }

 private:
  std::string Dir(uint32_t d) const { return root_ + "/" + std::to_string(d); }
  static bool Safe(const std::string& name) {
    if (name.empty() || name.size() > 4096 || name.front() == '/') return false;
    size_t start = 0;
    for (;;) {
      size_t slash = name.find('/', start);
      std::string_view part(name.data() + start,
                            (slash == std::string::npos ? name.size() : slash) - start);
      if (part.empty() || part == "." || part == "..") return false;
      if (slash == std::string::npos) return true;
      start = slash + 1;
    }
  }

  std::string root_;
  uint32_t dirs_ = 0;
};

// Host access flags are the application's promise about its own transfers, which the ICD checks
// (CL_INVALID_OPERATION); the worker itself moves the data for every transfer and map, so the
// backend objects are created without them.
constexpr cl_mem_flags kHostAccessFlags =
    CL_MEM_HOST_WRITE_ONLY | CL_MEM_HOST_READ_ONLY | CL_MEM_HOST_NO_ACCESS;

// Replies (not read data, which the session's staging limit bounds) a client may leave unread
// before it is cut off.
constexpr size_t kMaxUnreadReplyBytes = 64u << 20;
}  // namespace

void SessionCore::Send(capnp::MessageBuilder& message) {
  std::lock_guard<std::mutex> lock(out_mu_);
  if (closed.load() || stop_) return;
  if (out_.empty() && !writing_) {
    auto rest = proto::WriteFrameNow(outlet(), proto::FrameKind::kReply, message, limits);
    GMUX_STAGE(6);
    if (!rest.ok() || rest->empty()) return;
    Queue(Out{std::move(*rest), nullptr});
    return;
  }
  auto frame = proto::EncodeFrame(proto::FrameKind::kReply, message, limits);
  if (frame.ok()) Queue(Out{std::move(*frame), nullptr});
}

void SessionCore::Queue(Out out) {
  queued_bytes_ += out.bytes.size();
  out_.push_back(std::move(out));
  if (queued_bytes_ > kMaxUnreadReplyBytes) {
    // The client has stopped reading: it is cut off rather than let the worker grow.
    spdlog::warn("session {} of tenant '{}' left {} bytes of replies "
                 "unread: disconnected", static_cast<unsigned long long>(id),
                 tenant_name.c_str(), queued_bytes_);
    CloseLocked();
    return;
  }
  if (!writer_.joinable()) {
    writer_ = std::thread([this] { WriterLoop(); });
  }
  out_cv_.notify_one();
}

void SessionCore::Defer(std::function<void()> write) {
  std::lock_guard<std::mutex> lock(out_mu_);
  if (closed.load() || stop_) return;
  Queue(Out{{}, std::move(write)});
}

bool SessionCore::DeferIfIdle(std::function<void()>& write) {
  std::lock_guard<std::mutex> lock(out_mu_);
  if (closed.load() || stop_ || writing_ || !out_.empty()) return false;
  Queue(Out{{}, std::move(write)});
  return true;
}

void SessionCore::SendFromWriter(capnp::MessageBuilder& message) {
  if (closed.load()) return;
  proto::WriteFrame(outlet(), proto::FrameKind::kReply, message, limits).IgnoreError();
}

void SessionCore::UseRing(uint64_t seq, std::shared_ptr<proto::ShmRing> ring) {
  Defer([this, seq, ring] {
    capnp::MallocMessageBuilder b;
    auto r = b.initRoot<wire::Reply>();
    r.setSeq(seq);
    r.setStatus(CL_SUCCESS);
    SendFromWriter(b);  // the last frame on the socket
    std::lock_guard<std::mutex> lock(out_mu_);
    if (!stop_) ring_ = ring;
  });
}

void SessionCore::SendDataFromWriter(uint64_t seq, uint64_t offset, const uint8_t* data,
                                     size_t n, bool last) {
  if (closed.load()) return;
  proto::WriteDataFrame(outlet(), {seq, offset, static_cast<uint32_t>(n), last}, data, limits)
      .IgnoreError();
}

void SessionCore::WriterLoop() {
  std::unique_lock<std::mutex> lock(out_mu_);
  for (;;) {
    out_cv_.wait(lock, [&] { return stop_ || !out_.empty(); });
    if (stop_) return;
    Out o = std::move(out_.front());
    out_.pop_front();
    queued_bytes_ -= o.bytes.size();
    writing_ = true;
    lock.unlock();
    if (o.write) {
      o.write();
    } else if (!closed.load()) {
      proto::WriteAll(outlet(), o.bytes).IgnoreError();
    }
    o = Out{};  // a deferred writer's data is released before the lock is taken again
    lock.lock();
    writing_ = false;
  }
}

void SessionCore::SetSessionLimits(const SessionLimits& l) {
  {
    std::lock_guard<std::mutex> lock(limits_mu_);
    session_limits_ = l;
  }
  limits_generation.fetch_add(1);
}

SessionLimits SessionCore::SessionLimitsNow() const {
  std::lock_guard<std::mutex> lock(limits_mu_);
  return session_limits_;
}

void SessionCore::Close() {
  std::lock_guard<std::mutex> lock(out_mu_);
  CloseLocked();
}

void SessionCore::CloseLocked() {
  closed = true;
  stop_ = true;
  out_.clear();
  queued_bytes_ = 0;
  out_cv_.notify_all();
  // Wakes a writer blocked on a client that does not read; the descriptor stays open until the
  // writer is joined.
  if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
  if (ring_) ring_->Close();
}

void SessionCore::SendStatus(uint64_t seq, cl_int status, const std::string& message) {
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire::Reply>();
  r.setSeq(seq);
  r.setStatus(status);
  r.setMessage(message);
  Send(b);
}

Result<std::shared_ptr<HostBuffer>> HostBuffer::MapSealed(int fd, size_t size, bool populate) {
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  GMUX_RETURN_IF_ERROR(CheckSealedMemfd(fd, size, "shared memory", "the transfer"));
  auto b = std::shared_ptr<HostBuffer>(new HostBuffer());
  b->size_ = size;
  if (size > 0) {
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE,
                     MAP_SHARED | (populate ? MAP_POPULATE : 0), fd, 0);
    if (p == MAP_FAILED) return ResourceExhausted("cannot map shared memory");
    b->data_ = static_cast<uint8_t*>(p);
    b->mapped_ = true;
  }
  return b;
}

void HostBuffer::FaultInAhead() {
  if (mapped_ && !prefault_) prefault_ = Prefaulter::Get().Start(data_, size_);
}

std::shared_ptr<HostBuffer> HostBuffer::View(std::shared_ptr<HostBuffer> whole, size_t size) {
  return View(std::move(whole), 0, size);
}

std::shared_ptr<HostBuffer> HostBuffer::View(std::shared_ptr<HostBuffer> whole, size_t offset,
                                             size_t size) {
  auto v = std::shared_ptr<HostBuffer>(new HostBuffer());
  offset = std::min(offset, whole->size_);
  v->data_ = whole->data_ + offset;
  v->size_ = std::min(size, whole->size_ - offset);
  v->whole_ = std::move(whole);
  return v;
}

// A buffer's own storage from this size asks for transparent huge pages: its first touch
// (a write received over TCP, or the device's) then faults 2 MiB at a time instead of 4 KiB,
// which cut the first 256 MiB write into a new buffer over TCP by 40 % (docs/performance.md,
// "Transfers over TCP: the bound read honestly"). The buffer's whole size is charged and booked
// already, so a huge page cannot hold more than the tenant was charged for. Only a hint: with
// THP off (or `never`), nothing changes; with `defrag` at its default (`madvise`), a fault may
// compact memory to find a huge page.
constexpr size_t kHugeStorageMinBytes = 8u << 20;

std::shared_ptr<HostBuffer> HostBuffer::Anonymous(size_t n) {
  if (n == 0) return nullptr;
  auto b = std::shared_ptr<HostBuffer>(new HostBuffer());
  void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  if (n >= kHugeStorageMinBytes) ::madvise(p, n, MADV_HUGEPAGE);
  b->data_ = static_cast<uint8_t*>(p);
  b->size_ = n;
  b->mapped_ = true;
  return b;
}

namespace {

// The last large staging buffers released, kept for the next transfers: a large allocation is
// mapped afresh each time, and faulting in and zeroing 256 MiB cost more than the transfer's
// copies over TCP. Two, so that a write that arrives while the previous one still copies to the
// device (a blocking write over TCP returns once its data is sent) finds one too; the largest
// released, together at most kKeptMaxBytes; all dropped when an allocation fails (the tenant's
// memory limit counts them).
constexpr size_t kKeptMinBytes = 1u << 20;
constexpr size_t kKeptMaxBytes = 1u << 30;
constexpr size_t kKeptBuffers = 2;
struct KeptBuffers {
  struct Kept {
    std::unique_ptr<uint8_t[]> buf;
    size_t capacity = 0;
  };
  std::mutex mu;
  std::vector<Kept> kept;
  size_t Total() const {
    size_t t = 0;
    for (const Kept& k : kept) t += k.capacity;
    return t;
  }
};
KeptBuffers& Kept() {
  static auto* k = new KeptBuffers();  // never destroyed: buffers may be released at exit
  return *k;
}

// Large shared mappings are unmapped by a thread of their own. Unmapping the last mapping of a
// client's memfd frees its pages (34 ms for 256 MiB on the 2-core VM, shmem's freeing costs
// more than anonymous memory's), and the thread that releases a buffer is the session's, whose
// next request (often the next clCreateBuffer) would wait for it; natively, the application's
// clReleaseMemObject pays the free(), not the next call.
constexpr size_t kUnmapLaterBytes = 4u << 20;
class Unmapper {
 public:
  static Unmapper& Get() {
    static auto* u = new Unmapper();  // never destroyed: its thread runs until the process ends
    return *u;
  }
  void Add(void* p, size_t n) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!started_) {
        try {
          std::thread([this] { Run(); }).detach();
          started_ = true;
        } catch (const std::system_error&) {
          // No thread to be had: unmapped here, as small mappings are.
        }
      }
      if (started_) {
        todo_.emplace_back(p, n);
        cv_.notify_one();
        return;
      }
    }
    ::munmap(p, n);
  }

 private:
  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [this] { return !todo_.empty(); });
      auto [p, n] = todo_.front();
      todo_.pop_front();
      lock.unlock();
      ::munmap(p, n);
      lock.lock();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<void*, size_t>> todo_;
  bool started_ = false;
};

}  // namespace

HostBuffer::HostBuffer(size_t n) : size_(n) {
  KeptBuffers& k = Kept();
  if (n >= kKeptMinBytes) {
    std::lock_guard<std::mutex> lock(k.mu);
    // The smallest that fits, but not one more than twice the size: its pages would be held for
    // nothing.
    auto best = k.kept.end();
    for (auto it = k.kept.begin(); it != k.kept.end(); ++it) {
      if (it->capacity >= n && it->capacity / 2 <= n &&
          (best == k.kept.end() || it->capacity < best->capacity)) {
        best = it;
      }
    }
    if (best != k.kept.end()) {
      heap_ = std::move(best->buf);
      capacity_ = best->capacity;
      k.kept.erase(best);
    }
  }
  if (!heap_) {
    try {
      heap_.reset(new uint8_t[n]);
    } catch (const std::bad_alloc&) {
      {
        std::lock_guard<std::mutex> lock(k.mu);
        k.kept.clear();
      }
      heap_.reset(new uint8_t[n]);
    }
    capacity_ = n;
  }
  data_ = heap_.get();
}

HostBuffer::~HostBuffer() {
  Prefaulter::Get().Stop(prefault_);
  if (mapped_ && size_ >= kUnmapLaterBytes) {
    Unmapper::Get().Add(data_, size_);
  } else if (mapped_) {
    ::munmap(data_, size_);
  }
  std::vector<std::unique_ptr<uint8_t[]>> dropped;  // destroyed last, after the lock
  if (heap_ && capacity_ >= kKeptMinBytes && capacity_ <= kKeptMaxBytes) {
    KeptBuffers& k = Kept();
    std::lock_guard<std::mutex> lock(k.mu);
    // Kept in place of the smallest kept ones while the total would pass the bound or there
    // are kKeptBuffers already; not kept if that would drop a larger one.
    std::sort(k.kept.begin(), k.kept.end(),
              [](const auto& a, const auto& b) { return a.capacity < b.capacity; });
    size_t drop = 0;
    size_t total = k.Total();
    while (drop < k.kept.size() &&
           (k.kept.size() - drop >= kKeptBuffers || total + capacity_ > kKeptMaxBytes) &&
           k.kept[drop].capacity <= capacity_) {
      total -= k.kept[drop].capacity;
      ++drop;
    }
    if (k.kept.size() - drop < kKeptBuffers && total + capacity_ <= kKeptMaxBytes) {
      // Freed after the lock is let go (up to a GiB of pages to give back).
      for (size_t i = 0; i < drop; ++i) dropped.push_back(std::move(k.kept[i].buf));
      k.kept.erase(k.kept.begin(), k.kept.begin() + static_cast<std::ptrdiff_t>(drop));
      k.kept.push_back({std::move(heap_), capacity_});
    }
  }
}

cl_int StatusToCl(const Status& status) {
  switch (status.code()) {
    case StatusCode::kOk: return CL_SUCCESS;
    case StatusCode::kNotFound: return CL_INVALID_VALUE;
    case StatusCode::kPermissionDenied: return CL_INVALID_OPERATION;
    case StatusCode::kResourceExhausted: return CL_OUT_OF_RESOURCES;
    case StatusCode::kUnavailable: return CL_DEVICE_NOT_AVAILABLE;
    case StatusCode::kUnimplemented: return CL_INVALID_OPERATION;
    case StatusCode::kFailedPrecondition: return CL_INVALID_OPERATION;
    default: return CL_INVALID_VALUE;
  }
}

namespace {

constexpr size_t kMaxInfoBytes = 1u << 20;

// Whether a command's profiling times can be read: it completed, or its results are being
// delivered (`ran` is set just before the record completes).
bool ProfilingReady(const EventRecord& ev) { return ev.status() == CL_COMPLETE || ev.ran.load(); }

// A completed command's profiling times, each as clGetEventProfilingInfo of the backend event
// that answers it (EventRecord::ProfilingEvent); what the backend does not give is left out.
proto::EventProfile ProfileOf(const EventRecord& ev) {
  proto::EventProfile all;
  for (uint32_t i = 0; i < proto::kProfilingValues; ++i) {
    const cl_profiling_info q = proto::kProfilingFirst + i;
    Ref<cl_event> b = ev.ProfilingEvent(q);
    cl_ulong t = 0;
    if (b && Dispatch(b->h).clGetEventProfilingInfo(b->h, q, sizeof(t), &t, nullptr) ==
                 CL_SUCCESS) {
      all.value[i] = t;
      all.available |= 1u << i;
    }
  }
  return all;
}

// Info parameters whose values are handles or host pointers: the client answers them itself,
// and the daemon never sends a backend address.
bool IsHandleParam(uint32_t p) {
  switch (p) {
    case CL_DEVICE_PLATFORM: case CL_DEVICE_PARENT_DEVICE:
    case CL_CONTEXT_DEVICES: case CL_CONTEXT_PROPERTIES:
    case CL_QUEUE_CONTEXT: case CL_QUEUE_DEVICE: case CL_QUEUE_DEVICE_DEFAULT:
    case CL_SAMPLER_CONTEXT:
    case CL_MEM_CONTEXT: case CL_MEM_ASSOCIATED_MEMOBJECT: case CL_MEM_HOST_PTR:
    case CL_IMAGE_BUFFER:
    case CL_PROGRAM_CONTEXT: case CL_PROGRAM_DEVICES:
    case CL_KERNEL_PROGRAM: case CL_KERNEL_CONTEXT:
    case CL_EVENT_COMMAND_QUEUE: case CL_EVENT_CONTEXT:
      return true;
    default:
      return false;
  }
}

bool Triple(capnp::List<uint64_t>::Reader l, size_t out[3]) {
  if (l.size() != 3) return false;
  for (unsigned i = 0; i < 3; ++i) out[i] = static_cast<size_t>(l[i]);
  return true;
}

struct RectArgs {
  size_t buffer_origin[3];
  size_t host_origin[3];
  size_t region[3];
  size_t brp, bsp, hrp, hsp;
  uint64_t buffer_end = 0;
  uint64_t host_end = 0;
};

bool DecodeRect(wire::Rect::Reader r, RectArgs& a) {
  if (!Triple(r.getBufferOrigin(), a.buffer_origin) || !Triple(r.getHostOrigin(), a.host_origin) ||
      !Triple(r.getRegion(), a.region)) {
    return false;
  }
  a.brp = r.getBufferRowPitch();
  a.bsp = r.getBufferSlicePitch();
  a.hrp = r.getHostRowPitch();
  a.hsp = r.getHostSlicePitch();
  return proto::RectEnd(a.buffer_origin, a.region, a.brp, a.bsp, a.buffer_end) &&
         proto::RectEnd(a.host_origin, a.region, a.hrp, a.hsp, a.host_end);
}

// An image region's origin and region (3 entries each) and the host bytes its layout spans.
struct ImageRegion {
  size_t origin[3];
  size_t region[3];
  uint64_t host_bytes = 0;
};

// origin + region does not wrap around in any dimension. The backend checks the region against
// the image's size, and PoCL 3.1 does so with the sum: a wrapped end passes, and a read, write
// or fill of the image then runs far outside it.
bool RegionEnds(const size_t origin[3], const size_t region[3]) {
  size_t end = 0;
  for (int i = 0; i < 3; ++i) {
    if (__builtin_add_overflow(origin[i], region[i], &end)) return false;
  }
  return true;
}

bool DecodeImageRegion(capnp::List<uint64_t>::Reader origin, capnp::List<uint64_t>::Reader region,
                       uint32_t image_type, size_t element_bytes, size_t row_pitch,
                       size_t slice_pitch, ImageRegion& out) {
  return Triple(origin, out.origin) && Triple(region, out.region) &&
         RegionEnds(out.origin, out.region) &&
         proto::ImageHostBytes(image_type, out.region, element_bytes, row_pitch, slice_pitch,
                               out.host_bytes);
}

}  // namespace

namespace {
uint64_t PrivateDataBytes();
}  // namespace

Session::Session(std::shared_ptr<SessionCore> core, const Backend& backend, CommandSink& sink,
                 SessionLimits limits)
    : core_(std::move(core)), backend_(backend), cl_(backend.cl()), sink_(sink),
      limits_(limits) {
  for (cl_device_id d : backend_.devices()) {
    DeviceLimits l;
    cl_uint dims = 3, bits = 64;
    size_t sizes[16] = {};
    cl_ulong local = 0, alloc = 0;
    cl_.clGetDeviceInfo(d, CL_DEVICE_MAX_WORK_ITEM_DIMENSIONS, sizeof(dims), &dims, nullptr);
    cl_.clGetDeviceInfo(d, CL_DEVICE_MAX_WORK_ITEM_SIZES, sizeof(sizes), sizes, nullptr);
    cl_.clGetDeviceInfo(d, CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof(l.max_work_group_size),
                        &l.max_work_group_size, nullptr);
    cl_.clGetDeviceInfo(d, CL_DEVICE_LOCAL_MEM_SIZE, sizeof(local), &local, nullptr);
    cl_.clGetDeviceInfo(d, CL_DEVICE_ADDRESS_BITS, sizeof(bits), &bits, nullptr);
    cl_.clGetDeviceInfo(d, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof(alloc), &alloc, nullptr);
    cl_ulong global = 0;
    cl_.clGetDeviceInfo(d, CL_DEVICE_GLOBAL_MEM_SIZE, sizeof(global), &global, nullptr);
    l.global_mem_size = global;
    l.max_work_item_dims = dims;
    for (int i = 0; i < 3; ++i) l.max_work_item_sizes[i] = sizes[i];
    l.local_mem_size = local;
    l.address_bits = bits == 32 ? 32 : 64;
    l.max_mem_alloc_size = alloc;
    device_limits_.push_back(l);
  }
  residency_ = std::make_shared<Residency>(cl_, backend_.devices());
  sink_.AttachResidency(residency_);
  // PrivateRoom's baseline: the worker's private data before the tenant made anything (taken
  // later, it would hold the first transfer's staging for good).
  {
    std::lock_guard<std::mutex> books_lock(storage_books_->mu);
    storage_books_->ReadLimitLocked();
    if (storage_books_->data_limit != 0) storage_books_->base_private = PrivateDataBytes();
  }
}

uint64_t Session::MemoryView(uint32_t device) const {
  uint64_t v = device < device_limits_.size() ? device_limits_[device].global_mem_size : 0;
  if (limits_.memory_capacity != 0) v = std::min(v, limits_.memory_capacity);
  if (limits_.memory_quota != 0) v = std::min(v, limits_.memory_quota);
  return v;
}

uint64_t Session::MaxAllocView(uint32_t device) const {
  uint64_t v = device < device_limits_.size() ? device_limits_[device].max_mem_alloc_size : 0;
  return std::min(v, MemoryView(device));
}

Session::Err Session::ChargeMemory(const std::vector<uint32_t>& devices, uint64_t bytes,
                                   bool buffer, std::shared_ptr<MemCharge>& out) {
  out = std::make_shared<MemCharge>();
  out->sink = &sink_;
  if (bytes == 0) return {};
  // A pool device is lent whole: its memory is the lease holder's, and the backend's limits
  // are the only ones (docs/operations.md, "Device pool").
  std::vector<uint32_t> shared;
  for (uint32_t d : devices) {
    if (!OnPool(d)) shared.push_back(d);
  }
  for (uint32_t d : shared) {
    if (buffer && bytes > MaxAllocView(d)) {
      return {CL_INVALID_BUFFER_SIZE, "buffer of " + std::to_string(bytes) +
                                          " bytes is larger than CL_DEVICE_MAX_MEM_ALLOC_SIZE (" +
                                          std::to_string(MaxAllocView(d)) + ") of device " +
                                          std::to_string(d)};
    }
  }
  for (uint32_t d : shared) {
    CommandSink::MemoryAnswer a = sink_.ReserveMemory(d, bytes);
    if (!a.granted) {
      // What was reserved on other devices goes back with `out`.
      std::string why =
          a.limit == 0 ? "no answer from gmuxd"
          : a.over_quota
              ? "the tenant's memory_quota on device " + std::to_string(d) + " (" +
                    std::to_string(a.used) + " of " + std::to_string(a.limit) + " bytes in use)"
              : "the memory gmuxd manages on device " + std::to_string(d) + " (memory_bytes, " +
                    std::to_string(a.limit) + " bytes) is taken";
      return {CL_MEM_OBJECT_ALLOCATION_FAILURE,
              std::to_string(bytes) + " more bytes exceed " + why};
    }
    out->held.emplace_back(d, bytes);
  }
  return {};
}

Session::Err Session::CheckObjects() const {
  if (limits_.max_objects == 0) return {};
  const uint64_t n = contexts_.size() + queues_.size() + mems_.size() + programs_.size() +
                     kernels_.size() + samplers_.size();
  if (n >= limits_.max_objects) {
    return {CL_OUT_OF_HOST_MEMORY, "this tenant holds " + std::to_string(n) +
                                       " OpenCL objects, its limit (max_objects)"};
  }
  return {};
}

Session::Err Session::CheckEvents() const {
  if (limits_.max_events != 0 && events_.size() >= limits_.max_events) {
    return {CL_OUT_OF_HOST_MEMORY, "this tenant holds " + std::to_string(events_.size()) +
                                       " events, its limit (max_events)"};
  }
  return {};
}

Result<std::shared_ptr<HostBuffer>> Session::MapShared(int fd, size_t size) {
  struct stat st{};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return InvalidArgument("cannot stat shared memory");
  }
  uint64_t key = static_cast<uint64_t>(st.st_ino);
  for (auto& [k, whole] : shm_maps_) {
    if (k == key && whole->size() >= size) {
      // Same memfd as before (its seal still holds: the inode is the one we checked).
      ::close(fd);
      return HostBuffer::View(whole, size);
    }
  }
  // Only the bytes this transfer uses are mapped (a client's large memfd costs nothing more);
  // MapSealed checks the file is at least that long.
  GMUX_ASSIGN_OR_RETURN(auto whole, HostBuffer::MapSealed(fd, size));
  std::erase_if(shm_maps_, [&](const auto& e) { return e.first == key; });
  if (shm_maps_.size() >= kMaxShmMaps) shm_maps_.erase(shm_maps_.begin());
  size_t kept = whole->size();
  for (const auto& e : shm_maps_) kept += e.second->size();
  while (!shm_maps_.empty() && kept > limits_.max_bulk_bytes) {
    kept -= shm_maps_.front().second->size();
    shm_maps_.erase(shm_maps_.begin());
  }
  // One larger than the limit itself is used once, not kept (the transfer still holds it).
  if (whole->size() <= limits_.max_bulk_bytes) shm_maps_.emplace_back(key, whole);
  return HostBuffer::View(whole, size);
}

bool Session::StorageFor(const ContextObj& ctx) {
  // A pool context stands for devices the tenant does not see: not asked.
  if (ctx.pool || ctx.devices.empty()) return false;
  return EveryDeviceShares(ctx, shares_host_, 0, 4096);
}

bool Session::EveryDeviceShares(const ContextObj& ctx, std::vector<int8_t>& cache,
                                size_t offset, size_t size) {
  cache.resize(backend_.devices().size(), -1);
  for (uint32_t d : ctx.devices) {
    if (d >= cache.size()) return false;
    if (cache[d] < 0) {
      cache[d] = SharesHostMemory(cl_, ctx.ctx->h, backend_.devices()[d], offset, size) ? 1 : 0;
    }
    if (cache[d] == 0) return false;
  }
  return true;
}

namespace {
// Whether no device's build log of `program` names a compiler error ("error:"), for every
// device of `dv` (none given: every device of the program).
bool NoCompilerError(const cl_icd_dispatch& cl, cl_program program,
                     std::vector<cl_device_id> dv) {
  if (dv.empty()) {
    cl_uint n = 0;
    if (cl.clGetProgramInfo(program, CL_PROGRAM_NUM_DEVICES, sizeof(n), &n, nullptr) !=
            CL_SUCCESS || n == 0) {
      return false;
    }
    dv.resize(n);
    if (cl.clGetProgramInfo(program, CL_PROGRAM_DEVICES, n * sizeof(cl_device_id), dv.data(),
                            nullptr) != CL_SUCCESS) {
      return false;
    }
  }
  for (cl_device_id d : dv) {
    size_t size = 0;
    if (cl.clGetProgramBuildInfo(program, d, CL_PROGRAM_BUILD_LOG, 0, nullptr, &size) !=
        CL_SUCCESS) {
      return false;
    }
    std::string log(size, '\0');
    if (size > 0 && cl.clGetProgramBuildInfo(program, d, CL_PROGRAM_BUILD_LOG, size, log.data(),
                                             nullptr) != CL_SUCCESS) {
      return false;
    }
    for (char& c : log) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (log.find("error") != std::string::npos) return false;
  }
  return true;
}
}  // namespace

bool Session::SlotStorageFor(const ContextObj& ctx, uint64_t offset, uint64_t size) {
  // Whole pages: what StorageFor probed.
  static const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  if (offset % page == 0 && size % page == 0) return true;
  return EveryDeviceShares(ctx, shares_host_slots_, kArenaAlign, kArenaAlign);
}

namespace {
// Appended to the build options of programs from source (BUILD_PROGRAM, COMPILE_PROGRAM).
constexpr std::string_view kArgInfoOption = " -cl-kernel-arg-info";

// Buffers on shared memory one session may hold: each is a mapping, and a process has at most
// vm.max_map_count (65,530 by default) for everything.
constexpr uint64_t kMaxStorageBuffers = 8192;

// The worker's private data (VmData), what RLIMIT_DATA limits.
uint64_t PrivateDataBytes() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmData:", 0) == 0) return std::strtoull(line.c_str() + 7, nullptr, 10) << 10;
  }
  return 0;
}
}  // namespace

void StorageBooks::ApplyLocked() const {
  if (data_limit == 0) return;
  rlimit lim{};
  if (::getrlimit(RLIMIT_DATA, &lim) != 0) return;
  lim.rlim_cur = bytes >= data_limit ? 0 : data_limit - bytes;
  ::setrlimit(RLIMIT_DATA, &lim);
}

void StorageBooks::KeepLocked(KeptMapping m, std::vector<std::shared_ptr<HostBuffer>>& gone) {
  kept_bytes += m.mapping->size();
  kept.push_back(std::move(m));
  while (kept_bytes > kKeptMappingsBytes || kept.size() > kKeptMappingsEntries) {
    const uint64_t n = kept.front().mapping->size();
    kept_bytes -= n;
    UnbookLocked(n);
    gone.push_back(std::move(kept.front().mapping));
    kept.pop_front();
  }
}

bool StorageBooks::DropKeptLocked(std::vector<std::shared_ptr<HostBuffer>>& gone) {
  if (kept.empty()) return false;
  for (KeptMapping& k : kept) {
    UnbookLocked(k.mapping->size());
    gone.push_back(std::move(k.mapping));
  }
  kept.clear();
  kept_bytes = 0;
  ApplyLocked();
  return true;
}

std::shared_ptr<HostBuffer> StorageBooks::TakeKeptLocked(uint64_t dev, uint64_t ino,
                                                         size_t size) {
  for (auto it = kept.rbegin(); it != kept.rend(); ++it) {
    if (it->dev != dev || it->ino != ino || it->mapping->size() != size) continue;
    std::shared_ptr<HostBuffer> m = std::move(it->mapping);
    kept_bytes -= size;
    kept.erase(std::next(it).base());
    return m;
  }
  return nullptr;
}

Result<std::shared_ptr<HostBuffer>> Session::ArenaFor(uint32_t arena) {
  int fd = passed_fd_;
  passed_fd_ = -1;
  if (auto it = arenas_.find(arena); it != arenas_.end()) {
    if (fd >= 0) ::close(fd);  // offered again (an earlier request failed after taking it)
    return it->second;
  }
  if (fd < 0) return InvalidArgument("unknown storage arena");
  struct stat st{};
  if (arenas_.size() >= kMaxArenas || ::fstat(fd, &st) != 0 || st.st_size <= 0 ||
      static_cast<uint64_t>(st.st_size) > kArenaMaxBytes) {
    ::close(fd);
    return InvalidArgument(arenas_.size() >= kMaxArenas ? "too many storage arenas"
                                                         : "a storage arena of a bad size");
  }
  // Not populated: a page is faulted in where a buffer on it is first touched.
  GMUX_ASSIGN_OR_RETURN(auto mapped, HostBuffer::MapSealed(fd, static_cast<size_t>(st.st_size),
                                                           /*populate=*/false));
  arenas_[arena] = mapped;
  return mapped;
}

bool Session::StorageRoom(uint64_t bytes, bool own_mapping) {
  // The worker's memory limit (worker_memory_bytes, RLIMIT_DATA) does not see shared mappings:
  // while buffers are on shared memory, RLIMIT_DATA is lowered by their bytes, and a buffer
  // fits only while they and the private data in use stay within the limit together. So a
  // tenant's memory is bounded the same wherever its buffers live; past it a buffer is made
  // in the worker's own memory, where the limit refuses it.
  std::vector<std::shared_ptr<HostBuffer>> gone;  // unmapped after the lock
  std::lock_guard<std::mutex> lock(storage_books_->mu);
  StorageBooks& b = *storage_books_;
  b.ReadLimitLocked();
  const auto fits = [&] {
    return !(own_mapping && b.buffers >= kMaxStorageBuffers) &&
           !(b.data_limit != 0 && b.bytes + bytes + b.PrivateInUseLocked() > b.data_limit);
  };
  // Released buffers' mappings kept for reuse give way first.
  if (!fits() && (!b.DropKeptLocked(gone) || !fits())) return false;
  b.bytes += bytes;
  if (own_mapping) ++b.buffers;
  b.ApplyLocked();
  return true;
}

void StorageBooks::ReadLimitLocked() {
  if (limit_read) return;
  rlimit lim{};
  if (::getrlimit(RLIMIT_DATA, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY) {
    data_limit = lim.rlim_cur;
  }
  limit_read = true;
}

uint64_t StorageBooks::PrivateInUseLocked() {
  return std::max(PrivateDataBytes(), base_private + private_buffers);
}

Session::Err Session::PrivateRoom(uint64_t bytes, const char* what,
                                  std::shared_ptr<void>* booking) {
  std::vector<std::shared_ptr<HostBuffer>> gone;  // unmapped after the lock
  std::lock_guard<std::mutex> lock(storage_books_->mu);
  StorageBooks& b = *storage_books_;
  if (b.data_limit == 0) return {};  // no limit: nothing to book
  // Released buffers' mappings kept for reuse give way first.
  if (b.bytes + bytes + b.PrivateInUseLocked() > b.data_limit) b.DropKeptLocked(gone);
  if (b.bytes + bytes + b.PrivateInUseLocked() > b.data_limit) {
    // Released staging buffers kept for reuse count in VmData: given back, then measured again.
    std::vector<KeptBuffers::Kept> dropping;
    {
      KeptBuffers& k = Kept();
      std::lock_guard<std::mutex> kept_lock(k.mu);
      dropping.swap(k.kept);
    }
    const bool dropped = !dropping.empty();
    dropping.clear();
    if (!dropped || b.bytes + bytes + b.PrivateInUseLocked() > b.data_limit) {
      return {CL_MEM_OBJECT_ALLOCATION_FAILURE,
              std::string(what) + " of " + std::to_string(bytes) +
                  " bytes does not fit this tenant's worker memory limit (worker_memory_bytes) "
                  "with the memory it holds"};
    }
  }
  b.private_buffers += bytes;
  *booking = std::shared_ptr<void>(nullptr, [books = storage_books_, bytes](void*) {
    std::lock_guard<std::mutex> held(books->mu);
    books->private_buffers -= bytes;
  });
  return {};
}

Session::~Session() {
  core_->closed = true;
  {
    std::vector<std::shared_ptr<HostBuffer>> gone;
    std::lock_guard<std::mutex> lock(storage_books_->mu);
    storage_books_->closed = true;
    storage_books_->DropKeptLocked(gone);
  }
  {
    auto lock = residency_->Lock();
    mems_.clear();
  }
  residency_->Clear();
  if (passed_fd_ >= 0) ::close(passed_fd_);
}

namespace {
std::vector<uint64_t> Ids(capnp::List<uint64_t>::Reader list) {
  std::vector<uint64_t> out;
  for (uint64_t x : list) out.push_back(x);
  return out;
}
}  // namespace

Result<cl_device_id> Session::DeviceFor(uint64_t id) const {
  if (id >= backend_.devices().size() || PoolHidden(core_->pool_mask, static_cast<uint32_t>(id))) {
    return NotFound("unknown device id " + std::to_string(id));
  }
  // The pool's device: the one the tenant's lease lends now (all are of one kind).
  if (OnPool(id)) return backend_.devices()[sink_.PoolDevice(static_cast<uint32_t>(id))];
  return backend_.devices()[id];
}

std::vector<uint64_t> Session::ExpandPool(std::vector<uint64_t> devices) const {
  const uint64_t mask = core_->pool_mask;
  if (mask == 0) return devices;
  const uint64_t lowest = static_cast<uint64_t>(__builtin_ctzll(mask));
  if (std::find(devices.begin(), devices.end(), lowest) == devices.end()) return devices;
  for (uint64_t d = lowest + 1; d < 64 && d < backend_.devices().size(); ++d) {
    if ((mask >> d & 1) != 0 && std::find(devices.begin(), devices.end(), d) == devices.end()) {
      devices.push_back(d);
    }
  }
  return devices;
}

uint8_t* Session::BulkSink::Place(const proto::DataFrame& f) {
  Bulk* bulk = nullptr;
  if (Err e = s_->PlaceChunk(0, f.id, f.offset, f.bytes, &bulk); !e.ok()) {
    s_->core_->SendStatus(0, e.code, e.message);  // unasked, as for a bulkData without a seq
  }
  // An empty chunk has no bytes to point at (and a transfer of 0 bytes no buffer).
  return bulk == nullptr || f.bytes == 0 ? nullptr : bulk->bytes.data() + f.offset;
}

void Session::BulkSink::Placed(const proto::DataFrame& f, bool complete) {
  auto it = s_->bulk_.find(f.id);
  if (complete && it != s_->bulk_.end()) it->second->filled += f.bytes;
}

Status Session::Serve() {
  proto::FrameReader reader(core_->fd, proto::FrameKind::kRequest, core_->limits);
  reader.SetDataSink(&bulk_sink_);
  // A client that makes blocking calls in a loop sends its next request within microseconds of
  // the answer: staying awake for it saves the wake-up (docs/policies.md, "A worker that waits
  // awake").
  proto::SpinWait spin = proto::SpinWait::ForThisThread(std::chrono::microseconds(core_->spin_us));
  // While its commands run, the backend's threads may need this thread's CPU: it then yields
  // at every look (proto/spin_wait.h).
  reader.SpinAfterAnswers(&spin, [this] { return sink_.DeviceRunning(); });
  for (;;) {
    if (passed_fd_ >= 0) ::close(passed_fd_);  // a descriptor no request took
    passed_fd_ = -1;
    if (to_submit_.size() >= 256) SubmitPending();
    // Commands go to the device in batches: once no more requests have arrived.
    auto msg = reader.Next(&passed_fd_, [this, &reader] {
      SubmitPending();
      // The broker's go-ahead for what was just sent.
      sink_.AwaitRelease(core_->fd, reader.ring());
    });
    if (!msg.ok()) return msg.status();
    GMUX_STAGE(1);
    // Two threads spinning for each other's messages on one CPU slow both (common/cpu_apart.h).
    // Only while requests come quickly enough for this thread to spin for them: a client whose
    // calls are far apart (or many tenants on few CPUs) sleeps between them, and then sharing
    // its CPU costs nothing.
    if (reader.ring() != nullptr) {
      CpuApart::SetPeerCpu(spin.WillSpin() ? reader.ring()->ProducerCpu() : -1);
      CpuApart::CheckThisThread();
    }
    RefreshLimits();
    capnp::MallocMessageBuilder reply(kj::arrayPtr(reply_scratch_.get(), kReplyScratchWords));
    bool replied = false;
    uint64_t seq = 0;
    Err err;
    KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() {
      auto req = msg->root<wire::Request>();
      seq = req.getSeq();
      // Bulk data of several chunks in the stream takes a while to arrive: the commands before
      // it (a large write whose data came first, say) start now, instead of after its last
      // chunk, and release their staging buffers meanwhile. (Data in shared memory is there
      // already, and a small transfer's commands stay in the batch.)
      if (req.isBulkBegin() && !req.getBulkBegin().getShm() &&
          req.getBulkBegin().getSize() > proto::kBulkChunkBytes) {
        SubmitPending();
      }
      err = Handle(req, reply, replied);
    })) {
      // Decoding validated the message, so this is a limit hit while reading it.
      return DataLoss(std::string("malformed request: ") + e->getDescription().cStr());
    }
    // A request that waits for an answer may wait on these commands: hand them over first.
    // Its client most likely sends nothing more until it has the answer.
    if (seq != 0) {
      GMUX_STAGE(2);
      SubmitPending();
      reader.ExpectQuiet();
    }
    if (replied) continue;
    if (seq != 0) {
      auto r = reply.getRoot<wire::Reply>();
      r.setSeq(seq);
      r.setStatus(err.code);
      if (!err.ok()) r.setMessage(err.message);
      core_->Send(reply);
      if (request_ring_ && reader.ring() == nullptr) {
        // The answer to `requestRing` has gone: every later request comes through the ring.
        GMUX_RETURN_IF_ERROR(reader.ReadFromRing(request_ring_.get()));
      }
    } else if (!err.ok()) {
      // An asynchronous request failed: report it unasked (seq 0); the client returns it from
      // its next blocking call.
      core_->SendStatus(0, err.code, err.message);
    }
  }
}

template <typename Table>
auto* FindId(Table& table, uint64_t id) {
  auto it = table.find(id);
  return it == table.end() ? nullptr : &it->second;
}

// Declares `var` pointing at the entry for `id`, or returns the OpenCL error `code`.
#define GMUX_LOOKUP(var, table, id, code, what)                                          \
  auto* var = FindId(table, id);                                                        \
  if (var == nullptr) {                                                                 \
    return Err{code, std::string("unknown ") + (what) + " id " + std::to_string(id)};   \
  }

Session::Err Session::Handle(wire::Request::Reader req, capnp::MallocMessageBuilder& reply,
                             bool& replied) {
  auto root = reply.initRoot<wire::Reply>();
  switch (req.which()) {
    case wire::Request::HELLO:
      return {CL_INVALID_OPERATION, "hello sent twice"};

    case wire::Request::GET_INFO:
      return GetInfo(req.getGetInfo(), reply);

    case wire::Request::CREATE_CONTEXT: {
      if (Err e = CheckObjects(); !e.ok()) return e;
      auto r = req.getCreateContext();
      if (contexts_.count(r.getId()) != 0) return {CL_INVALID_VALUE, "context id in use"};
      if (r.getDevices().size() == 0 || r.getDevices().size() > backend_.devices().size()) {
        return {CL_INVALID_VALUE, "bad device list"};
      }
      std::vector<uint64_t> asked;
      for (uint64_t d : r.getDevices()) {
        auto dev = DeviceFor(d);
        if (!dev.ok()) return {CL_INVALID_DEVICE, dev.status().message()};
        // OpenCL: duplicate devices in the list are ignored.
        if (std::find(asked.begin(), asked.end(), d) == asked.end()) asked.push_back(d);
      }
      // A context on the pool takes the tenant's lease first (BioCloud's implicit lease): it
      // may wait in the pool's queue, and fails when no device becomes free in time.
      const bool pool =
          std::any_of(asked.begin(), asked.end(), [&](uint64_t d) { return OnPool(d); });
      if (pool) {
        const uint32_t lowest = static_cast<uint32_t>(__builtin_ctzll(core_->pool_mask));
        const CommandSink::LeaseAnswer a = sink_.AcquireLease(lowest, core_->fd);
        if (!a.granted) {
          return {CL_DEVICE_NOT_AVAILABLE, "no pool device for this tenant: " + a.why};
        }
      }
      // The backend context spans every pool device, so the session's buffers, programs and
      // kernels work on whichever device a later lease lends.
      std::vector<cl_device_id> devs;
      std::vector<uint32_t> idx;
      for (uint64_t d : ExpandPool(asked)) {
        devs.push_back(backend_.devices()[d]);
        idx.push_back(static_cast<uint32_t>(d));
      }
      cl_context_properties props[] = {CL_CONTEXT_PLATFORM,
                                       reinterpret_cast<cl_context_properties>(backend_.platform()),
                                       0};
      cl_int err = CL_SUCCESS;
      cl_context c = cl_.clCreateContext(props, static_cast<cl_uint>(devs.size()), devs.data(),
                                         nullptr, nullptr, &err);
      if (c == nullptr) {
        if (pool) sink_.PoolContexts(pool_contexts_);  // the lease may go again
        return {err, "clCreateContext failed"};
      }
      contexts_[r.getId()] = {Adopt(c), std::move(idx), pool};
      if (pool) sink_.PoolContexts(++pool_contexts_);
      return {};
    }

    case wire::Request::CREATE_QUEUE: {
      if (Err e = CheckObjects(); !e.ok()) return e;
      auto r = req.getCreateQueue();
      if (queues_.count(r.getId()) != 0) return {CL_INVALID_VALUE, "queue id in use"};
      GMUX_LOOKUP(ctx, contexts_, r.getContext(), CL_INVALID_CONTEXT, "context");
      const bool in_context = std::find(ctx->devices.begin(), ctx->devices.end(),
                                        r.getDevice()) != ctx->devices.end();
      if (!in_context || PoolHidden(core_->pool_mask, static_cast<uint32_t>(r.getDevice()))) {
        return {CL_INVALID_DEVICE, "device is not in the context"};
      }
      cl_command_queue_properties props = r.getProperties();
      if (props & ~static_cast<cl_command_queue_properties>(CL_QUEUE_PROFILING_ENABLE |
                                                            CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE)) {
        return {CL_INVALID_VALUE, "unknown queue properties"};
      }
      cl_int err = CL_SUCCESS;
      // On the pool: on the device the tenant's lease lends now (moved if a later one differs).
      const uint32_t device = OnPool(r.getDevice())
                                  ? sink_.PoolDevice(static_cast<uint32_t>(r.getDevice()))
                                  : static_cast<uint32_t>(r.getDevice());
      // Backend queues always profile: the scheduler needs device START/END for every command.
      cl_command_queue q = cl_.clCreateCommandQueue(
          ctx->ctx->h, backend_.devices()[device], props | CL_QUEUE_PROFILING_ENABLE, &err);
      if (q == nullptr) return {err, "clCreateCommandQueue failed"};
      QueueObj qo;
      qo.q = Adopt(q);
      qo.device = device;
      qo.context = ctx->ctx->h;
      if (OnPool(r.getDevice())) {
        sink_.AddPoolQueue(qo.q, ctx->ctx, props | CL_QUEUE_PROFILING_ENABLE, device);
      }
      qo.in_order = (props & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE) == 0;
      queues_[r.getId()] = std::move(qo);
      return {};
    }

    case wire::Request::CREATE_BUFFER: {
      if (Err e = CheckObjects(); !e.ok()) return e;
      auto r = req.getCreateBuffer();
      if (mems_.count(r.getId()) != 0) return {CL_INVALID_VALUE, "mem id in use"};
      GMUX_LOOKUP(ctx, contexts_, r.getContext(), CL_INVALID_CONTEXT, "context");
      cl_mem_flags flags = r.getFlags() & ~static_cast<cl_mem_flags>(
                                              CL_MEM_USE_HOST_PTR | CL_MEM_COPY_HOST_PTR |
                                              CL_MEM_ALLOC_HOST_PTR | kHostAccessFlags);
      // Shared memory offered as the buffer's storage: mapped here for the buffer's life when
      // the devices work on host memory in place; otherwise only its initial contents count.
      std::shared_ptr<uint8_t> storage;
      bool on_storage = false, in_place = false;
      if (r.getStorage()) {
        if (r.getInitialData() != 0) {
          return {CL_INVALID_VALUE, "buffer storage and initial data both given"};
        }
        in_place = StorageFor(*ctx);
        std::shared_ptr<HostBuffer> mapped;
        uint64_t at = 0;
        uint64_t memfd_dev = 0, memfd_ino = 0;
        bool memfd_kept = false;  // `mapped` was kept from a released buffer, still booked
        if (r.getStorageArena() != 0) {
          // A small buffer in one of the client's arenas (mapped here once, for the session).
          auto found = ArenaFor(r.getStorageArena());
          if (!found.ok()) return {CL_INVALID_VALUE, found.status().message()};
          mapped = *found;
          at = r.getStorageOffset();
          if (r.getSize() >= kArenaBufferMax) {
            return {CL_INVALID_VALUE, "a buffer in an arena must be under 64 KiB"};
          }
          if (at % kArenaAlign != 0 || at > mapped->size() || r.getSize() > mapped->size() - at) {
            return {CL_INVALID_VALUE, "buffer storage outside its arena"};
          }
        } else {
          if (passed_fd_ < 0) return {CL_INVALID_VALUE, "buffer storage without a descriptor"};
          int fd = passed_fd_;
          passed_fd_ = -1;
          // A released buffer's memory again: its mapping here, if kept, with every page the
          // device touched still in place (StorageBooks::kept).
          struct stat st{};
          if (::fstat(fd, &st) == 0) {
            memfd_dev = static_cast<uint64_t>(st.st_dev);
            memfd_ino = static_cast<uint64_t>(st.st_ino);
            std::lock_guard<std::mutex> lock(storage_books_->mu);
            mapped = storage_books_->TakeKeptLocked(memfd_dev, memfd_ino, r.getSize());
            memfd_kept = mapped != nullptr;
          }
          if (memfd_kept) {
            ::close(fd);
          } else {
            auto whole = HostBuffer::MapSealed(fd, r.getSize(), /*populate=*/false);
            if (!whole.ok()) return {CL_INVALID_VALUE, whole.status().message()};
            mapped = *whole;
          }
        }
        // A slot inside a page on a device that works in place on whole pages only: no
        // storage, answered plainly (the client's later page-aligned slots may have it).
        // An arena's slot is booked whole (a multiple of kArenaAlign) and is no mapping of
        // its own: the cap on buffers with their own mappings does not count it.
        const bool own_mapping = r.getStorageArena() == 0;
        const uint64_t booked =
            own_mapping ? r.getSize() : (r.getSize() + kArenaAlign - 1) / kArenaAlign * kArenaAlign;
        if (memfd_kept && !in_place) {
          std::lock_guard<std::mutex> lock(storage_books_->mu);
          storage_books_->UnbookLocked(booked);
          storage_books_->ApplyLocked();
        }
        on_storage = in_place && (memfd_kept || ((own_mapping || SlotStorageFor(*ctx, at,
                                                                                r.getSize())) &&
                                                 StorageRoom(booked, own_mapping)));
        if (on_storage) {
          // The device's first touch of each page would fault in this process too (an output
          // buffer's, or an input's the application wrote): a large one is faulted in ahead.
          if (own_mapping && r.getSize() >= Prefaulter::kMinBytes) mapped->FaultInAhead();
          // Booked until the mapping goes (the buffer's last backend object destroyed).
          // A buffer's own mapping of up to 32 MiB is kept for the client's next buffer on
          // that memory, still booked.
          const bool keepable = own_mapping && memfd_ino != 0 &&
                                booked <= StorageBooks::kKeptMappingMaxBytes;
          auto unbook = [keep = mapped, books = storage_books_, n = booked, own_mapping,
                         keepable, memfd_dev, memfd_ino](uint8_t*) {
            std::vector<std::shared_ptr<HostBuffer>> gone;  // unmapped after the lock
            std::lock_guard<std::mutex> lock(books->mu);
            if (keepable && !books->closed) {
              books->KeepLocked({memfd_dev, memfd_ino, keep}, gone);
            } else {
              books->bytes -= n;
              if (own_mapping) --books->buffers;
            }
            books->ApplyLocked();
          };
          storage = std::shared_ptr<uint8_t>(mapped->data() + at, std::move(unbook));
        } else {
          storage = std::shared_ptr<uint8_t>(mapped, mapped->data() + at);
        }
        if (!on_storage && (r.getFlags() & CL_MEM_COPY_HOST_PTR) != 0) {
          flags |= CL_MEM_COPY_HOST_PTR;
        }
      }
      std::shared_ptr<Bulk> init;
      if (r.getInitialData() != 0) {
        Err e = TakeBulk(r.getInitialData(), r.getSize(), init);
        if (!e.ok()) return e;
        flags |= CL_MEM_COPY_HOST_PTR;
      }
      // A large buffer whose client keeps no storage for it (TCP): on devices that work in
      // place, its storage is this process's memory, so that inline write data is received
      // straight into it (DirectTarget). Still the worker's private memory (PrivateRoom), mapped
      // once booked (the mapping counts in VmData at once).
      const bool own = !r.getStorage() && !init && r.getSize() >= kOwnStorageMinBytes &&
                       StorageFor(*ctx);
      std::shared_ptr<HostBuffer> own_storage;
      std::shared_ptr<MemCharge> charge;
      if (Err e = ChargeMemory(ctx->devices, r.getSize(), true, charge); !e.ok()) {
        if (init) core_->bulk_bytes.fetch_sub(init->bytes.staged());
        return e;
      }
      std::shared_ptr<void> private_booking;
      if (!on_storage) {
        if (Err e = PrivateRoom(r.getSize(), "a buffer", &private_booking); !e.ok()) {
          if (init) core_->bulk_bytes.fetch_sub(init->bytes.staged());
          return e;
        }
      }
      cl_int err = CL_SUCCESS;
      auto lock = residency_->Lock();
      cl_mem m = nullptr;
      if (own) own_storage = HostBuffer::Anonymous(r.getSize());
      if (own_storage) {
        storage = std::shared_ptr<uint8_t>(own_storage, own_storage->data());
        m = CreateOnStorage(cl_, ctx->ctx->h, flags, r.getSize(), storage, &err);
        if (m == nullptr) {  // then as any other buffer
          storage.reset();
          own_storage.reset();
        }
      }
      if (m == nullptr) {
        m = on_storage
                ? CreateOnStorage(cl_, ctx->ctx->h, flags, r.getSize(), storage, &err)
                : cl_.clCreateBuffer(ctx->ctx->h, flags, r.getSize(),
                                     init ? init->bytes.data()
                                     : (flags & CL_MEM_COPY_HOST_PTR) != 0 ? storage.get()
                                                                           : nullptr,
                                     &err);
      }
      if (init) core_->bulk_bytes.fetch_sub(init->bytes.staged());
      if (m == nullptr) return {err, "clCreateBuffer failed"};
      // Declined because the devices do not work in place: the client offers no more. Declined
      // for the memory limit: no answer, the client offers again later.
      if (r.getStorage() && (on_storage || !in_place)) root.setStorage(on_storage);
      MemObj mo;
      mo.mem = Adopt(m);
      mo.size = r.getSize();
      mo.charge = std::move(charge);
      mo.private_booking = std::move(private_booking);
      Residency::Allocation a;
      a.kind = Residency::Kind::kBuffer;
      a.mem = mo.mem;
      a.context = ctx->ctx;
      a.devices = ctx->devices;
      a.flags = flags & ~static_cast<cl_mem_flags>(CL_MEM_COPY_HOST_PTR);
      a.bytes = r.getSize();
      if (on_storage || own_storage) a.storage = std::move(storage);
      mo.own_storage = std::move(own_storage);
      mo.alloc = residency_->AddLocked(std::move(a));
      mems_[r.getId()] = std::move(mo);
      return {};
    }

    case wire::Request::CREATE_SUB_BUFFER: {
      if (Err e = CheckObjects(); !e.ok()) return e;
      auto r = req.getCreateSubBuffer();
      if (mems_.count(r.getId()) != 0) return {CL_INVALID_VALUE, "mem id in use"};
      GMUX_LOOKUP(parent, mems_, r.getParent(), CL_INVALID_MEM_OBJECT, "mem");
      if (r.getOrigin() > parent->size || r.getSize() > parent->size - r.getOrigin()) {
        return {CL_INVALID_VALUE, "sub-buffer region outside its parent"};
      }
      cl_buffer_region region{r.getOrigin(), r.getSize()};
      cl_int err = CL_SUCCESS;
      auto lock = residency_->Lock();
      if (err = residency_->UseLocked(parent->alloc); err != CL_SUCCESS) {
        return {err, "the parent buffer could not be brought back to the device"};
      }
      const cl_mem_flags flags = r.getFlags() & ~kHostAccessFlags;
      cl_mem m = cl_.clCreateSubBuffer(parent->mem->h, flags, CL_BUFFER_CREATE_TYPE_REGION,
                                       &region, &err);
      if (m == nullptr) return {err, "clCreateSubBuffer failed"};
      MemObj mo{Adopt(m), r.getSize()};
      // The parent's memory lives as long as the sub-buffer does, released or not.
      mo.private_booking = parent->private_booking;
      if (parent->alloc) {
        Residency::Allocation a;
        a.kind = Residency::Kind::kSubBuffer;
        a.mem = mo.mem;
        a.context = parent->alloc->context;
        a.devices = parent->alloc->devices;
        a.flags = flags;
        a.parent = parent->alloc;
        a.region = region;
        mo.alloc = residency_->AddLocked(std::move(a));
      }
      mems_[r.getId()] = std::move(mo);
      return {};
    }

    case wire::Request::CREATE_PROGRAM_WITH_SOURCE: {
      if (Err e = CheckObjects(); !e.ok()) return e;
      auto r = req.getCreateProgramWithSource();
      if (programs_.count(r.getId()) != 0) return {CL_INVALID_VALUE, "program id in use"};
      GMUX_LOOKUP(ctx, contexts_, r.getContext(), CL_INVALID_CONTEXT, "context");
      const char* src = r.getSource().cStr();
      size_t len = r.getSource().size();
      cl_int err = CL_SUCCESS;
      cl_program p = cl_.clCreateProgramWithSource(ctx->ctx->h, 1, &src, &len, &err);
      if (p == nullptr) return {err, "clCreateProgramWithSource failed"};
      programs_[r.getId()] = {Adopt(p), ctx->devices, std::string(src, len), false, false};
      return {};
    }

    case wire::Request::CREATE_PROGRAM_WITH_BINARY: {
      if (Err e = CheckObjects(); !e.ok()) return e;
      auto r = req.getCreateProgramWithBinary();
      if (programs_.count(r.getId()) != 0) return {CL_INVALID_VALUE, "program id in use"};
      GMUX_LOOKUP(ctx, contexts_, r.getContext(), CL_INVALID_CONTEXT, "context");
      auto devs = r.getDevices();
      auto bins = r.getBinaries();
      if (devs.size() == 0 || devs.size() != bins.size() || devs.size() > ctx->devices.size()) {
        return {CL_INVALID_VALUE, "device and binary lists differ"};
      }
      std::vector<cl_device_id> dv;
      std::vector<uint32_t> idx;
      std::vector<size_t> lens;
      std::vector<const unsigned char*> ptrs;
      for (unsigned i = 0; i < devs.size(); ++i) {
        if (std::find(ctx->devices.begin(), ctx->devices.end(), devs[i]) == ctx->devices.end() ||
            PoolHidden(core_->pool_mask, static_cast<uint32_t>(devs[i]))) {
          return {CL_INVALID_DEVICE, "device is not in the context"};
        }
        // The pool's device: the same binary for each of its devices (all of one kind).
        for (uint64_t d : ExpandPool({devs[i]})) {
          dv.push_back(backend_.devices()[d]);
          idx.push_back(static_cast<uint32_t>(d));
          lens.push_back(bins[i].size());
          ptrs.push_back(bins[i].begin());
        }
      }
      std::vector<cl_int> status(dv.size(), CL_SUCCESS);
      cl_int err = CL_SUCCESS;
      cl_program p = cl_.clCreateProgramWithBinary(ctx->ctx->h, static_cast<cl_uint>(dv.size()),
                                                   dv.data(), lens.data(), ptrs.data(),
                                                   status.data(), &err);
      auto bs = root.initBinaryStatus(static_cast<unsigned>(status.size()));
      for (unsigned i = 0; i < status.size(); ++i) bs.set(i, status[i]);
      if (p == nullptr) return {err, "clCreateProgramWithBinary failed"};
      ProgramObj obj;
      obj.program = Adopt(p);
      obj.devices = std::move(idx);
      obj.from_binary = true;
      programs_[r.getId()] = std::move(obj);
      return {};
    }

    case wire::Request::CREATE_PROGRAM_WITH_I_L: {
      if (Err e = CheckObjects(); !e.ok()) return e;
      auto r = req.getCreateProgramWithIL();
      if (programs_.count(r.getId()) != 0) return {CL_INVALID_VALUE, "program id in use"};
      GMUX_LOOKUP(ctx, contexts_, r.getContext(), CL_INVALID_CONTEXT, "context");
      auto il = r.getIl();
      if (il.size() == 0) return {CL_INVALID_VALUE, "empty IL"};
      // A vendor ICD older than OpenCL 2.1 leaves the slot empty.
      if (cl_.clCreateProgramWithIL == nullptr) {
        return {CL_INVALID_OPERATION, "the backend does not take IL programs"};
      }
      cl_int err = CL_SUCCESS;
      cl_program p = cl_.clCreateProgramWithIL(ctx->ctx->h, il.begin(), il.size(), &err);
      if (p == nullptr) return {err != CL_SUCCESS ? err : CL_INVALID_VALUE, "clCreateProgramWithIL failed"};
      ProgramObj obj;
      obj.program = Adopt(p);
      obj.devices = ctx->devices;
      obj.from_binary = true;  // no source to scan: its kernels run whole
      programs_[r.getId()] = std::move(obj);
      return {};
    }

    case wire::Request::CREATE_PROGRAM_WITH_BUILT_IN_KERNELS: {
      if (Err e = CheckObjects(); !e.ok()) return e;
      auto r = req.getCreateProgramWithBuiltInKernels();
      if (programs_.count(r.getId()) != 0) return {CL_INVALID_VALUE, "program id in use"};
      GMUX_LOOKUP(ctx, contexts_, r.getContext(), CL_INVALID_CONTEXT, "context");
      std::vector<cl_device_id> dv;
      std::vector<uint32_t> idx;
      for (uint64_t d : ExpandPool(Ids(r.getDevices()))) {
        if (std::find(ctx->devices.begin(), ctx->devices.end(), d) == ctx->devices.end()) {
          return {CL_INVALID_DEVICE, "device is not in the context"};
        }
        dv.push_back(backend_.devices()[d]);
        idx.push_back(static_cast<uint32_t>(d));
      }
      if (dv.empty()) return {CL_INVALID_VALUE, "no devices"};
      cl_int err = CL_SUCCESS;
      cl_program p = cl_.clCreateProgramWithBuiltInKernels(
          ctx->ctx->h, static_cast<cl_uint>(dv.size()), dv.data(), r.getKernelNames().cStr(), &err);
      if (p == nullptr) {
        return {err != CL_SUCCESS ? err : CL_INVALID_VALUE, "clCreateProgramWithBuiltInKernels failed"};
      }
      ProgramObj obj;
      obj.program = Adopt(p);
      obj.devices = std::move(idx);
      obj.from_binary = true;  // built in: no source, so its kernels run whole
      // Not built yet: whether it must be, and whether building succeeds, is the backend's
      // to say (PoCL 3.1 refuses kernels of an unbuilt built-in program).
      programs_[r.getId()] = std::move(obj);
      return {};
    }

    case wire::Request::SET_SPEC_CONSTANT: {
      auto r = req.getSetSpecConstant();
      GMUX_LOOKUP(p, programs_, r.getProgram(), CL_INVALID_PROGRAM, "program");
      auto v = r.getValue();
      if (v.size() == 0) return {CL_INVALID_VALUE, "empty specialization constant value"};
      if (cl_.clSetProgramSpecializationConstant == nullptr) {
        return {CL_INVALID_OPERATION, "the backend has no specialization constants"};
      }
      cl_int err = cl_.clSetProgramSpecializationConstant(p->program->h, r.getSpecId(), v.size(),
                                                          v.begin());
      if (err != CL_SUCCESS) return {err, "clSetProgramSpecializationConstant failed"};
      return {};
    }

    case wire::Request::BUILD_PROGRAM:
    case wire::Request::COMPILE_PROGRAM: {
      bool build = req.isBuildProgram();
      uint64_t pid = build ? req.getBuildProgram().getProgram() : req.getCompileProgram().getProgram();
      auto devs = build ? req.getBuildProgram().getDevices() : req.getCompileProgram().getDevices();
      std::string options = build ? req.getBuildProgram().getOptions().cStr()
                                  : req.getCompileProgram().getOptions().cStr();
      GMUX_LOOKUP(p, programs_, pid, CL_INVALID_PROGRAM, "program");
      // OpenCL builds and compiles programs from source or binary only (PoCL 3.1 asserts
      // building a linked program whose binaries were read).
      if (p->linked) return {CL_INVALID_OPERATION, "a linked program cannot be built again"};
      std::vector<cl_device_id> dv;
      for (uint64_t d : ExpandPool(Ids(devs))) {
        if (std::find(p->devices.begin(), p->devices.end(), d) == p->devices.end()) {
          return {CL_INVALID_DEVICE, "device is not associated with the program"};
        }
        dv.push_back(backend_.devices()[d]);
      }
      // The -I directories the client sent (their headers read on its side).
      IncludeTree includes;
      const std::string inc_err =
          build ? includes.Make(req.getBuildProgram().getIncludeDirs(),
                                req.getBuildProgram().getIncludeFiles())
                : includes.Make(req.getCompileProgram().getIncludeDirs(),
                                req.getCompileProgram().getIncludeFiles());
      if (!inc_err.empty()) return {CL_INVALID_BUILD_OPTIONS, inc_err};
      options = includes.Options() + options;
      // Programs from source are built with their kernels' argument info (address qualifiers
      // and types), which CREATE_KERNEL reports to the client for its clSetKernelArg checks.
      // The application's CL_PROGRAM_BUILD_OPTIONS does not show it (kArgInfoOption).
      p->arg_info_added = !p->source.empty();
      if (p->arg_info_added) options += kArgInfoOption;
      cl_int err;
      if (build && p->from_binary && p->built) {
        // Built again from the same binary: nothing can change, and PoCL 3.1 asserts in its
        // kernel cache (program_device_dir) on a second build of a program from binary, which
        // would end the session. The program stays built, as the application expects.
        return {};
      }
      if (build) {
        err = cl_.clBuildProgram(p->program->h, static_cast<cl_uint>(dv.size()),
                                 dv.empty() ? nullptr : dv.data(), options.c_str(), nullptr,
                                 nullptr);
        // A failure with no compiler error in any device's log is not the source's: PoCL 3.1
        // fails so ("failed to build the program", nothing else) when other processes build
        // the same program into its kernel cache at that moment (dozens of a tenant's sessions
        // starting together share its cache; natively the same happens to processes sharing a
        // cold cache: 1 of 32 failed, 2 runs of 3). Built once more.
        if (err == CL_BUILD_PROGRAM_FAILURE && !p->from_binary &&
            NoCompilerError(cl_, p->program->h, dv)) {
          err = cl_.clBuildProgram(p->program->h, static_cast<cl_uint>(dv.size()),
                                   dv.empty() ? nullptr : dv.data(), options.c_str(), nullptr,
                                   nullptr);
        }
        // Split execution only for programs whose whole source we scanned (kernel_scan.h).
        p->splittable = false;
        p->variants.reset();
        if (err == CL_SUCCESS && !p->source.empty()) {
          SplitVerdict v = ScanForSplit(p->source, options);
          p->splittable = v.splittable;
          if (v.restorable) {
            p->variants = std::make_shared<RestoredVariants>(cl_, p->program, p->source, options);
            p->restore_needs_local = v.uses_groups;
          }
        }
      } else {
        auto r = req.getCompileProgram();
        if (r.getHeaders().size() != r.getHeaderNames().size()) {
          return {CL_INVALID_VALUE, "header lists differ"};
        }
        std::vector<cl_program> headers;
        std::vector<const char*> names;
        auto header_ids = r.getHeaders();
        auto header_names = r.getHeaderNames();
        for (unsigned i = 0; i < header_ids.size(); ++i) {
          GMUX_LOOKUP(h, programs_, header_ids[i], CL_INVALID_PROGRAM, "program");
          // A header is a program's source; PoCL 3.1 reads a binary program's (NULL) as one.
          if (h->source.empty()) {
            return {CL_INVALID_OPERATION, "header program " + std::to_string(header_ids[i]) +
                                              " was not created from source"};
          }
          // The backend writes each header to a file named after it below its own temporary
          // directory: a name must stay inside it.
          const std::string_view name = header_names[i].cStr();
          if (name.empty() || name.front() == '/' || name == ".." || name.starts_with("../") ||
              name.find("/../") != std::string_view::npos || name.ends_with("/..")) {
            return {CL_INVALID_VALUE, "header name '" + std::string(name) +
                                          "' is absolute or leaves its directory"};
          }
          headers.push_back(h->program->h);
          names.push_back(header_names[i].cStr());
        }
        err = cl_.clCompileProgram(p->program->h, static_cast<cl_uint>(dv.size()),
                                   dv.empty() ? nullptr : dv.data(), options.c_str(),
                                   static_cast<cl_uint>(headers.size()),
                                   headers.empty() ? nullptr : headers.data(),
                                   names.empty() ? nullptr : names.data(), nullptr, nullptr);
      }
      if (err != CL_SUCCESS) {
        return {err, build ? "program build failed (see the build log)"
                           : "program compile failed (see the build log)"};
      }
      if (build) p->built = true;
      return {};
    }

    case wire::Request::LINK_PROGRAM: {
      auto r = req.getLinkProgram();
      if (programs_.count(r.getId()) != 0) return {CL_INVALID_VALUE, "program id in use"};
      GMUX_LOOKUP(ctx, contexts_, r.getContext(), CL_INVALID_CONTEXT, "context");
      std::vector<cl_device_id> dv;
      std::vector<uint32_t> idx;
      for (uint64_t d : ExpandPool(Ids(r.getDevices()))) {
        if (std::find(ctx->devices.begin(), ctx->devices.end(), d) == ctx->devices.end()) {
          return {CL_INVALID_DEVICE, "device is not in the context"};
        }
        dv.push_back(backend_.devices()[d]);
        idx.push_back(static_cast<uint32_t>(d));
      }
      std::vector<cl_program> inputs;
      for (uint64_t in : r.getInputs()) {
        GMUX_LOOKUP(p, programs_, in, CL_INVALID_PROGRAM, "program");
        // An input whose compile failed has no object to link (PoCL 3.1 asserts on one).
        for (uint32_t di : p->devices) {
          cl_build_status st = CL_BUILD_NONE;
          if (di < backend_.devices().size() &&
              cl_.clGetProgramBuildInfo(p->program->h, backend_.devices()[di],
                                        CL_PROGRAM_BUILD_STATUS, sizeof(st), &st,
                                        nullptr) == CL_SUCCESS &&
              st == CL_BUILD_ERROR) {
            return {CL_INVALID_OPERATION,
                    "input program " + std::to_string(in) + " failed to compile"};
          }
        }
        inputs.push_back(p->program->h);
      }
      cl_int err = CL_SUCCESS;
      cl_program p = cl_.clLinkProgram(ctx->ctx->h, static_cast<cl_uint>(dv.size()),
                                       dv.empty() ? nullptr : dv.data(), r.getOptions().cStr(),
                                       static_cast<cl_uint>(inputs.size()), inputs.data(), nullptr,
                                       nullptr, &err);
      if (p == nullptr) return {err != CL_SUCCESS ? err : CL_LINK_PROGRAM_FAILURE, "link failed"};
      programs_[r.getId()] = {Adopt(p), idx.empty() ? ctx->devices : idx, {}, false, true};
      if (err != CL_SUCCESS) return {err, "link failed (see the build log)"};
      return {};
    }

    case wire::Request::CREATE_KERNEL: {
      if (Err e = CheckObjects(); !e.ok()) return e;
      auto r = req.getCreateKernel();
      if (kernels_.count(r.getId()) != 0) return {CL_INVALID_VALUE, "kernel id in use"};
      GMUX_LOOKUP(p, programs_, r.getProgram(), CL_INVALID_PROGRAM, "program");
      cl_int err = CL_SUCCESS;
      cl_kernel k = cl_.clCreateKernel(p->program->h, r.getName().cStr(), &err);
      if (k == nullptr) return {err, std::string("clCreateKernel failed for '") + r.getName().cStr() + "'"};
      cl_uint nargs = 0;
      cl_.clGetKernelInfo(k, CL_KERNEL_NUM_ARGS, sizeof(nargs), &nargs, nullptr);
      KernelObj ko{Adopt(k), std::make_shared<std::mutex>(), nargs, p->splittable, {},
                   r.getName().cStr(), p->variants, p->restore_needs_local};
      // Queried now, before any argument is set (CL_KERNEL_LOCAL_MEM_SIZE counts set __local
      // arguments too).
      for (uint32_t di : p->devices) {
        if (di >= backend_.devices().size()) continue;
        cl_device_id dev = backend_.devices()[di];
        KernelLimits kl;
        cl_ulong lm = 0;
        cl_.clGetKernelWorkGroupInfo(k, dev, CL_KERNEL_WORK_GROUP_SIZE, sizeof(kl.work_group_size),
                                     &kl.work_group_size, nullptr);
        cl_.clGetKernelWorkGroupInfo(k, dev, CL_KERNEL_COMPILE_WORK_GROUP_SIZE,
                                     sizeof(size_t) * 3, kl.compile_work_group_size.data(), nullptr);
        cl_.clGetKernelWorkGroupInfo(k, dev, CL_KERNEL_LOCAL_MEM_SIZE, sizeof(lm), &lm, nullptr);
        kl.local_mem_size = lm;
        ko.limits[di] = kl;
      }
      kernels_[r.getId()] = std::move(ko);
      auto kr = root.initKernel();
      kr.setNumArgs(nargs);
      // Address qualifiers let the client tell a __local size from a NULL buffer argument, and
      // a by-value argument's size lets it refuse a wrong arg_size at clSetKernelArg, as OpenCL
      // does (CL_INVALID_ARG_SIZE), rather than at a fire-and-forget launch, whose failure a
      // program sees only in the event's status.
      auto quals = kr.initArgAddressQualifiers(nargs);
      auto sizes = kr.initArgValueSizes(nargs);
      for (cl_uint i = 0; i < nargs; ++i) {
        cl_kernel_arg_address_qualifier q = 0;
        if (cl_.clGetKernelArgInfo(k, i, CL_KERNEL_ARG_ADDRESS_QUALIFIER, sizeof(q), &q, nullptr) !=
            CL_SUCCESS) {
          q = 0;
        }
        quals.set(i, q);
        char type[64] = {};
        if (q == CL_KERNEL_ARG_ADDRESS_PRIVATE &&
            cl_.clGetKernelArgInfo(k, i, CL_KERNEL_ARG_TYPE_NAME, sizeof(type) - 1, type,
                                   nullptr) == CL_SUCCESS) {
          sizes.set(i, ArgValueSize(type));
        }
      }
      return {};
    }

    case wire::Request::CREATE_USER_EVENT: {
      if (Err e = CheckEvents(); !e.ok()) return e;
      auto r = req.getCreateUserEvent();
      if (events_.count(r.getId()) != 0 || r.getId() == 0) return {CL_INVALID_VALUE, "event id in use"};
      GMUX_LOOKUP(ctx, contexts_, r.getContext(), CL_INVALID_CONTEXT, "context");
      (void)ctx;
      events_[r.getId()] = std::make_shared<EventRecord>(r.getId(), true, 0);
      return {};
    }

    case wire::Request::SET_USER_EVENT_STATUS: {
      auto r = req.getSetUserEventStatus();
      GMUX_LOOKUP(ev, events_, r.getId(), CL_INVALID_EVENT, "event");
      if (!(*ev)->user()) return {CL_INVALID_EVENT, "not a user event"};
      if (r.getStatus() > CL_COMPLETE) return {CL_INVALID_VALUE, "status must be CL_COMPLETE or negative"};
      if ((*ev)->done()) return {CL_INVALID_OPERATION, "user event status already set"};
      (*ev)->Complete(r.getStatus());
      sink_.Rescan(*ev);
      return {};
    }

    case wire::Request::RELEASE: {
      auto r = req.getRelease();
      size_t n = 0;
      switch (r.getKind()) {
        case wire::ObjectKind::CONTEXT: {
          auto it = contexts_.find(r.getId());
          if (it == contexts_.end()) break;
          const bool pool = it->second.pool;
          contexts_.erase(it);
          n = 1;
          if (pool && pool_contexts_ > 0) {
            SubmitPending();  // the context's last commands are reported before its end
            sink_.PoolContexts(--pool_contexts_);
          }
          break;
        }
        case wire::ObjectKind::QUEUE: n = queues_.erase(r.getId()); break;
        case wire::ObjectKind::MEM: {
          auto lock = residency_->Lock();
          auto it = mems_.find(r.getId());
          if (it == mems_.end()) break;
          Residency::Allocation* a = it->second.alloc.get();
          mems_.erase(it);
          n = 1;
          residency_->ReleasedLocked(a);
          break;
        }
        case wire::ObjectKind::PROGRAM: n = programs_.erase(r.getId()); break;
        case wire::ObjectKind::KERNEL: n = kernels_.erase(r.getId()); break;
        case wire::ObjectKind::EVENT: n = events_.erase(r.getId()); break;
        case wire::ObjectKind::SAMPLER: n = samplers_.erase(r.getId()); break;
        default: break;
      }
      if (n == 0) return {CL_INVALID_VALUE, "release of unknown id " + std::to_string(r.getId())};
      return {};
    }

    case wire::Request::BULK_BEGIN: {
      auto r = req.getBulkBegin();
      if (r.getToken() == 0 || bulk_.count(r.getToken()) != 0) return {CL_INVALID_VALUE, "bulk token in use"};
      if (Err e = BeginBulk(r); !e.ok()) return RefuseBulk(req.getSeq(), r.getToken(), std::move(e));
      return {};
    }

    case wire::Request::REPLY_RING: {
      if (passed_fd_ < 0) return {CL_INVALID_VALUE, "reply ring without a descriptor"};
      int fd = passed_fd_;
      passed_fd_ = -1;
      if (reply_ring_) {
        ::close(fd);
        return {CL_INVALID_OPERATION, "reply ring asked for twice"};
      }
      if (req.getSeq() == 0) {
        ::close(fd);
        return {CL_INVALID_VALUE, "reply ring without a seq to answer"};
      }
      auto ring = proto::ShmRing::OpenProducer(fd, req.getReplyRing(), core_->fd);
      if (!ring.ok()) return {CL_INVALID_VALUE, ring.status().message()};
      reply_ring_ = true;
      replied = true;
      core_->UseRing(req.getSeq(), std::move(*ring));
      return {};
    }

    case wire::Request::REQUEST_RING: {
      if (passed_fd_ < 0) return {CL_INVALID_VALUE, "request ring without a descriptor"};
      int fd = passed_fd_;
      passed_fd_ = -1;
      if (request_ring_) {
        ::close(fd);
        return {CL_INVALID_OPERATION, "request ring asked for twice"};
      }
      if (req.getSeq() == 0) {
        ::close(fd);
        return {CL_INVALID_VALUE, "request ring without a seq to answer"};
      }
      auto ring = proto::ShmRing::OpenConsumer(fd, req.getRequestRing(), core_->fd);
      if (!ring.ok()) return {CL_INVALID_VALUE, ring.status().message()};
      // Read from once the answer has gone (Serve): the client sends nothing before it.
      request_ring_ = std::move(*ring);
      return {};
    }

    case wire::Request::SHM_FORGET: {
      // Transfers still using the mapping hold it; only the kept reference goes.
      uint64_t key = req.getShmForget();
      std::erase_if(shm_maps_, [&](const auto& e) { return e.first == key; });
      return {};
    }

    case wire::Request::BULK_DATA: {
      auto r = req.getBulkData();
      auto data = r.getData();
      Bulk* bulk = nullptr;
      if (Err e = PlaceChunk(req.getSeq(), r.getToken(), r.getOffset(), data.size(), &bulk);
          !e.ok() || bulk == nullptr) {
        return e;
      }
      // An empty chunk has no bytes to point at (and a transfer of 0 bytes no buffer).
      if (data.size() != 0) {
        std::memcpy(bulk->bytes.data() + r.getOffset(), data.begin(), data.size());
      }
      bulk->filled += data.size();
      return {};
    }

    case wire::Request::ENQUEUE:
      return Enqueue(req.getSeq(), req.getEnqueue(), replied);

    case wire::Request::FINISH:
      return Finish(req.getSeq(), req.getFinish(), replied);

    case wire::Request::WAIT_EVENTS:
      return WaitEvents(req.getSeq(), req.getWaitEvents(), replied);
    case wire::Request::WAIT_EVENTS_PROFILED:
      return WaitEvents(req.getSeq(), req.getWaitEventsProfiled(), replied, /*profiled=*/true);

    case wire::Request::CREATE_IMAGE:
      return CreateImage(req.getCreateImage());

    case wire::Request::CREATE_SAMPLER: {
      if (Err e = CheckObjects(); !e.ok()) return e;
      auto r = req.getCreateSampler();
      if (samplers_.count(r.getId()) != 0) return {CL_INVALID_VALUE, "sampler id in use"};
      GMUX_LOOKUP(ctx, contexts_, r.getContext(), CL_INVALID_CONTEXT, "context");
      cl_int err = CL_SUCCESS;
      cl_sampler smp = cl_.clCreateSampler(ctx->ctx->h, r.getNormalizedCoords() ? CL_TRUE : CL_FALSE,
                                           r.getAddressingMode(), r.getFilterMode(), &err);
      if (smp == nullptr) return {err, "clCreateSampler failed"};
      samplers_[r.getId()] = Adopt(smp);
      return {};
    }

    case wire::Request::IMAGE_FORMATS: {
      auto r = req.getImageFormats();
      GMUX_LOOKUP(ctx, contexts_, r.getContext(), CL_INVALID_CONTEXT, "context");
      cl_uint n = 0;
      cl_int err = cl_.clGetSupportedImageFormats(ctx->ctx->h, r.getFlags(), r.getImageType(), 0,
                                                  nullptr, &n);
      if (err != CL_SUCCESS) return {err, "clGetSupportedImageFormats failed"};
      std::vector<cl_image_format> formats(std::min<cl_uint>(n, 4096));
      if (!formats.empty()) {
        err = cl_.clGetSupportedImageFormats(ctx->ctx->h, r.getFlags(), r.getImageType(),
                                             static_cast<cl_uint>(formats.size()), formats.data(),
                                             nullptr);
        if (err != CL_SUCCESS) return {err, "clGetSupportedImageFormats failed"};
      }
      root.setInfo(kj::arrayPtr(reinterpret_cast<const kj::byte*>(formats.data()),
                                formats.size() * sizeof(cl_image_format)));
      return {};
    }

    case wire::Request::LEASE:
      return {CL_INVALID_OPERATION, "leases are asked on a control connection (gmux lease)"};

    case wire::Request::FRAME:
      return {CL_INVALID_OPERATION, "frame reports belong on a frame agent's connection"};

    case wire::Request::FRAMES:
      return {CL_INVALID_OPERATION, "`gmux frames` is asked on a control connection"};

    case wire::Request::ADMIN:
      return {CL_INVALID_OPERATION, "`gmux usage` and `gmux tenant` ask on a control connection"};

    case wire::Request::STATS: {
      auto s = root.initStats();
      s.setLiveBackendObjects(LiveBackendObjects());
      s.setPendingCommands(sink_.Outstanding());
      s.setBulkBytes(core_->bulk_bytes.load());
      s.setScheduler(sink_.Status());
      return {};
    }
  }
  return {CL_INVALID_OPERATION, "unknown request"};
}

Session::Err Session::PlaceChunk(uint64_t seq, uint64_t token, uint64_t offset, uint64_t n,
                                 Bulk** out) {
  *out = nullptr;
  if (token != 0 && token == refused_bulk_) return {};  // already refused
  GMUX_LOOKUP(b, bulk_, token, CL_INVALID_VALUE, "bulk token");
  Bulk& bulk = **b;
  if (offset != bulk.filled || n > bulk.bytes.size() - offset) {
    core_->bulk_bytes.fetch_sub(bulk.bytes.staged());
    bulk_.erase(token);
    return RefuseBulk(seq, token,
                      {CL_INVALID_VALUE, "bulk data out of order or outside its transfer"});
  }
  *out = &bulk;
  return {};
}

Session::Err Session::RefuseBulk(uint64_t seq, uint64_t token, Err e) {
  refused_bulk_ = token;
  refused_bulk_err_ = e;
  // A client that asked gets the answer now; otherwise the command naming the token gets it.
  return seq != 0 ? e : Err{};
}

std::shared_ptr<HostBuffer> Session::DirectTarget(wire::BulkBegin::Reader r) {
  if (r.getShm() || r.getDestMem() == 0 || r.getSize() == 0) return nullptr;
  auto* m = FindId(mems_, r.getDestMem());
  if (m == nullptr || !m->own_storage) return nullptr;
  if (r.getDestOffset() > m->size || r.getSize() > m->size - r.getDestOffset()) return nullptr;
  // Commands still in the batch go first (a run of blocking writes of one chunk each: the
  // previous write's own command). If everything outstanding is the marker of an earlier write
  // received in place, no command can see the bytes early: markers touch no memory. The count
  // of markers falls before the count of outstanding commands (Executor::Deliver), and both
  // only fall while this thread reads them, so `n <= markers` means only markers are left.
  SubmitPending();
  if (const uint64_t n = sink_.Outstanding(); n > direct_markers_->load()) return nullptr;
  return HostBuffer::View(m->own_storage, r.getDestOffset(), r.getSize());
}

Session::Err Session::BeginBulk(wire::BulkBegin::Reader r) {
  std::shared_ptr<Bulk> b;
  if (auto direct = DirectTarget(r)) {
    // Received in place: no staging (a view of the buffer's storage stages nothing).
    b = std::make_shared<Bulk>(std::move(direct));
    b->direct_mem = r.getDestMem();
    b->direct_offset = r.getDestOffset();
  } else if (r.getShm()) {
    // The client's own memory, mapped: nothing is allocated here, so no staging limit applies
    // (the command that uses it checks the size against its buffer).
    if (passed_fd_ < 0) return {CL_INVALID_VALUE, "shared-memory bulk without a descriptor"};
    int fd = passed_fd_;
    passed_fd_ = -1;
    auto mapped = MapShared(fd, r.getSize());
    if (!mapped.ok()) return {CL_INVALID_VALUE, mapped.status().message()};
    b = std::make_shared<Bulk>(*mapped);
    b->filled = r.getSize();
  } else {
    if (!StagingRoom(r.getSize())) {
      return {CL_OUT_OF_RESOURCES, "bulk transfer of " + std::to_string(r.getSize()) +
                                       " bytes exceeds the session's staging limit (max_bulk_bytes)"};
    }
    try {
      b = std::make_shared<Bulk>(std::make_shared<HostBuffer>(r.getSize()));
    } catch (const std::bad_alloc&) {
      return {CL_OUT_OF_HOST_MEMORY, "cannot stage bulk data"};
    }
  }
  core_->bulk_bytes.fetch_add(b->bytes.staged());
  bulk_[r.getToken()] = std::move(b);
  return {};
}

bool Session::StagingRoom(uint64_t bytes) {
  // The limit is read again while waiting: the tenant's share changes as its sessions come and
  // go.
  auto fits = [this, bytes] {
    RefreshLimits();
    const uint64_t max = limits_.max_bulk_bytes;
    return max == 0 || (bytes <= max && core_->bulk_bytes.load() + bytes <= max);
  };
  if (fits()) return true;
  if (bytes > limits_.max_bulk_bytes) return false;
  // Full with what this session's earlier transfers hold: wait for them to free it, as a
  // blocking call waits natively for the commands before it (writes or reads queued behind a
  // long kernel were refused).
  SubmitPending();
  sink_.WaitUntil(fits);
  // If it still does not fit, nothing outstanding can free it, but the writer may still be
  // sending reads' data, which frees their staging once sent (after their commands completed).
  // A client that does not read its replies stops that: refused after kSendStallLimit without
  // progress.
  constexpr auto kSendStallLimit = std::chrono::seconds(5);
  uint64_t sending = core_->sending_bytes.load();
  auto progress = std::chrono::steady_clock::now();
  while (!fits() && sending != 0 && !core_->closed.load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const auto now = std::chrono::steady_clock::now();
    if (const uint64_t s = core_->sending_bytes.load(); s != sending) {
      sending = s;
      progress = now;
    } else if (now - progress > kSendStallLimit) {
      break;
    }
  }
  return fits();
}

void Session::RefreshLimits() {
  if (const uint64_t g = core_->limits_generation.load(); g != limits_seen_) {
    limits_ = core_->SessionLimitsNow();
    limits_seen_ = g;
  }
}

Session::Err Session::TakeBulk(uint64_t token, uint64_t expected, std::shared_ptr<Bulk>& out,
                               bool direct_ok) {
  auto it = bulk_.find(token);
  if (it == bulk_.end()) {
    if (token != 0 && token == refused_bulk_) {
      refused_bulk_ = 0;
      return std::move(refused_bulk_err_);
    }
    return {CL_INVALID_VALUE, "unknown bulk token " + std::to_string(token)};
  }
  out = std::move(it->second);
  bulk_.erase(it);
  if (out->direct_mem != 0 && !direct_ok) {
    out.reset();
    return {CL_INVALID_VALUE, "bulk data announced for a buffer write used otherwise"};
  }
  if (out->bytes.size() != expected || out->filled != out->bytes.size()) {
    core_->bulk_bytes.fetch_sub(out->bytes.staged());
    out.reset();
    return {CL_INVALID_VALUE, "bulk data does not match the command's size"};
  }
  return {};
}

Session::Err Session::GetInfo(wire::GetInfo::Reader r, capnp::MallocMessageBuilder& reply) {
  const uint32_t p = r.getParam();
  if (IsHandleParam(p)) return {CL_INVALID_VALUE, "handle-valued parameter"};
  const uint64_t id = r.getId();
  // A two-call query (size, then value) through one of the backend's info functions.
  auto query = [&](auto&& call) -> Err {
    size_t n = 0;
    cl_int err = call(0, nullptr, &n);
    if (err != CL_SUCCESS) return {err, "query failed"};
    if (n > kMaxInfoBytes) return {CL_OUT_OF_RESOURCES, "info value too large"};
    std::vector<uint8_t> v(n);
    if (n > 0) {
      err = call(n, v.data(), nullptr);
      if (err != CL_SUCCESS) return {err, "query failed"};
    }
    reply.getRoot<wire::Reply>().setInfo(kj::arrayPtr(v.data(), v.size()));
    return {};
  };
  cl_device_id dev = nullptr;
  if (r.getHasDevice()) {
    auto d = DeviceFor(r.getDevice());
    if (!d.ok()) return {CL_INVALID_DEVICE, d.status().message()};
    dev = *d;
  }
  switch (r.getKind()) {
    case wire::ObjectKind::PLATFORM:
      return query([&](size_t s, void* v, size_t* o) {
        return cl_.clGetPlatformInfo(backend_.platform(), p, s, v, o);
      });
    case wire::ObjectKind::DEVICE: {
      auto d = DeviceFor(id);
      if (!d.ok()) return {CL_INVALID_DEVICE, d.status().message()};
      if (p == CL_DEVICE_GLOBAL_MEM_SIZE || p == CL_DEVICE_MAX_MEM_ALLOC_SIZE) {
        // The tenant's view: what it may allocate (its quota, the managed capacity).
        const cl_ulong v = p == CL_DEVICE_GLOBAL_MEM_SIZE
                               ? MemoryView(static_cast<uint32_t>(id))
                               : MaxAllocView(static_cast<uint32_t>(id));
        return query([&](size_t s, void* out, size_t* o) -> cl_int {
          if (out != nullptr && s < sizeof(v)) return CL_INVALID_VALUE;
          if (out != nullptr) std::memcpy(out, &v, sizeof(v));
          if (o != nullptr) *o = sizeof(v);
          return CL_SUCCESS;
        });
      }
      return query([&](size_t s, void* v, size_t* o) { return cl_.clGetDeviceInfo(*d, p, s, v, o); });
    }
    case wire::ObjectKind::CONTEXT: {
      GMUX_LOOKUP(c, contexts_, id, CL_INVALID_CONTEXT, "context");
      return query([&](size_t s, void* v, size_t* o) {
        return cl_.clGetContextInfo(c->ctx->h, p, s, v, o);
      });
    }
    case wire::ObjectKind::MEM: {
      GMUX_LOOKUP(m, mems_, id, CL_INVALID_MEM_OBJECT, "mem");
      auto lock = residency_->Lock();
      if (cl_int err = residency_->UseLocked(m->alloc); err != CL_SUCCESS) {
        return {err, "the memory object could not be brought back to the device"};
      }
      if (p >= CL_IMAGE_FORMAT && p <= CL_IMAGE_NUM_SAMPLES) {
        if (!m->image) return {CL_INVALID_MEM_OBJECT, "not an image"};
        return query([&](size_t s, void* v, size_t* o) {
          return cl_.clGetImageInfo(m->mem->h, p, s, v, o);
        });
      }
      return query([&](size_t s, void* v, size_t* o) {
        return cl_.clGetMemObjectInfo(m->mem->h, p, s, v, o);
      });
    }
    case wire::ObjectKind::PROGRAM: {
      GMUX_LOOKUP(pr, programs_, id, CL_INVALID_PROGRAM, "program");
      cl_program h = pr->program->h;
      if (p >= CL_PROGRAM_BUILD_STATUS && p <= CL_PROGRAM_BUILD_GLOBAL_VARIABLE_TOTAL_SIZE) {
        if (dev == nullptr) return {CL_INVALID_DEVICE, "build info needs a device"};
        if (p == CL_PROGRAM_BUILD_OPTIONS) {
          // The options as the application gave them: without the argument info added.
          std::string opts;
          Err e = query([&](size_t s, void* v, size_t* o) {
            return cl_.clGetProgramBuildInfo(h, dev, p, s, v, o);
          });
          if (!e.ok()) return e;
          auto got = reply.getRoot<wire::Reply>().getInfo();
          opts.assign(reinterpret_cast<const char*>(got.begin()), got.size());
          opts = opts.c_str();
          if (pr->arg_info_added && opts.ends_with(kArgInfoOption)) {
            opts.resize(opts.size() - kArgInfoOption.size());
          }
          reply.getRoot<wire::Reply>().setInfo(
              kj::arrayPtr(reinterpret_cast<const uint8_t*>(opts.c_str()), opts.size() + 1));
          return {};
        }
        return query([&](size_t s, void* v, size_t* o) {
          return cl_.clGetProgramBuildInfo(h, dev, p, s, v, o);
        });
      }
      if (p == CL_PROGRAM_BINARIES) {
        size_t nd = pr->devices.size();
        std::vector<size_t> sizes(nd);
        cl_int err = cl_.clGetProgramInfo(h, CL_PROGRAM_BINARY_SIZES, nd * sizeof(size_t),
                                          sizes.data(), nullptr);
        if (err != CL_SUCCESS) return {err, "binary sizes query failed"};
        uint64_t total = 0;
        for (size_t s : sizes) total += s;
        if (total > core_->limits.max_payload_bytes / 2) return {CL_OUT_OF_RESOURCES, "binaries too large"};
        std::vector<uint8_t> all(total);
        std::vector<unsigned char*> ptrs(nd);
        uint64_t at = 0;
        for (size_t i = 0; i < nd; ++i) {
          ptrs[i] = all.data() + at;
          at += sizes[i];
        }
        err = cl_.clGetProgramInfo(h, CL_PROGRAM_BINARIES, nd * sizeof(unsigned char*), ptrs.data(),
                                   nullptr);
        if (err != CL_SUCCESS) return {err, "binaries query failed"};
        reply.getRoot<wire::Reply>().setInfo(kj::arrayPtr(all.data(), all.size()));
        return {};
      }
      return query([&](size_t s, void* v, size_t* o) { return cl_.clGetProgramInfo(h, p, s, v, o); });
    }
    case wire::ObjectKind::KERNEL: {
      GMUX_LOOKUP(k, kernels_, id, CL_INVALID_KERNEL, "kernel");
      cl_kernel h = k->kernel->h;
      if (r.getSubGroup()) {
        if (dev == nullptr) return {CL_INVALID_DEVICE, "sub-group info needs a device"};
        if (cl_.clGetKernelSubGroupInfo == nullptr) {
          return {CL_INVALID_OPERATION, "the backend has no sub-group queries"};
        }
        auto in = r.getInput();
        // Inputs are a local size (up to 3 size_t) or a sub-group count.
        if (in.size() > 3 * sizeof(size_t)) return {CL_INVALID_VALUE, "sub-group input too large"};
        return query([&](size_t s, void* v, size_t* o) {
          return cl_.clGetKernelSubGroupInfo(h, dev, p, in.size(),
                                             in.size() == 0 ? nullptr : in.begin(), s, v, o);
        });
      }
      if (p >= CL_KERNEL_ARG_ADDRESS_QUALIFIER && p <= CL_KERNEL_ARG_NAME) {
        if (r.getArgIndex() >= k->num_args) return {CL_INVALID_ARG_INDEX, "no such argument"};
        return query([&](size_t s, void* v, size_t* o) {
          return cl_.clGetKernelArgInfo(h, r.getArgIndex(), p, s, v, o);
        });
      }
      if (p >= CL_KERNEL_WORK_GROUP_SIZE && p <= CL_KERNEL_GLOBAL_WORK_SIZE) {
        if (dev == nullptr) dev = backend_.devices()[0];
        return query([&](size_t s, void* v, size_t* o) {
          return cl_.clGetKernelWorkGroupInfo(h, dev, p, s, v, o);
        });
      }
      return query([&](size_t s, void* v, size_t* o) { return cl_.clGetKernelInfo(h, p, s, v, o); });
    }
    case wire::ObjectKind::EVENT: {
      GMUX_LOOKUP(ev, events_, id, CL_INVALID_EVENT, "event");
      if (p == CL_EVENT_COMMAND_EXECUTION_STATUS) {
        cl_int st = (*ev)->status();
        reply.getRoot<wire::Reply>().setInfo(
            kj::arrayPtr(reinterpret_cast<const kj::byte*>(&st), sizeof(st)));
        return {};
      }
      if (p == proto::kProfilingAllParam) {
        // Every value at once (proto/event_profile.h), each as the single query answers it.
        if (!ProfilingReady(**ev)) {
          return {CL_PROFILING_INFO_NOT_AVAILABLE, "event not complete"};
        }
        const std::vector<uint8_t> v = ProfileOf(**ev).Encode();
        reply.getRoot<wire::Reply>().setInfo(kj::arrayPtr(v.data(), v.size()));
        return {};
      }
      if (p >= CL_PROFILING_COMMAND_QUEUED && p <= CL_PROFILING_COMMAND_COMPLETE) {
        Ref<cl_event> b = (*ev)->ProfilingEvent(p);
        if (!b || !ProfilingReady(**ev)) {
          return {CL_PROFILING_INFO_NOT_AVAILABLE, "event not complete"};
        }
        return query([&](size_t s, void* v, size_t* o) {
          return cl_.clGetEventProfilingInfo(b->h, p, s, v, o);
        });
      }
      return {CL_INVALID_VALUE, "event parameter answered by the client"};
    }
    default:
      return {CL_INVALID_VALUE, "unsupported object kind"};
  }
}

void Session::Track(QueueObj& q, const std::shared_ptr<EventRecord>& ev) {
  // Commands of a queue finish roughly in order: dropping finished ones from the front keeps
  // this O(1) amortized however many are in flight.
  while (!q.outstanding.empty() && q.outstanding.front()->done()) q.outstanding.pop_front();
  q.outstanding.push_back(ev);
  if (q.in_order) q.last = ev;
}

Session::Err Session::Enqueue(uint64_t seq, wire::Enqueue::Reader r, bool& replied) {
  const uint64_t event_id = r.getEvent();
  if (event_id == 0 || events_.count(event_id) != 0) {
    return {CL_INVALID_VALUE, "event id 0 or in use"};
  }
  GMUX_LOOKUP(q, queues_, r.getQueue(), CL_INVALID_COMMAND_QUEUE, "queue");
  if (Err e = CheckEvents(); !e.ok()) return e;
  if (limits_.max_queued_commands != 0 &&
      sink_.Outstanding() + to_submit_.size() >= limits_.max_queued_commands) {
    // Full: wait for the device to drain, as a driver blocks on a full command ring (the client
    // blocks on its socket meanwhile). Only a queue that cannot drain, everything in it held
    // behind events nothing running will set, is an error.
    SubmitPending();
    if (!sink_.WaitForRoom(limits_.max_queued_commands)) {
      return {CL_OUT_OF_RESOURCES,
              "this tenant has " + std::to_string(sink_.Outstanding()) +
                  " commands queued, its limit (max_queued_commands), all held behind events "
                  "not set yet"};
    }
  }
  auto event = std::make_shared<EventRecord>(event_id, false, q->device);
  // Decoding errors fail the command's event, so a later wait on it returns instead of hanging.
  auto fail = [&](Err e) {
    event->Complete(CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST);
    if (r.getKeepEvent()) events_[event_id] = event;
    return e;
  };

  auto cmd = std::make_shared<Command>();
  cmd->session = core_;
  cmd->tenant = core_->tenant;
  cmd->device = q->device;
  cmd->queue = q->q;
  cmd->event = event;
  for (uint64_t w : r.getWaitList()) {
    auto it = events_.find(w);
    if (it == events_.end()) {
      return fail({CL_INVALID_EVENT_WAIT_LIST, "unknown event id " + std::to_string(w)});
    }
    cmd->deps.push_back(it->second);
  }
  if (q->in_order && q->last) cmd->order_deps.push_back(q->last);
  if (!q->in_order && q->barrier) cmd->order_deps.push_back(q->barrier);
  cmd->block.kind = core::BlockKind::kMarker;
  if (!told_complete_.empty()) {
    // Natively such a write had completed before anything after it was enqueued. Its queue, if
    // in order, orders this command already; a released queue's entry goes once done.
    std::erase_if(told_complete_, [](const ToldComplete& t) { return t.event->done(); });
    for (const ToldComplete& t : told_complete_) {
      if (t.context == q->context && !(q->in_order && t.queue == r.getQueue())) {
        cmd->after.push_back(t.event);
      }
    }
  }

  switch (r.which()) {
    case wire::Enqueue::NDRANGE: {
      auto nd = r.getNdrange();
      GMUX_LOOKUP(k, kernels_, nd.getKernel(), CL_INVALID_KERNEL, "kernel");
      uint32_t dim = nd.getWorkDim();
      if (dim < 1 || dim > 3) return fail({CL_INVALID_WORK_DIMENSION, "work_dim must be 1..3"});
      if (nd.getGlobalSize().size() != dim ||
          (nd.getLocalSize().size() != 0 && nd.getLocalSize().size() != dim) ||
          (nd.getGlobalOffset().size() != 0 && nd.getGlobalOffset().size() != dim)) {
        return fail({CL_INVALID_VALUE, "work sizes do not match work_dim"});
      }
      if (nd.getArgs().size() != k->num_args) {
        return fail({CL_INVALID_KERNEL_ARGS, "argument count does not match the kernel"});
      }
      struct Arg {
        int kind;  // 0 value, 1 mem, 2 null mem, 3 local, 4 sampler
        std::vector<uint8_t> bytes;
        Ref<cl_mem> mem;
        Ref<cl_sampler> sampler;
        size_t local = 0;
      };
      // Sets every argument of the kernel (under the kernel's mutex, held by the caller): the
      // whole launch and each chunk of a split launch set them the same way.
      static constexpr auto kSetArgs = [](const cl_icd_dispatch& d, cl_kernel kernel,
                                          const std::vector<Arg>& args) -> cl_int {
        for (cl_uint i = 0; i < args.size(); ++i) {
          cl_int err = CL_SUCCESS;
          switch (args[i].kind) {
            case 0: err = d.clSetKernelArg(kernel, i, args[i].bytes.size(), args[i].bytes.data()); break;
            case 1: err = d.clSetKernelArg(kernel, i, sizeof(cl_mem), &args[i].mem->h); break;
            case 2: err = d.clSetKernelArg(kernel, i, sizeof(cl_mem), nullptr); break;
            case 4: err = d.clSetKernelArg(kernel, i, sizeof(cl_sampler), &args[i].sampler->h); break;
            default: err = d.clSetKernelArg(kernel, i, args[i].local, nullptr); break;
          }
          if (err != CL_SUCCESS) return err;
        }
        return CL_SUCCESS;
      };
      std::vector<Arg> args(k->num_args);
      // Read the list once: each read counts its whole size against the traversal limit.
      auto arg_list = nd.getArgs();
      for (uint32_t i = 0; i < k->num_args; ++i) {
        auto a = arg_list[i];
        switch (a.which()) {
          case wire::KernelArg::UNSET:
            return fail({CL_INVALID_KERNEL_ARGS, "argument " + std::to_string(i) + " is not set"});
          case wire::KernelArg::VALUE:
            args[i].kind = 0;
            args[i].bytes.assign(a.getValue().begin(), a.getValue().end());
            break;
          case wire::KernelArg::MEM: {
            auto it = mems_.find(a.getMem());
            if (it == mems_.end()) {
              return fail({CL_INVALID_MEM_OBJECT, "argument " + std::to_string(i) +
                                                      ": unknown mem id " + std::to_string(a.getMem())});
            }
            args[i].kind = 1;
            args[i].mem = it->second.mem;
            break;
          }
          case wire::KernelArg::NULL_MEM:
            args[i].kind = 2;
            break;
          case wire::KernelArg::LOCAL: {
            ClStatus v = ValidateLocalArgSize(a.getLocal());
            if (!v.ok()) return fail({v.code, "argument " + std::to_string(i) + ": " + v.message});
            args[i].kind = 3;
            args[i].local = a.getLocal();
            break;
          }
          case wire::KernelArg::SAMPLER: {
            auto it = samplers_.find(a.getSampler());
            if (it == samplers_.end()) {
              return fail({CL_INVALID_SAMPLER, "argument " + std::to_string(i) +
                                                   ": unknown sampler id " +
                                                   std::to_string(a.getSampler())});
            }
            args[i].kind = 4;
            args[i].sampler = it->second;
            break;
          }
        }
      }
      std::array<size_t, 3> off{0, 0, 0}, gs{1, 1, 1}, ls{0, 0, 0};
      bool has_local = nd.getLocalSize().size() == dim;
      for (uint32_t i = 0; i < dim; ++i) {
        gs[i] = nd.getGlobalSize()[i];
        if (nd.getGlobalOffset().size() == dim) off[i] = nd.getGlobalOffset()[i];
        if (has_local) ls[i] = nd.getLocalSize()[i];
      }
      // The spec's errors, decided here rather than by the backend (which may assert on them).
      {
        const DeviceLimits& dl = device_limits_[q->device];
        auto kl_it = k->limits.find(q->device);
        const KernelLimits kl = kl_it != k->limits.end() ? kl_it->second : KernelLimits{};
        ClStatus v = ValidateNDRange(dl, kl, dim, off.data(), gs.data(),
                                     has_local ? ls.data() : nullptr);
        if (v.ok()) {
          std::vector<size_t> locals;
          for (const Arg& a : args) {
            if (a.kind == 3) locals.push_back(a.local);
          }
          v = ValidateLocalMemory(dl, kl, locals);
        }
        if (!v.ok()) return fail({v.code, v.message});
      }
      uint64_t items = 1, groups = 1;
      for (uint32_t i = 0; i < dim; ++i) {
        items *= gs[i];  // validated: the product fits
        if (has_local) groups *= gs[i] / ls[i];
      }
      cmd->block.kind = core::BlockKind::kKernel;
      cmd->block.work_items = items;
      cmd->block.work_groups = has_local ? groups : 0;
      // The kernel its chunks run: its own, or its program's restoring variant for this shape
      // once that is built (restore.h; until then, and without one, the launch runs whole).
      std::optional<RestoredVariants::Kernel> chunk_kernel;
      cl_device_id device = backend_.devices()[q->device];
      if (k->splittable) {
        chunk_kernel = RestoredVariants::Kernel{k->kernel, k->mu, 0};
      } else if (k->variants && (has_local || !k->restore_needs_local)) {
        chunk_kernel = k->variants->Find(k->name, LaunchShape{dim, gs, off}, device);
      }
      if (chunk_kernel) {
        // May run in chunks of whole work-groups along the last dimension (splitter.h).
        auto plan = PlanSplit(cl_, k->kernel->h, device, dim, gs, has_local ? &ls : nullptr);
        if (plan && chunk_kernel->work_group_size != 0 &&
            plan->local[0] * plan->local[1] * plan->local[2] > chunk_kernel->work_group_size) {
          plan.reset();  // the variant cannot take the local size the plan passes
        }
        if (plan) {
          cmd->block.splittable = core::Splittable::kYes;
          cmd->block.work_groups = plan->granules;
          cmd->run_chunk = [kernel = chunk_kernel->kernel, mu = chunk_kernel->mu, args, dim, off,
                            gs, plan = *plan](cl_command_queue cq, const std::vector<cl_event>& w,
                                              const core::WorkRange& range, cl_event* out) {
            const cl_icd_dispatch& d = Dispatch(cq);
            std::lock_guard<std::mutex> lock(*mu);
            if (cl_int err = kSetArgs(d, kernel->h, args); err != CL_SUCCESS) return err;
            return EnqueueChunk(d, cq, kernel->h, dim, off, gs, plan, range,
                                static_cast<cl_uint>(w.size()), w.empty() ? nullptr : w.data(), out);
          };
        }
      }
      cmd->run = [kernel = k->kernel, mu = k->mu, args = std::move(args), dim, off, gs, ls,
                  has_local](cl_command_queue cq, const std::vector<cl_event>& w, cl_event* out) {
        const cl_icd_dispatch& d = Dispatch(cq);
        std::lock_guard<std::mutex> lock(*mu);
        if (cl_int err = kSetArgs(d, kernel->h, args); err != CL_SUCCESS) return err;
        return d.clEnqueueNDRangeKernel(cq, kernel->h, dim, off.data(), gs.data(),
                                        has_local ? ls.data() : nullptr,
                                        static_cast<cl_uint>(w.size()), w.empty() ? nullptr : w.data(),
                                        out);
      };
      break;
    }

    case wire::Enqueue::WRITE_BUFFER: {
      auto wb = r.getWriteBuffer();
      GMUX_LOOKUP(m, mems_, wb.getMem(), CL_INVALID_MEM_OBJECT, "mem");
      std::shared_ptr<Bulk> data;
      if (wb.getIsRect()) {
        RectArgs ra;
        if (!DecodeRect(wb.getRect(), ra) || ra.buffer_end > m->size) {
          return fail({CL_INVALID_VALUE, "rectangle outside the buffer or malformed"});
        }
        Err e = TakeBulk(wb.getBulk(), ra.host_end, data);
        if (!e.ok()) return fail(e);
        cmd->run = [mem = m->mem, data, ra](cl_command_queue cq, const std::vector<cl_event>& w,
                                            cl_event* out) {
          return Dispatch(cq).clEnqueueWriteBufferRect(
              cq, mem->h, CL_FALSE, ra.buffer_origin, ra.host_origin, ra.region, ra.brp, ra.bsp,
              ra.hrp, ra.hsp, data->bytes.data(), static_cast<cl_uint>(w.size()),
              w.empty() ? nullptr : w.data(), out);
        };
      } else if (wb.getRemote() != 0) {
        // One copy: the worker reads the client's memory when the write runs (remote_copy.h).
        if (!core_->remote) return fail({CL_INVALID_OPERATION, "remote copy is not enabled"});
        if (wb.getOffset() > m->size || wb.getSize() > m->size - wb.getOffset() ||
            wb.getSize() == 0) {
          return fail({CL_INVALID_VALUE, "write outside the buffer"});
        }
        auto transfer = std::make_shared<RemoteTransfer>();
        cmd->remote = transfer;
        cmd->run = [mem = m->mem, off = wb.getOffset(), n = wb.getSize(), at = wb.getRemote(),
                    copier = core_->remote, transfer](cl_command_queue cq,
                                                      const std::vector<cl_event>& w,
                                                      cl_event* out) {
          return EnqueueRemoteCopy(cq, mem->h, /*to_device=*/true, off, n, at, copier, transfer,
                                   w, out);
        };
        cmd->block.kind = core::BlockKind::kCopy;
        cmd->block.bytes = wb.getSize();
        cmd->finished = [core = core_, transfer, seq](cl_int status) {
          // A non-blocking write's failure is reported unasked too (the next blocking call
          // returns it), as well as through its event.
          if (seq == 0 && status == CL_COMPLETE) return;
          core->SendStatus(seq, status == CL_COMPLETE ? CL_SUCCESS : status,
                           status == CL_COMPLETE ? "" : transfer->message);
        };
        replied = seq != 0;
        break;
      } else {
        if (wb.getOffset() > m->size || wb.getSize() > m->size - wb.getOffset() || wb.getSize() == 0) {
          return fail({CL_INVALID_VALUE, "write outside the buffer"});
        }
        Err e = TakeBulk(wb.getBulk(), wb.getSize(), data, /*direct_ok=*/true);
        if (!e.ok()) return fail(e);
        uint64_t off = wb.getOffset();
        if (data->direct_mem != 0) {
          // Received in place: the bytes are in the buffer already, and nothing ran since they
          // came (DirectTarget). The command keeps the write's place in the queue and its event.
          if (data->direct_mem != wb.getMem() || data->direct_offset != off) {
            return fail({CL_INVALID_VALUE, "bulk data was received for another write"});
          }
          cmd->run = [](cl_command_queue cq, const std::vector<cl_event>& w, cl_event* out) {
            return Dispatch(cq).clEnqueueMarkerWithWaitList(
                cq, static_cast<cl_uint>(w.size()), w.empty() ? nullptr : w.data(), out);
          };
          direct_markers_->fetch_add(1);
          cmd->in_place_markers = direct_markers_;
        } else {
          cmd->run = [mem = m->mem, data, off](cl_command_queue cq,
                                               const std::vector<cl_event>& w, cl_event* out) {
            return Dispatch(cq).clEnqueueWriteBuffer(
                cq, mem->h, CL_FALSE, off, data->bytes.size(), data->bytes.data(),
                static_cast<cl_uint>(w.size()), w.empty() ? nullptr : w.data(), out);
          };
        }
      }
      cmd->block.kind = core::BlockKind::kCopy;
      cmd->block.bytes = data->bytes.size();
      // A write with a seq (its data in the client's shared memory) is answered once it ran, so
      // the client may reuse that memory.
      cmd->finished = [core = core_, data, seq](cl_int status) {
        core->bulk_bytes.fetch_sub(data->bytes.staged());
        if (seq != 0) core->SendStatus(seq, status == CL_COMPLETE ? CL_SUCCESS : status, "");
      };
      replied = seq != 0;
      break;
    }

    case wire::Enqueue::READ_BUFFER: {
      auto rb = r.getReadBuffer();
      if (seq == 0) return fail({CL_INVALID_VALUE, "a read needs a seq"});
      GMUX_LOOKUP(m, mems_, rb.getMem(), CL_INVALID_MEM_OBJECT, "mem");
      RectArgs ra{};
      uint64_t host_bytes;
      bool rect = rb.getIsRect();
      if (rect) {
        if (!DecodeRect(rb.getRect(), ra) || ra.buffer_end > m->size) {
          return fail({CL_INVALID_VALUE, "rectangle outside the buffer or malformed"});
        }
        host_bytes = ra.host_end;
      } else {
        if (rb.getOffset() > m->size || rb.getSize() > m->size - rb.getOffset() || rb.getSize() == 0) {
          return fail({CL_INVALID_VALUE, "read outside the buffer"});
        }
        host_bytes = rb.getSize();
      }
      if (rb.getRemote() != 0) {
        // One copy: the worker writes the client's memory when the read runs (remote_copy.h).
        if (!core_->remote) return fail({CL_INVALID_OPERATION, "remote copy is not enabled"});
        if (rect) return fail({CL_INVALID_VALUE, "a rectangle read cannot be copied remotely"});
        auto transfer = std::make_shared<RemoteTransfer>();
        cmd->remote = transfer;
        cmd->run = [mem = m->mem, off = rb.getOffset(), n = host_bytes, at = rb.getRemote(),
                    copier = core_->remote, transfer](cl_command_queue cq,
                                                      const std::vector<cl_event>& w,
                                                      cl_event* out) {
          return EnqueueRemoteCopy(cq, mem->h, /*to_device=*/false, off, n, at, copier, transfer,
                                   w, out);
        };
        cmd->finished = [core = core_, transfer, seq](cl_int status) {
          core->SendStatus(seq, status == CL_COMPLETE ? CL_SUCCESS : status,
                           status == CL_COMPLETE ? "" : transfer->message);
        };
        cmd->block.kind = core::BlockKind::kCopy;
        cmd->block.bytes = host_bytes;
        replied = true;
        break;
      }
      std::shared_ptr<HostBuffer> staging;
      const bool shm = rb.getShm();
      if (!rect && !shm && core_->data_frames && m->own_storage &&
          host_bytes >= kOwnStorageMinBytes && core_->storage_reads.load() == 0) {
        // Sent from the buffer itself, no staging copy (StorageRead).
        StorageRead(*cmd, HostBuffer::View(m->own_storage, rb.getOffset(), host_bytes), seq);
        cmd->block.kind = core::BlockKind::kCopy;
        cmd->block.bytes = host_bytes;
        replied = true;
        break;
      }
      if (Err e = StageRead(host_bytes, shm, /*zero=*/rect, staging); !e.ok()) return fail(e);
      uint64_t off = rb.getOffset();
      if (!rect && !shm && host_bytes >= kStreamedReadBytes) {
        StreamedRead(*cmd, m->mem, off, staging, seq);
        cmd->block.kind = core::BlockKind::kCopy;
        cmd->block.bytes = host_bytes;
        replied = true;
        break;
      }
      cmd->run = [mem = m->mem, staging, off, rect, ra](cl_command_queue cq,
                                                        const std::vector<cl_event>& w,
                                                        cl_event* out) {
        const cl_icd_dispatch& d = Dispatch(cq);
        if (rect) {
          return d.clEnqueueReadBufferRect(cq, mem->h, CL_FALSE, ra.buffer_origin, ra.host_origin,
                                           ra.region, ra.brp, ra.bsp, ra.hrp, ra.hsp,
                                           staging->data(), static_cast<cl_uint>(w.size()),
                                           w.empty() ? nullptr : w.data(), out);
        }
        return d.clEnqueueReadBuffer(cq, mem->h, CL_FALSE, off, staging->size(), staging->data(),
                                     static_cast<cl_uint>(w.size()), w.empty() ? nullptr : w.data(),
                                     out);
      };
      cmd->finished = ReadFinished(core_, staging, seq, shm);
      cmd->block.kind = core::BlockKind::kCopy;
      cmd->block.bytes = host_bytes;
      replied = true;  // the data (or the error) is the reply
      break;
    }

    case wire::Enqueue::COPY_BUFFER: {
      auto cb = r.getCopyBuffer();
      GMUX_LOOKUP(src, mems_, cb.getSrc(), CL_INVALID_MEM_OBJECT, "mem");
      GMUX_LOOKUP(dst, mems_, cb.getDst(), CL_INVALID_MEM_OBJECT, "mem");
      if (cb.getIsRect()) {
        RectArgs ra;
        if (!DecodeRect(cb.getRect(), ra) || ra.buffer_end > src->size || ra.host_end > dst->size) {
          return fail({CL_INVALID_VALUE, "rectangle outside a buffer or malformed"});
        }
        cmd->run = [s = src->mem, t = dst->mem, ra](cl_command_queue cq,
                                                    const std::vector<cl_event>& w, cl_event* out) {
          return Dispatch(cq).clEnqueueCopyBufferRect(
              cq, s->h, t->h, ra.buffer_origin, ra.host_origin, ra.region, ra.brp, ra.bsp, ra.hrp,
              ra.hsp, static_cast<cl_uint>(w.size()), w.empty() ? nullptr : w.data(), out);
        };
        cmd->block.bytes = ra.region[0] * ra.region[1] * ra.region[2];
      } else {
        uint64_t so = cb.getSrcOffset(), d_off = cb.getDstOffset(), n = cb.getSize();
        if (so > src->size || n > src->size - so || d_off > dst->size || n > dst->size - d_off) {
          return fail({CL_INVALID_VALUE, "copy outside a buffer"});
        }
        cmd->run = [s = src->mem, t = dst->mem, so, d_off, n](
                       cl_command_queue cq, const std::vector<cl_event>& w, cl_event* out) {
          return Dispatch(cq).clEnqueueCopyBuffer(cq, s->h, t->h, so, d_off, n,
                                                  static_cast<cl_uint>(w.size()),
                                                  w.empty() ? nullptr : w.data(), out);
        };
        cmd->block.bytes = n;
      }
      cmd->block.kind = core::BlockKind::kCopy;
      break;
    }

    case wire::Enqueue::FILL_BUFFER: {
      auto fb = r.getFillBuffer();
      GMUX_LOOKUP(m, mems_, fb.getMem(), CL_INVALID_MEM_OBJECT, "mem");
      std::vector<uint8_t> pattern(fb.getPattern().begin(), fb.getPattern().end());
      uint64_t off = fb.getOffset(), n = fb.getSize();
      if (pattern.empty() || pattern.size() > 128 || off > m->size || n > m->size - off) {
        return fail({CL_INVALID_VALUE, "fill outside the buffer or bad pattern"});
      }
      cmd->run = [mem = m->mem, pattern = std::move(pattern), off, n](
                     cl_command_queue cq, const std::vector<cl_event>& w, cl_event* out) {
        return Dispatch(cq).clEnqueueFillBuffer(cq, mem->h, pattern.data(), pattern.size(), off, n,
                                                static_cast<cl_uint>(w.size()),
                                                w.empty() ? nullptr : w.data(), out);
      };
      cmd->block.kind = core::BlockKind::kCopy;
      cmd->block.bytes = n;
      break;
    }

    case wire::Enqueue::MARKER:
    case wire::Enqueue::BARRIER: {
      bool barrier = r.isBarrier();
      // With an empty wait list both wait for every earlier command of the queue; commands the
      // daemon still holds (behind user events) must be ordered explicitly.
      if (r.getWaitList().size() == 0) {
        for (const auto& e : q->outstanding) {
          if (!e->done()) cmd->order_deps.push_back(e);
        }
      }
      cmd->run = [barrier](cl_command_queue cq, const std::vector<cl_event>& w, cl_event* out) {
        const cl_icd_dispatch& d = Dispatch(cq);
        return barrier ? d.clEnqueueBarrierWithWaitList(cq, static_cast<cl_uint>(w.size()),
                                                        w.empty() ? nullptr : w.data(), out)
                       : d.clEnqueueMarkerWithWaitList(cq, static_cast<cl_uint>(w.size()),
                                                       w.empty() ? nullptr : w.data(), out);
      };
      if (barrier && !q->in_order) q->barrier = event;
      // A marker with a seq is answered once it completed: the client waits on it before
      // copying a buffer on shared memory itself (docs/protocol.md, "Buffers on shared memory").
      if (seq != 0) {
        cmd->finished = [core = core_, seq](cl_int status) {
          core->SendStatus(seq, status == CL_COMPLETE ? CL_SUCCESS : status, "");
        };
        replied = true;
      }
      break;
    }

    case wire::Enqueue::READ_IMAGE:
    case wire::Enqueue::WRITE_IMAGE:
    case wire::Enqueue::COPY_IMAGE:
    case wire::Enqueue::FILL_IMAGE:
    case wire::Enqueue::COPY_IMAGE_TO_BUFFER:
    case wire::Enqueue::COPY_BUFFER_TO_IMAGE:
      if (Err e = EnqueueImage(seq, r, *cmd, replied); !e.ok()) return fail(e);
      break;

    default:
      return fail({CL_INVALID_OPERATION, "unknown command"});
  }

  Track(*q, event);
  if (r.getKeepEvent()) events_[event_id] = event;
  if (r.getToldComplete()) {
    // It runs after every earlier one of its context (its `after`, or its in-order queue), so
    // it stands for them: one entry per context, however many such writes a client sends.
    std::erase_if(told_complete_, [&](const ToldComplete& t) { return t.context == q->context; });
    told_complete_.push_back({r.getQueue(), q->context, event});
  }
  to_submit_.push_back(std::move(cmd));
  return {};
}

Session::Err Session::StageRead(uint64_t host_bytes, bool shm, bool zero,
                                std::shared_ptr<HostBuffer>& out) {
  if (!shm && !StagingRoom(host_bytes)) {
    return {CL_OUT_OF_RESOURCES, "read exceeds the session's staging limit (max_bulk_bytes)"};
  }
  if (shm) {
    // The device writes straight into the client's memory: no copy on the daemon.
    if (passed_fd_ < 0) return {CL_INVALID_VALUE, "shared-memory read without a descriptor"};
    int fd = passed_fd_;
    passed_fd_ = -1;
    auto mapped = MapShared(fd, host_bytes);
    if (!mapped.ok()) return {CL_INVALID_VALUE, mapped.status().message()};
    out = *mapped;
  } else {
    try {
      out = std::make_shared<HostBuffer>(host_bytes);
    } catch (const std::bad_alloc&) {
      return {CL_OUT_OF_HOST_MEMORY, "cannot stage the read"};
    }
    if (zero) std::memset(out->data(), 0, host_bytes);
  }
  core_->bulk_bytes.fetch_add(out->staged());
  return {};
}

namespace {
// Reads up to this size are answered from the completing thread (ReadFinished). Over TCP only
// up to what a new connection's send buffer takes at once (tcp_wmem's default, 16 KiB): a
// reply the socket took only in part had its rest sent by the writer thread, and 32-64 KiB
// reads over TCP took 420-490 us instead of 90-120 us (docs/policies.md, "Transfers over TCP
// in place").
constexpr size_t kDirectReadReplyBytes = 64u << 10;
constexpr size_t kDirectReadReplyBytesTcp = 16u << 10;

// Sends bytes [from, to) of a read's staging buffer as the answer to `seq`, in chunks, the
// last one marked so when `to` is the end: as data frames to a client that reads them, else as
// ReadData messages. On the writer thread only.
void SendReadData(SessionCore* c, uint64_t seq, const HostBuffer& staging, size_t from,
                  size_t to) {
  size_t at = from;
  do {
    const size_t n = std::min(proto::kBulkChunkBytes, to - at);
    const bool last = at + n == staging.size();
    if (c->data_frames) {
      // Raw: the client receives the bytes straight into the application's memory.
      c->SendDataFromWriter(seq, at, staging.data() + at, n, last);
    } else {
      capnp::MallocMessageBuilder b;
      auto rep = b.initRoot<wire::Reply>();
      rep.setSeq(seq);
      auto rd = rep.initReadData();
      rd.setOffset(at);
      if (n % sizeof(capnp::word) == 0 &&
          reinterpret_cast<uintptr_t>(staging.data() + at) % sizeof(capnp::word) == 0) {
        // Sent without copying into the message.
        rd.adoptData(b.getOrphanage().referenceExternalData(
            capnp::Data::Reader(staging.data() + at, n)));
      } else {
        rd.setData(kj::arrayPtr(staging.data() + at, n));
      }
      rd.setLast(last);
      c->SendFromWriter(b);
    }
    at += n;
  } while (at < to);
}

// A read streamed piece by piece (Session::StreamedRead): which pieces the device has read and
// which are sent. It holds the session's core weakly: its last strong reference must not go on
// the writer thread (whose join it is) nor on the backend's callback thread.
struct ReadFlow {
  std::weak_ptr<SessionCore> core;
  std::shared_ptr<HostBuffer> staging;
  std::shared_ptr<RemoteTransfer> transfer;  // the pieces' events
  uint64_t seq = 0;
  std::mutex mu;
  size_t ready = 0;  // bytes from the start the device has read (pieces complete in order)
  size_t sent = 0;   // bytes handed to the writer
  bool failed = false;
  bool decided = false;  // the whole read completed (or failed): the pieces' callbacks no longer count

  // On `c`'s writer thread: sends what is ready and not yet sent.
  void Flush(SessionCore* c) {
    size_t from, to;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (failed || ready <= sent) return;
      from = sent;
      to = sent = ready;
    }
    SendReadData(c, seq, *staging, from, to);
  }
};

void CL_CALLBACK PieceRead(cl_event, cl_int status, void* user) {
  // Owns one reference to the flow and the piece's end.
  auto* p = static_cast<std::pair<std::shared_ptr<ReadFlow>, size_t>*>(user);
  std::shared_ptr<ReadFlow> flow = std::move(p->first);
  const size_t end = p->second;
  delete p;
  {
    std::lock_guard<std::mutex> lock(flow->mu);
    // A failure is found by the read's completion itself (it asks every piece); ready pieces
    // go out early only while the read is still running.
    if (status < 0 || flow->decided || flow->failed) return;
    flow->ready = std::max(flow->ready, end);
  }
  if (std::shared_ptr<SessionCore> core = flow->core.lock()) {
    core->Defer([flow, c = core.get()] { flow->Flush(c); });
  }
}
}  // namespace

void Session::StreamedRead(Command& cmd, Ref<cl_mem> mem, uint64_t offset,
                           std::shared_ptr<HostBuffer> staging, uint64_t seq) {
  auto flow = std::make_shared<ReadFlow>();
  flow->core = core_;
  flow->staging = staging;
  flow->seq = seq;
  // The device reads the buffer in pieces, each waiting for the one before (the queue may be
  // out of order); a piece's data leaves as soon as it is in, while the next is read. The
  // last piece's event is the command's END, the first's its START (the tenant's device time
  // covers the whole read), and a failed piece fails the read.
  auto transfer = std::make_shared<RemoteTransfer>();
  cmd.remote = transfer;
  flow->transfer = transfer;
  cmd.run = [mem, staging, offset, flow, transfer](cl_command_queue cq,
                                                   const std::vector<cl_event>& w,
                                                   cl_event* out) {
    const cl_icd_dispatch& d = Dispatch(cq);
    std::vector<cl_event> waits = w;
    const size_t n = staging->size();
    for (size_t at = 0; at < n; at += kReadPieceBytes) {
      const size_t len = std::min(kReadPieceBytes, n - at);
      cl_event ev = nullptr;
      cl_int err = d.clEnqueueReadBuffer(cq, mem->h, CL_FALSE, offset + at, len,
                                         staging->data() + at, static_cast<cl_uint>(waits.size()),
                                         waits.empty() ? nullptr : waits.data(), &ev);
      if (err != CL_SUCCESS) {
        // The pieces enqueued already write into the staging buffer, which goes with the
        // failed command: they end first (each waits for the one before).
        if (!transfer->pieces.empty()) {
          cl_event last = transfer->pieces.back()->h;
          d.clWaitForEvents(1, &last);
        }
        return err;
      }
      if (at + len == n) {
        *out = ev;
        return CL_SUCCESS;
      }
      Ref<cl_event> piece = Adopt(ev);  // kept until the command ends
      if (!transfer->map) transfer->map = piece;
      transfer->pieces.push_back(piece);
      auto* user = new std::pair<std::shared_ptr<ReadFlow>, size_t>(flow, at + len);
      if (d.clSetEventCallback(ev, CL_COMPLETE, PieceRead, user) != CL_SUCCESS) {
        delete user;  // sent at the end instead
      }
      waits.assign(1, ev);
    }
    return CL_INVALID_VALUE;  // unreachable: the loop ends at the last piece
  };
  cmd.finished = [flow, core = core_](cl_int status) {
    SessionCore* c = core.get();
    // Every piece is done (the last waited for them): a failed one fails the read, whatever
    // the backend made of the pieces after it and whether its callback has run yet.
    cl_int piece_status = CL_COMPLETE;
    for (const Ref<cl_event>& piece : flow->transfer->pieces) {
      cl_int st = CL_COMPLETE;
      if (Dispatch(piece->h).clGetEventInfo(piece->h, CL_EVENT_COMMAND_EXECUTION_STATUS,
                                             sizeof(st), &st, nullptr) != CL_SUCCESS ||
          st < 0) {
        piece_status = st < 0 ? st : CL_OUT_OF_RESOURCES;
        break;
      }
    }
    bool failed;
    {
      std::lock_guard<std::mutex> lock(flow->mu);
      failed = status != CL_COMPLETE || piece_status != CL_COMPLETE;
      flow->failed = failed;
      flow->decided = true;
      if (!failed) flow->ready = flow->staging->size();
    }
    if (failed) {
      c->SendStatus(flow->seq, status != CL_COMPLETE ? status : piece_status, "read failed");
      c->bulk_bytes.fetch_sub(flow->staging->staged());
      return;
    }
    const size_t staged = flow->staging->staged();
    c->sending_bytes.fetch_add(staged);
    c->Defer([flow, c, staged] {
      flow->Flush(c);
      c->bulk_bytes.fetch_sub(staged);
      c->sending_bytes.fetch_sub(staged);
    });
  };
}

namespace {
// A read sent straight from its buffer's own storage (Session::StorageRead): once the marker
// after its wait list completes, the writer sends the bytes from the buffer, then sets `sent`,
// a user event the command's own marker waits for. Setting it is owed once: if the send is
// dropped (the session closed), the destructor sets it failed, so the queue never stalls.
struct StorageReadFlow {
  std::weak_ptr<SessionCore> core;
  std::shared_ptr<HostBuffer> view;
  uint64_t seq = 0;
  cl_event sent = nullptr;  // owned
  std::shared_ptr<void> turn;  // SessionCore::storage_reads, held by the command and the flow
  cl_int failure = CL_INVALID_OPERATION;

  void Settle(cl_int status) {
    if (sent == nullptr) return;
    const cl_icd_dispatch& d = Dispatch(sent);
    d.clSetUserEventStatus(sent, status);
    d.clReleaseEvent(sent);
    sent = nullptr;
  }
  ~StorageReadFlow() { Settle(failure); }

  // On the writer thread: sends the bytes from the buffer as data frames. The read holds its
  // device until they are out, so a client that stops reading must not hold it: a frame the
  // socket has not taken within kFrameStall plus its size at kFrameMinRate is copied out with
  // everything after it, and the read completes, the rest going out from the copy. A client
  // that keeps reading, however slowly its memory takes the bytes (a new vector's first touch),
  // is sent everything from the buffer.
  static constexpr auto kFrameStall = std::chrono::milliseconds(5);
  static constexpr uint64_t kFrameMinRate = 256u << 20;  // bytes per second
  void Send(SessionCore* c) {
    const size_t n = view->size();
    if (sent == nullptr) {  // completed already: `view` is a copy
      SendReadData(c, seq, *view, 0, n);
      return;
    }
    std::unique_ptr<uint8_t[]> copy;  // [at, n) of the view, once taken
    size_t copied_from = 0;
    std::vector<uint8_t> rest;
    for (size_t at = 0; at < n && !c->closed.load();) {
      const size_t len = std::min(proto::kBulkChunkBytes, n - at);
      const proto::DataFrame f{seq, at, static_cast<uint32_t>(len), at + len == n};
      if (copy) {
        proto::WriteDataFrame(c->outlet(), f, copy.get() + (at - copied_from), c->limits)
            .IgnoreError();
      } else {
        const auto deadline = std::chrono::steady_clock::now() + kFrameStall +
                              std::chrono::microseconds(len * 1000000 / kFrameMinRate);
        if (!proto::WriteDataFrameUntil(c->outlet(), f, view->data() + at, deadline, &rest,
                                        c->limits)
                 .ok()) {
          break;
        }
        if (!rest.empty()) {
          // Past its deadline: this frame's rest is in `rest`; the frames after it from a copy.
          if (at + len < n) {
            copy.reset(new (std::nothrow) uint8_t[n - (at + len)]);
            if (copy) {
              copied_from = at + len;
              std::memcpy(copy.get(), view->data() + copied_from, n - copied_from);
            }
          }
          if (copy || at + len == n) Settle(CL_COMPLETE);  // nothing reads the buffer now
          proto::WriteAll(c->outlet(), rest).IgnoreError();
          if (!copy && at + len < n) {
            // No memory for a copy: the rest goes out from the buffer, waiting on the client.
            SendReadData(c, seq, *view, at + len, n);
            break;
          }
        }
      }
      at += len;
    }
    Settle(CL_COMPLETE);
  }
};

void CL_CALLBACK StorageReadReady(cl_event, cl_int status, void* user) {
  auto* held = static_cast<std::shared_ptr<StorageReadFlow>*>(user);
  std::shared_ptr<StorageReadFlow> flow = std::move(*held);
  delete held;
  std::shared_ptr<SessionCore> core = flow->core.lock();
  if (status < 0 || !core) {
    flow->Settle(status < 0 ? status : CL_INVALID_OPERATION);
    return;
  }
  std::function<void()> send = [flow, c = core.get()] { flow->Send(c); };
  if (core->DeferIfIdle(send)) return;
  // The writer is busy, perhaps on a client that does not read: the bytes are copied out now
  // and the read completes, as a staged read would (one such copy at a time: storage_reads).
  std::shared_ptr<HostBuffer> copy;
  try {
    copy = std::make_shared<HostBuffer>(flow->view->size());
  } catch (const std::bad_alloc&) {
    core->Defer(std::move(send));  // waits its turn, holding its device meanwhile
    return;
  }
  std::memcpy(copy->data(), flow->view->data(), copy->size());
  flow->Settle(CL_COMPLETE);
  flow->view = std::move(copy);
  core->Defer(std::move(send));
}
}  // namespace

void Session::StorageRead(Command& cmd, std::shared_ptr<HostBuffer> view, uint64_t seq) {
  std::weak_ptr<SessionCore> weak = core_;
  core_->storage_reads.fetch_add(1);
  std::shared_ptr<void> turn(nullptr, [weak](void*) {
    if (auto c = weak.lock()) c->storage_reads.fetch_sub(1);
  });
  cmd.run = [weak, view, seq, turn](cl_command_queue cq, const std::vector<cl_event>& w,
                                    cl_event* out) {
    const cl_icd_dispatch& d = Dispatch(cq);
    cl_context ctx = nullptr;
    cl_int err = d.clGetCommandQueueInfo(cq, CL_QUEUE_CONTEXT, sizeof(ctx), &ctx, nullptr);
    if (err != CL_SUCCESS) return err;
    auto flow = std::make_shared<StorageReadFlow>();
    flow->core = weak;
    flow->view = view;
    flow->seq = seq;
    flow->turn = turn;
    flow->sent = d.clCreateUserEvent(ctx, &err);
    if (flow->sent == nullptr) return err;
    cl_event ready = nullptr;
    err = d.clEnqueueMarkerWithWaitList(cq, static_cast<cl_uint>(w.size()),
                                        w.empty() ? nullptr : w.data(), &ready);
    if (err != CL_SUCCESS) return err;  // (the flow sets `sent` failed as it goes)
    err = d.clEnqueueMarkerWithWaitList(cq, 1, &flow->sent, out);
    if (err == CL_SUCCESS) {
      auto* user = new std::shared_ptr<StorageReadFlow>(flow);
      if (d.clSetEventCallback(ready, CL_COMPLETE, StorageReadReady, user) != CL_SUCCESS) {
        // Nothing will send: the command fails, and the flow, going, sets `sent` failed.
        delete user;
        err = CL_OUT_OF_RESOURCES;
        d.clReleaseEvent(*out);
        *out = nullptr;
      }
    }
    d.clReleaseEvent(ready);
    return err;
  };
  // The data (with its last chunk) was the answer; only a failure is left to say.
  cmd.finished = [core = core_, seq](cl_int status) {
    if (status != CL_COMPLETE) core->SendStatus(seq, status, "read failed");
  };
}

std::function<void(cl_int)> Session::ReadFinished(std::shared_ptr<SessionCore> core,
                                                  std::shared_ptr<HostBuffer> staging, uint64_t seq,
                                                  bool shm) {
  return [core = std::move(core), staging = std::move(staging), seq, shm](cl_int status) {
    if (status != CL_COMPLETE) {
      core->SendStatus(seq, status, "read failed");
    } else if (shm) {
      core->SendStatus(seq, CL_SUCCESS, "");
    } else if (staging->size() <= (core->tcp ? kDirectReadReplyBytesTcp : kDirectReadReplyBytes)) {
      // A small read is answered from here, as a status is: handing it to the writer thread
      // cost a wake-up more than the send (Send queues what the socket does not take at once).
      capnp::MallocMessageBuilder b;
      auto rep = b.initRoot<wire::Reply>();
      rep.setSeq(seq);
      auto rd = rep.initReadData();
      rd.setOffset(0);
      rd.setData(kj::arrayPtr(staging->data(), staging->size()));
      rd.setLast(true);
      core->Send(b);
    } else {
      // The data goes out from the staging buffer on the writer thread (a client slow to read
      // it holds up only itself); the writer runs while `core` lives, so it needs no reference.
      core->sending_bytes.fetch_add(staging->staged());
      core->Defer([c = core.get(), staging, seq] {
        SendReadData(c, seq, *staging, 0, staging->size());
        c->bulk_bytes.fetch_sub(staging->staged());
        c->sending_bytes.fetch_sub(staging->staged());
      });
      return;
    }
    core->bulk_bytes.fetch_sub(staging->staged());
  };
}

Session::Err Session::CreateImage(wire::CreateImage::Reader r) {
  if (mems_.count(r.getId()) != 0) return {CL_INVALID_VALUE, "mem id in use"};
  GMUX_LOOKUP(ctx, contexts_, r.getContext(), CL_INVALID_CONTEXT, "context");
  auto d = r.getDesc();
  cl_image_format format{r.getChannelOrder(), r.getChannelDataType()};
  size_t element_bytes = proto::ImageElementBytes(
      format.image_channel_order, format.image_channel_data_type);
  if (element_bytes == 0)
    return {CL_IMAGE_FORMAT_NOT_SUPPORTED, "unknown image format"};
  cl_image_desc desc{};
  desc.image_type = d.getType();
  desc.image_width = d.getWidth();
  desc.image_height = d.getHeight();
  desc.image_depth = d.getDepth();
  desc.image_array_size = d.getArraySize();
  MemObj* on_buffer = nullptr;  // its handle is read under the residency lock, below
  if (d.getBuffer() != 0) {
    GMUX_LOOKUP(b, mems_, d.getBuffer(), CL_INVALID_IMAGE_DESCRIPTOR, "mem");
    if (b->image) return {CL_INVALID_IMAGE_DESCRIPTOR, "an image buffer must be a buffer"};
    on_buffer = b;
  }
  cl_mem_flags flags = r.getFlags() & ~static_cast<cl_mem_flags>(
                                          CL_MEM_USE_HOST_PTR | CL_MEM_COPY_HOST_PTR |
                                          CL_MEM_ALLOC_HOST_PTR | kHostAccessFlags);
  std::shared_ptr<Bulk> init;
  if (r.getInitialData() != 0) {
    size_t region[3];
    proto::ImageFullRegion(desc.image_type, desc.image_width, desc.image_height, desc.image_depth,
                           desc.image_array_size, region);
    uint64_t bytes = 0;
    if (!proto::ImageHostBytes(desc.image_type, region, element_bytes, d.getRowPitch(),
                               d.getSlicePitch(), bytes)) {
      return {CL_INVALID_IMAGE_SIZE, "image size or pitches invalid"};
    }
    Err e = TakeBulk(r.getInitialData(), bytes, init);
    if (!e.ok()) return e;
    flags |= CL_MEM_COPY_HOST_PTR;
    desc.image_row_pitch = d.getRowPitch();
    desc.image_slice_pitch = d.getSlicePitch();
  }
  // The client sends the image's bytes up to the last element; a backend may read whole pitches
  // (the last row's and slice's padding too), so those are given to it, zeroed.
  std::vector<uint8_t> padded;
  const uint8_t* host = init ? init->bytes.data() : nullptr;
  if (init) {
    const bool one_row = desc.image_type == CL_MEM_OBJECT_IMAGE1D ||
                         desc.image_type == CL_MEM_OBJECT_IMAGE1D_BUFFER;
    const uint64_t rows =
        one_row || desc.image_type == CL_MEM_OBJECT_IMAGE1D_ARRAY ? 1 : desc.image_height;
    const uint64_t slices = desc.image_type == CL_MEM_OBJECT_IMAGE3D ? desc.image_depth
                            : (desc.image_type == CL_MEM_OBJECT_IMAGE1D_ARRAY ||
                               desc.image_type == CL_MEM_OBJECT_IMAGE2D_ARRAY)
                                ? desc.image_array_size
                                : 1;
    // A pitch that says nothing about the layout (the slice pitch of one slice, the row pitch of
    // one row) is dropped, so that a pitch far beyond the image cannot ask for padding of bytes
    // that were never sent. A dropped row pitch that was the default slice pitch is kept as one.
    if (slices <= 1) desc.image_slice_pitch = 0;
    if (rows <= 1) {
      if (slices > 1 && desc.image_slice_pitch == 0) desc.image_slice_pitch = desc.image_row_pitch;
      desc.image_row_pitch = 0;
    }
    const uint64_t rp = desc.image_row_pitch != 0 ? desc.image_row_pitch
                                                  : uint64_t{desc.image_width} * element_bytes;
    const uint64_t sp = desc.image_slice_pitch != 0 ? desc.image_slice_pitch : rp * rows;
    // ImageHostBytes bounded sp * (slices - 1) and rp * (rows - 1) by the bytes sent, so the
    // padded size is at most about twice those.
    const uint64_t full = sp * slices;
    if (full > init->bytes.size()) {
      try {
        padded.assign(full, 0);
      } catch (const std::bad_alloc&) {
        core_->bulk_bytes.fetch_sub(init->bytes.staged());
        return {CL_OUT_OF_HOST_MEMORY, "no host memory to pad the image's last row and slice"};
      }
      std::memcpy(padded.data(), init->bytes.data(), init->bytes.size());
      host = padded.data();
    }
  }
  // An image's device memory: its elements, tightly packed (a 1D image buffer's are its
  // buffer's, counted there).
  uint64_t image_bytes = 0;
  if (on_buffer == nullptr) {
    size_t full[3];
    proto::ImageFullRegion(desc.image_type, desc.image_width, desc.image_height, desc.image_depth,
                           desc.image_array_size, full);
    if (!proto::ImageHostBytes(desc.image_type, full, element_bytes, 0, 0, image_bytes)) {
      image_bytes = 0;  // the backend refuses it below
    }
  }
  std::shared_ptr<MemCharge> charge;
  if (Err e = ChargeMemory(ctx->devices, image_bytes, false, charge); !e.ok()) {
    if (init) core_->bulk_bytes.fetch_sub(init->bytes.staged());
    return e;
  }
  std::shared_ptr<void> private_booking;
  if (image_bytes != 0) {
    if (Err e = PrivateRoom(image_bytes, "an image", &private_booking); !e.ok()) {
      if (init) core_->bulk_bytes.fetch_sub(init->bytes.staged());
      return e;
    }
  }
  cl_int err = CL_SUCCESS;
  auto lock = residency_->Lock();
  if (on_buffer != nullptr) {
    if (err = residency_->UseLocked(on_buffer->alloc); err != CL_SUCCESS) {
      if (init) core_->bulk_bytes.fetch_sub(init->bytes.staged());
      return {err, "the image's buffer could not be brought back to the device"};
    }
    desc.buffer = on_buffer->mem->h;
  }
  cl_mem m = cl_.clCreateImage(ctx->ctx->h, flags, &format, &desc, const_cast<uint8_t*>(host), &err);
  if (init) core_->bulk_bytes.fetch_sub(init->bytes.staged());
  if (m == nullptr) return {err, "clCreateImage failed"};
  MemObj mo;
  mo.charge = std::move(charge);
  // An image on a buffer keeps the buffer's memory, released or not.
  mo.private_booking =
      on_buffer != nullptr ? on_buffer->private_booking : std::move(private_booking);
  mo.mem = Adopt(m);
  mo.image = true;
  mo.image_type = static_cast<uint32_t>(desc.image_type);
  mo.element_bytes = element_bytes;
  if (on_buffer == nullptr || on_buffer->alloc) {
    Residency::Allocation a;
    a.kind = on_buffer != nullptr ? Residency::Kind::kImageOnBuffer : Residency::Kind::kImage;
    a.mem = mo.mem;
    a.context = ctx->ctx;
    a.devices = ctx->devices;
    a.flags = flags & ~static_cast<cl_mem_flags>(CL_MEM_COPY_HOST_PTR);
    a.format = format;
    a.desc = desc;
    a.desc.image_row_pitch = 0;
    a.desc.image_slice_pitch = 0;
    a.desc.buffer = nullptr;
    a.bytes = image_bytes;
    if (on_buffer != nullptr) a.parent = on_buffer->alloc;
    mo.alloc = residency_->AddLocked(std::move(a));
  }
  mems_[r.getId()] = std::move(mo);
  return {};
}

Session::Err Session::EnqueueImage(uint64_t seq, wire::Enqueue::Reader r, Command& cmd,
                                   bool& replied) {
  auto image = [&](uint64_t id, MemObj*& out) -> Err {
    auto it = mems_.find(id);
    if (it == mems_.end()) return {CL_INVALID_MEM_OBJECT, "unknown mem id " + std::to_string(id)};
    if (!it->second.image) return {CL_INVALID_MEM_OBJECT, "mem " + std::to_string(id) + " is not an image"};
    out = &it->second;
    return {};
  };
  auto buffer = [&](uint64_t id, MemObj*& out) -> Err {
    auto it = mems_.find(id);
    if (it == mems_.end() || it->second.image) {
      return {CL_INVALID_MEM_OBJECT, "unknown buffer id " + std::to_string(id)};
    }
    out = &it->second;
    return {};
  };
  auto waits = [](const std::vector<cl_event>& w) {
    return std::pair<cl_uint, const cl_event*>(static_cast<cl_uint>(w.size()),
                                               w.empty() ? nullptr : w.data());
  };
  cmd.block.kind = core::BlockKind::kCopy;
  MemObj* img = nullptr;
  MemObj* buf = nullptr;
  switch (r.which()) {
    case wire::Enqueue::READ_IMAGE: {
      auto ri = r.getReadImage();
      if (seq == 0) return {CL_INVALID_VALUE, "a read needs a seq"};
      if (Err e = image(ri.getMem(), img); !e.ok()) return e;
      ImageRegion ir;
      size_t rp = ri.getRowPitch(), sp = ri.getSlicePitch();
      if (!DecodeImageRegion(ri.getOrigin(), ri.getRegion(), img->image_type, img->element_bytes,
                             rp, sp, ir)) {
        return {CL_INVALID_VALUE, "image region or pitches malformed"};
      }
      std::shared_ptr<HostBuffer> staging;
      const bool shm = ri.getShm();
      // Pitches may leave gaps the device never writes: zero them rather than send stale heap.
      if (Err e = StageRead(ir.host_bytes, shm, /*zero=*/rp != 0 || sp != 0, staging); !e.ok()) {
        return e;
      }
      cmd.run = [mem = img->mem, staging, ir, rp, sp, waits](cl_command_queue cq,
                                                             const std::vector<cl_event>& w,
                                                             cl_event* out) {
        auto [n, list] = waits(w);
        return Dispatch(cq).clEnqueueReadImage(cq, mem->h, CL_FALSE, ir.origin, ir.region, rp, sp,
                                               staging->data(), n, list, out);
      };
      cmd.finished = ReadFinished(core_, staging, seq, shm);
      cmd.block.bytes = ir.host_bytes;
      replied = true;
      return {};
    }
    case wire::Enqueue::WRITE_IMAGE: {
      auto wi = r.getWriteImage();
      if (Err e = image(wi.getMem(), img); !e.ok()) return e;
      ImageRegion ir;
      size_t rp = wi.getRowPitch(), sp = wi.getSlicePitch();
      if (!DecodeImageRegion(wi.getOrigin(), wi.getRegion(), img->image_type, img->element_bytes,
                             rp, sp, ir)) {
        return {CL_INVALID_VALUE, "image region or pitches malformed"};
      }
      std::shared_ptr<Bulk> data;
      if (Err e = TakeBulk(wi.getBulk(), ir.host_bytes, data); !e.ok()) return e;
      cmd.run = [mem = img->mem, data, ir, rp, sp, waits](cl_command_queue cq,
                                                          const std::vector<cl_event>& w,
                                                          cl_event* out) {
        auto [n, list] = waits(w);
        return Dispatch(cq).clEnqueueWriteImage(cq, mem->h, CL_FALSE, ir.origin, ir.region, rp, sp,
                                                data->bytes.data(), n, list, out);
      };
      cmd.finished = [core = core_, data, seq](cl_int status) {
        core->bulk_bytes.fetch_sub(data->bytes.staged());
        if (seq != 0) core->SendStatus(seq, status == CL_COMPLETE ? CL_SUCCESS : status, "");
      };
      cmd.block.bytes = ir.host_bytes;
      replied = seq != 0;
      return {};
    }
    case wire::Enqueue::COPY_IMAGE: {
      auto ci = r.getCopyImage();
      MemObj* dst = nullptr;
      if (Err e = image(ci.getSrc(), img); !e.ok()) return e;
      if (Err e = image(ci.getDst(), dst); !e.ok()) return e;
      std::array<size_t, 3> so{}, d_o{}, reg{};
      if (!Triple(ci.getSrcOrigin(), so.data()) || !Triple(ci.getDstOrigin(), d_o.data()) ||
          !Triple(ci.getRegion(), reg.data()) || !RegionEnds(so.data(), reg.data()) ||
          !RegionEnds(d_o.data(), reg.data())) {
        return {CL_INVALID_VALUE, "image region malformed"};
      }
      cmd.run = [s = img->mem, t = dst->mem, so, d_o, reg, waits](
                    cl_command_queue cq, const std::vector<cl_event>& w, cl_event* out) {
        auto [n, list] = waits(w);
        return Dispatch(cq).clEnqueueCopyImage(cq, s->h, t->h, so.data(), d_o.data(), reg.data(),
                                               n, list, out);
      };
      cmd.block.bytes = reg[0] * reg[1] * reg[2] * img->element_bytes;
      return {};
    }
    case wire::Enqueue::FILL_IMAGE: {
      auto fi = r.getFillImage();
      if (Err e = image(fi.getMem(), img); !e.ok()) return e;
      std::array<size_t, 3> org{}, reg{};
      std::array<uint8_t, 16> color{};
      if (fi.getColor().size() != color.size() || !Triple(fi.getOrigin(), org.data()) ||
          !Triple(fi.getRegion(), reg.data()) || !RegionEnds(org.data(), reg.data())) {
        return {CL_INVALID_VALUE, "fill color or region malformed"};
      }
      std::memcpy(color.data(), fi.getColor().begin(), color.size());
      cmd.run = [mem = img->mem, color, org, reg, waits](cl_command_queue cq,
                                                         const std::vector<cl_event>& w,
                                                         cl_event* out) {
        auto [n, list] = waits(w);
        return Dispatch(cq).clEnqueueFillImage(cq, mem->h, color.data(), org.data(), reg.data(),
                                               n, list, out);
      };
      cmd.block.bytes = reg[0] * reg[1] * reg[2] * img->element_bytes;
      return {};
    }
    case wire::Enqueue::COPY_IMAGE_TO_BUFFER:
    case wire::Enqueue::COPY_BUFFER_TO_IMAGE: {
      const bool to_buffer = r.isCopyImageToBuffer();
      auto cb = to_buffer ? r.getCopyImageToBuffer() : r.getCopyBufferToImage();
      if (Err e = image(cb.getImage(), img); !e.ok()) return e;
      if (Err e = buffer(cb.getBuffer(), buf); !e.ok()) return e;
      std::array<size_t, 3> org{}, reg{};
      if (!Triple(cb.getOrigin(), org.data()) || !Triple(cb.getRegion(), reg.data()) ||
          !RegionEnds(org.data(), reg.data())) {
        return {CL_INVALID_VALUE, "image region malformed"};
      }
      size_t off = cb.getOffset();
      cmd.run = [i = img->mem, b = buf->mem, org, reg, off, to_buffer, waits](
                    cl_command_queue cq, const std::vector<cl_event>& w, cl_event* out) {
        auto [n, list] = waits(w);
        const cl_icd_dispatch& dp = Dispatch(cq);
        return to_buffer ? dp.clEnqueueCopyImageToBuffer(cq, i->h, b->h, org.data(), reg.data(),
                                                         off, n, list, out)
                         : dp.clEnqueueCopyBufferToImage(cq, b->h, i->h, off, org.data(),
                                                         reg.data(), n, list, out);
      };
      cmd.block.bytes = reg[0] * reg[1] * reg[2] * img->element_bytes;
      return {};
    }
    default:
      return {CL_INVALID_OPERATION, "unknown command"};
  }
}

void Session::SubmitPending() {
  if (!to_submit_.empty()) sink_.Submit(std::move(to_submit_));
  to_submit_.clear();
}

Session::Err Session::Finish(uint64_t seq, uint64_t queue, bool& replied) {
  GMUX_LOOKUP(q, queues_, queue, CL_INVALID_COMMAND_QUEUE, "queue");
  // clFinish waits for every command of the queue enqueued so far. Rather than sending a marker
  // through the scheduler and the device, wait for their events: each completes after its
  // results (read data) were sent, so the answer still follows them on the wire.
  std::erase_if(q->outstanding, [](const auto& e) { return e->done(); });
  if (seq == 0) return {};
  if (q->outstanding.empty()) return {};
  struct State {
    std::atomic<size_t> left;
    std::atomic<bool> failed{false};
  };
  auto st = std::make_shared<State>();
  st->left = q->outstanding.size();
  replied = true;
  for (auto& e : q->outstanding) {
    e->AddWaiter([st, core = core_, seq](cl_int status) {
      if (status < 0) st->failed = true;
      if (st->left.fetch_sub(1) == 1) {
        // clFinish itself succeeds; failed commands report through their events.
        core->SendStatus(seq, CL_SUCCESS, "");
      }
    });
  }
  return {};
}

Session::Err Session::WaitEvents(uint64_t seq, capnp::List<uint64_t>::Reader ids, bool& replied,
                                 bool profiled) {
  if (ids.size() == 0) return {CL_INVALID_VALUE, "no events"};
  std::vector<std::shared_ptr<EventRecord>> evs;
  for (uint64_t id : ids) {
    auto it = events_.find(id);
    if (it == events_.end()) return {CL_INVALID_EVENT, "unknown event id " + std::to_string(id)};
    evs.push_back(it->second);
  }
  if (seq == 0) return {};
  struct State {
    std::atomic<size_t> left;
    std::atomic<bool> failed{false};
  };
  auto st = std::make_shared<State>();
  st->left = evs.size();
  replied = true;
  // The waiters hold the records weakly: the last one to run reads every event's times.
  std::shared_ptr<std::vector<std::weak_ptr<EventRecord>>> all;
  // A list whose times would not fit an info value is answered plainly (the client then asks).
  if (evs.size() > kMaxInfoBytes / proto::EventProfile::kWireBytes) profiled = false;
  if (profiled) {
    all = std::make_shared<std::vector<std::weak_ptr<EventRecord>>>(evs.begin(), evs.end());
  }
  for (auto& e : evs) {
    e->AddWaiter([st, core = core_, seq, all](cl_int status) {
      if (status < 0) st->failed = true;
      if (st->left.fetch_sub(1) != 1) return;
      if (st->failed || !all) {
        core->SendStatus(seq, st->failed ? CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST : CL_SUCCESS,
                         "");
        return;
      }
      // Each event's profiling times as a GetInfo of kProfilingAllParam answers them (the
      // backend's calls are not blocking: allowed in a completion callback).
      std::vector<uint8_t> info;
      info.reserve(all->size() * proto::EventProfile::kWireBytes);
      for (const auto& w : *all) {
        proto::EventProfile p;
        if (auto rec = w.lock(); rec && ProfilingReady(*rec)) {
          p = ProfileOf(*rec);
        }
        const std::vector<uint8_t> one = p.Encode();
        info.insert(info.end(), one.begin(), one.end());
      }
      capnp::MallocMessageBuilder b;
      auto r = b.initRoot<wire::Reply>();
      r.setSeq(seq);
      r.setStatus(CL_SUCCESS);
      r.setInfo(kj::arrayPtr(info.data(), info.size()));
      core->Send(b);
    });
  }
  return {};
}

void BuildHelloReply(capnp::MessageBuilder& b, const Backend& backend, const std::string& tenant,
                     uint64_t session, uint64_t pool_mask, bool remote_copy) {
  auto rep = b.initRoot<wire::Reply>();
  rep.setSeq(1);
  rep.setStatus(CL_SUCCESS);
  auto h = rep.initHello();
  h.setProtocolVersion(proto::kProtocolVersion);
  h.setTenant(tenant);
  h.setSession(session);
  h.setRemoteCopy(remote_copy);
  h.setBufferStorage(true);
  h.setStorageArenas(true);
  h.setDataFrames(true);
  h.setReplyRing(true);
  h.setProfiledWaits(true);
  h.setRequestRing(true);
  const auto& devs = backend.devices();
  // The pool's devices are one device to a tenant: the lowest of them (docs/operations.md).
  std::vector<unsigned> shown;
  for (unsigned i = 0; i < devs.size(); ++i) {
    if (PoolHidden(pool_mask, i)) continue;
    shown.push_back(i);
  }
  auto list = h.initDevices(static_cast<unsigned>(shown.size()));
  for (unsigned k = 0; k < shown.size(); ++k) {
    const unsigned i = shown[k];
    list[k].setIndex(i);
    list[k].setName(backend.DeviceName(i));
    cl_device_type type = 0;
    backend.cl().clGetDeviceInfo(devs[i], CL_DEVICE_TYPE, sizeof(type), &type, nullptr);
    list[k].setType(type);
  }
}

}  // namespace gmux::daemon
