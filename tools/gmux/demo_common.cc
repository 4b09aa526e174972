#include "demo_common.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>
#include <utility>

namespace gmux::cli {

std::vector<std::string> SplitList(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string x;
  while (std::getline(in, x, ',')) {
    if (!x.empty()) out.push_back(x);
  }
  return out;
}

bool WriteAll(int fd, const std::string& out) {
  size_t off = 0;
  while (off < out.size()) {
    ssize_t w = ::write(fd, out.data() + off, out.size() - off);
    if (w <= 0) return false;
    off += static_cast<size_t>(w);
  }
  return true;
}

std::string IcdBeside(const std::filesystem::path& exe) {
  const std::filesystem::path lib = exe.parent_path().parent_path() / "lib";
  const std::filesystem::path built = lib / "libgmux-icd.so";
  const std::filesystem::path installed = lib / "gmux" / "libgmux-icd.so";
  std::error_code ec;
  return (!std::filesystem::exists(built, ec) && std::filesystem::exists(installed, ec))
             ? installed.string()
             : built.string();
}

bool DemoPaths::Find(const char* tool) {
  std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe");
  gmuxd = (exe.parent_path() / "gmuxd").string();
  icd = IcdBeside(exe);
  if (std::filesystem::exists(gmuxd) && std::filesystem::exists(icd)) return true;
  std::cerr << tool << ": needs " << gmuxd << " and " << icd
            << " (build the gmuxd and gmux-icd targets)\n";
  return false;
}

bool DemoDaemon::Prepare(const std::string& prefix, const DemoPaths& paths) {
  paths_ = paths;
  std::string tmpl = "/tmp/" + prefix + "-XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) return false;
  dir_ = tmpl;
  socket_ = dir_ + "/gmuxd.sock";
  vendors_ = dir_ + "/vendors";
  ::chmod(dir_.c_str(), 0755);
  std::error_code ec;
  std::filesystem::create_directories(vendors_, ec);
  if (ec) return false;
  ::chmod(vendors_.c_str(), 0755);
  std::ofstream(vendors_ + "/gmux.icd") << paths_.icd << "\n";
  ::chmod((vendors_ + "/gmux.icd").c_str(), 0644);
  return true;
}

bool DemoDaemon::Start(const std::string& config, int exit_after_s) {
  const std::string file = dir_ + "/gmux.toml";
  {
    std::ofstream cfg(file);
    cfg << "[daemon]\nsocket = \"" << socket_ << "\"\n" << config;
  }
  pid_ = ::fork();
  if (pid_ == 0) {
    // Its messages go to a log in the run's dir: a run that fails shows their tail.
    int log = ::open((dir_ + "/gmuxd.log").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (log >= 0) ::dup2(log, 2);
    const std::string after = std::to_string(exit_after_s);
    ::execl(paths_.gmuxd.c_str(), paths_.gmuxd.c_str(), "--config", file.c_str(), "--exit-after",
            after.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  if (pid_ < 0) return false;
  for (int i = 0; i < 3000; ++i) {
    if (std::filesystem::exists(socket_)) return true;
    int st;
    if (::waitpid(pid_, &st, WNOHANG) == pid_) {
      pid_ = -1;
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

void DemoDaemon::Stop() {
  if (pid_ > 0) {
    ::kill(pid_, SIGTERM);
    int st;
    ::waitpid(pid_, &st, 0);
    pid_ = -1;
  }
  if (!dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
    dir_.clear();
  }
}

std::string DemoDaemon::LogTail(size_t lines) const {
  std::ifstream in(dir_ + "/gmuxd.log");
  std::deque<std::string> tail;
  std::string line;
  while (std::getline(in, line)) {
    tail.push_back(line);
    if (tail.size() > lines) tail.pop_front();
  }
  std::string out;
  for (const auto& l : tail) out += l + "\n";
  return out;
}

DemoTenant::DemoTenant(DemoTenant&& other) noexcept
    : pid_(std::exchange(other.pid_, -1)), up_(std::exchange(other.up_, -1)),
      down_(std::exchange(other.down_, -1)) {}

DemoTenant::~DemoTenant() {
  if (up_ >= 0) ::close(up_);
  if (down_ >= 0) ::close(down_);
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    int st;
    ::waitpid(pid_, &st, 0);
  }
}

bool DemoTenant::Spawn(const DemoDaemon& daemon, uid_t uid,
                       const std::function<int(int up, int down)>& body) {
  int up[2], down[2];
  if (::pipe(up) != 0) return false;
  if (::pipe(down) != 0) {
    ::close(up[0]);
    ::close(up[1]);
    return false;
  }
  pid_ = ::fork();
  if (pid_ == 0) {
    ::close(up[0]);
    ::close(down[1]);
    // Nothing of the demo's other tenants (their pipes' ends) stays open here: a tenant's pipe
    // must reach end-of-file when that tenant and the demo close it.
    for (int fd = 3; fd < 1024; ++fd) {
      if (fd != up[1] && fd != down[0]) ::close(fd);
    }
    if (uid != 0 && (::setgid(uid) != 0 || ::setuid(uid) != 0)) ::_exit(3);
    ::setenv("OCL_ICD_VENDORS", daemon.vendors().c_str(), 1);
    ::setenv("GMUX_SOCKET", daemon.socket().c_str(), 1);
    ::_exit(body(up[1], down[0]));
  }
  ::close(up[1]);
  ::close(down[0]);
  up_ = up[0];
  down_ = down[1];
  return pid_ > 0;
}

bool DemoTenant::WaitReady(std::chrono::steady_clock::time_point deadline) {
  if (up_ < 0) return false;
  for (;;) {
    const auto left = deadline - std::chrono::steady_clock::now();
    if (left <= std::chrono::steady_clock::duration::zero()) return false;
    pollfd p{up_, POLLIN, 0};
    const int ms = static_cast<int>(std::min<int64_t>(
        std::chrono::duration_cast<std::chrono::milliseconds>(left).count() + 1, 1000));
    if (::poll(&p, 1, ms) <= 0) continue;
    char c = 0;
    return ::read(up_, &c, 1) == 1 && c == 'r';
  }
}

void DemoTenant::Kill() {
  if (pid_ > 0) ::kill(pid_, SIGKILL);
}

bool StartAll(std::vector<DemoTenant>& tenants, int* not_ready) {
  bool ok = true;
  for (size_t i = 0; i < tenants.size() && ok; ++i) {
    ok = tenants[i].WaitReady();
    if (!ok && not_ready != nullptr) *not_ready = static_cast<int>(i);
  }
  for (auto& t : tenants) ok = ok && t.Start();
  if (!ok) {
    for (auto& t : tenants) t.Kill();
  }
  return ok;
}

bool DemoTenant::Start() {
  const char c = 's';
  return down_ >= 0 && ::write(down_, &c, 1) == 1;
}

std::string DemoTenant::Finish(int& exit_status, std::chrono::steady_clock::time_point deadline) {
  std::string out;
  char buf[4096];
  bool timed_out = false;
  while (up_ >= 0) {
    // What it wrote (or its exit) counts even past the deadline: only a tenant still running
    // then has timed out.
    const auto left = deadline - std::chrono::steady_clock::now();
    const int ms = left <= std::chrono::steady_clock::duration::zero()
                       ? 0
                       : static_cast<int>(std::min<int64_t>(
                             std::chrono::duration_cast<std::chrono::milliseconds>(left).count() +
                                 1,
                             1000));
    pollfd p{up_, POLLIN, 0};
    if (::poll(&p, 1, ms) <= 0) {
      if (ms == 0) {
        timed_out = true;
        break;
      }
      continue;
    }
    const ssize_t n = ::read(up_, buf, sizeof(buf));
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  if (timed_out && pid_ > 0) ::kill(pid_, SIGKILL);
  if (up_ >= 0) ::close(up_);
  if (down_ >= 0) ::close(down_);
  up_ = down_ = -1;
  exit_status = -1;
  if (pid_ > 0) {
    int st = 0;
    ::waitpid(pid_, &st, 0);
    if (WIFEXITED(st)) exit_status = WEXITSTATUS(st);
    pid_ = -1;
  }
  if (timed_out) exit_status = kTimedOut;
  return out;
}

}  // namespace gmux::cli
