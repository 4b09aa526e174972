// OpenCL conformance of the gmux ICD (docs/conformance.md): each behaviour is run through gmux
// and, where the backend offers it, directly on the backend, and the answers compared.
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <capnp/any.h>
#include <capnp/message.h>
#include <gtest/gtest.h>

#include <algorithm>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "proto/frame.h"
#include "runtime/runtime_env.h"

namespace gmux::testing {
namespace {

// ---- kernels with many arguments ----

constexpr int kManyArgs = 40;

// One kernel of kManyArgs `__global int*` arguments: a<k>[i] = a<k>[i] * 2 + k.
std::string ManyBufferArgsSource() {
  std::string s = "__kernel void many(";
  for (int k = 0; k < kManyArgs; ++k) {
    s += (k ? ", " : "") + std::string("__global int* a") + std::to_string(k);
  }
  s += ") {\n  int i = get_global_id(0);\n";
  for (int k = 0; k < kManyArgs; ++k) {
    s += "  a" + std::to_string(k) + "[i] = a" + std::to_string(k) + "[i] * 2 + " +
         std::to_string(k) + ";\n";
  }
  return s + "}\n";
}

// One kernel of an output buffer and kManyArgs int scalars: out[i] = i + sum of k * s<k>.
std::string ManyScalarArgsSource() {
  std::string s = "__kernel void scalars(__global int* out";
  for (int k = 0; k < kManyArgs; ++k) s += ", int s" + std::to_string(k);
  s += ") {\n  int i = get_global_id(0);\n  int acc = i;\n";
  for (int k = 0; k < kManyArgs; ++k) {
    s += "  acc += " + std::to_string(k) + " * s" + std::to_string(k) + ";\n";
  }
  return s + "  out[i] = acc;\n}\n";
}

struct ManyArgsResult {
  std::vector<std::vector<int>> buffers;   // each argument's buffer after the launch
  std::vector<int> scalar_out;
  std::vector<std::string> arg_names;      // CL_KERNEL_ARG_NAME per argument
  std::vector<std::string> arg_types;      // CL_KERNEL_ARG_TYPE_NAME
  std::vector<cl_uint> arg_qualifiers;     // CL_KERNEL_ARG_ADDRESS_QUALIFIER
};

std::string ArgInfoString(cl_kernel k, cl_uint i, cl_kernel_arg_info param) {
  size_t n = 0;
  EXPECT_EQ(clGetKernelArgInfo(k, i, param, 0, nullptr, &n), CL_SUCCESS) << "arg " << i;
  std::string s(n, '\0');
  EXPECT_EQ(clGetKernelArgInfo(k, i, param, n, s.data(), nullptr), CL_SUCCESS) << "arg " << i;
  return std::string(s.c_str());
}

ManyArgsResult RunManyArgs(const char* platform) {
  ManyArgsResult out;
  ClDevice d;
  EXPECT_TRUE(OpenDevice(platform, d)) << platform;
  if (!d.ok()) return out;
  const size_t n = 256;
  std::string log;
  cl_program p = BuildProgram(d, ManyBufferArgsSource() + ManyScalarArgsSource(), &log,
                              "-cl-kernel-arg-info");
  EXPECT_NE(p, nullptr) << log;
  if (p == nullptr) return out;
  cl_int err = CL_SUCCESS;
  cl_kernel k = clCreateKernel(p, "many", &err);
  EXPECT_EQ(err, CL_SUCCESS) << platform;
  if (k == nullptr) {
    clReleaseProgram(p);
    return out;
  }
  cl_uint nargs = 0;
  EXPECT_EQ(clGetKernelInfo(k, CL_KERNEL_NUM_ARGS, sizeof(nargs), &nargs, nullptr), CL_SUCCESS);
  EXPECT_EQ(nargs, static_cast<cl_uint>(kManyArgs));
  std::vector<cl_mem> bufs;
  for (int a = 0; a < kManyArgs; ++a) {
    std::vector<int> init(n);
    for (size_t i = 0; i < n; ++i) init[i] = static_cast<int>(i) * (a + 1);
    cl_mem b = clCreateBuffer(d.context, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR,
                              n * sizeof(int), init.data(), &err);
    EXPECT_EQ(err, CL_SUCCESS);
    bufs.push_back(b);
    EXPECT_EQ(clSetKernelArg(k, static_cast<cl_uint>(a), sizeof(cl_mem), &b), CL_SUCCESS)
        << "arg " << a;
  }
  EXPECT_EQ(clEnqueueNDRangeKernel(d.queue, k, 1, nullptr, &n, nullptr, 0, nullptr, nullptr),
            CL_SUCCESS);
  for (int a = 0; a < kManyArgs; ++a) {
    std::vector<int> v(n);
    EXPECT_EQ(clEnqueueReadBuffer(d.queue, bufs[a], CL_TRUE, 0, n * sizeof(int), v.data(), 0,
                                  nullptr, nullptr),
              CL_SUCCESS);
    out.buffers.push_back(std::move(v));
  }
  for (cl_uint a = 0; a < nargs; ++a) {
    out.arg_names.push_back(ArgInfoString(k, a, CL_KERNEL_ARG_NAME));
    out.arg_types.push_back(ArgInfoString(k, a, CL_KERNEL_ARG_TYPE_NAME));
    cl_kernel_arg_address_qualifier q = 0;
    EXPECT_EQ(clGetKernelArgInfo(k, a, CL_KERNEL_ARG_ADDRESS_QUALIFIER, sizeof(q), &q, nullptr),
              CL_SUCCESS);
    out.arg_qualifiers.push_back(q);
  }

  cl_kernel ks = clCreateKernel(p, "scalars", &err);
  EXPECT_EQ(err, CL_SUCCESS);
  cl_mem o = clCreateBuffer(d.context, CL_MEM_WRITE_ONLY, n * sizeof(int), nullptr, &err);
  EXPECT_EQ(clSetKernelArg(ks, 0, sizeof(cl_mem), &o), CL_SUCCESS);
  for (int a = 0; a < kManyArgs; ++a) {
    int v = a + 3;
    EXPECT_EQ(clSetKernelArg(ks, static_cast<cl_uint>(a + 1), sizeof(int), &v), CL_SUCCESS);
  }
  EXPECT_EQ(clEnqueueNDRangeKernel(d.queue, ks, 1, nullptr, &n, nullptr, 0, nullptr, nullptr),
            CL_SUCCESS);
  out.scalar_out.resize(n);
  EXPECT_EQ(clEnqueueReadBuffer(d.queue, o, CL_TRUE, 0, n * sizeof(int), out.scalar_out.data(), 0,
                                nullptr, nullptr),
            CL_SUCCESS);
  clReleaseMemObject(o);
  clReleaseKernel(ks);
  for (cl_mem b : bufs) clReleaseMemObject(b);
  clReleaseKernel(k);
  clReleaseProgram(p);
  return out;
}

TEST(ConformanceTest, KernelWithManyArgumentsMatchesNative) {
  ManyArgsResult g = RunManyArgs(kGmux);
  ManyArgsResult nat = RunManyArgs(kNative);
  ASSERT_EQ(g.buffers.size(), static_cast<size_t>(kManyArgs));
  ASSERT_EQ(nat.buffers.size(), static_cast<size_t>(kManyArgs));
  for (int a = 0; a < kManyArgs; ++a) {
    ASSERT_EQ(g.buffers[a].size(), nat.buffers[a].size());
    EXPECT_EQ(g.buffers[a], nat.buffers[a]) << "argument " << a;
    for (size_t i = 0; i < g.buffers[a].size(); ++i) {
      ASSERT_EQ(g.buffers[a][i], static_cast<int>(i) * (a + 1) * 2 + a) << a << " " << i;
    }
  }
  EXPECT_EQ(g.arg_names, nat.arg_names);
  EXPECT_EQ(g.arg_types, nat.arg_types);
  EXPECT_EQ(g.arg_qualifiers, nat.arg_qualifiers);
  ASSERT_EQ(g.arg_names.size(), static_cast<size_t>(kManyArgs));
  for (int a = 0; a < kManyArgs; ++a) {
    EXPECT_EQ(g.arg_names[a], "a" + std::to_string(a));
    EXPECT_EQ(g.arg_qualifiers[a], static_cast<cl_uint>(CL_KERNEL_ARG_ADDRESS_GLOBAL));
  }
  EXPECT_EQ(g.scalar_out, nat.scalar_out);
  int sum = 0;
  for (int a = 0; a < kManyArgs; ++a) sum += a * (a + 3);
  ASSERT_FALSE(g.scalar_out.empty());
  EXPECT_EQ(g.scalar_out[7], 7 + sum);
}

// ---- CL_MEM_FLAGS ----

std::vector<cl_mem_flags> MemFlags(const char* platform) {
  std::vector<cl_mem_flags> out;
  ClDevice d;
  EXPECT_TRUE(OpenDevice(platform, d)) << platform;
  if (!d.ok()) return out;
  static int host[256];
  cl_int err = CL_SUCCESS;
  auto flags_of = [&](cl_mem m) {
    cl_mem_flags f = 0;
    EXPECT_NE(m, nullptr);
    if (m != nullptr) {
      EXPECT_EQ(clGetMemObjectInfo(m, CL_MEM_FLAGS, sizeof(f), &f, nullptr), CL_SUCCESS);
    }
    out.push_back(f);
  };
  std::vector<cl_mem> all;
  auto buffer = [&](cl_mem_flags f, void* ptr) {
    cl_mem m = clCreateBuffer(d.context, f, sizeof(host), ptr, &err);
    EXPECT_EQ(err, CL_SUCCESS) << "flags " << f;
    flags_of(m);
    all.push_back(m);
    return m;
  };
  cl_mem copy_rw = buffer(CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, host);
  cl_mem rw_host_ro = buffer(CL_MEM_READ_WRITE | CL_MEM_HOST_READ_ONLY, nullptr);
  cl_mem use_ro = buffer(CL_MEM_READ_ONLY | CL_MEM_USE_HOST_PTR, host);
  buffer(CL_MEM_WRITE_ONLY | CL_MEM_ALLOC_HOST_PTR | CL_MEM_HOST_NO_ACCESS, nullptr);
  cl_buffer_region region{0, 64};
  auto sub = [&](cl_mem parent, cl_mem_flags f) {
    cl_mem m = clCreateSubBuffer(parent, f, CL_BUFFER_CREATE_TYPE_REGION, &region, &err);
    EXPECT_EQ(err, CL_SUCCESS) << "sub-buffer flags " << f;
    flags_of(m);
    all.push_back(m);
  };
  sub(copy_rw, 0);
  sub(copy_rw, CL_MEM_READ_ONLY);
  sub(rw_host_ro, CL_MEM_HOST_READ_ONLY);
  sub(rw_host_ro, 0);
  sub(use_ro, 0);
  for (auto it = all.rbegin(); it != all.rend(); ++it) clReleaseMemObject(*it);
  return out;
}

TEST(ConformanceTest, MemFlagsAreTheApplicationsAsNative) {
  auto g = MemFlags(kGmux);
  auto nat = MemFlags(kNative);
  EXPECT_EQ(g, nat);
  ASSERT_EQ(g.size(), 9u);
  EXPECT_EQ(g[0], static_cast<cl_mem_flags>(CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR));
  EXPECT_EQ(g[1], static_cast<cl_mem_flags>(CL_MEM_READ_WRITE | CL_MEM_HOST_READ_ONLY));
  EXPECT_EQ(g[2], static_cast<cl_mem_flags>(CL_MEM_READ_ONLY | CL_MEM_USE_HOST_PTR));
  // Sub-buffers inherit the access flags they do not give and the host pointer flags.
  EXPECT_EQ(g[4], static_cast<cl_mem_flags>(CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR));
  EXPECT_EQ(g[5], static_cast<cl_mem_flags>(CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR));
  EXPECT_EQ(g[6], static_cast<cl_mem_flags>(CL_MEM_READ_WRITE | CL_MEM_HOST_READ_ONLY));
  EXPECT_EQ(g[7], static_cast<cl_mem_flags>(CL_MEM_READ_WRITE | CL_MEM_HOST_READ_ONLY));
}

// ---- host access flags (CL_MEM_HOST_*) ----

// The error codes of host transfers and maps on buffers and a sub-buffer created with each host
// access flag, and the data a kernel-free round trip leaves (written where allowed, then read
// where allowed), on `platform`. Sub-buffer flags that contradict the parent's come last.
std::vector<cl_int> HostAccess(const char* platform) {
  ClDevice d;
  EXPECT_TRUE(OpenDevice(platform, d)) << platform;
  if (!d.ok()) return {};
  std::vector<cl_int> out;
  cl_int err = CL_SUCCESS;
  std::vector<int> data(64, 7), back(64, 0);
  const size_t bytes = data.size() * sizeof(int);
  for (cl_mem_flags host : {cl_mem_flags{0}, cl_mem_flags{CL_MEM_HOST_READ_ONLY},
                            cl_mem_flags{CL_MEM_HOST_WRITE_ONLY},
                            cl_mem_flags{CL_MEM_HOST_NO_ACCESS}}) {
    cl_mem parent = clCreateBuffer(d.context, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR | host,
                                   2 * bytes, std::vector<int>(128, 3).data(), &err);
    EXPECT_EQ(err, CL_SUCCESS);
    cl_buffer_region region{bytes, bytes};
    cl_mem sub = clCreateSubBuffer(parent, 0, CL_BUFFER_CREATE_TYPE_REGION, &region, &err);
    EXPECT_EQ(err, CL_SUCCESS);
    for (cl_mem m : {parent, sub}) {
      out.push_back(clEnqueueWriteBuffer(d.queue, m, CL_TRUE, 0, bytes, data.data(), 0, nullptr,
                                         nullptr));
      std::fill(back.begin(), back.end(), 0);
      out.push_back(clEnqueueReadBuffer(d.queue, m, CL_TRUE, 0, bytes, back.data(), 0, nullptr,
                                        nullptr));
      out.push_back(back[5]);  // 7 written, 3 from creation, 0 not read
      for (cl_map_flags mf : {cl_map_flags{CL_MAP_READ}, cl_map_flags{CL_MAP_WRITE},
                              cl_map_flags{CL_MAP_WRITE_INVALIDATE_REGION}}) {
        cl_int merr = CL_SUCCESS;
        void* p = clEnqueueMapBuffer(d.queue, m, CL_TRUE, mf, 0, bytes, 0, nullptr, nullptr, &merr);
        out.push_back(merr);
        if (p != nullptr) {
          if (mf == CL_MAP_READ) out.push_back(static_cast<int*>(p)[5]);
          EXPECT_EQ(clEnqueueUnmapMemObject(d.queue, m, p, 0, nullptr, nullptr), CL_SUCCESS);
        }
      }
      EXPECT_EQ(clFinish(d.queue), CL_SUCCESS);
    }
    clReleaseMemObject(sub);
    clReleaseMemObject(parent);
  }
  // A sub-buffer cannot get back host access its parent denies.
  for (auto [p, s] : {std::pair<cl_mem_flags, cl_mem_flags>{CL_MEM_HOST_WRITE_ONLY, CL_MEM_HOST_READ_ONLY},
                      {CL_MEM_HOST_READ_ONLY, CL_MEM_HOST_WRITE_ONLY},
                      {CL_MEM_HOST_NO_ACCESS, CL_MEM_HOST_READ_ONLY},
                      {CL_MEM_HOST_READ_ONLY, CL_MEM_HOST_READ_ONLY}}) {
    cl_mem parent = clCreateBuffer(d.context, CL_MEM_READ_WRITE | p, bytes, nullptr, &err);
    cl_buffer_region region{0, bytes};
    cl_mem sub = clCreateSubBuffer(parent, s, CL_BUFFER_CREATE_TYPE_REGION, &region, &err);
    out.push_back(err);
    if (sub != nullptr) clReleaseMemObject(sub);
    clReleaseMemObject(parent);
  }
  return out;
}

TEST(ConformanceTest, HostAccessFlagsRefuseTheHostAsNativelyAndKeepTheData) {
  auto g = HostAccess(kGmux);
  auto nat = HostAccess(kNative);
  EXPECT_EQ(g, nat);
  ASSERT_FALSE(g.empty());
  // No flag: write, read (7), three maps, the read map seeing 7; for buffer and sub-buffer.
  const std::vector<cl_int> open{CL_SUCCESS, CL_SUCCESS, 7, CL_SUCCESS, 7, CL_SUCCESS, CL_SUCCESS};
  EXPECT_EQ(std::vector<cl_int>(g.begin(), g.begin() + 7), open);
  // CL_MEM_HOST_READ_ONLY: the write is refused, the read sees the creation data.
  const std::vector<cl_int> read_only{CL_INVALID_OPERATION, CL_SUCCESS, 3, CL_SUCCESS, 3,
                                      CL_INVALID_OPERATION, CL_INVALID_OPERATION};
  EXPECT_EQ(std::vector<cl_int>(g.begin() + 14, g.begin() + 21), read_only);
  EXPECT_EQ(std::vector<cl_int>(g.end() - 4, g.end()),
            (std::vector<cl_int>{CL_INVALID_VALUE, CL_INVALID_VALUE, CL_INVALID_VALUE, CL_SUCCESS}));
}

// ---- clSetMemObjectDestructorCallback ----

struct DestructorLog {
  std::mutex mu;
  std::vector<int> order;
};
struct DestructorTag {
  DestructorLog* log;
  int n;
};

void CL_CALLBACK OnDestroy(cl_mem, void* user) {
  auto* t = static_cast<DestructorTag*>(user);
  std::lock_guard<std::mutex> lock(t->log->mu);
  t->log->order.push_back(t->n);
}

// The order the callbacks ran in; `early` receives what had run before the last release.
std::vector<int> DestructorOrder(const char* platform, std::vector<int>& early) {
  ClDevice d;
  EXPECT_TRUE(OpenDevice(platform, d)) << platform;
  if (!d.ok()) return {};
  DestructorLog log;
  DestructorTag tags[3] = {{&log, 1}, {&log, 2}, {&log, 3}};
  cl_int err = CL_SUCCESS;
  cl_mem m = clCreateBuffer(d.context, CL_MEM_READ_WRITE, 4096, nullptr, &err);
  EXPECT_EQ(err, CL_SUCCESS);
  EXPECT_EQ(clSetMemObjectDestructorCallback(nullptr, OnDestroy, &tags[0]),
            CL_INVALID_MEM_OBJECT);
  EXPECT_EQ(clSetMemObjectDestructorCallback(m, nullptr, nullptr), CL_INVALID_VALUE);
  for (auto& t : tags) EXPECT_EQ(clSetMemObjectDestructorCallback(m, OnDestroy, &t), CL_SUCCESS);
  EXPECT_EQ(clRetainMemObject(m), CL_SUCCESS);
  EXPECT_EQ(clReleaseMemObject(m), CL_SUCCESS);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  {
    std::lock_guard<std::mutex> lock(log.mu);
    early = log.order;
  }
  EXPECT_EQ(clReleaseMemObject(m), CL_SUCCESS);
  // Implementations may run them on another thread: wait for them a while.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(log.mu);
      if (log.order.size() >= 3 || std::chrono::steady_clock::now() > deadline) return log.order;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

TEST(ConformanceTest, MemDestructorCallbacksRunInReverseOrderAtTheLastRelease) {
  std::vector<int> g_early, nat_early;
  auto g = DestructorOrder(kGmux, g_early);
  auto nat = DestructorOrder(kNative, nat_early);
  EXPECT_EQ(nat, (std::vector<int>{3, 2, 1}));
  EXPECT_EQ(g, (std::vector<int>{3, 2, 1}));
  EXPECT_TRUE(g_early.empty());
  EXPECT_TRUE(nat_early.empty());
}

// ---- native kernels ----

void CL_CALLBACK NativeFn(void* args) { *static_cast<int**>(args)[0] += 1; }

TEST(ConformanceTest, NativeKernelsAreNotOfferedThroughGmux) {
  ClDevice g;
  ASSERT_TRUE(OpenDevice(kGmux, g));
  cl_device_exec_capabilities caps = 0;
  ASSERT_EQ(clGetDeviceInfo(g.device, CL_DEVICE_EXECUTION_CAPABILITIES, sizeof(caps), &caps,
                            nullptr),
            CL_SUCCESS);
  EXPECT_EQ(caps & CL_EXEC_NATIVE_KERNEL, 0u);
  EXPECT_NE(caps & CL_EXEC_KERNEL, 0u);
  int counter = 0;
  int* arg = &counter;
  EXPECT_EQ(clEnqueueNativeKernel(g.queue, NativeFn, &arg, sizeof(arg), 0, nullptr, nullptr, 0,
                                  nullptr, nullptr),
            CL_INVALID_OPERATION);
  EXPECT_EQ(clEnqueueNativeKernel(nullptr, NativeFn, &arg, sizeof(arg), 0, nullptr, nullptr, 0,
                                  nullptr, nullptr),
            CL_INVALID_COMMAND_QUEUE);
  EXPECT_EQ(clFinish(g.queue), CL_SUCCESS);
  EXPECT_EQ(counter, 0);

  // The backend itself runs them (in this process): the capability is gmux's to withhold.
  ClDevice nat;
  ASSERT_TRUE(OpenDevice(kNative, nat));
  cl_device_exec_capabilities native_caps = 0;
  ASSERT_EQ(clGetDeviceInfo(nat.device, CL_DEVICE_EXECUTION_CAPABILITIES, sizeof(native_caps),
                            &native_caps, nullptr),
            CL_SUCCESS);
  EXPECT_EQ(caps, native_caps & ~static_cast<cl_device_exec_capabilities>(CL_EXEC_NATIVE_KERNEL));
  if (native_caps & CL_EXEC_NATIVE_KERNEL) {
    ASSERT_EQ(clEnqueueNativeKernel(nat.queue, NativeFn, &arg, sizeof(arg), 0, nullptr, nullptr,
                                    0, nullptr, nullptr),
              CL_SUCCESS);
    ASSERT_EQ(clFinish(nat.queue), CL_SUCCESS);
    EXPECT_EQ(counter, 1);
  }
}

// ---- decode failures never terminate the program ----
//
// A fake daemon answers the handshake, then every request with a reply that frames and
// validates but whose payload has the wrong type where the ICD reads it (a struct where a list
// is expected), so reading it throws inside the ICD. A child process (a fresh ICD connection)
// calls in; it must get error codes and exit normally.

constexpr const char* kChildEnv = "GMUX_CONFORMANCE_FAKE_DAEMON_CHILD";

// Replaces the reply's one set pointer (the union's, with message unset) by a struct.
void PoisonUnionPointer(proto::wire::Reply::Builder rep) {
  capnp::AnyStruct::Builder any(kj::mv(rep));
  auto ptrs = any.getPointerSection();
  for (unsigned i = 0; i < ptrs.size(); ++i) {
    if (!ptrs[i].isNull()) ptrs[i].initAs<proto::wire::Stats>().setSessions(7);
  }
}

void PoisonList(proto::wire::KernelReply::Builder kr) {
  capnp::AnyStruct::Builder any(kj::mv(kr));
  auto ptrs = any.getPointerSection();
  for (unsigned i = 0; i < ptrs.size(); ++i) ptrs[i].initAs<proto::wire::Stats>().setSessions(7);
}

void ServeFakeDaemon(int listen_fd) {
  pollfd p{listen_fd, POLLIN, 0};
  if (::poll(&p, 1, 60000) != 1) return;
  int fd = ::accept(listen_fd, nullptr, nullptr);
  if (fd < 0) return;
  for (;;) {
    auto msg = proto::ReadFrame(fd, proto::FrameKind::kRequest);
    if (!msg.ok()) break;
    auto req = msg->root<proto::wire::Request>();
    uint64_t seq = req.getSeq();
    if (seq == 0) continue;
    capnp::MallocMessageBuilder b;
    auto rep = b.initRoot<proto::wire::Reply>();
    rep.setSeq(seq);
    rep.setStatus(CL_SUCCESS);
    if (req.isHello()) {
      auto h = rep.initHello();
      h.setProtocolVersion(proto::kProtocolVersion);
      h.setTenant("fake");
      auto d = h.initDevices(1)[0];
      d.setIndex(0);
      d.setName("fake device");
      d.setType(CL_DEVICE_TYPE_GPU);
    } else if (req.isCreateKernel()) {
      auto kr = rep.initKernel();
      kr.setNumArgs(3);
      kr.initArgAddressQualifiers(3);
      PoisonList(kr);
    } else if (req.isGetInfo() || req.isImageFormats()) {
      uint8_t bytes[16] = {};
      rep.setInfo(kj::arrayPtr(bytes, sizeof(bytes)));
      PoisonUnionPointer(rep);
    }
    if (!proto::WriteFrame(fd, proto::FrameKind::kReply, b).ok()) break;
  }
  ::close(fd);
}

TEST(ConformanceTest, UnreadableRepliesBecomeErrorCodesNotATerminatedProgram) {
  std::string path = RuntimeEnv::dir + "/fake-daemon.sock";
  int lfd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(lfd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(::bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(lfd, 4), 0);
  std::thread server(ServeFakeDaemon, lfd);
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::setenv("GMUX_SOCKET", path.c_str(), 1);
    ::setenv("GMUX_TEST_CHILD", "1", 1);
    ::setenv(kChildEnv, "1", 1);
    ::execl("/proc/self/exe", "conformance_test",
            "--gtest_filter=ConformanceFakeDaemonChild.CallsReturnErrors",
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  ::shutdown(lfd, SHUT_RDWR);
  server.join();
  ::close(lfd);
  ASSERT_TRUE(WIFEXITED(status)) << "the client was killed by signal "
                                 << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

// Runs only as the child of the test above.
TEST(ConformanceFakeDaemonChild, CallsReturnErrors) {
  if (std::getenv(kChildEnv) == nullptr) GTEST_SKIP() << "runs as a child of the test above";
  cl_platform_id p = FindPlatform(kGmux);
  ASSERT_NE(p, nullptr);
  cl_device_id d = nullptr;
  ASSERT_EQ(clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 1, &d, nullptr), CL_SUCCESS);
  char name[256] = {};
  cl_int err = clGetDeviceInfo(d, CL_DEVICE_NAME, sizeof(name), name, nullptr);
  EXPECT_NE(err, CL_SUCCESS);
  cl_context ctx = clCreateContext(nullptr, 1, &d, nullptr, nullptr, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  cl_uint nformats = 0;
  EXPECT_NE(clGetSupportedImageFormats(ctx, CL_MEM_READ_ONLY, CL_MEM_OBJECT_IMAGE2D, 0, nullptr,
                                       &nformats),
            CL_SUCCESS);
  const char* src = "__kernel void k(__global int* a) {}";
  cl_program prog = clCreateProgramWithSource(ctx, 1, &src, nullptr, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  ASSERT_EQ(clBuildProgram(prog, 1, &d, "", nullptr, nullptr), CL_SUCCESS);
  cl_kernel k = clCreateKernel(prog, "k", &err);
  EXPECT_EQ(k, nullptr);
  EXPECT_NE(err, CL_SUCCESS);
  clReleaseProgram(prog);
  clReleaseContext(ctx);
}

}  // namespace
}  // namespace gmux::testing
