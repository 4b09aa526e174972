// libFuzzer target: a worker's request handling (daemon::Session) on untrusted requests, against
// the real backend (Backend::Open with its defaults: PoCL's CPU device through
// /etc/OpenCL/vendors) and the real worker queue and executors. Per input, as gmux-worker serves
// one client after its hello: a SessionCore on one end of a socket pair (the hello reply is sent
// first, as the worker does), a WorkerQueue whose control channel leads to a stand-in broker in
// this process, and a Session serving the requests the input holds until the client closes.
//
// Input format (session_input.h): a sequence of frames, each a little-endian u32 word W and then
// W & 0xFFFFFF bytes of a Request's Cap'n Proto payload (flat encoding, no frame header). The
// harness adds a valid frame header (zero-padding the payload to whole words). W >> 24 are
// flags: pass a memfd with the frame (bit 0), sealed against shrinking (bit 1), or the previous
// frame's memfd again (bit 2), of (W >> 27) 4 KiB pages; without a memfd, bit 3 sends a BulkData
// request as a data frame instead (proto/frame.h). So the fuzzer mutates requests' fields
// without breaking the framing of the rest; the frame decoder itself is frame_fuzz's target. A
// payload DecodePayload rejects is left out (it would only end the session, as frame_fuzz shows).
//
// The client side plays an ICD: requests are sent in order, and after one with a seq the client
// waits for its answer (at most kReplyWait, 100 ms; after one answer that does not come, e.g. a
// Finish behind a user event never set, it stops waiting), so commands run before the next
// request, as with a real application. Every reply must decode as a Reply. After the last
// request it closes its write side; once Serve() returned and the released commands completed,
// everything is torn down, and no backend object may be left (LiveBackendObjects() == 0) and no
// memory leaked.
//
// Tenant code and resources. Kernels run in the worker's address space, so the harness runs
// only known code, rewriting what the input asks for before it is sent (the session then sees
// ordinary requests):
//  - program sources and binaries are replaced by the fixed kernels of session_input.h (built
//    once at start-up for binaries), each memory-safe for any argument and launch shape;
//  - build/compile/link options and embedded header names outside fixed lists are replaced;
//  - kernel arguments of the two kinds PoCL would take for object addresses (a pointer-sized
//    value; a sampler for a pointer argument) are changed, see session_input.h: a tenant can
//    crash its own worker with them, which this target does not look for again;
//  - buffers are capped at kMaxBufferBytes and image dimensions at kMaxImageDim (tenants'
//    memory is bounded by their [limits] and the OS, not by the session);
//  - the stand-in broker never releases a kernel launch of more than kMaxWorkItems work-items
//    (gmuxd's watchdog bounds a tenant's device time; here the launch simply never runs);
//  - an input's first kMaxBuilds builds, compiles and links are sent, and its first
//    kMaxLaunches kernel launches released (PoCL compiles for each: this bounds an input's time).
// Everything else reaches the session as the input says: ids, sizes, offsets, regions, pitches,
// wait lists, argument kinds and values, flags, bulk transfers, shared memory.
//
// The stand-in broker releases every other Ready at once, a splittable launch in two chunks (so
// split execution runs too), answers Stats queries, and checks the worker's control messages as
// gmuxd's scheduler does (a worker gmuxd would drop for a malformed message is a bug).
//
// PoCL and LLVM keep allocations for the process's lifetime (.ci/lsan.supp); the same
// suppressions are built in below. Seeds: fuzz/corpus/session/ (session_corpus_gen).
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <kj/exception.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "daemon/backend.h"
#include "daemon/cl_ref.h"
#include "daemon/control.h"
#include "daemon/session.h"
#include "daemon/worker_queue.h"
#include "proto/frame.h"
#include "session_input.h"

extern "C" const char* __lsan_default_suppressions() {
  // As .ci/lsan.supp: PoCL's and LLVM's allocations that live until exit.
  return "leak:libpocl.so\nleak:libLLVM-15.so\n";
}

namespace {

using namespace gmux;
using namespace gmux::daemon;
namespace wire = gmux::proto::wire;
namespace in = gmux::fuzz::session;

constexpr uint64_t kMaxBufferBytes = 1 << 20;
constexpr uint64_t kMaxImageDim = 64;
constexpr uint64_t kMaxWorkItems = 1 << 16;
// PoCL compiles for every build, compile and link (and for every new launch shape of a kernel):
// about 0.1 to 2 s each. Per input at most this many are sent or released, so that an input
// stays well inside the CI's per-input time limit (25 s) even with a cold kernel cache.
constexpr int kMaxBuilds = 6;
constexpr int kMaxLaunches = 16;
constexpr uint64_t kMaxBulkBytes = 16 << 20;  // the session's staging limit
constexpr auto kReplyWait = std::chrono::milliseconds(100);
constexpr auto kDrainLimit = std::chrono::seconds(5);

[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "session_fuzz: %s\n", what);
  std::abort();
}

Backend* g_backend = nullptr;
// GMUX_SESSION_FUZZ_VERBOSE=1: print every request as sent, every reply and the input's timing.
bool g_verbose = false;
std::vector<std::string> g_binaries;  // device 0's binary of each source that builds alone

// ---- rewriting what the input asks for (see the top of the file) ----

bool FixText(capnp::Text::Builder t, const std::string_view* table, size_t n,
             const std::function<void(std::string_view)>& set) {
  std::string_view s(t.begin(), t.size());
  size_t i = s.empty() ? 0 : static_cast<uint8_t>(s[0]) % n;
  for (size_t j = 0; j < n; ++j) {
    if (table[j] == s) return false;
  }
  set(table[i]);
  return true;
}

// Applies the rewrites to `req`; true when anything changed.
bool Rewrite(wire::Request::Builder req) {
  auto text = [](std::string_view v) { return capnp::Text::Reader(v.data(), v.size()); };
  bool changed = false;
  auto options = [&](capnp::Text::Builder t, auto set) {
    changed |= FixText(t, in::kOptions, in::kNumOptions,
                       [&](std::string_view v) { set(text(v)); });
  };
  switch (req.which()) {
    case wire::Request::CREATE_PROGRAM_WITH_SOURCE: {
      auto p = req.getCreateProgramWithSource();
      changed |= FixText(p.getSource(), in::kSources, in::kNumSources,
                         [&](std::string_view v) { p.setSource(text(v)); });
      break;
    }
    case wire::Request::CREATE_PROGRAM_WITH_BINARY: {
      auto bins = req.getCreateProgramWithBinary().getBinaries();
      for (unsigned i = 0; i < bins.size(); ++i) {
        auto b = bins[i];
        std::string_view have(reinterpret_cast<const char*>(b.begin()), b.size());
        bool known = false;
        for (const auto& k : g_binaries) known |= k == have;
        if (known) continue;
        const std::string& k = g_binaries[have.empty() ? 0 : static_cast<uint8_t>(have[0]) %
                                                                  g_binaries.size()];
        bins.set(i, capnp::Data::Reader(reinterpret_cast<const kj::byte*>(k.data()), k.size()));
        changed = true;
      }
      break;
    }
    case wire::Request::BUILD_PROGRAM: {
      auto b = req.getBuildProgram();
      options(b.getOptions(), [&](capnp::Text::Reader v) { b.setOptions(v); });
      break;
    }
    case wire::Request::COMPILE_PROGRAM: {
      auto c = req.getCompileProgram();
      options(c.getOptions(), [&](capnp::Text::Reader v) { c.setOptions(v); });
      auto names = c.getHeaderNames();
      for (unsigned i = 0; i < names.size(); ++i) {
        changed |= FixText(names[i], in::kHeaderNames, in::kNumHeaderNames,
                           [&](std::string_view v) { names.set(i, text(v)); });
      }
      break;
    }
    case wire::Request::LINK_PROGRAM: {
      auto l = req.getLinkProgram();
      options(l.getOptions(), [&](capnp::Text::Reader v) { l.setOptions(v); });
      break;
    }
    case wire::Request::CREATE_BUFFER: {
      auto b = req.getCreateBuffer();
      if (b.getSize() > kMaxBufferBytes) {
        b.setSize(kMaxBufferBytes);
        changed = true;
      }
      break;
    }
    case wire::Request::ENQUEUE: {
      if (!req.getEnqueue().isNdrange()) break;
      auto args = req.getEnqueue().getNdrange().getArgs();
      for (unsigned i = 0; i < args.size(); ++i) {
        auto a = args[i];
        if (a.isValue() && a.getValue().size() == sizeof(void*)) {
          // PoCL reads a pointer-sized value given to a pointer or sampler argument as the
          // address of an object (session_input.h); the fixed kernels take no such values.
          std::vector<kj::byte> cut(a.getValue().begin(), a.getValue().begin() + 4);
          a.setValue(kj::arrayPtr(cut.data(), cut.size()));
          changed = true;
        } else if (a.isSampler() && i == in::kPointerArg) {
          // PoCL takes a sampler given to a pointer argument for a buffer (and asserts).
          a.setNullMem();
          changed = true;
        }
      }
      break;
    }
    case wire::Request::CREATE_IMAGE: {
      auto d = req.getCreateImage().getDesc();
      auto cap = [&](uint64_t v, auto set) {
        if (v > kMaxImageDim) {
          set(kMaxImageDim);
          changed = true;
        }
      };
      cap(d.getWidth(), [&](uint64_t v) { d.setWidth(v); });
      cap(d.getHeight(), [&](uint64_t v) { d.setHeight(v); });
      cap(d.getDepth(), [&](uint64_t v) { d.setDepth(v); });
      cap(d.getArraySize(), [&](uint64_t v) { d.setArraySize(v); });
      break;
    }
    default:
      break;
  }
  return changed;
}

bool MayRewrite(wire::Request::Which w) {
  switch (w) {
    case wire::Request::CREATE_PROGRAM_WITH_SOURCE:
    case wire::Request::CREATE_PROGRAM_WITH_BINARY:
    case wire::Request::BUILD_PROGRAM:
    case wire::Request::COMPILE_PROGRAM:
    case wire::Request::LINK_PROGRAM:
    case wire::Request::CREATE_BUFFER:
    case wire::Request::CREATE_IMAGE:
    case wire::Request::ENQUEUE:
      return true;
    default:
      return false;
  }
}

struct Frame {
  std::vector<uint8_t> bytes;  // header + payload
  uint64_t seq = 0;
  uint8_t flags = 0;
};

// A BulkData request as the data frame carrying the same chunk (proto/frame.h).
std::vector<uint8_t> DataFrameOf(wire::BulkData::Reader d) {
  const auto data = d.getData();
  const size_t padded = (data.size() + 7) / 8 * 8;
  std::vector<uint8_t> out(proto::kHeaderBytes + proto::kDataPrefixBytes + padded, 0);
  proto::EncodeHeader({proto::kProtocolVersion, proto::FrameKind::kData,
                       static_cast<uint32_t>(proto::kDataPrefixBytes + padded)},
                      out.data());
  uint8_t* p = out.data() + proto::kHeaderBytes;
  const uint64_t token = d.getToken(), offset = d.getOffset();
  const uint32_t length = static_cast<uint32_t>(data.size()), flags = 0;
  std::memcpy(p, &token, 8);  // little-endian hosts, as the frame's fields
  std::memcpy(p + 8, &offset, 8);
  std::memcpy(p + 16, &length, 4);
  std::memcpy(p + 20, &flags, 4);
  if (data.size() != 0) std::memcpy(p + proto::kDataPrefixBytes, data.begin(), data.size());
  return out;
}

// Splits the input into frames (see the top of the file).
std::vector<Frame> Frames(const uint8_t* data, size_t size) {
  std::vector<Frame> out;
  const proto::FrameLimits limits;
  int builds = 0;
  size_t at = 0;
  while (at + 4 <= size) {
    uint32_t w;
    std::memcpy(&w, data + at, 4);
    at += 4;
    size_t len = std::min<size_t>(w & in::kLengthMask, size - at);
    Frame f;
    f.flags = static_cast<uint8_t>(w >> in::kFlagsShift);
    kj::Array<capnp::word> words = kj::heapArray<capnp::word>((len + 7) / 8);
    std::memset(words.begin(), 0, words.size() * sizeof(capnp::word));
    std::memcpy(words.begin(), data + at, len);
    at += len;
    auto msg = proto::DecodePayload(std::move(words), proto::FrameKind::kRequest, limits);
    if (!msg.ok()) continue;
    std::optional<std::vector<uint8_t>> rewritten;
    bool skip = false;
    // Reading may throw (a Text without its NUL): the session meets the same request and ends.
    auto ignored = kj::runCatchingExceptions([&]() {
      auto req = msg->root<wire::Request>();
      f.seq = req.getSeq();
      if (req.isBulkData() && (f.flags & in::kPassMemfd) == 0 &&
          (f.flags & in::kAsDataFrame) != 0) {
        rewritten = DataFrameOf(req.getBulkData());
        f.seq = 0;
        return;
      }
      if (req.isBuildProgram() || req.isCompileProgram() || req.isLinkProgram()) {
        skip = ++builds > kMaxBuilds;
      }
      if (skip || !MayRewrite(req.which())) return;
      capnp::MallocMessageBuilder b;
      b.setRoot(req);
      if (!Rewrite(b.getRoot<wire::Request>())) return;
      auto bytes = proto::EncodeFrame(proto::FrameKind::kRequest, b, limits);
      if (bytes.ok()) rewritten = std::move(*bytes);
    });
    (void)ignored;
    if (skip) continue;
    if (rewritten) {
      f.bytes = std::move(*rewritten);
    } else {
      size_t padded = (len + 7) / 8 * 8;
      f.bytes.resize(proto::kHeaderBytes + padded, 0);
      proto::EncodeHeader({proto::kProtocolVersion, proto::FrameKind::kRequest,
                           static_cast<uint32_t>(padded)},
                          f.bytes.data());
      std::memcpy(f.bytes.data() + proto::kHeaderBytes, data + at - len, len);
    }
    if (g_verbose) {
      auto m = proto::DecodeFrame(f.bytes, proto::FrameKind::kRequest, limits);
      if (!m.ok()) {
        std::fprintf(stderr, "data frame of %zu bytes\n", f.bytes.size());
        out.push_back(std::move(f));
        continue;
      }
      auto thrown = kj::runCatchingExceptions([&]() {
        std::fprintf(stderr, "request (flags %#x): %s\n", f.flags,
                     kj::str(m->root<wire::Request>()).cStr());
      });
      if (thrown != nullptr) std::fprintf(stderr, "request that cannot be read\n");
    }
    out.push_back(std::move(f));
  }
  return out;
}

// ---- the stand-in broker ----

class Broker {
 public:
  explicit Broker(int fd, size_t devices) : fd_(fd), devices_(devices) {
    thread_ = std::thread([this] { Loop(); });
  }
  // Returns once the worker closed its end.
  void Join() { thread_.join(); }
  // Released dispatches whose Done has not come.
  uint64_t InFlight() const { return inflight_.load(); }

 private:
  void Loop() {
    for (;;) {
      auto m = ctl::Receive(fd_);
      if (!m.ok()) {
        if (m.status().code() == StatusCode::kUnavailable) return;  // the worker closed
        Fail("malformed control message from the worker");
      }
      if (m->fd >= 0) Fail("the worker passed a descriptor");
      switch (m->type) {
        case ctl::Type::kReady: OnReady(m->As<ctl::Ready>(), m->body.size()); break;
        case ctl::Type::kDone: OnDone(m->As<ctl::Done>(), m->body.size()); break;
        case ctl::Type::kStatsQuery: {
          auto q = m->As<ctl::StatsQuery>();
          if (q.size() != 1) Fail("malformed stats query");
          const std::string text = "{\"devices\":[]}";
          std::vector<uint8_t> body(sizeof(uint64_t) + text.size());
          std::memcpy(body.data(), &q[0].seq, sizeof(uint64_t));
          std::memcpy(body.data() + sizeof(uint64_t), text.data(), text.size());
          ctl::Send(fd_, ctl::Type::kStatsReply, body.data(), 1, body.size()).IgnoreError();
          break;
        }
        case ctl::Type::kMemReserve:
          // Everything is granted; the worker must ask for something, on a device it has.
          for (const ctl::MemReserve& r : m->As<ctl::MemReserve>()) {
            if (r.device >= devices_ || r.bytes == 0) Fail("a memory reservation gmuxd would drop");
            mem_held_[r.device] += r.bytes;
            ctl::MemAnswer a{r.seq, r.bytes, static_cast<uint32_t>(ctl::MemVerdict::kGranted),
                             r.device, mem_held_[r.device], 0};
            ctl::Send(fd_, ctl::Type::kMemAnswer, &a, sizeof(a), 1).IgnoreError();
          }
          break;
        case ctl::Type::kMemFree:
          for (const ctl::MemFree& f : m->As<ctl::MemFree>()) {
            if (f.device >= devices_ || f.bytes > mem_held_[f.device]) {
              Fail("the worker gave back device memory it does not hold");
            }
            mem_held_[f.device] -= f.bytes;
          }
          break;
        default:
          Fail("unexpected control message type from the worker");
      }
    }
  }

  void OnReady(const std::vector<ctl::Ready>& ready, size_t body) {
    if (ready.empty() && body != 0) Fail("malformed Ready");
    std::vector<ctl::Release> out;
    for (const ctl::Ready& r : ready) {
      // As Scheduler::OnReady checks them.
      const bool kernel = r.kind == static_cast<uint8_t>(core::BlockKind::kKernel);
      const bool split = r.splittable == static_cast<uint8_t>(core::Splittable::kYes);
      if (r.device >= devices_ || r.kind > static_cast<uint8_t>(core::BlockKind::kMarker) ||
          r.splittable > 1 ||
          (split && (!kernel || r.work_groups == 0 || r.work_items % r.work_groups != 0)) ||
          !seen_.insert(r.cmd).second) {
        Fail("a Ready the scheduler would drop the worker for");
      }
      if (kernel && (r.work_items > kMaxWorkItems || ++launches_ > kMaxLaunches)) {
        continue;  // never released
      }
      if (split && r.work_groups >= 2) {
        const uint64_t granule = r.work_items / r.work_groups;
        const uint64_t half = r.work_groups / 2 * granule;
        if (g_verbose) {
          std::fprintf(stderr, "broker: launch of %llu work-items released in two chunks\n",
                       static_cast<unsigned long long>(r.work_items));
        }
        out.push_back({r.cmd, 0, half, /*last=*/0, /*whole=*/0});
        out.push_back({r.cmd, half, r.work_items, 1, 0});
        released_[r.cmd] = 2;
        inflight_ += 2;
      } else {
        out.push_back({r.cmd, 0, r.work_items, 1, 1});
        released_[r.cmd] = 1;
        inflight_ += 1;
      }
    }
    if (!out.empty()) ctl::SendRecords(fd_, ctl::Type::kRelease, out).IgnoreError();
  }

  void OnDone(const std::vector<ctl::Done>& done, size_t body) {
    if (done.empty() && body != 0) Fail("malformed Done");
    for (const ctl::Done& d : done) {
      auto it = released_.find(d.cmd);
      if (it == released_.end() || it->second == 0) Fail("Done for a dispatch never released");
      --it->second;
      --inflight_;
    }
  }

  const int fd_;
  const size_t devices_;
  std::thread thread_;
  std::set<uint64_t> seen_;
  std::map<uint32_t, uint64_t> mem_held_;  // device memory granted, by device
  std::unordered_map<uint64_t, int> released_;  // dispatches not yet done, by command
  std::atomic<uint64_t> inflight_{0};
  int launches_ = 0;
};

// ---- the client ----

class Client {
 public:
  explicit Client(int fd) : fd_(fd) {
    reader_ = std::thread([this] { Read(); });
  }

  // Sends every frame, waiting for the answers to those with a seq; then closes its write side.
  void Send(const std::vector<Frame>& frames) {
    int memfd = -1;
    std::vector<int> memfds;
    bool waiting = true;
    for (const Frame& f : frames) {
      int pass = -1;
      if (f.flags & in::kPassMemfd) {
        if ((f.flags & in::kReuseMemfd) && memfd >= 0) {
          pass = memfd;
        } else {
          pass = ::memfd_create("session_fuzz", MFD_CLOEXEC | MFD_ALLOW_SEALING);
          if (pass < 0) Fail("memfd_create failed");
          size_t pages = f.flags >> in::kMemfdPagesShift;
          if (::ftruncate(pass, static_cast<off_t>(pages * in::kMemfdPageBytes)) != 0) {
            Fail("ftruncate failed");
          }
          if ((f.flags & in::kSealMemfd) && ::fcntl(pass, F_ADD_SEALS, F_SEAL_SHRINK) != 0) {
            Fail("sealing failed");
          }
          memfds.push_back(pass);
          memfd = pass;
        }
      }
      if (!Write(f.bytes, pass)) break;  // the session ended
      if (f.seq != 0 && waiting) waiting = WaitFor(f.seq);
    }
    ::shutdown(fd_, SHUT_WR);
    for (int m : memfds) ::close(m);
  }

  void Join() { reader_.join(); }

 private:
  bool Write(const std::vector<uint8_t>& bytes, int pass) {
    size_t at = 0;
    while (at < bytes.size()) {
      iovec iov{const_cast<uint8_t*>(bytes.data()) + at, bytes.size() - at};
      msghdr msg{};
      msg.msg_iov = &iov;
      msg.msg_iovlen = 1;
      alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
      if (pass >= 0 && at == 0) {
        msg.msg_control = control;
        msg.msg_controllen = sizeof(control);
        cmsghdr* c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        std::memcpy(CMSG_DATA(c), &pass, sizeof(int));
      }
      ssize_t n = ::sendmsg(fd_, &msg, MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) continue;
        return false;
      }
      at += static_cast<size_t>(n);
    }
    return true;
  }

  // Whether the answer to `seq` came in time (or the session ended).
  bool WaitFor(uint64_t seq) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, kReplyWait, [&] { return eof_ || answered_.count(seq) != 0; });
  }

  // Reads replies until the session closes; each must decode. A frame cut short by the close
  // (the session's writer stopped mid-frame) is not an error.
  void Read() {
    const proto::FrameLimits limits;
    std::vector<uint8_t> buf;
    uint8_t chunk[64 << 10];
    for (;;) {
      ssize_t n = ::recv(fd_, chunk, sizeof(chunk), 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      buf.insert(buf.end(), chunk, chunk + n);
      size_t at = 0;
      while (buf.size() - at >= proto::kHeaderBytes) {
        auto h = proto::DecodeHeader({buf.data() + at, proto::kHeaderBytes}, limits);
        if (!h.ok() || h->kind != proto::FrameKind::kReply) Fail("bad reply header");
        const size_t total = proto::kHeaderBytes + h->payload_bytes;
        if (buf.size() - at < total) break;
        auto m = proto::DecodeFrame({buf.data() + at, total}, proto::FrameKind::kReply, limits);
        if (!m.ok()) Fail("a reply that does not decode");
        uint64_t seq = 0;
        bool answer = false;
        auto thrown = kj::runCatchingExceptions([&]() {
          auto r = m->root<wire::Reply>();
          seq = r.getSeq();
          answer = !r.isReadData() || r.getReadData().getLast();
          (void)r.getMessage().size();
          if (g_verbose) {
            std::fprintf(stderr, "reply seq %llu status %d %s%s\n",
                         static_cast<unsigned long long>(seq), r.getStatus(),
                         r.isReadData() ? "(read data) " : "", r.getMessage().cStr());
          }
        });
        if (thrown != nullptr) Fail("a reply that cannot be read");
        if (seq != 0 && answer) {
          std::lock_guard<std::mutex> lock(mu_);
          answered_.insert(seq);
          cv_.notify_all();
        }
        at += total;
      }
      buf.erase(buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(at));
    }
    std::lock_guard<std::mutex> lock(mu_);
    eof_ = true;
    cv_.notify_all();
  }

  const int fd_;
  std::thread reader_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::set<uint64_t> answered_;
  bool eof_ = false;
};

// Builds each source that builds alone and keeps device 0's binary (for binary programs).
void BuildBinaries(const Backend& b) {
  const cl_icd_dispatch& cl = b.cl();
  cl_device_id dev = b.devices()[0];
  cl_context_properties props[] = {CL_CONTEXT_PLATFORM,
                                   reinterpret_cast<cl_context_properties>(b.platform()), 0};
  cl_int err = CL_SUCCESS;
  cl_context ctx = cl.clCreateContext(props, 1, &dev, nullptr, nullptr, &err);
  if (ctx == nullptr) Fail("clCreateContext failed");
  for (std::string_view s : in::kSources) {
    const char* src = s.data();
    size_t len = s.size();
    cl_program p = cl.clCreateProgramWithSource(ctx, 1, &src, &len, &err);
    if (p == nullptr) Fail("clCreateProgramWithSource failed");
    if (cl.clBuildProgram(p, 1, &dev, "", nullptr, nullptr) == CL_SUCCESS) {
      size_t n = 0;
      cl.clGetProgramInfo(p, CL_PROGRAM_BINARY_SIZES, sizeof(n), &n, nullptr);
      std::string bin(n, '\0');
      unsigned char* ptr = reinterpret_cast<unsigned char*>(bin.data());
      if (n > 0 && cl.clGetProgramInfo(p, CL_PROGRAM_BINARIES, sizeof(ptr), &ptr, nullptr) ==
                       CL_SUCCESS) {
        g_binaries.push_back(std::move(bin));
      }
    }
    cl.clReleaseProgram(p);
  }
  cl.clReleaseContext(ctx);
  if (g_binaries.empty()) Fail("no kernel source built");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  ::signal(SIGPIPE, SIG_IGN);
  const char* verbose = std::getenv("GMUX_SESSION_FUZZ_VERBOSE");
  g_verbose = verbose != nullptr && verbose[0] == '1';
  struct sigaction before[NSIG] = {};
  for (int sig = 1; sig < NSIG; ++sig) ::sigaction(sig, nullptr, &before[sig]);
  auto backend = Backend::Open(BackendOptions{});
  if (!backend.ok()) {
    std::fprintf(stderr, "session_fuzz: %s\n", backend.status().ToString().c_str());
    std::exit(1);
  }
  g_backend = backend->release();  // lives as long as the process (as in gmux-worker)
  BuildBinaries(*g_backend);
  // LLVM (PoCL's compiler) installed its crash handler for SIGABRT, SIGSEGV, SIGINT and more;
  // libFuzzer leaves a signal that has a handler alone, so a PoCL assertion would end the process
  // with no crash input written. Those signals get back what they had before (the sanitizers'
  // or none, then libFuzzer's own); PoCL's own handlers (SIGFPE for kernels) stay.
  struct sigaction llvm = {};
  ::sigaction(SIGABRT, nullptr, &llvm);
  if (llvm.sa_handler != before[SIGABRT].sa_handler) {
    for (int sig = 1; sig < NSIG; ++sig) {
      struct sigaction now = {};
      if (::sigaction(sig, nullptr, &now) == 0 && now.sa_handler == llvm.sa_handler) {
        ::sigaction(sig, &before[sig], nullptr);
      }
    }
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<Frame> frames = Frames(data, size);
  const size_t devices = g_backend->devices().size();

  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) Fail("socketpair failed");
  int ctl_fds[2];
  if (!ctl::Pair(ctl_fds).ok()) Fail("ctl::Pair failed");

  auto core = std::make_shared<SessionCore>();
  core->fd = fds[0];
  core->id = 1;
  core->tenant = 1;
  core->tenant_name = "fuzz";
  {
    capnp::MallocMessageBuilder b;
    BuildHelloReply(b, *g_backend, core->tenant_name, core->id);
    core->Send(b);
  }
  SessionLimits limits;
  limits.max_bulk_bytes = kMaxBulkBytes;

  Broker broker(ctl_fds[0], devices);
  auto queue = std::make_unique<WorkerQueue>(ctl_fds[1], devices, nullptr);
  queue->Start();
  auto session = std::make_unique<Session>(core, *g_backend, *queue, limits);
  Client client(fds[1]);
  std::thread sender([&] { client.Send(frames); });

  Status served = session->Serve();
  const auto served_at = std::chrono::steady_clock::now();

  // Let what was released finish (its results still reach the client): nothing else can start
  // now, as only the client's requests set user events.
  const auto deadline = std::chrono::steady_clock::now() + kDrainLimit;
  uint64_t last = UINT64_MAX;
  int stable = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    const uint64_t outstanding = queue->Outstanding();
    stable = broker.InFlight() == 0 && outstanding == last ? stable + 1 : 0;
    if (stable >= 3) break;
    last = outstanding;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }

  session.reset();
  queue.reset();
  ::close(ctl_fds[1]);
  broker.Join();
  ::close(ctl_fds[0]);
  core->Close();  // wakes a sender blocked on a session that stopped reading
  sender.join();
  if (core.use_count() != 1) Fail("the session's core outlived its session and queue");
  core.reset();
  client.Join();
  ::close(fds[1]);
  if (LiveBackendObjects() != 0) Fail("backend objects left after the session ended");
  if (g_verbose) {
    auto ms = [](auto d) {
      return static_cast<long long>(
          std::chrono::duration_cast<std::chrono::milliseconds>(d).count());
    };
    std::fprintf(stderr,
                 "input: %zu bytes, %zu frames, served %lld ms (%s), torn down %lld ms later\n",
                 size, frames.size(), ms(served_at - start), served.ToString().c_str(),
                 ms(std::chrono::steady_clock::now() - served_at));
  }
  return 0;
}
