// libgmux-frame.so: vGASA's frame agent (Zhang et al., Section 3.2) for unmodified GL programs.
//
//   LD_PRELOAD=libgmux-frame.so glxgears
//
// It interposes the frame boundary: glXSwapBuffers and eglSwapBuffers, and the lookups that hand
// them out (glXGetProcAddress, glXGetProcAddressARB, eglGetProcAddress), so programs that fetch
// the swap through a pointer are covered too. At every swap it
//   1. measures the frame's CPU time (the previous Present's return to this swap call);
//   2. when gmuxd controls this program: flushes the GL commands (glFlush, so the device works
//      while the CPU sleeps), sends the CPU time and gets the sleep gmuxd's PI controller
//      decided (Eq. 1 with the command F of Eqs. 3-8), and sleeps that long;
//   3. calls the real swap (Present) and measures its execution time (the "GPU time" the
//      controller predicts the next frame's from; GMUX_FRAME_FINISH=1 adds a glFinish for drivers
//      whose swap returns before the frame is drawn);
//   4. reports the frame: every frame when controlled (with the next frame's request), batched
//      every 25 ms otherwise, one-way, so an uncontrolled program never waits for gmuxd.
// gmuxd tells the agent, unasked, when it comes under control or leaves it.
//
// Connection: like the OpenCL ICD, to GMUX_SOCKET or /run/gmux/gmuxd.sock; the program's uid
// picks its tenant. The connection is made by a short-lived thread, so a swap never waits for
// it; no daemon (or a daemon that goes away) leaves the program running as if the agent were not
// loaded, and a new attempt follows every 2 s. Other variables: GMUX_FRAME=0 turns the agent
// off; GMUX_FRAME_LOG=FILE appends one line per frame (end time, CPU, sleep, Present, in
// seconds and milliseconds, and the reference FPS in force, 0 when uncontrolled) for the
// program's own view of its frame rate; GMUX_FRAME_VERBOSE=1
// reports connection changes on stderr. A forked child starts with no connection of its own.
// The wire schema before the X11 headers, whose macros (Status, Success, None, Bool) would
// rename its identifiers.
#include "proto/frame.h"
// clang-format off
#include <EGL/egl.h>
#include <GL/glx.h>
// clang-format on
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace wire = gmux::proto::wire;

constexpr int64_t kBatchNs = 25'000'000;        // uncontrolled: report at most every 25 ms
constexpr int64_t kPollNs = 2'000'000;          // uncontrolled: look for gmuxd's word every 2 ms
constexpr int64_t kRetryNs = 2'000'000'000;     // a new connection attempt after 2 s
constexpr int kDecisionTimeoutMs = 250;         // a decision later than this: run uncontrolled
constexpr uint64_t kMaxSleepNs = 1'000'000'000;  // never sleep more than 1 s per frame
constexpr int64_t kUnansweredBackoffNs = 1'000'000'000;  // uncontrolled this long after a timeout

int64_t NowNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

int64_t ProcessCpuNs() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// The dynamic linker's dlsym, which this library interposes (see dlsym below).
using DlsymFn = void* (*)(void*, const char*);
DlsymFn RealDlsym() {
  static DlsymFn real = [] {
    void* f = ::dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (f == nullptr) f = ::dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    return reinterpret_cast<DlsymFn>(f);
  }();
  return real;
}

// The real swap functions, when a program fetched them with dlsym from a library it opened
// privately (glmark2 does): the handle they came from is the only place they are found.
std::atomic<void*> g_glx_swap_seen{nullptr};
std::atomic<void*> g_egl_swap_seen{nullptr};
std::atomic<void*> g_glx_gpa_seen{nullptr};
std::atomic<void*> g_glx_gpa_arb_seen{nullptr};
std::atomic<void*> g_egl_gpa_seen{nullptr};

// The first definition of `name` (a function) in the loaded objects, in load order, found by
// reading their dynamic symbol tables (GNU hash) rather than with dlsym: a dlsym from this
// library (loaded at start, never unloaded) that finds a symbol in a library the program opened
// marks that library undeletable, so a program that closes libGL and opens it again would find
// half of it still loaded and fail. nullptr when no object defines it.
struct Lookup {
  const char* name;
  uint32_t hash;
  void* found;
};

uint32_t GnuHash(const char* s) {
  uint32_t h = 5381;
  for (; *s != '\0'; ++s) h = h * 33 + static_cast<unsigned char>(*s);
  return h;
}

int FindInObject(dl_phdr_info* info, size_t, void* data) {
  auto* q = static_cast<Lookup*>(data);
  if (q->found != nullptr) return 1;
  const ElfW(Dyn)* dyn = nullptr;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    if (info->dlpi_phdr[i].p_type == PT_DYNAMIC) {
      dyn = reinterpret_cast<const ElfW(Dyn)*>(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
    }
  }
  if (dyn == nullptr) return 0;
  const ElfW(Addr) base = info->dlpi_addr;
  // The loader relocates these entries in place, except in read-only dynamic sections (vDSO).
  auto ptr = [base](ElfW(Addr) p) { return p < base ? p + base : p; };
  const ElfW(Sym)* symtab = nullptr;
  const char* strtab = nullptr;
  const uint32_t* gnu_hash = nullptr;
  for (const ElfW(Dyn)* d = dyn; d->d_tag != DT_NULL; ++d) {
    if (d->d_tag == DT_SYMTAB) symtab = reinterpret_cast<const ElfW(Sym)*>(ptr(d->d_un.d_ptr));
    if (d->d_tag == DT_STRTAB) strtab = reinterpret_cast<const char*>(ptr(d->d_un.d_ptr));
    if (d->d_tag == DT_GNU_HASH) gnu_hash = reinterpret_cast<const uint32_t*>(ptr(d->d_un.d_ptr));
  }
  if (symtab == nullptr || strtab == nullptr || gnu_hash == nullptr) return 0;
  const uint32_t nbuckets = gnu_hash[0], symoffset = gnu_hash[1], bloom_size = gnu_hash[2];
  if (nbuckets == 0) return 0;
  const auto* bloom = reinterpret_cast<const ElfW(Addr)*>(gnu_hash + 4);
  const uint32_t* buckets = reinterpret_cast<const uint32_t*>(bloom + bloom_size);
  const uint32_t* chain = buckets + nbuckets;
  uint32_t i = buckets[q->hash % nbuckets];
  if (i < symoffset) return 0;
  for (;; ++i) {
    const uint32_t h = chain[i - symoffset];
    if ((h | 1) == (q->hash | 1)) {
      const ElfW(Sym)& sym = symtab[i];
      if (sym.st_shndx != SHN_UNDEF && (sym.st_info & 0xf) == STT_FUNC &&
          std::strcmp(strtab + sym.st_name, q->name) == 0) {
        q->found = reinterpret_cast<void*>(base + sym.st_value);
        return 1;
      }
    }
    if ((h & 1) != 0) break;
  }
  return 0;
}

// A GL function for the program's current context, looked up at every use (nothing of a
// library the program may close is kept).
void* GlFunction(const char* name) {
  Lookup q{name, GnuHash(name), nullptr};
  ::dl_iterate_phdr(FindInObject, &q);
  return q.found;
}

bool EnvIs(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, value) == 0;
}

gmux::proto::FrameLimits ReplyLimits() {
  gmux::proto::FrameLimits l;
  l.max_payload_bytes = 4096;
  return l;
}

struct State {
  std::mutex mu;
  bool off = false;
  bool verbose = false;
  bool finish = false;
  int fd = -1;
  bool connecting = false;
  int64_t next_try_ns = 0;
  bool controlled = false;
  int64_t unanswered_until_ns = 0;  // no decisions asked for until then
  double reference = 0;  // the reference of the last decision (0: uncontrolled)
  uint64_t seq = 0;
  int64_t last_end_ns = 0;
  // Frames not yet reported.
  uint32_t pend_frames = 0;
  uint64_t pend_present_ns = 0;
  int64_t pend_end_ns = 0;
  int64_t last_sent_ns = 0;
  int64_t last_polled_ns = 0;  // when gmuxd's messages were last looked for
  int64_t last_proc_cpu_ns = 0;  // the process's CPU time at the last report
  FILE* log = nullptr;
  int64_t log_epoch_ns = 0;
  std::vector<uint8_t> in;  // bytes of a partly read reply
};

State& S() {
  static State* s = new State();  // never destroyed: swaps may run during exit
  return *s;
}

void Say(const char* what, const std::string& detail) {
  if (S().verbose) std::fprintf(stderr, "gmux-frame: %s%s\n", what, detail.c_str());
}

std::string ProgramName() {
  char buf[64] = {0};
  FILE* f = std::fopen("/proc/self/comm", "r");
  if (f == nullptr) return "?";
  if (std::fgets(buf, sizeof(buf), f) == nullptr) buf[0] = '\0';
  std::fclose(f);
  std::string s(buf);
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  return s;
}

// Connects and says hello; the socket (blocking) or -1.
int Connect(const std::string& renderer) {
  const char* path = std::getenv("GMUX_SOCKET");
  if (path == nullptr || *path == '\0') path = "/run/gmux/gmuxd.sock";
  sockaddr_un addr{};
  if (std::strlen(path) >= sizeof(addr.sun_path)) return -1;
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path, sizeof(addr.sun_path) - 1);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  timeval tv{2, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  capnp::MallocMessageBuilder b;
  auto req = b.initRoot<wire::Request>();
  req.setSeq(1);
  auto h = req.initHello();
  h.setProtocolVersion(gmux::proto::kProtocolVersion);
  h.setPid(static_cast<uint32_t>(::getpid()));
  h.setClientName("libgmux-frame");
  h.setFrameAgent(true);
  h.setProgram(ProgramName());
  h.setRenderer(renderer.substr(0, 256));
  if (!gmux::proto::WriteFrame(fd, gmux::proto::FrameKind::kRequest, b).ok()) {
    ::close(fd);
    return -1;
  }
  auto msg = gmux::proto::ReadFrame(fd, gmux::proto::FrameKind::kReply, ReplyLimits());
  bool ok = false;
  std::string why = msg.ok() ? "" : msg.status().message();
  if (msg.ok()) {
    KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() {
      auto rep = msg->root<wire::Reply>();
      ok = rep.getStatus() == 0 && rep.isHello();
      if (!ok) why = rep.getMessage();
      else why = std::string("tenant ") + rep.getHello().getTenant().cStr();
    })) {
      ok = false;
    }
  }
  Say(ok ? "connected: " : "not connected: ", why);
  if (!ok) {
    ::close(fd);
    return -1;
  }
  timeval none{0, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &none, sizeof(none));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &none, sizeof(none));
  return fd;
}

void Disconnect(State& s, const std::string& why) {
  if (s.fd >= 0) ::close(s.fd);
  s.fd = -1;
  s.controlled = false;
  s.in.clear();
  s.next_try_ns = NowNs() + kRetryNs;
  Say("disconnected: ", why);
}

// Starts a connection attempt in the background when one is due. Caller holds s.mu.
void MaybeConnect(State& s, int64_t now) {
  if (s.fd >= 0 || s.connecting || now < s.next_try_ns) return;
  s.connecting = true;
  std::string renderer = "?";
  using GetString = const GLubyte* (*)(GLenum);
  auto gs = reinterpret_cast<GetString>(GlFunction("glGetString"));
  if (gs != nullptr) {
    if (const GLubyte* r = gs(GL_RENDERER)) renderer = reinterpret_cast<const char*>(r);
  }
  try {
    std::thread([renderer] {
      int fd = Connect(renderer);
      State& st = S();
      std::lock_guard<std::mutex> lock(st.mu);
      st.connecting = false;
      if (fd < 0) {
        st.next_try_ns = NowNs() + kRetryNs;
        return;
      }
      st.fd = fd;
      st.controlled = false;
      st.in.clear();
      st.last_sent_ns = NowNs();
      st.last_proc_cpu_ns = ProcessCpuNs();
      st.pend_frames = 0;  // frames before the connection are not reported
      st.pend_present_ns = 0;
    }).detach();
  } catch (...) {
    s.connecting = false;
    s.next_try_ns = now + kRetryNs;
  }
}

bool SendReport(State& s, uint64_t seq, uint64_t cpu_ns) {
  capnp::MallocMessageBuilder b;
  auto req = b.initRoot<wire::Request>();
  req.setSeq(seq);
  auto f = req.initFrame();
  f.setFrames(s.pend_frames);
  f.setPresentEndNs(static_cast<uint64_t>(s.pend_end_ns));
  f.setPresentNs(s.pend_present_ns);
  f.setCpuNs(cpu_ns);
  const int64_t proc = ProcessCpuNs();
  f.setProcessCpuNs(static_cast<uint64_t>(std::max<int64_t>(0, proc - s.last_proc_cpu_ns)));
  auto bytes = gmux::proto::EncodeFrame(gmux::proto::FrameKind::kRequest, b);
  if (!bytes.ok()) return false;
  // Never waits: a daemon that does not read (stalled) leaves the frames for a later report.
  ssize_t n = ::send(s.fd, bytes->data(), bytes->size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;
  if (n != static_cast<ssize_t>(bytes->size())) {
    Disconnect(s, "send failed");  // also a partial message: the stream cannot be resumed
    return false;
  }
  s.pend_frames = 0;
  s.pend_present_ns = 0;
  s.last_sent_ns = NowNs();
  s.last_proc_cpu_ns = proc;
  return true;
}

// Reads gmuxd's messages. With `want` != 0, waits (up to the decision timeout) for the reply
// with that seq and returns its sleep; otherwise takes what has arrived and returns 0. Control
// messages (seq 0) update s.controlled on the way. `*answered` (when given) says whether the
// reply came.
uint64_t Receive(State& s, uint64_t want, bool* answered = nullptr) {
  if (answered != nullptr) *answered = false;
  const int64_t deadline = NowNs() + int64_t{kDecisionTimeoutMs} * 1'000'000;
  for (;;) {
    if (s.fd < 0) return 0;
    // Complete messages already read.
    while (s.in.size() >= gmux::proto::kHeaderBytes) {
      auto h = gmux::proto::DecodeHeader(
          std::span<const uint8_t>(s.in.data(), gmux::proto::kHeaderBytes), ReplyLimits());
      if (!h.ok() || h->kind != gmux::proto::FrameKind::kReply) {
        Disconnect(s, "malformed message from gmuxd");
        return 0;
      }
      const size_t total = gmux::proto::kHeaderBytes + h->payload_bytes;
      if (s.in.size() < total) break;
      auto msg = gmux::proto::DecodeFrame(std::span<const uint8_t>(s.in.data(), total),
                                          gmux::proto::FrameKind::kReply, ReplyLimits());
      s.in.erase(s.in.begin(), s.in.begin() + static_cast<ptrdiff_t>(total));
      if (!msg.ok()) {
        Disconnect(s, "malformed message from gmuxd");
        return 0;
      }
      uint64_t seq = 0, sleep_ns = 0;
      double reference = 0;
      bool error = false, is_frame = false, controlled = false;
      std::string why;
      KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() {
        auto rep = msg->root<wire::Reply>();
        seq = rep.getSeq();
        error = rep.getStatus() != 0;
        why = rep.getMessage();
        is_frame = rep.isFrame();
        if (is_frame) {
          sleep_ns = rep.getFrame().getSleepNs();
          controlled = rep.getFrame().getControlled();
          reference = rep.getFrame().getReferenceFps();
        }
      })) {
        error = true;
      }
      if (error || !is_frame) {
        Disconnect(s, why.empty() ? "unexpected message from gmuxd" : why);
        return 0;
      }
      if (seq == 0) {
        if (controlled != s.controlled) Say(controlled ? "controlled" : "uncontrolled", "");
        s.controlled = controlled;
        continue;
      }
      if (seq == want) {
        s.reference = reference;
        if (answered != nullptr) *answered = true;
        return std::min(sleep_ns, kMaxSleepNs);
      }
    }
    const int64_t left_ms = want == 0 ? 0 : (deadline - NowNs()) / 1'000'000;
    if (want != 0 && left_ms <= 0) {
      // gmuxd is late: this frame goes uncontrolled; a late reply is skipped when it comes.
      return 0;
    }
    pollfd p{s.fd, POLLIN, 0};
    int r = ::poll(&p, 1, static_cast<int>(left_ms));
    if (r <= 0) return 0;
    uint8_t buf[512];
    ssize_t n = ::recv(s.fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
      Disconnect(s, "gmuxd closed the connection");
      return 0;
    }
    if (n > 0) s.in.insert(s.in.end(), buf, buf + n);
    if (s.in.size() > 65536) {
      Disconnect(s, "too much unread data from gmuxd");
      return 0;
    }
  }
}

void Init() {
  State& s = S();
  s.off = EnvIs("GMUX_FRAME", "0");
  s.verbose = EnvIs("GMUX_FRAME_VERBOSE", "1");
  s.finish = EnvIs("GMUX_FRAME_FINISH", "1");
  const char* path = std::getenv("GMUX_FRAME_LOG");
  if (path != nullptr && *path != '\0' && !s.off) {
    s.log = std::fopen(path, "ae");
    if (s.log != nullptr) {
      std::fprintf(s.log,
                   "# gmux frame log: pid %d, %s; end_s cpu_ms sleep_ms present_ms reference_fps\n",
                   static_cast<int>(::getpid()), ProgramName().c_str());
    }
  }
}

std::once_flag g_init;

void AfterForkInChild() {
  // The parent's connection is not ours; the lock may have been held by a thread that does not
  // exist here.
  State& s = S();
  new (&s.mu) std::mutex();
  if (s.fd >= 0) ::close(s.fd);  // the child's copy only
  s.fd = -1;
  s.connecting = false;
  s.controlled = false;
  s.pend_frames = 0;
  s.pend_present_ns = 0;
  s.in.clear();
  s.next_try_ns = 0;
}

struct AtFork {
  AtFork() { ::pthread_atfork(nullptr, nullptr, AfterForkInChild); }
} g_at_fork;

template <typename F>
auto OnSwap(F&& real_swap) {
  std::call_once(g_init, Init);
  State& s = S();
  if (s.off) return real_swap();
  const int64_t t_call = NowNs();
  uint64_t sleep_ns = 0;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    MaybeConnect(s, t_call);
    s.reference = 0;
    // After a decision that came late (or could not be asked), the program runs uncontrolled
    // for a second rather than waiting at every frame for a daemon that is stalled.
    if (s.fd >= 0 && s.controlled && t_call >= s.unanswered_until_ns) {
      const uint64_t cpu = s.last_end_ns > 0 ? static_cast<uint64_t>(t_call - s.last_end_ns) : 0;
      using Flush = void (*)();
      if (auto flush = reinterpret_cast<Flush>(GlFunction("glFlush"))) flush();
      const uint64_t seq = ++s.seq;
      bool answered = false;
      if (SendReport(s, seq, cpu)) sleep_ns = Receive(s, seq, &answered);
      if (!answered) s.unanswered_until_ns = NowNs() + kUnansweredBackoffNs;
    }
  }
  if (sleep_ns > 0) {
    timespec ts{static_cast<time_t>(sleep_ns / 1'000'000'000),
                static_cast<long>(sleep_ns % 1'000'000'000)};
    while (::clock_nanosleep(CLOCK_MONOTONIC, 0, &ts, &ts) == EINTR) {
    }
  }
  const int64_t t0 = NowNs();
  auto result = real_swap();
  if (s.finish) {
    using Finish = void (*)();
    if (auto finish = reinterpret_cast<Finish>(GlFunction("glFinish"))) finish();
  }
  const int64_t t1 = NowNs();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.log != nullptr) {
      if (s.log_epoch_ns == 0) s.log_epoch_ns = t1;
      std::fprintf(s.log, "%.6f %.3f %.3f %.3f %.2f\n", static_cast<double>(t1) * 1e-9,
                   s.last_end_ns > 0 ? static_cast<double>(t_call - s.last_end_ns) * 1e-6 : 0.0,
                   static_cast<double>(sleep_ns) * 1e-6, static_cast<double>(t1 - t0) * 1e-6,
                   s.reference);
      if (t1 - s.log_epoch_ns > 1'000'000'000) {
        std::fflush(s.log);
        s.log_epoch_ns = t1;
      }
    }
    s.last_end_ns = t1;
    ++s.pend_frames;
    s.pend_present_ns += static_cast<uint64_t>(t1 - t0);
    s.pend_end_ns = t1;
    const bool asking = s.controlled && t1 >= s.unanswered_until_ns;
    if (s.fd >= 0 && !asking && t1 - s.last_sent_ns >= kBatchNs) {
      SendReport(s, 0, 0);
    }
    // gmuxd's word that control starts is read within 2 ms, however rarely reports go out: a
    // program at thousands of frames per second would otherwise run free for a whole batch.
    if (s.fd >= 0 && !asking && t1 - s.last_polled_ns >= kPollNs) {
      s.last_polled_ns = t1;
      Receive(s, 0);
    }
  }
  return result;
}

// The real `name`: the one the program's own dlsym found last (a program may unload its GL
// library and load it again: nothing older is kept), else the next definition after this
// library, else in `library` if the process loaded it privately. Looked up at every call: a
// dlsym costs tens of nanoseconds against a frame's milliseconds.
// `next` caches the RTLD_NEXT answer: a program that calls the swap by name without having
// fetched it with dlsym linked its GL library at start, and that one is never unloaded.
template <typename Fn>
Fn Next(const char* name, const char* library, const std::atomic<void*>* seen,
        std::atomic<void*>* next = nullptr) {
  void* f = seen != nullptr ? seen->load() : nullptr;
  if (f == nullptr && next != nullptr) f = next->load(std::memory_order_relaxed);
  if (f == nullptr) {
    f = RealDlsym()(RTLD_NEXT, name);
    if (f != nullptr && next != nullptr) next->store(f, std::memory_order_relaxed);
  }
  if (f == nullptr) {
    if (void* h = ::dlopen(library, RTLD_LAZY | RTLD_NOLOAD)) {
      f = RealDlsym()(h, name);
      ::dlclose(h);
    }
  }
  return reinterpret_cast<Fn>(f);
}

struct LogCloser {
  ~LogCloser() {
    State& s = S();
    if (s.log != nullptr) std::fflush(s.log);
  }
} g_log_closer;

}  // namespace

extern "C" {

__attribute__((visibility("default"))) void glXSwapBuffers(Display* dpy, GLXDrawable drawable) {
  using Fn = void (*)(Display*, GLXDrawable);
  static std::atomic<void*> next{nullptr};
  Fn f = Next<Fn>("glXSwapBuffers", "libGLX.so.0", &g_glx_swap_seen, &next);
  if (f == nullptr) f = Next<Fn>("glXSwapBuffers", "libGL.so.1", nullptr);
  if (f == nullptr) return;
  OnSwap([&] {
    f(dpy, drawable);
    return 0;
  });
}

__attribute__((visibility("default"))) EGLBoolean eglSwapBuffers(EGLDisplay dpy,
                                                                 EGLSurface surface) {
  using Fn = EGLBoolean (*)(EGLDisplay, EGLSurface);
  static std::atomic<void*> next{nullptr};
  Fn f = Next<Fn>("eglSwapBuffers", "libEGL.so.1", &g_egl_swap_seen, &next);
  if (f == nullptr) return EGL_FALSE;
  return OnSwap([&] { return f(dpy, surface); });
}

__attribute__((visibility("default"))) __GLXextFuncPtr glXGetProcAddressARB(const GLubyte* name) {
  if (name != nullptr && std::strcmp(reinterpret_cast<const char*>(name), "glXSwapBuffers") == 0) {
    return reinterpret_cast<__GLXextFuncPtr>(&glXSwapBuffers);
  }
  using Fn = __GLXextFuncPtr (*)(const GLubyte*);
  Fn real = Next<Fn>("glXGetProcAddressARB", "libGLX.so.0", &g_glx_gpa_arb_seen);
  return real != nullptr ? real(name) : nullptr;
}

__attribute__((visibility("default"))) __GLXextFuncPtr glXGetProcAddress(const GLubyte* name) {
  if (name != nullptr && std::strcmp(reinterpret_cast<const char*>(name), "glXSwapBuffers") == 0) {
    return reinterpret_cast<__GLXextFuncPtr>(&glXSwapBuffers);
  }
  using Fn = __GLXextFuncPtr (*)(const GLubyte*);
  Fn real = Next<Fn>("glXGetProcAddress", "libGLX.so.0", &g_glx_gpa_seen);
  return real != nullptr ? real(name) : nullptr;
}

__attribute__((visibility("default"))) __eglMustCastToProperFunctionPointerType eglGetProcAddress(
    const char* name) {
  if (name != nullptr && std::strcmp(name, "eglSwapBuffers") == 0) {
    return reinterpret_cast<__eglMustCastToProperFunctionPointerType>(&eglSwapBuffers);
  }
  using Fn = __eglMustCastToProperFunctionPointerType (*)(const char*);
  Fn real = Next<Fn>("eglGetProcAddress", "libEGL.so.1", &g_egl_gpa_seen);
  return real != nullptr ? real(name) : nullptr;
}

// Programs that open the GL library themselves and look the swap up with dlsym (glmark2,
// SDL, GLFW) would bypass the interposition above; their lookups of the interposed names on a
// library handle (or RTLD_DEFAULT) get this library's functions, and the real ones are
// remembered for the call through. Everything else, and every RTLD_NEXT lookup (another
// interposer asking for the next definition must get it, not this library's), goes to the real
// dlsym as a tail call: the dynamic linker finds the caller from the return address, which is
// then still the program's, so RTLD_NEXT, RTLD_DEFAULT's scope and dlerror() keep their meaning.
// Nothing here allocates, so malloc wrappers that call dlsym are safe.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wnonnull-compare"
__attribute__((visibility("default"), noinline, optimize("optimize-sibling-calls"))) void* dlsym(
    void* handle, const char* name) {
  DlsymFn real = RealDlsym();
  if (real == nullptr) return nullptr;
  if (name == nullptr || handle == RTLD_NEXT) return real(handle, name);
  struct Hook {
    const char* name;
    void* ours;
    std::atomic<void*>* seen;
  };
  const Hook hooks[] = {
      {"glXSwapBuffers", reinterpret_cast<void*>(&glXSwapBuffers), &g_glx_swap_seen},
      {"eglSwapBuffers", reinterpret_cast<void*>(&eglSwapBuffers), &g_egl_swap_seen},
      {"glXGetProcAddress", reinterpret_cast<void*>(&glXGetProcAddress), &g_glx_gpa_seen},
      {"glXGetProcAddressARB", reinterpret_cast<void*>(&glXGetProcAddressARB),
       &g_glx_gpa_arb_seen},
      {"eglGetProcAddress", reinterpret_cast<void*>(&eglGetProcAddress), &g_egl_gpa_seen},
  };
  for (const Hook& h : hooks) {
    if (std::strcmp(name, h.name) != 0) continue;
    void* found = real(handle, name);
    if (found == nullptr || found == h.ours) return found;
    h.seen->store(found);
    return h.ours;
  }
  return real(handle, name);
}
#pragma GCC diagnostic pop

}  // extern "C"
