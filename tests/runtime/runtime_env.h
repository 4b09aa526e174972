// The environment of every runtime integration test process: a gmuxd child on a socket in a
// fresh temp dir (stopped at exit, and by its own --exit-after if this process dies), and an
// ICD vendor dir holding the gmux ICD beside the backend's own, so one process can run the same
// program through gmux and directly on the backend and compare.
#pragma once

#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 120
#endif
#include <CL/cl.h>

#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace gmux::testing {

struct RuntimeEnv {
  static std::string dir;     // the temp dir
  static std::string socket;  // gmuxd's socket
  static int daemon_pid;
  static bool start_daemon;   // false in tests of the no-daemon behaviour
  // TCP mode (tests built with GMUX_TEST_TCP): gmuxd also listens on 127.0.0.1, port 0, and
  // the ICD reaches it through GMUX_ADDRESS with the token kTcpToken.
  static bool tcp;
  // With tcp, TLS (tests built with GMUX_TEST_TLS): gmuxd has a test CA's certificate and the
  // ICD trusts that CA (GMUX_TLS_CA); without, plain TCP (plain_tcp, "tcp://" address).
  static bool tls;
  static int tcp_port;
};

// What one test executable varies: its name's parts (tests/runtime/CMakeLists.txt) become these
// flags in its runtime_main.cc, the only file compiled once per executable besides its tests.
struct Variant {
  bool no_shm = false;          // "inline": GMUX_SHM=0
  bool no_data_frames = false;  // "messages": GMUX_DATA_FRAMES=0
  bool no_remote = false;       // "transfers_shm": GMUX_REMOTE_COPY=0
  bool no_storage = false;      // "transfers_copy", "map_shm_copy": GMUX_BUFFER_STORAGE=0
  bool no_daemon = false;       // the test starts its own daemons
  bool tcp = false;             // RuntimeEnv::tcp
  bool tls = false;             // RuntimeEnv::tls
};

// The main() of every runtime test executable: sets the variant's environment and runs the
// tests with the daemon's environment (RuntimeEnv).
int RunRuntimeTests(int argc, char** argv, const Variant& variant);

inline const char* kTcpToken = "test-token-7f3a";
inline const char* kTcpTenant = "tcp-tenant";

// A platform whose name contains `name` ("gmux", "Portable"), or nullptr.
cl_platform_id FindPlatform(const std::string& name);

// One device of a platform with a context and a queue.
struct ClDevice {
  cl_platform_id platform = nullptr;
  cl_device_id device = nullptr;
  cl_context context = nullptr;
  cl_command_queue queue = nullptr;
  ~ClDevice();
  bool ok() const { return queue != nullptr; }
};

// Opens the first device of the named platform; props are the queue's properties.
bool OpenDevice(const std::string& platform, ClDevice& out, cl_command_queue_properties props = 0);

// Builds `source`; returns nullptr and fills `log` on failure.
cl_program BuildProgram(const ClDevice& d, const std::string& source, std::string* log = nullptr,
                        const char* options = "");

std::string BuildLog(cl_program p, cl_device_id d);

// Runs a shell command (inheriting this process's environment, so the loader finds gmux) and
// returns its exit status (-1 when it did not exit normally); stdout and stderr go to `out`.
int RunShell(const std::string& cmd, std::string& out);

// Whether the environment variable `name` is set to `value`.
bool EnvIs(const char* name, const char* value);

// Whether the tests should take fewer iterations and sizes: set (GMUX_TEST_FEW_ITERATIONS) by
// scripts/test.sh's tsan stage, where the instrumented processes run many times slower.
bool FewIterations();

// The address ranges [from, to) of this process's mappings of buffers on shared memory (memfds
// named "gmux-buffer": icd/connection.h, CreateStorage).
std::vector<std::pair<uintptr_t, uintptr_t>> StorageMappings();
// The memfds (inode numbers) behind those mappings.
std::set<uint64_t> StorageFiles();

// The platforms compared by every program test.
inline const char* kGmux = "gmux";
inline const char* kNative = "Portable Computing Language";

}  // namespace gmux::testing
