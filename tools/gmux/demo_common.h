// What the `gmux demo` experiments share: a private gmuxd of this build on a temp socket, with a
// vendors directory naming only the gmux ICD, for tenant processes to load; and small helpers.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace gmux::cli {

// "a,b,,c" -> {"a", "b", "c"}.
std::vector<std::string> SplitList(const std::string& s);

// Writes all of `out` to `fd`; false when the descriptor fails.
bool WriteAll(int fd, const std::string& out);

// This build's gmuxd and libgmux-icd.so, beside the running gmux binary.
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

  const std::string& socket() const { return socket_; }
  const std::string& vendors() const { return vendors_; }

 private:
  DemoPaths paths_;
  std::string dir_, socket_, vendors_;
  pid_t pid_ = -1;
};

}  // namespace gmux::cli
