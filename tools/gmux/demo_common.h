// What the `gmux demo` experiments share: a private gmuxd of this build on a temp socket, with a
// vendors directory naming only the gmux ICD, for tenant processes to load; and small helpers.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace gmux::cli {

// "a,b,,c" -> {"a", "b", "c"}.
std::vector<std::string> SplitList(const std::string& s);

// Writes all of `out` to `fd`; false when the descriptor fails.
bool WriteAll(int fd, const std::string& out);

// The gmux ICD that goes with the gmux binary at `exe`: lib/libgmux-icd.so of its build tree,
// else lib/gmux/libgmux-icd.so of its install prefix (packaging/CMakeLists.txt); the build
// tree's path when neither exists.
std::string IcdBeside(const std::filesystem::path& exe);

// This build's (or installation's) gmuxd, beside the running gmux binary, and its ICD.
struct DemoPaths {
  std::string gmuxd, icd;
  // False (and a message naming `tool` on stderr) when either is missing.
  bool Find(const char* tool);
};

// One gmuxd for one run: a temp dir (mode 0755, so tenants under other uids reach it) holding
// the socket, gmux.toml and vendors/gmux.icd. Stopped (SIGTERM, reaped) and removed on Stop() or
// destruction.
class DemoDaemon {
 public:
  DemoDaemon() = default;
  DemoDaemon(const DemoDaemon&) = delete;
  DemoDaemon& operator=(const DemoDaemon&) = delete;
  ~DemoDaemon() { Stop(); }

  // Creates the temp dir ("/tmp/<prefix>-XXXXXX") and the vendors dir; false on failure.
  bool Prepare(const std::string& prefix, const DemoPaths& paths);
  // Writes `config` (the [daemon] table's socket line is added first) and starts gmuxd with
  // --exit-after `exit_after_s`; false when it does not come up.
  bool Start(const std::string& config, int exit_after_s);
  void Stop();
  // The last `lines` lines gmuxd wrote to its stderr (kept in the run's dir until Stop()).
  std::string LogTail(size_t lines = 40) const;

  const std::string& socket() const { return socket_; }
  const std::string& vendors() const { return vendors_; }

 private:
  DemoPaths paths_;
  std::string dir_, socket_, vendors_;
  pid_t pid_ = -1;
};

// One tenant process of a demo run: forked with the daemon's vendors dir and socket in its
// environment (as `uid` when non-zero). Its body gets the write end of the pipe up to the demo
// and the read end of the one down; it writes "r" when ready, waits for the start byte, writes
// its results, and returns its exit status. Killed and reaped if still running at destruction.
class DemoTenant {
 public:
  DemoTenant() = default;
  DemoTenant(DemoTenant&& other) noexcept;
  DemoTenant& operator=(DemoTenant&&) = delete;
  DemoTenant(const DemoTenant&) = delete;
  ~DemoTenant();

  bool Spawn(const DemoDaemon& daemon, uid_t uid, const std::function<int(int up, int down)>& body);
  // Its "r"; false when it exited first or wrote nothing by `deadline`.
  bool WaitReady(std::chrono::steady_clock::time_point deadline =
                     std::chrono::steady_clock::now() + std::chrono::minutes(5));
  bool Start();      // the start byte
  void Kill();       // SIGKILL (Finish() then reaps it and reports it failed)
  // What it wrote after "r" until it exited, and its exit status (-1: it did not exit normally).
  // Past `deadline` it is killed and the status is kTimedOut.
  static constexpr int kTimedOut = -2;
  std::string Finish(int& exit_status,
                     std::chrono::steady_clock::time_point deadline =
                         std::chrono::steady_clock::time_point::max());

 private:
  pid_t pid_ = -1;
  int up_ = -1, down_ = -1;
};

// Waits until every tenant is ready, then sends each its start byte. When one is not (it failed
// while setting up, or is stuck), every tenant is killed and false returned, with the first
// such tenant's index in `not_ready`: the others would otherwise wait for a start byte forever,
// and the demo with them.
bool StartAll(std::vector<DemoTenant>& tenants, int* not_ready = nullptr);

}  // namespace gmux::cli
