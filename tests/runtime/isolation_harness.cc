#include "runtime/isolation_harness.h"

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <kj/exception.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

namespace gmux::testing::iso {

namespace wire = proto::wire;

bool RunningAsRoot() { return ::geteuid() == 0; }

uid_t TenantUid(int tenant) {
  return RunningAsRoot() ? kTenantUidBase + static_cast<uid_t>(tenant) : ::geteuid();
}

std::string UidTenantName(int tenant) { return "uid-" + std::to_string(TenantUid(tenant)); }

namespace {

bool CanConnect(const std::string& path) {
  int fd = ConnectUnix(path);
  if (fd < 0) return false;
  ::close(fd);
  return true;
}

// Closes every descriptor from 3 up except those in `keep` (a child must not hold other
// children's pipe ends, or the test would never see those pipes close).
void CloseOtherFds(std::initializer_list<int> keep) {
  std::vector<int> fds;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (dirent* e = ::readdir(d)) {
      if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
      fds.push_back(std::atoi(e->d_name));
    }
    ::closedir(d);
  }
  for (int fd : fds) {
    if (fd <= 2 || std::find(keep.begin(), keep.end(), fd) != keep.end()) continue;
    ::close(fd);
  }
}

// Takes the identity of `uid` (group and supplementary groups first); false on failure.
bool BecomeUid(uid_t uid) {
  if (::geteuid() == uid) return true;
  return ::setgroups(0, nullptr) == 0 && ::setgid(uid) == 0 && ::setuid(uid) == 0;
}

// /proc/PID/stat fields after the command name: [0] = state, [1] = ppid, [11] = utime,
// [12] = stime.
std::vector<std::string> StatFields(pid_t pid) {
  std::string s = ReadFile("/proc/" + std::to_string(pid) + "/stat");
  size_t close = s.rfind(')');
  std::vector<std::string> out;
  if (close == std::string::npos) return out;
  std::istringstream in(s.substr(close + 1));
  std::string f;
  while (in >> f) out.push_back(f);
  return out;
}

std::map<pid_t, pid_t> ParentsOfAll() {
  std::map<pid_t, pid_t> parent;
  if (DIR* d = ::opendir("/proc")) {
    while (dirent* e = ::readdir(d)) {
      if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
      pid_t pid = std::atoi(e->d_name);
      auto f = StatFields(pid);
      if (f.size() > 1) parent[pid] = std::atoi(f[1].c_str());
    }
    ::closedir(d);
  }
  return parent;
}

bool WriteAll(int fd, const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  while (n > 0) {
    ssize_t w = ::write(fd, b, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    b += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

}  // namespace

std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// ---- PrivateDaemon ----

PrivateDaemon::~PrivateDaemon() {
  KillTree();
  std::error_code ec;
  if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
}

void PrivateDaemon::KillTree() {
  if (pid_ <= 0 || exited_) return;
  // Workers first (collected before the daemon goes, while they are still its children).
  std::vector<pid_t> tree = ProcessTree(pid_);
  ::kill(pid_, SIGKILL);
  for (pid_t p : tree) {
    if (p != pid_) ::kill(p, SIGKILL);
  }
  int status = 0;
  ::waitpid(pid_, &status, 0);
  exited_ = true;
}

void PrivateDaemon::Start(const std::string& config_toml, bool tcp) {
  char tmpl[] = "/tmp/gmux-iso-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  dir_ = tmpl;
  ASSERT_EQ(::chmod(tmpl, 0755), 0);
  socket_ = dir_ + "/s.sock";
  // The gmux ICD only: children see one platform and never load the backend themselves.
  std::filesystem::create_directories(vendors());
  ::chmod(vendors().c_str(), 0755);
  std::ofstream(vendors() + "/gmux.icd") << GMUX_ICD_PATH << "\n";
  ::chmod((vendors() + "/gmux.icd").c_str(), 0644);
  const std::string config = dir_ + "/g.toml";
  std::ofstream(config) << config_toml;
  const std::string port_file = dir_ + "/port";
  const std::string log = dir_ + "/gmuxd.log";
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
    }
    // The daemon must not see the test's ICD settings (it opens the backend directly anyway).
    ::unsetenv("GMUX_SOCKET");
    ::unsetenv("GMUX_ADDRESS");
    ::unsetenv("GMUX_TOKEN");
    if (tcp) {
      // Plain TCP unless the test's config sets up TLS.
      const bool tls = config_toml.find("tls_cert") != std::string::npos;
      ::execl(GMUXD_PATH, GMUXD_PATH, "--socket", socket_.c_str(), "--config", config.c_str(),
              "--listen", "127.0.0.1:0", "--port-file", port_file.c_str(), "--exit-after", "300",
              tls ? "--log-level" : "--plain-tcp", tls ? "info" : nullptr,
              static_cast<char*>(nullptr));
    } else {
      ::execl(GMUXD_PATH, GMUXD_PATH, "--socket", socket_.c_str(), "--config", config.c_str(),
              "--exit-after", "300", static_cast<char*>(nullptr));
    }
    ::_exit(127);
  }
  pid_ = pid;
  auto deadline = std::chrono::steady_clock::now() + 30s;
  while (!CanConnect(socket_) || (tcp && !std::filesystem::exists(port_file))) {
    ASSERT_TRUE(Alive()) << "gmuxd exited during start-up:\n" << Log();
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "gmuxd did not start:\n" << Log();
    std::this_thread::sleep_for(20ms);
  }
  if (tcp) {
    // The file may be created before the number is in it.
    while (tcp_port_ <= 0) {
      std::ifstream(port_file) >> tcp_port_;
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "no TCP port:\n" << Log();
      if (tcp_port_ <= 0) std::this_thread::sleep_for(20ms);
    }
  }
}

bool PrivateDaemon::Alive() {
  if (pid_ <= 0 || exited_) return false;
  int status = 0;
  if (::waitpid(pid_, &status, WNOHANG) == pid_) exited_ = true;
  return !exited_;
}

bool PrivateDaemon::Stop(std::chrono::milliseconds within) {
  if (!Alive()) return false;
  ::kill(pid_, SIGTERM);
  auto deadline = std::chrono::steady_clock::now() + within;
  while (std::chrono::steady_clock::now() < deadline) {
    if (!Alive()) return true;
    std::this_thread::sleep_for(10ms);
  }
  KillTree();
  return false;
}

std::string PrivateDaemon::Log() const { return dir_.empty() ? "" : ReadFile(dir_ + "/gmuxd.log"); }

// ---- Child ----

std::string Outcome::Describe() const {
  switch (kind) {
    case Kind::kExited:
      return "exit " + std::to_string(code);
    case Kind::kSignaled:
      return signal == SIGALRM ? "killed by its own time limit (SIGALRM)"
                               : "signal " + std::to_string(signal);
    case Kind::kTimedOut:
      return "still running at the deadline (killed)";
    case Kind::kNotStarted:
      break;
  }
  return "not started";
}

void Channel::Send(int64_t value) { WriteAll(up_, &value, sizeof(value)); }

bool Channel::WaitGo() {
  char c = 0;
  for (;;) {
    ssize_t r = ::read(down_, &c, 1);
    if (r < 0 && errno == EINTR) continue;
    return r == 1;
  }
}

Child::Child(Child&& other) noexcept { *this = std::move(other); }

Child& Child::operator=(Child&& other) noexcept {
  if (this != &other) {
    Kill();
    pid_ = std::exchange(other.pid_, -1);
    up_ = std::exchange(other.up_, -1);
    down_ = std::exchange(other.down_, -1);
  }
  return *this;
}

Child::~Child() { Kill(); }

Child Child::Spawn(const PrivateDaemon& daemon, const ChildOptions& options,
                   std::function<int(Channel&)> body) {
  int up[2], down[2];
  Child c;
  if (::pipe2(up, O_CLOEXEC) != 0) return c;
  if (::pipe2(down, O_CLOEXEC) != 0) {
    ::close(up[0]);
    ::close(up[1]);
    return c;
  }
  std::fflush(nullptr);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    CloseOtherFds({up[1], down[0]});
    ::setenv("OCL_ICD_VENDORS", daemon.vendors().c_str(), 1);
    ::setenv("GMUX_SOCKET", daemon.socket().c_str(), 1);
    ::unsetenv("GMUX_ADDRESS");
    ::unsetenv("GMUX_TOKEN");
    ::unsetenv("GMUX_SHM");
    for (const auto& [k, v] : options.env) ::setenv(k.c_str(), v.c_str(), 1);
    if (!BecomeUid(TenantUid(options.tenant))) {
      std::fprintf(stderr, "tenant %d: cannot become uid %u: %s\n", options.tenant,
                   TenantUid(options.tenant), std::strerror(errno));
      ::_exit(120);
    }
    ::alarm(static_cast<unsigned>(options.limit_s));
    Channel ch(up[1], down[0]);
    int code = 121;
    try {
      code = body(ch);
    } catch (...) {
      code = 122;
    }
    std::fflush(nullptr);
    ::_exit(code & 0xff);
  }
  ::close(up[1]);
  ::close(down[0]);
  if (pid < 0) {
    ::close(up[0]);
    ::close(down[1]);
    return c;
  }
  c.pid_ = pid;
  c.up_ = up[0];
  c.down_ = down[1];
  return c;
}

std::optional<int64_t> Child::Receive(std::chrono::milliseconds timeout) {
  if (up_ < 0) return std::nullopt;
  int64_t v = 0;
  size_t got = 0;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (got < sizeof(v)) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return std::nullopt;
    pollfd p{up_, POLLIN, 0};
    int n = ::poll(&p, 1, static_cast<int>(left.count()));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return std::nullopt;
    ssize_t r = ::read(up_, reinterpret_cast<char*>(&v) + got, sizeof(v) - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return std::nullopt;
    got += static_cast<size_t>(r);
  }
  return v;
}

void Child::Go() {
  if (down_ >= 0) WriteAll(down_, "g", 1);
}

Outcome Child::Wait(std::chrono::milliseconds timeout) {
  Outcome o;
  if (pid_ <= 0) return o;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  for (;;) {
    pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_) break;
    if (r < 0 && errno != EINTR) return o;
    if (std::chrono::steady_clock::now() >= deadline) {
      Kill();
      o.kind = Outcome::Kind::kTimedOut;
      return o;
    }
    std::this_thread::sleep_for(5ms);
  }
  pid_ = -1;
  if (WIFEXITED(status)) {
    o.kind = Outcome::Kind::kExited;
    o.code = WEXITSTATUS(status);
  } else {
    o.kind = Outcome::Kind::kSignaled;
    o.signal = WTERMSIG(status);
  }
  return o;
}

void Child::Kill() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }
  if (up_ >= 0) ::close(std::exchange(up_, -1));
  if (down_ >= 0) ::close(std::exchange(down_, -1));
}

void Child::Signal(int sig) {
  if (pid_ > 0) ::kill(pid_, sig);
}

void LingerUntilKilled() {
  for (;;) ::pause();
}

// ---- OpenCL helpers ----

GmuxDevice::~GmuxDevice() {
  if (queue != nullptr) clReleaseCommandQueue(queue);
  if (context != nullptr) clReleaseContext(context);
}

bool OpenGmux(GmuxDevice& out, cl_uint index, cl_int* create_err) {
  cl_uint n = 0;
  if (clGetPlatformIDs(0, nullptr, &n) != CL_SUCCESS || n == 0) return false;
  std::vector<cl_platform_id> ps(n);
  clGetPlatformIDs(n, ps.data(), nullptr);
  for (cl_platform_id p : ps) {
    char name[256] = {};
    clGetPlatformInfo(p, CL_PLATFORM_NAME, sizeof(name), name, nullptr);
    if (std::string(name).find("gmux") != std::string::npos) out.platform = p;
  }
  if (out.platform == nullptr) return false;
  cl_uint nd = 0;
  if (clGetDeviceIDs(out.platform, CL_DEVICE_TYPE_ALL, 0, nullptr, &nd) != CL_SUCCESS ||
      index >= nd) {
    return false;
  }
  std::vector<cl_device_id> devs(nd);
  if (clGetDeviceIDs(out.platform, CL_DEVICE_TYPE_ALL, nd, devs.data(), nullptr) != CL_SUCCESS) {
    return false;
  }
  out.device = devs[index];
  cl_int err = CL_SUCCESS;
  out.context = clCreateContext(nullptr, 1, &out.device, nullptr, nullptr, &err);
  if (create_err != nullptr) *create_err = err;
  if (out.context == nullptr) return false;
  out.queue = clCreateCommandQueue(out.context, out.device, 0, &err);
  return out.queue != nullptr;
}

cl_program Build(const GmuxDevice& d, const std::string& source, std::string* log, cl_int* err) {
  const char* src = source.c_str();
  cl_int e = CL_SUCCESS;
  cl_program p = clCreateProgramWithSource(d.context, 1, &src, nullptr, &e);
  if (p == nullptr) {
    if (err != nullptr) *err = e;
    return nullptr;
  }
  e = clBuildProgram(p, 1, &d.device, "", nullptr, nullptr);
  if (err != nullptr) *err = e;
  if (e != CL_SUCCESS) {
    if (log != nullptr) {
      size_t n = 0;
      clGetProgramBuildInfo(p, d.device, CL_PROGRAM_BUILD_LOG, 0, nullptr, &n);
      log->assign(n, '\0');
      clGetProgramBuildInfo(p, d.device, CL_PROGRAM_BUILD_LOG, n, log->data(), nullptr);
    }
    clReleaseProgram(p);
    return nullptr;
  }
  return p;
}

int KernelOnBuffer(GmuxDevice& d, const std::string& source, const char* name, size_t bytes,
                   const void* init, cl_kernel* kernel, cl_mem* buffer) {
  if (!OpenGmux(d)) return 50;
  cl_program p = Build(d, source);
  if (p == nullptr) return 51;
  cl_int err = CL_SUCCESS;
  *kernel = clCreateKernel(p, name, &err);
  const cl_mem_flags flags = CL_MEM_READ_WRITE | (init != nullptr ? CL_MEM_COPY_HOST_PTR : 0);
  *buffer = clCreateBuffer(d.context, flags, bytes, const_cast<void*>(init), &err);
  if (*kernel == nullptr || *buffer == nullptr ||
      clSetKernelArg(*kernel, 0, sizeof(cl_mem), buffer) != CL_SUCCESS) {
    return 52;
  }
  return 0;
}

int GoodTenant(int launches) {
  static const char* kAdd = "__kernel void add(__global int* a, int k) { a[get_global_id(0)] += k; }";
  GmuxDevice d;
  if (!OpenGmux(d)) return 11;
  std::string log;
  cl_program p = Build(d, kAdd, &log);
  if (p == nullptr) {
    std::fprintf(stderr, "good tenant: build failed: %s\n", log.c_str());
    return 12;
  }
  cl_int err = CL_SUCCESS;
  cl_kernel k = clCreateKernel(p, "add", &err);
  if (k == nullptr) return 13;
  const size_t n = 4096;
  std::vector<int> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<int>(i);
  cl_mem m = clCreateBuffer(d.context, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, n * sizeof(int),
                            v.data(), &err);
  if (m == nullptr) return 14;
  int added = 0;
  for (int i = 0; i < launches; ++i) {
    int inc = 1 + i % 3;
    if (clSetKernelArg(k, 0, sizeof(cl_mem), &m) != CL_SUCCESS ||
        clSetKernelArg(k, 1, sizeof(int), &inc) != CL_SUCCESS) {
      return 15;
    }
    if (clEnqueueNDRangeKernel(d.queue, k, 1, nullptr, &n, nullptr, 0, nullptr, nullptr) !=
        CL_SUCCESS) {
      return 16;
    }
    if (cl_int e = clFinish(d.queue); e != CL_SUCCESS) {
      std::fprintf(stderr, "good tenant: clFinish %d at launch %d\n", e, i);
      return 17;
    }
    added += inc;
  }
  std::vector<int> back(n, -1);
  if (clEnqueueReadBuffer(d.queue, m, CL_TRUE, 0, n * sizeof(int), back.data(), 0, nullptr,
                          nullptr) != CL_SUCCESS) {
    return 18;
  }
  for (size_t i = 0; i < n; ++i) {
    if (back[i] != static_cast<int>(i) + added) {
      std::fprintf(stderr, "good tenant: a[%zu] = %d, expected %d\n", i, back[i],
                   static_cast<int>(i) + added);
      return 19;
    }
  }
  clReleaseMemObject(m);
  clReleaseKernel(k);
  clReleaseProgram(p);
  return 0;
}

// ---- raw protocol ----

int ConnectUnix(const std::string& path, bool nonblocking) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) return -1;
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | (nonblocking ? SOCK_NONBLOCK : 0), 0);
  if (fd < 0) return -1;
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

int ConnectTcp(int port, bool nonblocking) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (nonblocking) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  return fd;
}

RawConn::~RawConn() {
  if (fd_ >= 0) ::close(fd_);
}

Status RawConn::Hello(const std::string& token) {
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire::Request>();
  r.setSeq(1);
  auto h = r.initHello();
  h.setProtocolVersion(proto::kProtocolVersion);
  h.setPid(static_cast<uint32_t>(::getpid()));
  h.setClientName("isolation_test raw client");
  if (!token.empty()) h.setToken(token);
  GMUX_RETURN_IF_ERROR(proto::WriteFrame(fd_, proto::FrameKind::kRequest, b));
  auto msg = proto::ReadFrame(fd_, proto::FrameKind::kReply);
  if (!msg.ok()) return msg.status();
  int32_t status = -1;
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() {
    status = msg->root<wire::Reply>().getStatus();
  })) {
    return DataLoss("malformed hello reply");
  }
  if (status != CL_SUCCESS) return PermissionDenied("hello refused: " + std::to_string(status));
  return Status::Ok();
}

Status RawConn::Post(capnp::MallocMessageBuilder& request, int pass_fd) {
  request.getRoot<wire::Request>().setSeq(0);
  return proto::WriteFrame(fd_, proto::FrameKind::kRequest, request, {}, pass_fd);
}

Result<int32_t> RawConn::Call(capnp::MallocMessageBuilder& request, int pass_fd) {
  const uint64_t seq = next_seq_++;
  request.getRoot<wire::Request>().setSeq(seq);
  GMUX_RETURN_IF_ERROR(
      proto::WriteFrame(fd_, proto::FrameKind::kRequest, request, {}, pass_fd));
  for (;;) {
    auto msg = proto::ReadFrame(fd_, proto::FrameKind::kReply);
    if (!msg.ok()) return msg.status();
    uint64_t got = 0;
    int32_t status = 0;
    bool last = true;
    KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() {
      auto rep = msg->root<wire::Reply>();
      got = rep.getSeq();
      status = rep.getStatus();
      if (rep.isReadData()) last = rep.getReadData().getLast();
    })) {
      return DataLoss("malformed reply");
    }
    if (got == 0) {
      if (async_error_ == 0) async_error_ = status;
      continue;
    }
    if (got == seq && last) return status;
  }
}

// ---- /proc ----

std::vector<pid_t> ProcessTree(pid_t root) {
  std::map<pid_t, pid_t> parent = ParentsOfAll();
  std::vector<pid_t> out{root};
  for (size_t i = 0; i < out.size(); ++i) {
    for (const auto& [pid, ppid] : parent) {
      if (ppid == out[i] && pid != root) out.push_back(pid);
    }
  }
  return out;
}

long RssKiB(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::atol(line.c_str() + 6);
  }
  return 0;
}

long TreeRssKiB(pid_t root) {
  long sum = 0;
  for (pid_t p : ProcessTree(root)) sum += RssKiB(p);
  return sum;
}

long ProcessUid(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("Uid:", 0) == 0) return std::atol(line.c_str() + 4);
  }
  return -1;
}

double TreeCpuLoad(pid_t root, std::chrono::milliseconds window) {
  auto sample = [&] {
    std::map<pid_t, long> ticks;
    for (pid_t p : ProcessTree(root)) {
      auto f = StatFields(p);
      if (f.size() > 12) ticks[p] = std::atol(f[11].c_str()) + std::atol(f[12].c_str());
    }
    return ticks;
  };
  auto before = sample();
  auto t0 = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(window);
  auto after = sample();
  double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  long used = 0;
  for (const auto& [pid, t] : after) {
    auto it = before.find(pid);
    used += it == before.end() ? t : std::max(0L, t - it->second);
  }
  return static_cast<double>(used) / static_cast<double>(::sysconf(_SC_CLK_TCK)) / wall;
}

std::vector<pid_t> DescendantsOwnedBy(pid_t root, const std::set<uid_t>& uids) {
  std::vector<pid_t> out;
  for (pid_t p : ProcessTree(root)) {
    if (p == root) continue;
    long uid = ProcessUid(p);
    if (uid >= 0 && uids.count(static_cast<uid_t>(uid)) != 0) out.push_back(p);
  }
  return out;
}

std::string StatusJson(const PrivateDaemon& daemon, int tenant) {
  return StatusOutput(daemon, tenant, true);
}

std::string StatusOutput(const PrivateDaemon& daemon, int tenant, bool json) {
  std::vector<std::string> args = {"status", "--socket", daemon.socket()};
  if (json) args.push_back("--json");
  int code = -1;
  std::string text = RunGmux(tenant, args, &code, /*with_stderr=*/false);
  if (code != 0) text.clear();
  return text;
}

std::string RunGmux(int tenant, const std::vector<std::string>& args, int* exit_code,
                    bool with_stderr) {
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return "";
  std::vector<std::string> all = {GMUX_CLI_PATH};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::fflush(nullptr);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    ::dup2(out[1], 1);
    if (with_stderr) ::dup2(out[1], 2);
    if (tenant >= 0 && !BecomeUid(TenantUid(tenant))) ::_exit(120);
    ::alarm(20);
    ::execv(GMUX_CLI_PATH, argv.data());
    ::_exit(127);
  }
  ::close(out[1]);
  std::string text;
  if (exit_code != nullptr) *exit_code = -1;
  if (pid > 0) {
    char buf[4096];
    for (;;) {
      ssize_t n = ::read(out[0], buf, sizeof(buf));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      text.append(buf, static_cast<size_t>(n));
    }
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (exit_code != nullptr && WIFEXITED(status)) *exit_code = WEXITSTATUS(status);
  }
  ::close(out[0]);
  return text;
}

}  // namespace gmux::testing::iso
