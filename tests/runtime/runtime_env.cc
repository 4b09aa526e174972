#include "runtime/runtime_env.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "runtime/test_pki.h"

namespace gmux::testing {

std::string RuntimeEnv::dir;
std::string RuntimeEnv::socket;
int RuntimeEnv::daemon_pid = -1;
bool RuntimeEnv::start_daemon = true;
bool RuntimeEnv::tcp = false;
bool RuntimeEnv::tls = false;
int RuntimeEnv::tcp_port = 0;

namespace {

bool CanConnect(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, path.c_str(), sizeof(a.sun_path) - 1);
  bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  ::close(fd);
  return ok;
}

class DaemonEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    // A child process a test started (e.g. with another token) keeps its parent's environment.
    if (std::getenv("GMUX_TEST_CHILD") != nullptr) {
      RuntimeEnv::start_daemon = false;
      return;
    }
    char tmpl[] = "/tmp/gmux-rt-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    RuntimeEnv::dir = tmpl;
    // Tests may run clients under other uids (tenants of their own): they must reach the socket
    // and the vendor dir.
    ::chmod(tmpl, 0755);
    RuntimeEnv::socket = RuntimeEnv::dir + "/gmuxd.sock";
    // Vendor dir: the gmux ICD plus every backend ICD of the system.
    std::string vendors = RuntimeEnv::dir + "/vendors";
    std::filesystem::create_directories(vendors);
    std::ofstream(vendors + "/gmux.icd") << GMUX_ICD_PATH << "\n";
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator("/etc/OpenCL/vendors", ec)) {
      if (e.path().extension() == ".icd") {
        std::filesystem::copy_file(e.path(), vendors + "/" + e.path().filename().string(), ec);
      }
    }
    ::setenv("OCL_ICD_VENDORS", vendors.c_str(), 1);
    ::setenv("GMUX_SOCKET", RuntimeEnv::socket.c_str(), 1);
    if (!RuntimeEnv::start_daemon) return;
    // TCP mode: a config giving the test token its own tenant, and a file for the bound port.
    std::string config = RuntimeEnv::dir + "/gmuxd.toml";
    std::string port_file = RuntimeEnv::dir + "/tcp-port";
    TestPki pki;
    if (RuntimeEnv::tcp) {
      std::ofstream out(config);
      if (RuntimeEnv::tls) {
        // TLS mode: certificates of a test CA, which the ICD is told to trust.
        const std::string err = MakeTestPki(RuntimeEnv::dir + "/pki", &pki);
        ASSERT_EQ(err, "");
        out << "[daemon]\ntls_cert = \"" << pki.server_cert() << "\"\ntls_key = \""
            << pki.server_key() << "\"\n";
      } else {
        out << "[daemon]\nplain_tcp = true\n";
      }
      out << "[[tenant]]\nname = \"" << kTcpTenant << "\"\ntokens = [\"" << kTcpToken
          << "\"]\n";
    }
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      std::string log = RuntimeEnv::dir + "/gmuxd.log";
      int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        ::dup2(fd, 2);
        ::dup2(fd, 1);
      }
      if (RuntimeEnv::tcp) {
        ::execl(GMUXD_PATH, GMUXD_PATH, "--socket", RuntimeEnv::socket.c_str(), "--config",
                config.c_str(), "--listen", "127.0.0.1:0", "--port-file", port_file.c_str(),
                "--exit-after", "600", static_cast<char*>(nullptr));
      } else {
        ::execl(GMUXD_PATH, GMUXD_PATH, "--socket", RuntimeEnv::socket.c_str(), "--exit-after",
                "600", static_cast<char*>(nullptr));
      }
      ::_exit(127);
    }
    RuntimeEnv::daemon_pid = pid;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!CanConnect(RuntimeEnv::socket) ||
           (RuntimeEnv::tcp && !std::filesystem::exists(port_file))) {
      int status = 0;
      ASSERT_EQ(::waitpid(pid, &status, WNOHANG), 0) << "gmuxd exited during start-up";
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "gmuxd did not start";
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (RuntimeEnv::tcp) {
      std::ifstream(port_file) >> RuntimeEnv::tcp_port;
      ASSERT_GT(RuntimeEnv::tcp_port, 0);
      std::string address = (RuntimeEnv::tls ? "127.0.0.1:" : "tcp://127.0.0.1:") +
                            std::to_string(RuntimeEnv::tcp_port);
      if (RuntimeEnv::tls) ::setenv("GMUX_TLS_CA", pki.ca().c_str(), 1);
      ::unsetenv("GMUX_SOCKET");
      ::setenv("GMUX_ADDRESS", address.c_str(), 1);
      ::setenv("GMUX_TOKEN", kTcpToken, 1);
    }
  }

  void TearDown() override {
    if (RuntimeEnv::daemon_pid > 0) {
      ::kill(RuntimeEnv::daemon_pid, SIGTERM);
      int status = 0;
      for (int i = 0; i < 500; ++i) {
        if (::waitpid(RuntimeEnv::daemon_pid, &status, WNOHANG) != 0) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      ::kill(RuntimeEnv::daemon_pid, SIGKILL);
      ::waitpid(RuntimeEnv::daemon_pid, &status, WNOHANG);
    }
    std::error_code ec;
    if (!RuntimeEnv::dir.empty()) std::filesystem::remove_all(RuntimeEnv::dir, ec);
  }
};

}  // namespace

cl_platform_id FindPlatform(const std::string& name) {
  cl_uint n = 0;
  if (clGetPlatformIDs(0, nullptr, &n) != CL_SUCCESS || n == 0) return nullptr;
  std::vector<cl_platform_id> ps(n);
  clGetPlatformIDs(n, ps.data(), nullptr);
  for (auto p : ps) {
    char buf[256] = {};
    clGetPlatformInfo(p, CL_PLATFORM_NAME, sizeof(buf), buf, nullptr);
    if (std::string(buf).find(name) != std::string::npos) return p;
  }
  return nullptr;
}

ClDevice::~ClDevice() {
  if (queue != nullptr) clReleaseCommandQueue(queue);
  if (context != nullptr) clReleaseContext(context);
}

bool OpenDevice(const std::string& platform, ClDevice& out, cl_command_queue_properties props) {
  out.platform = FindPlatform(platform);
  if (out.platform == nullptr) return false;
  if (clGetDeviceIDs(out.platform, CL_DEVICE_TYPE_ALL, 1, &out.device, nullptr) != CL_SUCCESS) {
    return false;
  }
  cl_int err = CL_SUCCESS;
  cl_context_properties cp[] = {CL_CONTEXT_PLATFORM,
                                reinterpret_cast<cl_context_properties>(out.platform), 0};
  out.context = clCreateContext(cp, 1, &out.device, nullptr, nullptr, &err);
  if (out.context == nullptr) return false;
  out.queue = clCreateCommandQueue(out.context, out.device, props, &err);
  return out.queue != nullptr;
}

std::string BuildLog(cl_program p, cl_device_id d) {
  size_t n = 0;
  clGetProgramBuildInfo(p, d, CL_PROGRAM_BUILD_LOG, 0, nullptr, &n);
  std::string log(n, '\0');
  clGetProgramBuildInfo(p, d, CL_PROGRAM_BUILD_LOG, n, log.data(), nullptr);
  return log;
}

cl_program BuildProgram(const ClDevice& d, const std::string& source, std::string* log,
                        const char* options) {
  const char* src = source.c_str();
  cl_int err = CL_SUCCESS;
  cl_program p = clCreateProgramWithSource(d.context, 1, &src, nullptr, &err);
  if (p == nullptr) return nullptr;
  if (clBuildProgram(p, 1, &d.device, options, nullptr, nullptr) != CL_SUCCESS) {
    if (log != nullptr) *log = BuildLog(p, d.device);
    clReleaseProgram(p);
    return nullptr;
  }
  return p;
}

bool EnvIs(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, value) == 0;
}

bool FewIterations() { return std::getenv("GMUX_TEST_FEW_ITERATIONS") != nullptr; }

namespace {

// Each mapping of a buffer on shared memory in /proc/self/maps: its range and its inode.
struct StorageMapping {
  uintptr_t from = 0, to = 0;
  uint64_t inode = 0;
};
std::vector<StorageMapping> ReadStorageMappings() {
  std::vector<StorageMapping> out;
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    if (line.find("memfd:gmux-buffer") == std::string::npos) continue;
    // from-to perms offset dev inode path
    StorageMapping m;
    char dash = 0;
    std::string perms, offset, dev;
    std::istringstream in(line);
    in >> std::hex >> m.from >> dash >> m.to >> perms >> offset >> dev >> std::dec >> m.inode;
    out.push_back(m);
  }
  return out;
}

}  // namespace

std::vector<std::pair<uintptr_t, uintptr_t>> StorageMappings() {
  std::vector<std::pair<uintptr_t, uintptr_t>> out;
  for (const StorageMapping& m : ReadStorageMappings()) out.emplace_back(m.from, m.to);
  return out;
}

std::set<uint64_t> StorageFiles() {
  std::set<uint64_t> out;
  for (const StorageMapping& m : ReadStorageMappings()) out.insert(m.inode);
  return out;
}

int RunShell(const std::string& cmd, std::string& out) {
  FILE* f = ::popen((cmd + " 2>&1").c_str(), "r");
  if (f == nullptr) return -1;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) out.append(buf.data(), n);
  int status = ::pclose(f);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

int RunRuntimeTests(int argc, char** argv, const Variant& variant) {
  ::testing::InitGoogleTest(&argc, argv);
  if (variant.no_shm) ::setenv("GMUX_SHM", "0", 1);
  if (variant.no_data_frames) ::setenv("GMUX_DATA_FRAMES", "0", 1);
  if (variant.no_remote) ::setenv("GMUX_REMOTE_COPY", "0", 1);
  if (variant.no_storage) ::setenv("GMUX_BUFFER_STORAGE", "0", 1);
  if (variant.no_daemon) RuntimeEnv::start_daemon = false;
  RuntimeEnv::tcp = variant.tcp;
  RuntimeEnv::tls = variant.tls;
  ::testing::AddGlobalTestEnvironment(new DaemonEnvironment());
  return RUN_ALL_TESTS();
}

}  // namespace gmux::testing
