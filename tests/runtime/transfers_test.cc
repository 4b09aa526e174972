// Large transfers through gmux: every byte arrives, in both directions, at offsets, through
// blocking and non-blocking calls and map/unmap. Built six times: local clients as they run by
// default (buffers of 64 KiB and more on shared memory, their blocking transfers copied by the
// client; the rest as in transfers_copy_test), transfers_copy_test (GMUX_BUFFER_STORAGE=0:
// reads of 64 KiB to 1 MiB and from 8 MiB, and writes from 4 MiB, copied straight between the
// application and the device by the worker, daemon/remote_copy.h; the others through shared
// memory or the stream), transfers_shm_test (GMUX_REMOTE_COPY=0: no remote copy),
// transfers_inline_test (GMUX_SHM=0: everything inline in the stream, as data frames),
// transfers_inline_messages_test (also GMUX_DATA_FRAMES=0: inline as messages) and
// transfers_tcp_test (over TLS).
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "runtime/runtime_env.h"

namespace gmux::testing {
namespace {

std::vector<uint32_t> Pattern(size_t n, uint32_t seed) {
  std::vector<uint32_t> v(n);
  uint32_t x = seed;
  for (auto& e : v) {
    x = x * 1664525u + 1013904223u;
    e = x;
  }
  return v;
}

// Whether this build's small buffers take arenas (docs/protocol.md, "Buffers on shared memory").
bool ArenasApply() {
  return !RuntimeEnv::tcp && !EnvIs("GMUX_SHM", "0") && !EnvIs("GMUX_BUFFER_STORAGE", "0") &&
         !EnvIs("GMUX_STORAGE_ARENAS", "0");
}

// A kernel that keeps the device busy for `n` rounds per work-item.
constexpr const char* kSlowKernel = R"(
    __kernel void slow(__global uint* x, uint n) {
      uint acc = get_global_id(0);
      for (uint i = 0; i < n; ++i) acc = acc * 1664525u + 1013904223u;
      x[get_global_id(0)] = acc;
    })";

// Replies come through a ring of shared memory where the session may use shared memory at all
// (docs/protocol.md, "Replies through shared memory"); every test of this file then reads its
// replies, read data and errors through it in those builds, and through the socket in the
// others. Small reads of many sizes, each a reply, cross the ring's wrap many times.
TEST(TransfersTest, RepliesComeThroughSharedMemoryWhereTheSessionMayUseIt) {
  ClDevice d;
  ASSERT_TRUE(OpenDevice(kGmux, d));
  bool ring = false;
  {
    std::ifstream maps("/proc/self/maps");
    for (std::string line; std::getline(maps, line);) {
      if (line.find("memfd:gmux-replies") != std::string::npos) ring = true;
    }
  }
  EXPECT_EQ(ring, !RuntimeEnv::tcp && !EnvIs("GMUX_SHM", "0") && !EnvIs("GMUX_REPLY_RING", "0"));
  // Requests likewise (docs/protocol.md, "Requests through shared memory"): every test of
  // this file sends its requests, inline data and descriptors through it in those builds.
  bool request_ring = false;
  {
    std::ifstream maps("/proc/self/maps");
    for (std::string line; std::getline(maps, line);) {
      if (line.find("memfd:gmux-requests") != std::string::npos) request_ring = true;
    }
  }
  EXPECT_EQ(request_ring, !RuntimeEnv::tcp && !EnvIs("GMUX_SHM", "0") &&
                              !EnvIs("GMUX_REQUEST_RING", "0"));
  cl_int err;
  constexpr size_t kWords = 16384;  // 64 KiB: reads of it come as a reply each
  auto src = Pattern(kWords, 5);
  cl_mem m = clCreateBuffer(d.context, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, kWords * 4,
                            src.data(), &err);
  ASSERT_EQ(err, CL_SUCCESS);
  size_t total = 0;
  for (size_t round = 0; total < (3u << 20); ++round) {
    const size_t words = 1 + (round * 7919) % (kWords - 1);
    const size_t at = (round * 104729) % (kWords - words + 1);
    std::vector<uint32_t> back(words, 0);
    // With an event, so the worker answers it (not the client's copy from shared memory).
    cl_event ev = nullptr;
    ASSERT_EQ(clEnqueueReadBuffer(d.queue, m, CL_TRUE, at * 4, words * 4, back.data(), 0,
                                  nullptr, &ev),
              CL_SUCCESS);
    clReleaseEvent(ev);
    ASSERT_TRUE(std::equal(back.begin(), back.end(), src.begin() + static_cast<long>(at)))
        << "round " << round;
    total += words * 4;
  }
  clReleaseMemObject(m);
}

TEST(TransfersTest, LargeWritesAndReadsArriveIntact) {
  ClDevice d;
  ASSERT_TRUE(OpenDevice(kGmux, d));
  const size_t n = (9u << 20) / 4 + 3;  // 9 MiB + 12 bytes: several chunks, not word-multiple
  auto src = Pattern(n, 7);
  cl_int err;
  cl_mem m = clCreateBuffer(d.context, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, n * 4, src.data(), &err);
  ASSERT_EQ(err, CL_SUCCESS);
  std::vector<uint32_t> back(n, 0);
  ASSERT_EQ(clEnqueueReadBuffer(d.queue, m, CL_TRUE, 0, n * 4, back.data(), 0, nullptr, nullptr), CL_SUCCESS);
  ASSERT_EQ(back, src);

  auto src2 = Pattern(n / 2, 11);
  ASSERT_EQ(clEnqueueWriteBuffer(d.queue, m, CL_FALSE, 4 * 1001, src2.size() * 4, src2.data(), 0, nullptr,
                                 nullptr), CL_SUCCESS);
  std::vector<uint32_t> part(n / 2, 0);
  cl_event ev;
  ASSERT_EQ(clEnqueueReadBuffer(d.queue, m, CL_FALSE, 4 * 1001, part.size() * 4, part.data(), 0, nullptr, &ev),
            CL_SUCCESS);
  ASSERT_EQ(clWaitForEvents(1, &ev), CL_SUCCESS);
  clReleaseEvent(ev);
  EXPECT_EQ(part, src2);

  auto* mapped = static_cast<uint32_t*>(clEnqueueMapBuffer(d.queue, m, CL_TRUE, CL_MAP_READ | CL_MAP_WRITE, 0,
                                                           n * 4, 0, nullptr, nullptr, &err));
  ASSERT_EQ(err, CL_SUCCESS);
  EXPECT_EQ(mapped[0], src[0]);
  EXPECT_EQ(mapped[1001], src2[0]);
  for (size_t i = 0; i < n; i += 4096) mapped[i] = static_cast<uint32_t>(i);
  ASSERT_EQ(clEnqueueUnmapMemObject(d.queue, m, mapped, 0, nullptr, nullptr), CL_SUCCESS);
  ASSERT_EQ(clEnqueueReadBuffer(d.queue, m, CL_TRUE, 0, n * 4, back.data(), 0, nullptr, nullptr), CL_SUCCESS);
  for (size_t i = 0; i < n; i += 4096) ASSERT_EQ(back[i], static_cast<uint32_t>(i));
  EXPECT_EQ(back[1], src[1]);
  ASSERT_EQ(clFinish(d.queue), CL_SUCCESS);
  clReleaseMemObject(m);
}

// A buffer size of 1 MiB plus a step of 4 KiB new to this process: the ICD keeps released
// buffers' memory for the next buffer of the same size, so a test that counts mappings must not
// meet memory an earlier test in the same process left (gtest_repeat, one process for all).
size_t FreshStorageBytes() {
  static std::atomic<size_t> step{0};
  return (1u << 20) + 4096 * step.fetch_add(1);
}

// Resident bytes of other processes' mappings of the memfd `inode` (the worker's mapping of a
// buffer's storage), from /proc/PID/smaps; -1 when no other process maps it.
long long PeerResidentBytes(uint64_t inode) {
  long long total = -1;
  const std::string self = std::to_string(::getpid());
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string pid = e.path().filename().string();
    if (pid == self || pid.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream smaps(e.path() / "smaps");
    bool ours = false;
    for (std::string line; std::getline(smaps, line);) {
      if (line.find("memfd:gmux-buffer") != std::string::npos) {
        // from-to perms offset dev inode path
        std::istringstream in(line);
        std::string range, perms, offset, dev;
        uint64_t ino = 0;
        in >> range >> perms >> offset >> dev >> ino;
        ours = ino == inode;
      } else if (ours && line.rfind("Rss:", 0) == 0) {
        total = std::max(total, 0LL) + std::atoll(line.c_str() + 4) * 1024;
        ours = false;
      }
    }
  }
  return total;
}

// The elements of `after` not in `before`.
std::set<uint64_t> Added(const std::set<uint64_t>& before, const std::set<uint64_t>& after) {
  std::set<uint64_t> out;
  for (uint64_t x : after) {
    if (before.count(x) == 0) out.insert(x);
  }
  return out;
}

// What slow_next computes: 300 steps of the pattern's generator, plus k.
uint32_t SlowNext(uint32_t x, uint32_t k) {
  for (int j = 0; j < 300; ++j) x = x * 1664525u + 1013904223u;
  return x + k;
}

// Buffers on shared memory (docs/protocol.md): a local client's buffers of 64 KiB and more are
// the worker's buffers themselves, and a blocking transfer with nothing in flight is the
// client's own copy. Queue order must hold all the same: a blocking read behind a running kernel
// sees its results, a blocking write behind a kernel still reading the buffer does not change
// what the kernel reads, a read waiting on another queue's event sees that command's writes, and
// the initial contents of CL_MEM_COPY_HOST_PTR, sub-buffers at odd offsets and out-of-order
// queues come out right. The kernel takes tens of milliseconds, so a copy that did not wait
// would be caught. In every variant (the copying paths when buffers are not on shared memory).
TEST(TransfersTest, BuffersOnSharedMemoryKeepQueueOrder) {
  ClDevice d;
  ASSERT_TRUE(OpenDevice(kGmux, d));
  const bool expect_storage =
      !RuntimeEnv::tcp && !EnvIs("GMUX_SHM", "0") && !EnvIs("GMUX_BUFFER_STORAGE", "0");
  const size_t n = FreshStorageBytes() / 4;
  auto a = Pattern(n, 1);
  const size_t before = StorageMappings().size();
  cl_int err;
  cl_mem ma = clCreateBuffer(d.context, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, n * 4, a.data(),
                             &err);
  ASSERT_EQ(err, CL_SUCCESS);
  cl_mem mb = clCreateBuffer(d.context, CL_MEM_READ_WRITE, n * 4, nullptr, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  EXPECT_EQ(StorageMappings().size() - before, expect_storage ? 2u : 0u);
  std::string log;
  cl_program p = BuildProgram(d, R"(
    __kernel void slow_next(__global const uint* a, __global uint* b, uint k) {
      size_t i = get_global_id(0);
      uint x = a[i];
      for (int j = 0; j < 300; ++j) x = x * 1664525u + 1013904223u;
      b[i] = x + k;
    })", &log);
  ASSERT_NE(p, nullptr) << log;
  cl_kernel kern = clCreateKernel(p, "slow_next", &err);
  ASSERT_EQ(err, CL_SUCCESS);
  auto launch = [&](cl_command_queue q, cl_mem in, cl_mem out, uint32_t k, cl_event* ev) {
    clSetKernelArg(kern, 0, sizeof(cl_mem), &in);
    clSetKernelArg(kern, 1, sizeof(cl_mem), &out);
    clSetKernelArg(kern, 2, sizeof(k), &k);
    size_t global = n;
    return clEnqueueNDRangeKernel(q, kern, 1, nullptr, &global, nullptr, 0, nullptr, ev);
  };
  auto expect = [&](const std::vector<uint32_t>& in, uint32_t k, const std::vector<uint32_t>& got,
                    const char* what) {
    size_t bad = 0;
    for (size_t i = 0; i < n; ++i) bad += got[i] != SlowNext(in[i], k);
    EXPECT_EQ(bad, 0u) << what;
  };
  std::vector<uint32_t> got(n, 0);

  // A blocking read behind a kernel in flight waits for it.
  ASSERT_EQ(launch(d.queue, ma, mb, 1, nullptr), CL_SUCCESS);
  ASSERT_EQ(clEnqueueReadBuffer(d.queue, mb, CL_TRUE, 0, n * 4, got.data(), 0, nullptr, nullptr),
            CL_SUCCESS);
  expect(a, 1, got, "read behind a kernel");

  // A blocking write behind a kernel still reading the buffer: the kernel reads the old data.
  auto a2 = Pattern(n, 2);
  ASSERT_EQ(launch(d.queue, ma, mb, 2, nullptr), CL_SUCCESS);
  ASSERT_EQ(clEnqueueWriteBuffer(d.queue, ma, CL_TRUE, 0, n * 4, a2.data(), 0, nullptr, nullptr),
            CL_SUCCESS);
  ASSERT_EQ(clEnqueueReadBuffer(d.queue, mb, CL_TRUE, 0, n * 4, got.data(), 0, nullptr, nullptr),
            CL_SUCCESS);
  expect(a, 2, got, "kernel behind which a blocking write was made");
  ASSERT_EQ(clEnqueueReadBuffer(d.queue, ma, CL_TRUE, 0, n * 4, got.data(), 0, nullptr, nullptr),
            CL_SUCCESS);
  EXPECT_TRUE(got == a2);

  // Nothing in flight: written and read by the client alone, then used by a kernel.
  ASSERT_EQ(clFinish(d.queue), CL_SUCCESS);
  auto a3 = Pattern(n, 3);
  ASSERT_EQ(clEnqueueWriteBuffer(d.queue, ma, CL_TRUE, 0, n * 4, a3.data(), 0, nullptr, nullptr),
            CL_SUCCESS);
  ASSERT_EQ(launch(d.queue, ma, mb, 3, nullptr), CL_SUCCESS);
  ASSERT_EQ(clFinish(d.queue), CL_SUCCESS);
  ASSERT_EQ(clEnqueueReadBuffer(d.queue, mb, CL_TRUE, 0, n * 4, got.data(), 0, nullptr, nullptr),
            CL_SUCCESS);
  expect(a3, 3, got, "kernel after a write with nothing in flight");

  // A sub-buffer at an offset, at an odd offset within it, both directions.
  cl_buffer_region region{4096, (64u << 10) + 4096};
  cl_mem sub = clCreateSubBuffer(ma, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, &region,
                                 &err);
  ASSERT_EQ(err, CL_SUCCESS);
  std::vector<uint8_t> bytes(65001), back(65001, 0);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 7 + 1);
  ASSERT_EQ(clEnqueueWriteBuffer(d.queue, sub, CL_TRUE, 3, bytes.size(), bytes.data(), 0, nullptr,
                                 nullptr), CL_SUCCESS);
  ASSERT_EQ(clEnqueueReadBuffer(d.queue, ma, CL_TRUE, 4096 + 3, back.size(), back.data(), 0,
                                nullptr, nullptr), CL_SUCCESS);
  EXPECT_TRUE(back == bytes);
  uint32_t edge[2] = {0, 0};
  ASSERT_EQ(clEnqueueReadBuffer(d.queue, ma, CL_TRUE, 4092, 4, &edge[0], 0, nullptr, nullptr),
            CL_SUCCESS);
  EXPECT_EQ(edge[0], a3[4092 / 4]);  // untouched before the sub-buffer
  clReleaseMemObject(sub);

  // A read on one queue waiting for a kernel on another.
  cl_command_queue q2 = clCreateCommandQueue(d.context, d.device, 0, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  cl_event done = nullptr;
  ASSERT_EQ(launch(q2, ma, mb, 4, &done), CL_SUCCESS);
  ASSERT_EQ(clFlush(q2), CL_SUCCESS);
  std::vector<uint32_t> cur(n);
  ASSERT_EQ(clEnqueueReadBuffer(d.queue, ma, CL_TRUE, 0, n * 4, cur.data(), 1, &done, nullptr),
            CL_SUCCESS);
  ASSERT_EQ(clEnqueueReadBuffer(d.queue, mb, CL_TRUE, 0, n * 4, got.data(), 1, &done, nullptr),
            CL_SUCCESS);
  expect(cur, 4, got, "read waiting on another queue's kernel");
  clReleaseEvent(done);
  ASSERT_EQ(clFinish(q2), CL_SUCCESS);
  clReleaseCommandQueue(q2);

  // A blocking map behind a kernel sees its results; what is written through a write mapping
  // is what the next kernel reads.
  ASSERT_EQ(launch(d.queue, ma, mb, 6, nullptr), CL_SUCCESS);
  auto* mapped = static_cast<uint32_t*>(clEnqueueMapBuffer(
      d.queue, mb, CL_TRUE, CL_MAP_READ, 0, n * 4, 0, nullptr, nullptr, &err));
  ASSERT_EQ(err, CL_SUCCESS);
  expect(cur, 6, std::vector<uint32_t>(mapped, mapped + n), "map behind a kernel");
  ASSERT_EQ(clEnqueueUnmapMemObject(d.queue, mb, mapped, 0, nullptr, nullptr), CL_SUCCESS);
  auto a4 = Pattern(n, 4);
  mapped = static_cast<uint32_t*>(clEnqueueMapBuffer(d.queue, ma, CL_TRUE, CL_MAP_WRITE, 0, n * 4,
                                                     0, nullptr, nullptr, &err));
  ASSERT_EQ(err, CL_SUCCESS);
  std::memcpy(mapped, a4.data(), n * 4);
  ASSERT_EQ(clEnqueueUnmapMemObject(d.queue, ma, mapped, 0, nullptr, nullptr), CL_SUCCESS);
  ASSERT_EQ(launch(d.queue, ma, mb, 7, nullptr), CL_SUCCESS);
  ASSERT_EQ(clEnqueueReadBuffer(d.queue, mb, CL_TRUE, 0, n * 4, got.data(), 0, nullptr, nullptr),
            CL_SUCCESS);
  expect(a4, 7, got, "kernel after a write mapping");
  cur = a4;

  // An out-of-order queue: ordered by events only.
  cl_command_queue ooo =
      clCreateCommandQueue(d.context, d.device, CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE, &err);
  if (err == CL_SUCCESS) {
    ASSERT_EQ(launch(ooo, ma, mb, 5, &done), CL_SUCCESS);
    ASSERT_EQ(clEnqueueReadBuffer(ooo, mb, CL_TRUE, 0, n * 4, got.data(), 1, &done, nullptr),
              CL_SUCCESS);
    expect(cur, 5, got, "out-of-order queue");
    clReleaseEvent(done);
    ASSERT_EQ(clFinish(ooo), CL_SUCCESS);
    clReleaseCommandQueue(ooo);
  }
  clReleaseKernel(kern);
  clReleaseProgram(p);
  clReleaseMemObject(mb);
  clReleaseMemObject(ma);
  // With nothing in flight, the two buffers' memory may stay for the next buffers of their
  // size (ReleasedBufferMemoryIsReusedOnlyWhenNothingCanWriteIt), and nothing more.
  EXPECT_LE(StorageMappings().size(), before + 2);
}

// Several threads at once, each with its own queue, making buffers of many sizes (each of
// 64 KiB or more on a memfd of its own, smaller ones in arenas: requests with descriptors),
// writing them, running a kernel on them and reading them back. Through a request ring every
// descriptor travels beside the ring and must reach the request it came with, whichever thread
// sent it.
TEST(TransfersTest, ThreadsSendingDescriptorsAtOnceEachGetTheirOwnData) {
  ClDevice d;
  ASSERT_TRUE(OpenDevice(kGmux, d));
  std::string log;
  cl_program p = BuildProgram(d, R"(
    __kernel void add(__global uint* b, uint k) { b[get_global_id(0)] += k; })", &log);
  ASSERT_NE(p, nullptr) << log;
  constexpr int kThreads = 4;
  constexpr int kRounds = 16;
  std::vector<std::string> failures(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      cl_int err;
      cl_command_queue q = clCreateCommandQueue(d.context, d.device, 0, &err);
      cl_kernel k = clCreateKernel(p, "add", &err);
      if (q == nullptr || k == nullptr) {
        failures[t] = "queue or kernel";
        return;
      }
      for (int r = 0; r < kRounds && failures[t].empty(); ++r) {
        // 1 KiB to 3 MiB, a different size in each thread and round.
        const size_t words = ((r * 7 + t * 13) % 3 == 0)
                                 ? 256 + static_cast<size_t>(r * 131 + t * 17) % 8192
                                 : (16384 + static_cast<size_t>(r * 40961 + t * 9973) % 770000);
        std::vector<uint32_t> data(words);
        for (size_t i = 0; i < words; ++i) data[i] = static_cast<uint32_t>(i * 31 + t * 7 + r);
        cl_mem m = clCreateBuffer(d.context, CL_MEM_READ_WRITE, words * 4, nullptr, &err);
        if (err != CL_SUCCESS) {
          failures[t] = "create " + std::to_string(err);
          break;
        }
        const cl_uint add = static_cast<cl_uint>(1000 * t + r);
        std::vector<uint32_t> back(words, 0);
        const size_t global = words;
        if (clEnqueueWriteBuffer(q, m, CL_TRUE, 0, words * 4, data.data(), 0, nullptr,
                                 nullptr) != CL_SUCCESS ||
            clSetKernelArg(k, 0, sizeof(m), &m) != CL_SUCCESS ||
            clSetKernelArg(k, 1, sizeof(add), &add) != CL_SUCCESS ||
            clEnqueueNDRangeKernel(q, k, 1, nullptr, &global, nullptr, 0, nullptr, nullptr) !=
                CL_SUCCESS ||
            clEnqueueReadBuffer(q, m, CL_TRUE, 0, words * 4, back.data(), 0, nullptr,
                                nullptr) != CL_SUCCESS) {
          failures[t] = "a call failed in round " + std::to_string(r);
        }
        for (size_t i = 0; i < words && failures[t].empty(); ++i) {
          if (back[i] != data[i] + add) {
            failures[t] = "round " + std::to_string(r) + ": word " + std::to_string(i) +
                          " of " + std::to_string(words) + " is " + std::to_string(back[i]) +
                          ", not " + std::to_string(data[i] + add);
          }
        }
        clReleaseMemObject(m);
      }
      clReleaseKernel(k);
      clReleaseCommandQueue(q);
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(failures[t], "") << "thread " << t;
  clReleaseProgram(p);
}

// Buffers on shared memory used from two threads. A non-blocking write another thread is still
// sending while this one calls clFinish must not count as done: once that thread's call
// returned, a blocking read is ordered after the write and sees its data. And a blocking read
// waiting on a user event keeps its buffer alive when another thread releases the last
// reference meanwhile (OpenCL defers the deletion), instead of copying from memory gone.
TEST(TransfersTest, BuffersOnSharedMemoryAcrossThreads) {
  ClDevice d;
  ASSERT_TRUE(OpenDevice(kGmux, d));
  const size_t n = 64u << 20;
  cl_int err;
  cl_mem b = clCreateBuffer(d.context, CL_MEM_READ_WRITE, n, nullptr, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  std::vector<uint8_t> src(n), head(4096);
  for (int iter = 0; iter < 4; ++iter) {
    const auto v = static_cast<uint8_t>(0xa0 + iter);
    std::memset(src.data(), v, n);
    cl_int write_err = CL_SUCCESS;
    std::thread other([&] {
      write_err = clEnqueueWriteBuffer(d.queue, b, CL_FALSE, 0, n, src.data(), 0, nullptr,
                                       nullptr);
    });
    std::this_thread::sleep_for(std::chrono::microseconds(500 * iter));
    ASSERT_EQ(clFinish(d.queue), CL_SUCCESS);
    other.join();
    ASSERT_EQ(write_err, CL_SUCCESS);
    ASSERT_EQ(clEnqueueReadBuffer(d.queue, b, CL_TRUE, 0, head.size(), head.data(), 0, nullptr,
                                  nullptr), CL_SUCCESS);
    EXPECT_EQ(head[0], v) << "iteration " << iter;
    EXPECT_EQ(head[4095], v) << "iteration " << iter;
    ASSERT_EQ(clFinish(d.queue), CL_SUCCESS);
  }
  cl_event gate = clCreateUserEvent(d.context, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  std::thread releaser([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    clReleaseMemObject(b);
    clSetUserEventStatus(gate, CL_COMPLETE);
  });
  std::vector<uint8_t> back(1u << 20, 0);
  EXPECT_EQ(clEnqueueReadBuffer(d.queue, b, CL_TRUE, 0, back.size(), back.data(), 1, &gate,
                                nullptr), CL_SUCCESS);
  releaser.join();
  EXPECT_EQ(back[0], 0xa3);
  clReleaseEvent(gate);
  ASSERT_EQ(clFinish(d.queue), CL_SUCCESS);
}

// A released buffer's shared memory is kept for the next buffer of its size (icd/connection.h,
// TakeStorage), but only when no command of the context can still write it: a kernel in flight
// writing a released buffer must not land in the next buffer. Reuse shows as the same number of
// storage mappings after the next buffer is made; what is kept is bounded (16 buffers, 64 MiB).
TEST(TransfersTest, ReleasedBufferMemoryIsReusedOnlyWhenNothingCanWriteIt) {
  ClDevice d;
  ASSERT_TRUE(OpenDevice(kGmux, d));
  const bool storage =
      !RuntimeEnv::tcp && !EnvIs("GMUX_SHM", "0") && !EnvIs("GMUX_BUFFER_STORAGE", "0");
  const size_t n = FreshStorageBytes() / 4;
  cl_int err;
  std::string log;
  cl_program p = BuildProgram(d, R"(
    __kernel void slow_fill(__global uint* b, uint k) {
      size_t i = get_global_id(0);
      uint x = (uint)i;
      for (int j = 0; j < 300; ++j) x = x * 1664525u + 1013904223u;
      b[i] = x + k;
    })", &log);
  ASSERT_NE(p, nullptr) << log;
  cl_kernel fill = clCreateKernel(p, "slow_fill", &err);
  ASSERT_EQ(err, CL_SUCCESS);
  cl_command_queue other = clCreateCommandQueue(d.context, d.device, 0, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  auto launch = [&](cl_mem m, uint32_t k) {
    clSetKernelArg(fill, 0, sizeof(cl_mem), &m);
    clSetKernelArg(fill, 1, sizeof(k), &k);
    size_t global = n;
    return clEnqueueNDRangeKernel(d.queue, fill, 1, nullptr, &global, nullptr, 0, nullptr,
                                  nullptr);
  };
  std::vector<uint32_t> got(n);

  // Settled (clFinish) before the release: the next buffer of that size is on the same memory,
  // and works as a new one.
  const std::set<uint64_t> before = StorageFiles();
  cl_mem a = clCreateBuffer(d.context, CL_MEM_READ_WRITE, n * 4, nullptr, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  ASSERT_EQ(launch(a, 1), CL_SUCCESS);
  ASSERT_EQ(clFinish(d.queue), CL_SUCCESS);
  const std::set<uint64_t> with_a = StorageFiles();
  const std::set<uint64_t> file_a = Added(before, with_a);
  EXPECT_EQ(file_a.size(), storage ? 1u : 0u);
  clReleaseMemObject(a);
  cl_mem b = clCreateBuffer(d.context, CL_MEM_READ_WRITE, n * 4, nullptr, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  const std::set<uint64_t> with_b = StorageFiles();
  EXPECT_TRUE(Added(with_a, with_b).empty()) << "a new memfd although one of the size was kept";
  for (uint64_t f : file_a) EXPECT_EQ(with_b.count(f), 1u) << "the memory was not reused";
  // The worker kept its mapping of that memory too (Session::StorageBooks::kept): the pages
  // the kernel wrote through it are still in place, where a new mapping would have none and the
  // device would fault each in again (readable where the worker runs as this user or as root).
  if (storage && file_a.size() == 1) {
    const long long resident = PeerResidentBytes(*file_a.begin());
    if (resident >= 0 || ::geteuid() == 0) {
      EXPECT_GE(resident, static_cast<long long>(n * 4) - 4096)
          << "the worker mapped the reused memory anew";
    }
  }
  auto pat = Pattern(n, 9);
  ASSERT_EQ(clEnqueueWriteBuffer(d.queue, b, CL_TRUE, 0, n * 4, pat.data(), 0, nullptr,
                                 nullptr), CL_SUCCESS);
  ASSERT_EQ(clEnqueueReadBuffer(d.queue, b, CL_TRUE, 0, n * 4, got.data(), 0, nullptr, nullptr),
            CL_SUCCESS);
  EXPECT_TRUE(got == pat);
  ASSERT_EQ(launch(b, 2), CL_SUCCESS);
  ASSERT_EQ(clEnqueueReadBuffer(d.queue, b, CL_TRUE, 0, n * 4, got.data(), 0, nullptr, nullptr),
            CL_SUCCESS);
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) bad += got[i] != SlowNext(static_cast<uint32_t>(i), 2);
  EXPECT_EQ(bad, 0u) << "a kernel on the reused memory";
  clReleaseMemObject(b);

  // Released while a kernel writing it runs (tens of ms): the next buffer of that size is
  // written through another queue at once and must keep exactly that.
  cl_mem x = clCreateBuffer(d.context, CL_MEM_READ_WRITE, n * 4, nullptr, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  ASSERT_EQ(clFinish(d.queue), CL_SUCCESS);
  const std::set<uint64_t> with_x = StorageFiles();
  EXPECT_TRUE(Added(with_b, with_x).empty()) << "x is not on b's memory";
  ASSERT_EQ(launch(x, 3), CL_SUCCESS);
  ASSERT_EQ(clFlush(d.queue), CL_SUCCESS);
  clReleaseMemObject(x);
  cl_mem y = clCreateBuffer(d.context, CL_MEM_READ_WRITE, n * 4, nullptr, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  const std::set<uint64_t> with_y = StorageFiles();
  for (uint64_t f : file_a) EXPECT_EQ(with_y.count(f), 0u) << "memory a kernel writes was reused";
  EXPECT_EQ(Added(with_x, with_y).size(), storage ? 1u : 0u);
  auto pat2 = Pattern(n, 10);
  ASSERT_EQ(clEnqueueWriteBuffer(other, y, CL_TRUE, 0, n * 4, pat2.data(), 0, nullptr, nullptr),
            CL_SUCCESS);
  ASSERT_EQ(clFinish(d.queue), CL_SUCCESS);
  ASSERT_EQ(clEnqueueReadBuffer(other, y, CL_TRUE, 0, n * 4, got.data(), 0, nullptr, nullptr),
            CL_SUCCESS);
  bad = 0;
  for (size_t i = 0; i < n; ++i) bad += got[i] != pat2[i];
  EXPECT_EQ(bad, 0u) << "words of the next buffer changed by the released one's kernel";
  clReleaseMemObject(y);

  // A completion learnt from clWaitForEvents counts too: everything before the event on its
  // in-order queue is done, so a buffer released then is kept.
  const size_t bytes2 = FreshStorageBytes();
  const std::set<uint64_t> before_c = StorageFiles();
  cl_mem c = clCreateBuffer(d.context, CL_MEM_READ_WRITE, bytes2, nullptr, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  const std::set<uint64_t> file_c = Added(before_c, StorageFiles());
  EXPECT_EQ(file_c.size(), storage ? 1u : 0u);
  cl_event ran = nullptr;
  clSetKernelArg(fill, 0, sizeof(cl_mem), &c);
  const uint32_t k4 = 4;
  clSetKernelArg(fill, 1, sizeof(k4), &k4);
  const size_t global = n;
  ASSERT_EQ(clEnqueueNDRangeKernel(d.queue, fill, 1, nullptr, &global, nullptr, 0, nullptr,
                                   &ran), CL_SUCCESS);
  ASSERT_EQ(clWaitForEvents(1, &ran), CL_SUCCESS);
  clReleaseEvent(ran);
  clReleaseMemObject(c);
  cl_mem c2 = clCreateBuffer(d.context, CL_MEM_READ_WRITE, bytes2, nullptr, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  for (uint64_t f : file_c) EXPECT_EQ(StorageFiles().count(f), 1u) << "not kept after a wait";
  clReleaseMemObject(c2);

  // What is kept is bounded: 40 buffers of 4 MiB released, at most 64 MiB stay mapped.
  ASSERT_EQ(clFinish(d.queue), CL_SUCCESS);
  ASSERT_EQ(clFinish(other), CL_SUCCESS);
  std::vector<cl_mem> many;
  for (int i = 0; i < 40; ++i) {
    many.push_back(clCreateBuffer(d.context, CL_MEM_READ_WRITE, 4u << 20, nullptr, &err));
    ASSERT_EQ(err, CL_SUCCESS);
  }
  for (cl_mem m : many) clReleaseMemObject(m);
  size_t kept = 0;
  for (const auto& [from, to] : StorageMappings()) kept += to - from;
  EXPECT_LE(kept, (64u << 20) + (2u << 20));  // and the 1 MiB ones kept before
  clReleaseCommandQueue(other);
  clReleaseKernel(fill);
  clReleaseProgram(p);
}

// Writes through shared memory hold their buffer until the worker answered; a client that
// outruns its worker waits for one instead of creating more (icd/connection.h, AcquireShm).
// Writes held behind a user event cannot get theirs back before the event is set, after them:
// they must still go through (after a bounded wait each), and a reused buffer must never carry
// an earlier write's bytes.
TEST(TransfersTest, WritesBehindAUserEventAndStreamsOfWritesKeepEveryByte) {
  ClDevice d;
  ASSERT_TRUE(OpenDevice(kGmux, d));
  constexpr size_t kWords = (1u << 20) / 4;  // 1 MiB per write: the shared-memory path
  constexpr size_t kParts = 12;              // more than the ICD keeps in flight
  cl_int err;
  cl_mem m = clCreateBuffer(d.context, CL_MEM_READ_WRITE, kParts * kWords * 4, nullptr, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  cl_event gate = clCreateUserEvent(d.context, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  std::vector<std::vector<uint32_t>> parts;
  for (size_t i = 0; i < kParts; ++i) {
    parts.push_back(Pattern(kWords, static_cast<uint32_t>(100 + i)));
    ASSERT_EQ(clEnqueueWriteBuffer(d.queue, m, CL_FALSE, i * kWords * 4, kWords * 4,
                                   parts.back().data(), 1, &gate, nullptr),
              CL_SUCCESS);
  }
  ASSERT_EQ(clSetUserEventStatus(gate, CL_COMPLETE), CL_SUCCESS);
  ASSERT_EQ(clFinish(d.queue), CL_SUCCESS);
  std::vector<uint32_t> back(kWords);
  for (size_t i = 0; i < kParts; ++i) {
    ASSERT_EQ(clEnqueueReadBuffer(d.queue, m, CL_TRUE, i * kWords * 4, kWords * 4, back.data(),
                                  0, nullptr, nullptr),
              CL_SUCCESS);
    ASSERT_EQ(back, parts[i]) << "part " << i;
  }
  // Blocking writes back to back, each part written three times over with a new pattern: the
  // last one must be what stays.
  for (uint32_t round = 0; round < 3; ++round) {
    for (size_t i = 0; i < kParts; ++i) {
      parts[i] = Pattern(kWords, static_cast<uint32_t>(1000 * (round + 1) + i));
      ASSERT_EQ(clEnqueueWriteBuffer(d.queue, m, CL_TRUE, i * kWords * 4, kWords * 4,
                                     parts[i].data(), 0, nullptr, nullptr),
                CL_SUCCESS);
    }
  }
  for (size_t i = 0; i < kParts; ++i) {
    ASSERT_EQ(clEnqueueReadBuffer(d.queue, m, CL_TRUE, i * kWords * 4, kWords * 4, back.data(),
                                  0, nullptr, nullptr),
              CL_SUCCESS);
    ASSERT_EQ(back, parts[i]) << "part " << i << " after the stream";
  }
  clReleaseEvent(gate);
  clReleaseMemObject(m);
}

// A forked child shares its parent's connection to gmuxd. Its calls must fail without reaching
// the parent's session (a write would land in the parent's buffer, and its answer would be
// taken for the parent's next request, which has the same number) and without reading it.
TEST(TransfersTest, AForkedChildCannotUseItsParentsSession) {
  ClDevice d;
  ASSERT_TRUE(OpenDevice(kGmux, d));
  const size_t n = (2u << 20) / 4;  // 2 MiB: through shared memory too, where it is used
  auto mine = Pattern(n, 3);
  cl_int err;
  cl_mem m = clCreateBuffer(d.context, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, n * 4,
                            mine.data(), &err);
  ASSERT_EQ(err, CL_SUCCESS);
  ASSERT_EQ(clFinish(d.queue), CL_SUCCESS);
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::alarm(60);  // a child stuck on the parent's connection ends, and the test with it
    auto other = Pattern(n, 4);
    int bad = 0;
    if (clEnqueueWriteBuffer(d.queue, m, CL_FALSE, 0, n * 4, other.data(), 0, nullptr,
                             nullptr) == CL_SUCCESS) {
      bad |= 1;
    }
    clFlush(d.queue);
    if (clEnqueueWriteBuffer(d.queue, m, CL_TRUE, 0, n * 4, other.data(), 0, nullptr,
                             nullptr) == CL_SUCCESS) {
      bad |= 2;
    }
    if (clEnqueueWriteBuffer(d.queue, m, CL_TRUE, 0, 4096, other.data(), 0, nullptr,
                             nullptr) == CL_SUCCESS) {
      bad |= 4;
    }
    if (clEnqueueReadBuffer(d.queue, m, CL_FALSE, 0, n * 4, other.data(), 0, nullptr,
                            nullptr) == CL_SUCCESS) {
      bad |= 8;
    }
    if (clFinish(d.queue) == CL_SUCCESS) bad |= 16;
    ::_exit(bad);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0)
      << "calls in the child succeeded (bits: 1 non-blocking write, 2 write, 4 small write, "
         "8 non-blocking read, 16 finish)";
  // The parent's session goes on as if the child had never been.
  std::vector<uint32_t> back(n, 0);
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(clEnqueueReadBuffer(d.queue, m, CL_TRUE, 0, n * 4, back.data(), 0, nullptr,
                                  nullptr), CL_SUCCESS);
    EXPECT_EQ(back, mine) << "the child's write reached the parent's buffer";
  }
  ASSERT_EQ(clFinish(d.queue), CL_SUCCESS);
  clReleaseMemObject(m);
}

// Sizes on both sides of every path's threshold (64 KiB, 1 MiB, 4 MiB, 8 MiB, the copier's 2 MiB
// parts, its 64 MiB mapping pieces, the 16 MiB from which a read through the stream is read
// from the device in 8 MiB pieces),
// odd sizes, unaligned host pointers and buffer offsets, and sub-buffers.
TEST(TransfersTest, EveryShapeArrivesIntact) {
  ClDevice d;
  ASSERT_TRUE(OpenDevice(kGmux, d));
  const size_t cap = (17u << 20) + 4096;
  cl_int err;
  cl_mem m = clCreateBuffer(d.context, CL_MEM_READ_WRITE, cap, nullptr, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  const size_t sizes[] = {1,           4096,         (64u << 10) - 1, 64u << 10,
                          (64u << 10) + 5, (1u << 20) + 3, (4u << 20) - 1, 4u << 20,
                          (4u << 20) + 7,  (8u << 20) - 1, 8u << 20, (9u << 20) + 1,
                          (16u << 20) - 1, 16u << 20, 17u << 20};
  // Under ThreadSanitizer (GMUX_TEST_FEW_ITERATIONS), a size per path (inline, one frame or
  // chunk, several) at two offsets: its races are in the paths, not in the sizes.
  const bool few = FewIterations();
  const size_t few_sizes[] = {1, (64u << 10) + 5, (4u << 20) + 7, 17u << 20};
  uint32_t seed = 1;
  for (size_t n : sizes) {
    if (few && std::find(std::begin(few_sizes), std::end(few_sizes), n) == std::end(few_sizes)) {
      continue;
    }
    for (size_t off : {size_t{0}, size_t{3}, size_t{4096}}) {
      if (off + n > cap || (few && off == 4096)) continue;
      SCOPED_TRACE("size " + std::to_string(n) + " offset " + std::to_string(off));
      // One byte past a word-aligned start: the application's pointers need not be aligned.
      std::vector<uint8_t> src(n + 1), back(n + 2, 0xEE);
      auto pat = Pattern((n + 4) / 4, ++seed);
      std::memcpy(src.data() + 1, pat.data(), n);
      ASSERT_EQ(clEnqueueWriteBuffer(d.queue, m, CL_TRUE, off, n, src.data() + 1, 0, nullptr,
                                     nullptr), CL_SUCCESS);
      ASSERT_EQ(clEnqueueReadBuffer(d.queue, m, CL_TRUE, off, n, back.data() + 1, 0, nullptr,
                                    nullptr), CL_SUCCESS);
      ASSERT_EQ(0, std::memcmp(back.data() + 1, src.data() + 1, n));
      ASSERT_EQ(back[0], 0xEE);  // nothing written around the application's range
      ASSERT_EQ(back[n + 1], 0xEE);
    }
  }
  // Larger than a remote copy's mapping piece (64 MiB): three pieces, the last one odd.
  {
    const size_t big = (130u << 20) + 5;
    cl_mem b = clCreateBuffer(d.context, CL_MEM_READ_WRITE, big + 4096, nullptr, &err);
    ASSERT_EQ(err, CL_SUCCESS);
    std::vector<uint8_t> src(big), back(big, 0);
    auto pat = Pattern((big + 3) / 4, 77);
    std::memcpy(src.data(), pat.data(), big);
    ASSERT_EQ(clEnqueueWriteBuffer(d.queue, b, CL_TRUE, 4096, big, src.data(), 0, nullptr,
                                   nullptr), CL_SUCCESS);
    ASSERT_EQ(clEnqueueReadBuffer(d.queue, b, CL_TRUE, 4096, big, back.data(), 0, nullptr,
                                  nullptr), CL_SUCCESS);
    EXPECT_TRUE(back == src);
    clReleaseMemObject(b);
  }
  // A sub-buffer at an offset: written through it, read through the parent and back.
  const size_t sub_off = 1u << 20, sub_n = 6u << 20;
  cl_buffer_region region{sub_off, sub_n};
  cl_mem sub = clCreateSubBuffer(m, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, &region, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  auto pat = Pattern(sub_n / 4, 99);
  ASSERT_EQ(clEnqueueWriteBuffer(d.queue, sub, CL_TRUE, 0, sub_n, pat.data(), 0, nullptr, nullptr),
            CL_SUCCESS);
  std::vector<uint32_t> whole(sub_n / 4 + 2, 0);
  ASSERT_EQ(clEnqueueReadBuffer(d.queue, m, CL_TRUE, sub_off - 4, whole.size() * 4, whole.data(),
                                0, nullptr, nullptr), CL_SUCCESS);
  EXPECT_TRUE(std::equal(pat.begin(), pat.end(), whole.begin() + 1));
  std::vector<uint32_t> via_sub(sub_n / 4 - 1, 0);
  ASSERT_EQ(clEnqueueReadBuffer(d.queue, sub, CL_TRUE, 4, via_sub.size() * 4, via_sub.data(), 0,
                                nullptr, nullptr), CL_SUCCESS);
  EXPECT_TRUE(std::equal(via_sub.begin(), via_sub.end(), pat.begin() + 1));
  // Non-blocking in a row, in queue order: the last write wins, the read sees it.
  auto a = Pattern((8u << 20) / 4, 5), b = Pattern((8u << 20) / 4, 6);
  std::vector<uint32_t> got(a.size(), 0);
  ASSERT_EQ(clEnqueueWriteBuffer(d.queue, m, CL_FALSE, 0, a.size() * 4, a.data(), 0, nullptr,
                                 nullptr), CL_SUCCESS);
  ASSERT_EQ(clEnqueueWriteBuffer(d.queue, m, CL_FALSE, 0, b.size() * 4, b.data(), 0, nullptr,
                                 nullptr), CL_SUCCESS);
  ASSERT_EQ(clEnqueueReadBuffer(d.queue, m, CL_FALSE, 0, got.size() * 4, got.data(), 0, nullptr,
                                nullptr), CL_SUCCESS);
  ASSERT_EQ(clFinish(d.queue), CL_SUCCESS);
  EXPECT_EQ(got, b);
  clReleaseMemObject(sub);
  clReleaseMemObject(m);
}

// Pages of [from, to) present in this process's page tables (/proc/self/pagemap, bit 63).
size_t PresentPages(uintptr_t from, uintptr_t to) {
  std::vector<uint64_t> entries((to - from) / 4096);
  FILE* f = std::fopen("/proc/self/pagemap", "rb");
  if (f == nullptr) return 0;
  size_t got = 0;
  if (std::fseek(f, static_cast<long>(from / 4096 * 8), SEEK_SET) == 0) {
    got = std::fread(entries.data(), 8, entries.size(), f);
  }
  std::fclose(f);
  size_t present = 0;
  for (size_t i = 0; i < got; ++i) present += (entries[i] >> 63) & 1;
  return present;
}

// New buffers of 8 MiB and more on shared memory are faulted in ahead by a thread of the ICD
// and one of the worker (common/prefault.h) while the application and the device touch them:
// initial contents, writes made at once, a kernel's reads and writes and buffers released while
// their pages are still being faulted in all keep every byte. Where buffers are on shared
// memory, a new buffer nobody touched ends up wholly in the application's page tables.
TEST(TransfersTest, NewLargeBuffersFaultedInAheadKeepEveryByte) {
  ClDevice d;
  ASSERT_TRUE(OpenDevice(kGmux, d));
  const bool expect_storage =
      !RuntimeEnv::tcp && !EnvIs("GMUX_SHM", "0") && !EnvIs("GMUX_BUFFER_STORAGE", "0");
  std::string log;
  cl_program p = BuildProgram(d, R"(
    __kernel void xor3(__global const uint* a, __global const uint* b, __global uint* c) {
      size_t i = get_global_id(0);
      c[i] = a[i] ^ (b[i] * 3u);
    })", &log);
  ASSERT_NE(p, nullptr) << log;
  cl_int err;
  cl_kernel kern = clCreateKernel(p, "xor3", &err);
  ASSERT_EQ(err, CL_SUCCESS);
  for (int round = 0; round < 3; ++round) {
    // Sizes new to the process each round (released buffers' memory is reused by size).
    const size_t n = ((9u << 20) + 4096 * static_cast<size_t>(7 + round) + 4 * round) / 4;
    auto a = Pattern(n, 20 + round);
    auto b = Pattern(n, 40 + round);
    cl_mem ma = clCreateBuffer(d.context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, n * 4,
                               a.data(), &err);
    ASSERT_EQ(err, CL_SUCCESS);
    cl_mem mb = clCreateBuffer(d.context, CL_MEM_READ_ONLY, n * 4, nullptr, &err);
    ASSERT_EQ(err, CL_SUCCESS);
    ASSERT_EQ(clEnqueueWriteBuffer(d.queue, mb, CL_TRUE, 0, n * 4, b.data(), 0, nullptr, nullptr),
              CL_SUCCESS);
    cl_mem mc = clCreateBuffer(d.context, CL_MEM_WRITE_ONLY, n * 4, nullptr, &err);
    ASSERT_EQ(err, CL_SUCCESS);
    clSetKernelArg(kern, 0, sizeof(cl_mem), &ma);
    clSetKernelArg(kern, 1, sizeof(cl_mem), &mb);
    clSetKernelArg(kern, 2, sizeof(cl_mem), &mc);
    size_t global = n;
    ASSERT_EQ(clEnqueueNDRangeKernel(d.queue, kern, 1, nullptr, &global, nullptr, 0, nullptr,
                                     nullptr), CL_SUCCESS);
    // Released with the kernel queued, their pages perhaps still being faulted in.
    clReleaseMemObject(ma);
    clReleaseMemObject(mb);
    std::vector<uint32_t> c(n, 0);
    ASSERT_EQ(clEnqueueReadBuffer(d.queue, mc, CL_TRUE, 0, n * 4, c.data(), 0, nullptr, nullptr),
              CL_SUCCESS);
    for (size_t i = 0; i < n; ++i) {
      if (c[i] != (a[i] ^ (b[i] * 3u))) FAIL() << "round " << round << ", element " << i;
    }
    clReleaseMemObject(mc);
  }
  if (expect_storage) {
    const auto before = StorageMappings();
    const size_t bytes = (12u << 20) + 4096 * 5;
    cl_mem m = clCreateBuffer(d.context, CL_MEM_READ_WRITE, bytes, nullptr, &err);
    ASSERT_EQ(err, CL_SUCCESS);
    std::pair<uintptr_t, uintptr_t> fresh{0, 0};
    for (const auto& range : StorageMappings()) {
      bool old = false;
      for (const auto& b : before) old = old || b == range;
      if (!old && range.second - range.first >= bytes) fresh = range;
    }
    ASSERT_NE(fresh.first, 0u) << "no new mapping for the buffer";
    // Populated by the ICD's thread, not by this one: waited for (a poll, not a time limit on
    // how fast).
    const size_t pages = (fresh.second - fresh.first) / 4096;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (PresentPages(fresh.first, fresh.second) < pages &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    EXPECT_EQ(PresentPages(fresh.first, fresh.second), pages);
    clReleaseMemObject(m);
  }
  clReleaseKernel(kern);
  clReleaseProgram(p);
}

// Small buffers (under 64 KiB) on shared memory are slots of a few shared arenas: hundreds of
// them of odd sizes, with initial contents or written, copied by the device, read whole and at
// offsets, through sub-buffers, released and their slots reused, each keep their own bytes.
TEST(TransfersTest, SmallBuffersShareArenasAndKeepEveryByte) {
  ClDevice d;
  ASSERT_TRUE(OpenDevice(kGmux, d));
  const bool expect_arenas = ArenasApply();
  const auto files_before = StorageFiles();
  const size_t sizes[] = {1, 3, 255, 256, 257, 4095, 4096, 4097, 40000, 65535};
  struct Small {
    cl_mem m = nullptr;
    std::vector<uint8_t> bytes;
  };
  auto bytes_of = [](size_t n, uint32_t seed) {
    std::vector<uint8_t> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>((i * 131 + seed * 7 + 1) >> 1);
    return v;
  };
  cl_int err;
  std::vector<Small> live;
  uint32_t seed = 0;
  auto make = [&](size_t n) {
    Small s;
    s.bytes = bytes_of(n, ++seed);
    if (seed % 2 == 0) {
      s.m = clCreateBuffer(d.context, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, n,
                           s.bytes.data(), &err);
      EXPECT_EQ(err, CL_SUCCESS);
    } else {
      s.m = clCreateBuffer(d.context, CL_MEM_READ_WRITE, n, nullptr, &err);
      EXPECT_EQ(err, CL_SUCCESS);
      EXPECT_EQ(clEnqueueWriteBuffer(d.queue, s.m, CL_TRUE, 0, n, s.bytes.data(), 0, nullptr,
                                     nullptr), CL_SUCCESS);
    }
    live.push_back(std::move(s));
  };
  auto check_all = [&](const char* when) {
    for (size_t i = 0; i < live.size(); ++i) {
      std::vector<uint8_t> got(live[i].bytes.size(), 0);
      ASSERT_EQ(clEnqueueReadBuffer(d.queue, live[i].m, CL_TRUE, 0, got.size(), got.data(), 0,
                                    nullptr, nullptr), CL_SUCCESS);
      ASSERT_EQ(got, live[i].bytes) << when << ", buffer " << i << " of " << got.size() << " B";
    }
  };
  for (int i = 0; i < 300; ++i) make(sizes[i % std::size(sizes)]);
  check_all("after creation");
  if (expect_arenas) {
    const auto files = StorageFiles();
    size_t fresh = 0;
    for (uint64_t f : files) fresh += files_before.count(f) == 0 ? 1 : 0;
    EXPECT_GE(fresh, 1u) << "small buffers are not on shared memory";
    EXPECT_LE(fresh, 8u) << "300 small buffers made " << fresh << " memfds";
  }
  // The device copies between them (in queue order after blocking writes of the same bytes).
  for (size_t i = 0; i + 1 < live.size(); i += 7) {
    Small& from = live[i];
    Small& to = live[i + 1];
    const size_t n = std::min(from.bytes.size(), to.bytes.size());
    ASSERT_EQ(clEnqueueCopyBuffer(d.queue, from.m, to.m, 0, 0, n, 0, nullptr, nullptr),
              CL_SUCCESS);
    std::copy(from.bytes.begin(), from.bytes.begin() + static_cast<long>(n), to.bytes.begin());
  }
  // Non-blocking reads at an offset, then clFinish.
  std::vector<std::vector<uint8_t>> tails(live.size());
  for (size_t i = 0; i < live.size(); ++i) {
    const size_t off = live[i].bytes.size() / 3;
    tails[i].assign(live[i].bytes.size() - off, 0);
    ASSERT_EQ(clEnqueueReadBuffer(d.queue, live[i].m, CL_FALSE, off, tails[i].size(),
                                  tails[i].data(), 0, nullptr, nullptr), CL_SUCCESS);
  }
  ASSERT_EQ(clFinish(d.queue), CL_SUCCESS);
  for (size_t i = 0; i < live.size(); ++i) {
    const size_t off = live[i].bytes.size() / 3;
    ASSERT_TRUE(std::equal(tails[i].begin(), tails[i].end(), live[i].bytes.begin() +
                           static_cast<long>(off))) << "buffer " << i;
  }
  // A sub-buffer of a small buffer writes into its parent's slot.
  cl_uint align_bits = 0;
  clGetDeviceInfo(d.device, CL_DEVICE_MEM_BASE_ADDR_ALIGN, sizeof(align_bits), &align_bits,
                  nullptr);
  const size_t origin = std::max<size_t>(align_bits / 8, 1);
  for (Small& s : live) {
    if (s.bytes.size() < origin + 64) continue;
    cl_buffer_region region{origin, 64};
    cl_mem sub = clCreateSubBuffer(s.m, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, &region,
                                   &err);
    ASSERT_EQ(err, CL_SUCCESS);
    auto patch = bytes_of(64, 999);
    ASSERT_EQ(clEnqueueWriteBuffer(d.queue, sub, CL_TRUE, 0, 64, patch.data(), 0, nullptr,
                                   nullptr), CL_SUCCESS);
    std::copy(patch.begin(), patch.end(), s.bytes.begin() + static_cast<long>(origin));
    clReleaseMemObject(sub);
    break;
  }
  // Every other one released, and as many made again on their slots.
  std::vector<Small> kept;
  for (size_t i = 0; i < live.size(); ++i) {
    if (i % 2 == 0) {
      clReleaseMemObject(live[i].m);
    } else {
      kept.push_back(std::move(live[i]));
    }
  }
  live = std::move(kept);
  const auto files_mid = StorageFiles();
  for (int i = 0; i < 150; ++i) make(sizes[(i * 3) % std::size(sizes)]);
  check_all("after reuse");
  if (expect_arenas) {
    size_t fresh = 0;
    for (uint64_t f : StorageFiles()) fresh += files_mid.count(f) == 0 ? 1 : 0;
    EXPECT_EQ(fresh, 0u) << "released slots were not reused";
  }
  // Released while a kernel that writes them is queued: their slots are not reused until the
  // queue is done, and the buffers made meanwhile and after keep their own bytes.
  std::string log;
  cl_program p = BuildProgram(d, R"(
    __kernel void fill(__global uchar* a, uchar v) { a[get_global_id(0)] = v; })", &log);
  ASSERT_NE(p, nullptr) << log;
  cl_kernel kern = clCreateKernel(p, "fill", &err);
  ASSERT_EQ(err, CL_SUCCESS);
  for (int round = 0; round < 4; ++round) {
    std::vector<cl_mem> doomed;
    for (int i = 0; i < 20; ++i) {
      cl_mem m = clCreateBuffer(d.context, CL_MEM_READ_WRITE, 4096, nullptr, &err);
      ASSERT_EQ(err, CL_SUCCESS);
      const cl_uchar v = 0xee;
      clSetKernelArg(kern, 0, sizeof(cl_mem), &m);
      clSetKernelArg(kern, 1, sizeof(v), &v);
      size_t global = 4096;
      ASSERT_EQ(clEnqueueNDRangeKernel(d.queue, kern, 1, nullptr, &global, nullptr, 0, nullptr,
                                       nullptr), CL_SUCCESS);
      doomed.push_back(m);
    }
    for (cl_mem m : doomed) clReleaseMemObject(m);
    for (int i = 0; i < 20; ++i) make(4096);
    ASSERT_EQ(clFinish(d.queue), CL_SUCCESS);
    for (int i = 0; i < 20; ++i) make(4096);
    check_all("after releases with kernels queued");
  }
  // Threads making small buffers at once (new arenas among them) each keep their own.
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        const size_t n = 64 + static_cast<size_t>((t * 997 + i * 131) % 30000);
        auto want = bytes_of(n, static_cast<uint32_t>(1000 + t * 1000 + i));
        cl_int e = CL_SUCCESS;
        cl_mem m = clCreateBuffer(d.context, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, n,
                                  want.data(), &e);
        if (e != CL_SUCCESS) {
          ++wrong;
          continue;
        }
        std::vector<uint8_t> got(n, 0);
        if (clEnqueueReadBuffer(d.queue, m, CL_TRUE, 0, n, got.data(), 0, nullptr, nullptr) !=
                CL_SUCCESS ||
            got != want) {
          ++wrong;
        }
        clReleaseMemObject(m);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0);
  check_all("after the threads");
  clReleaseKernel(kern);
  clReleaseProgram(p);
  for (Small& s : live) clReleaseMemObject(s.m);
}

// Remote copy only (the other paths copy in the application's own process, where such a call
// faults as it would natively): memory the application no longer maps fails the transfer with
// an error, and the session goes on serving.
TEST(TransfersTest, MemoryTheApplicationUnmappedIsAnErrorNotACrash) {
  if (RuntimeEnv::tcp || EnvIs("GMUX_SHM", "0") || EnvIs("GMUX_REMOTE_COPY", "0")) {
    GTEST_SKIP() << "remote copy only: the other paths copy in the application's process";
  }
  ClDevice d;
  ASSERT_TRUE(OpenDevice(kGmux, d));
  const size_t n = 8u << 20;
  cl_int err;
  cl_mem m = clCreateBuffer(d.context, CL_MEM_READ_WRITE, n, nullptr, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  void* gone = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(gone, MAP_FAILED);
  ::munmap(gone, n);
  EXPECT_NE(clEnqueueReadBuffer(d.queue, m, CL_TRUE, 0, n, gone, 0, nullptr, nullptr), CL_SUCCESS);
  EXPECT_NE(clEnqueueWriteBuffer(d.queue, m, CL_TRUE, 0, n, gone, 0, nullptr, nullptr), CL_SUCCESS);
  // Non-blocking: the event fails (and the next blocking call reports it).
  cl_event ev = nullptr;
  ASSERT_EQ(clEnqueueWriteBuffer(d.queue, m, CL_FALSE, 0, n, gone, 0, nullptr, &ev), CL_SUCCESS);
  clWaitForEvents(1, &ev);
  cl_int status = CL_COMPLETE;
  ASSERT_EQ(clGetEventInfo(ev, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof(status), &status, nullptr),
            CL_SUCCESS);
  EXPECT_LT(status, 0);
  clReleaseEvent(ev);
  clFinish(d.queue);
  // Unmapped while a non-blocking read may be running: whatever it returns, nothing crashes.
  void* racing = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(racing, MAP_FAILED);
  clEnqueueReadBuffer(d.queue, m, CL_FALSE, 0, n, racing, 0, nullptr, nullptr);
  ::munmap(racing, n);
  clFinish(d.queue);
  // The session still serves.
  auto src = Pattern(n / 4, 3);
  std::vector<uint32_t> back(n / 4, 0);
  ASSERT_EQ(clEnqueueWriteBuffer(d.queue, m, CL_TRUE, 0, n, src.data(), 0, nullptr, nullptr),
            CL_SUCCESS);
  ASSERT_EQ(clEnqueueReadBuffer(d.queue, m, CL_TRUE, 0, n, back.data(), 0, nullptr, nullptr),
            CL_SUCCESS);
  EXPECT_EQ(back, src);
  clReleaseMemObject(m);
}

// A queue released with commands not finished: releasing it flushes them (OpenCL 1.2, 5.1), so
// they run although nothing else is sent (the reads below of a buffer on an arena are the
// client's own copies), and they leave no mark on their context: small buffers released
// afterwards give their arena slots back for the next ones, instead of holding every slot from
// then on (which, after the arenas' limit, would put every small buffer on the copying paths).
TEST(TransfersTest, AQueueReleasedUnfinishedDoesNotHoldArenaSlots) {
  ClDevice d;
  ASSERT_TRUE(OpenDevice(kGmux, d));
  const bool expect_arenas = ArenasApply();
  cl_int err;
  std::string log;
  cl_program p = BuildProgram(d, kSlowKernel, &log);
  ASSERT_NE(p, nullptr) << log;
  cl_kernel slow = clCreateKernel(p, "slow", &err);
  ASSERT_EQ(err, CL_SUCCESS);
  cl_command_queue q = clCreateCommandQueue(d.context, d.device, 0, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  cl_mem x = clCreateBuffer(d.context, CL_MEM_READ_WRITE, 64 * 4, nullptr, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  const uint32_t iters = 20000;
  clSetKernelArg(slow, 0, sizeof(cl_mem), &x);
  clSetKernelArg(slow, 1, sizeof(iters), &iters);
  size_t global = 64;
  // No event: waiting for one would settle the queue through it.
  ASSERT_EQ(clEnqueueNDRangeKernel(q, slow, 1, nullptr, &global, nullptr, 0, nullptr, nullptr),
            CL_SUCCESS);
  ASSERT_EQ(clReleaseCommandQueue(q), CL_SUCCESS);  // unfinished
  // Its end seen through the data (reads on the test's queue, which settle nothing of it).
  uint32_t expect = 0;
  for (uint32_t i = 0; i < iters; ++i) expect = expect * 1664525u + 1013904223u;
  uint32_t first = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (first != expect && std::chrono::steady_clock::now() < deadline) {
    ASSERT_EQ(clEnqueueReadBuffer(d.queue, x, CL_TRUE, 0, 4, &first, 0, nullptr, nullptr),
              CL_SUCCESS);
  }
  ASSERT_EQ(first, expect);
  const auto files_before = StorageFiles();
  // 64 buffers of 16 KiB (half an arena) made and released, 100 times: with slots reused, one
  // or two arenas (the worker's answer that settles the released queue is on its way); held
  // back, a new arena for every two rounds up to the limit (32).
  std::vector<uint8_t> bytes(16 << 10, 0x5a), back(16 << 10);
  for (int round = 0; round < 100; ++round) {
    std::vector<cl_mem> made;
    for (int i = 0; i < 64; ++i) {
      bytes[0] = static_cast<uint8_t>(round + i);
      cl_mem m = clCreateBuffer(d.context, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR,
                                bytes.size(), bytes.data(), &err);
      ASSERT_EQ(err, CL_SUCCESS);
      made.push_back(m);
    }
    ASSERT_EQ(clEnqueueReadBuffer(d.queue, made.back(), CL_TRUE, 0, back.size(), back.data(), 0,
                                  nullptr, nullptr), CL_SUCCESS);
    ASSERT_EQ(back, bytes);
    for (cl_mem m : made) clReleaseMemObject(m);
  }
  const auto files_after = StorageFiles();
  size_t added = 0;
  for (uint64_t f : files_after) added += files_before.count(f) == 0;
  if (expect_arenas) {
    EXPECT_LE(added, 3u) << "arena slots released after an unfinished queue were not reused";
  } else {
    EXPECT_EQ(added, 0u);
  }
  clReleaseMemObject(x);
  clReleaseKernel(slow);
  clReleaseProgram(p);
}

// A blocking write has completed when it returns, natively: a command enqueued after it on
// another queue, or on its own out-of-order queue, with no event between them, sees its data.
// Through gmux a blocking write may return once its data is sent (the stream, TCP, shared
// memory); the worker then runs every later command after it. Each write waits behind a slow
// kernel on its queue, so a command that overtook it would see the old data.
TEST(TransfersTest, BlockingWritesAreDoneForCommandsOfEveryQueue) {
  ClDevice d;
  ASSERT_TRUE(OpenDevice(kGmux, d));
  cl_int err;
  cl_command_queue q2 = clCreateCommandQueue(d.context, d.device, 0, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  cl_command_queue q3 =
      clCreateCommandQueue(d.context, d.device, CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  std::string log;
  cl_program p = BuildProgram(d, std::string(kSlowKernel) + R"(
    __kernel void copy_plus(__global const uint* a, __global uint* b, uint k) {
      size_t i = get_global_id(0);
      b[i] = a[i] + k;
    })", &log);
  ASSERT_NE(p, nullptr) << log;
  cl_kernel slow = clCreateKernel(p, "slow", &err);
  ASSERT_EQ(err, CL_SUCCESS);
  cl_kernel copy = clCreateKernel(p, "copy_plus", &err);
  ASSERT_EQ(err, CL_SUCCESS);
  cl_mem busy = clCreateBuffer(d.context, CL_MEM_READ_WRITE, 64 * 4, nullptr, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  auto hold = [&](cl_command_queue q) {  // a few ms of work ahead of the write
    const uint32_t iters = 200000;
    clSetKernelArg(slow, 0, sizeof(cl_mem), &busy);
    clSetKernelArg(slow, 1, sizeof(iters), &iters);
    size_t global = 64;
    return clEnqueueNDRangeKernel(q, slow, 1, nullptr, &global, nullptr, 0, nullptr, nullptr);
  };
  // Sizes of every path: an arena slot, a small and a medium shared or inline transfer, and a
  // large one (the worker's copy locally).
  for (size_t bytes : {size_t{4096}, size_t{256} << 10, size_t{5} << 20}) {
    SCOPED_TRACE("bytes " + std::to_string(bytes));
    const size_t n = bytes / 4;
    cl_mem a = clCreateBuffer(d.context, CL_MEM_READ_WRITE, bytes, nullptr, &err);
    ASSERT_EQ(err, CL_SUCCESS);
    cl_mem b = clCreateBuffer(d.context, CL_MEM_READ_WRITE, bytes, nullptr, &err);
    ASSERT_EQ(err, CL_SUCCESS);
    std::vector<uint32_t> back(n);
    auto copy_on = [&](cl_command_queue q, uint32_t k) {
      clSetKernelArg(copy, 0, sizeof(cl_mem), &a);
      clSetKernelArg(copy, 1, sizeof(cl_mem), &b);
      clSetKernelArg(copy, 2, sizeof(k), &k);
      size_t global = n;
      return clEnqueueNDRangeKernel(q, copy, 1, nullptr, &global, nullptr, 0, nullptr, nullptr);
    };
    auto check = [&](const std::vector<uint32_t>& src, uint32_t k, const char* what) {
      size_t wrong = 0;
      for (size_t i = 0; i < n; ++i) wrong += back[i] != src[i] + k;
      EXPECT_EQ(wrong, 0u) << what;
    };
    for (uint32_t round = 0; round < 4; ++round) {
      // Written on the first queue, read by a kernel on the second.
      auto src = Pattern(n, 100 + round);
      ASSERT_EQ(hold(d.queue), CL_SUCCESS);
      ASSERT_EQ(clEnqueueWriteBuffer(d.queue, a, CL_TRUE, 0, bytes, src.data(), 0, nullptr,
                                     nullptr), CL_SUCCESS);
      ASSERT_EQ(copy_on(q2, round), CL_SUCCESS);
      ASSERT_EQ(clEnqueueReadBuffer(q2, b, CL_TRUE, 0, bytes, back.data(), 0, nullptr, nullptr),
                CL_SUCCESS);
      check(src, round, "a kernel on another queue");
      // On an out-of-order queue, then a kernel on the same queue.
      src = Pattern(n, 200 + round);
      ASSERT_EQ(hold(q3), CL_SUCCESS);
      ASSERT_EQ(clEnqueueWriteBuffer(q3, a, CL_TRUE, 0, bytes, src.data(), 0, nullptr, nullptr),
                CL_SUCCESS);
      ASSERT_EQ(copy_on(q3, round), CL_SUCCESS);
      ASSERT_EQ(clFinish(q3), CL_SUCCESS);
      ASSERT_EQ(clEnqueueReadBuffer(q2, b, CL_TRUE, 0, bytes, back.data(), 0, nullptr, nullptr),
                CL_SUCCESS);
      check(src, round, "a kernel after it on an out-of-order queue");
      // A rectangle, then a read on another queue; a blocking write's event is complete.
      src = Pattern(n, 300 + round);
      const size_t row = 1024, rows = bytes / row;
      const size_t origin[3] = {0, 0, 0}, region[3] = {row, rows, 1};
      ASSERT_EQ(hold(d.queue), CL_SUCCESS);
      ASSERT_EQ(clEnqueueWriteBufferRect(d.queue, a, CL_TRUE, origin, origin, region, row, 0,
                                         row, 0, src.data(), 0, nullptr, nullptr), CL_SUCCESS);
      ASSERT_EQ(clEnqueueReadBuffer(q2, a, CL_TRUE, 0, bytes, back.data(), 0, nullptr, nullptr),
                CL_SUCCESS);
      check(src, 0, "a read on another queue after a rectangle");
      src = Pattern(n, 400 + round);
      cl_event ev = nullptr;
      ASSERT_EQ(hold(d.queue), CL_SUCCESS);
      ASSERT_EQ(clEnqueueWriteBuffer(d.queue, a, CL_TRUE, 0, bytes, src.data(), 0, nullptr, &ev),
                CL_SUCCESS);
      cl_int status = 0;
      ASSERT_EQ(clGetEventInfo(ev, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof(status), &status,
                               nullptr), CL_SUCCESS);
      EXPECT_EQ(status, CL_COMPLETE);
      clReleaseEvent(ev);
      ASSERT_EQ(clEnqueueReadBuffer(q2, a, CL_TRUE, 0, bytes, back.data(), 0, nullptr, nullptr),
                CL_SUCCESS);
      check(src, 0, "a read on another queue after a write with an event");
    }
    ASSERT_EQ(clFinish(d.queue), CL_SUCCESS);
    clReleaseMemObject(a);
    clReleaseMemObject(b);
  }
  clReleaseMemObject(busy);
  clReleaseKernel(slow);
  clReleaseKernel(copy);
  clReleaseProgram(p);
  clReleaseCommandQueue(q2);
  clReleaseCommandQueue(q3);
}

// Large writes whose data goes inline (transfers_inline*, transfers_tcp) are received straight
// into the buffer when nothing of the session is in flight (docs/protocol.md, "Writes received
// in place"); behind a kernel they are staged, so the kernel never sees them early. Both, runs
// of writes, sub-buffers, and another thread's requests meanwhile keep every byte in order.
TEST(TransfersTest, WritesReceivedInPlaceKeepQueueOrder) {
  ClDevice d;
  ASSERT_TRUE(OpenDevice(kGmux, d));
  cl_int err;
  std::string log;
  cl_program p = BuildProgram(d, R"(
    __kernel void fill_slow(__global uint* x, uint n, uint seed) {
      uint acc = seed + get_global_id(0);
      for (uint i = 0; i < n; ++i) acc = acc * 1664525u + 1013904223u;
      x[get_global_id(0)] = seed + get_global_id(0) + ((acc & 1u) & (n >> 31));
    }
    __kernel void add(__global uint* x, uint k) { x[get_global_id(0)] += k; })", &log);
  ASSERT_NE(p, nullptr) << log;
  cl_kernel fill = clCreateKernel(p, "fill_slow", &err);
  ASSERT_EQ(err, CL_SUCCESS);
  cl_kernel add = clCreateKernel(p, "add", &err);
  ASSERT_EQ(err, CL_SUCCESS);
  constexpr size_t kPart = size_t{5} << 20, kBytes = 3 * kPart, kN = kBytes / 4, kP = kPart / 4;
  cl_mem x = clCreateBuffer(d.context, CL_MEM_READ_WRITE, kBytes, nullptr, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  auto fill_on = [&](cl_command_queue q, uint32_t seed, cl_event* ev) {
    const uint32_t iters = 100;
    clSetKernelArg(fill, 0, sizeof(cl_mem), &x);
    clSetKernelArg(fill, 1, sizeof(iters), &iters);
    clSetKernelArg(fill, 2, sizeof(seed), &seed);
    size_t global = kN;
    return clEnqueueNDRangeKernel(q, fill, 1, nullptr, &global, nullptr, 0, nullptr, ev);
  };
  std::vector<uint32_t> back(kN);
  auto read_all = [&] {
    ASSERT_EQ(clEnqueueReadBuffer(d.queue, x, CL_TRUE, 0, kBytes, back.data(), 0, nullptr,
                                  nullptr), CL_SUCCESS);
  };
  // back[i] for i in [from, to) is src[i - at] (+ k), or the fill of `seed` when src is null.
  auto wrong_in = [&](size_t from, size_t to, const std::vector<uint32_t>* src, size_t at,
                      uint32_t seed_or_k) {
    size_t wrong = 0;
    for (size_t i = from; i < to; ++i) {
      wrong += back[i] != (src ? (*src)[i - at] + seed_or_k : seed_or_k + static_cast<uint32_t>(i));
    }
    return wrong;
  };
  cl_command_queue q2 = clCreateCommandQueue(d.context, d.device, 0, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  cl_mem y = clCreateBuffer(d.context, CL_MEM_READ_WRITE, 4096, nullptr, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  for (uint32_t round = 0; round < 2; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    // A write behind a kernel on its queue that fills the whole buffer: the write comes after.
    auto mid = Pattern(kP, 10 + round);
    ASSERT_EQ(fill_on(d.queue, 1000 * round, nullptr), CL_SUCCESS);
    // On the device when the data comes (data of several chunks hands over what came before).
    ASSERT_EQ(clEnqueueWriteBuffer(d.queue, x, CL_TRUE, kPart, kPart, mid.data(), 0, nullptr,
                                   nullptr), CL_SUCCESS);
    read_all();
    EXPECT_EQ(wrong_in(0, kP, nullptr, 0, 1000 * round), 0u) << "before the write";
    EXPECT_EQ(wrong_in(kP, 2 * kP, &mid, kP, 0), 0u) << "the write, behind the kernel";
    EXPECT_EQ(wrong_in(2 * kP, kN, nullptr, 0, 1000 * round), 0u) << "after the write";
    // Behind a kernel on another queue, through the wait list.
    cl_event filled = nullptr;
    ASSERT_EQ(fill_on(q2, 2000 * round + 7, &filled), CL_SUCCESS);
    ASSERT_EQ(clFlush(q2), CL_SUCCESS);
    ASSERT_EQ(clEnqueueWriteBuffer(d.queue, x, CL_FALSE, 0, kPart, mid.data(), 1, &filled,
                                   nullptr), CL_SUCCESS);
    clReleaseEvent(filled);
    read_all();
    EXPECT_EQ(wrong_in(0, kP, &mid, 0, 0), 0u) << "the write, behind the other queue's kernel";
    EXPECT_EQ(wrong_in(kP, kN, nullptr, 0, 2000 * round + 7), 0u);
    // Held by a user event: a read on another queue, not ordered after the write, sees the
    // old contents until the event is set.
    cl_event gate = clCreateUserEvent(d.context, &err);
    ASSERT_EQ(err, CL_SUCCESS);
    auto later = Pattern(kP, 40 + round);
    ASSERT_EQ(clEnqueueWriteBuffer(d.queue, x, CL_FALSE, 0, kPart, later.data(), 1, &gate,
                                   nullptr), CL_SUCCESS);
    ASSERT_EQ(clFlush(d.queue), CL_SUCCESS);
    std::vector<uint32_t> early(kP);
    ASSERT_EQ(clEnqueueReadBuffer(q2, x, CL_TRUE, 0, kPart, early.data(), 0, nullptr, nullptr),
              CL_SUCCESS);
    EXPECT_EQ(early, mid) << "a write held by a user event was seen before it ran";
    ASSERT_EQ(clSetUserEventStatus(gate, CL_COMPLETE), CL_SUCCESS);
    clReleaseEvent(gate);
    read_all();
    EXPECT_EQ(wrong_in(0, kP, &later, 0, 0), 0u) << "the write, once its event was set";
    // A run of blocking writes (each received in place once the one before is done), then
    // non-blocking ones and a kernel on the same queue.
    auto a = Pattern(2 * kP, 20 + round), b = Pattern(2 * kP, 30 + round);
    ASSERT_EQ(clEnqueueWriteBuffer(d.queue, x, CL_TRUE, 0, 2 * kPart, a.data(), 0, nullptr,
                                   nullptr), CL_SUCCESS);
    ASSERT_EQ(clEnqueueWriteBuffer(d.queue, x, CL_TRUE, kPart, 2 * kPart, b.data(), 0, nullptr,
                                   nullptr), CL_SUCCESS);
    read_all();
    EXPECT_EQ(wrong_in(0, kP, &a, 0, 0), 0u);
    EXPECT_EQ(wrong_in(kP, kN, &b, kP, 0), 0u) << "the second write wins where they overlap";
    ASSERT_EQ(clEnqueueWriteBuffer(d.queue, x, CL_FALSE, kPart, 2 * kPart, a.data(), 0, nullptr,
                                   nullptr), CL_SUCCESS);
    ASSERT_EQ(clEnqueueWriteBuffer(d.queue, x, CL_FALSE, 0, 2 * kPart, b.data(), 0, nullptr,
                                   nullptr), CL_SUCCESS);
    const uint32_t k = 5 + round;
    clSetKernelArg(add, 0, sizeof(cl_mem), &x);
    clSetKernelArg(add, 1, sizeof(k), &k);
    size_t global = kN;
    ASSERT_EQ(clEnqueueNDRangeKernel(d.queue, add, 1, nullptr, &global, nullptr, 0, nullptr,
                                     nullptr), CL_SUCCESS);
    read_all();
    EXPECT_EQ(wrong_in(0, 2 * kP, &b, 0, k), 0u);
    EXPECT_EQ(wrong_in(2 * kP, kN, &a, kP, k), 0u);
    // Into a sub-buffer (staged: it is not the buffer the storage belongs to).
    cl_buffer_region region{kPart, 2 * kPart};
    cl_mem sub = clCreateSubBuffer(x, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, &region,
                                   &err);
    ASSERT_EQ(err, CL_SUCCESS);
    ASSERT_EQ(clEnqueueWriteBuffer(d.queue, sub, CL_TRUE, 0, 2 * kPart, a.data(), 0, nullptr,
                                   nullptr), CL_SUCCESS);
    clReleaseMemObject(sub);
    read_all();
    EXPECT_EQ(wrong_in(0, kP, &b, 0, k), 0u);
    EXPECT_EQ(wrong_in(kP, kN, &a, kP, 0), 0u) << "through the sub-buffer";
  }
  // Another thread's kernels and reads on another queue and buffer while large writes stream.
  std::atomic<bool> stop{false};
  std::atomic<size_t> other_wrong{0}, other_rounds{0};
  std::thread other([&] {
    cl_kernel add2 = clCreateKernel(p, "add", nullptr);
    std::vector<uint32_t> zeros(1024, 0), got(1024);
    clEnqueueWriteBuffer(q2, y, CL_TRUE, 0, 4096, zeros.data(), 0, nullptr, nullptr);
    uint32_t total = 0;
    while (!stop.load()) {
      const uint32_t one = 1;
      clSetKernelArg(add2, 0, sizeof(cl_mem), &y);
      clSetKernelArg(add2, 1, sizeof(one), &one);
      size_t g = 1024;
      clEnqueueNDRangeKernel(q2, add2, 1, nullptr, &g, nullptr, 0, nullptr, nullptr);
      ++total;
      clEnqueueReadBuffer(q2, y, CL_TRUE, 0, 4096, got.data(), 0, nullptr, nullptr);
      other_wrong += static_cast<size_t>(
          std::count_if(got.begin(), got.end(), [&](uint32_t v) { return v != total; }));
      ++other_rounds;
    }
    clReleaseKernel(add2);
  });
  for (uint32_t round = 0; round < 8; ++round) {
    auto src = Pattern(kN, 50 + round);
    ASSERT_EQ(clEnqueueWriteBuffer(d.queue, x, CL_TRUE, 0, kBytes, src.data(), 0, nullptr,
                                   nullptr), CL_SUCCESS);
    read_all();
    EXPECT_EQ(wrong_in(0, kN, &src, 0, 0), 0u) << "round " << round << " with another thread";
  }
  stop = true;
  other.join();
  EXPECT_EQ(other_wrong.load(), 0u);
  EXPECT_GT(other_rounds.load(), 0u);
  clReleaseMemObject(y);
  clReleaseMemObject(x);
  clReleaseKernel(fill);
  clReleaseKernel(add);
  clReleaseProgram(p);
  clReleaseCommandQueue(q2);
}

// Reads of buffers whose storage is the worker's (inline clients) are sent from the buffer
// itself; the read completes only once sent, so a kernel after it on its queue cannot change
// the bytes on their way, and a read whose wait list failed sends nothing and fails.
TEST(TransfersTest, ReadsSentFromTheBufferSeeOnlyWhatCameBefore) {
  ClDevice d;
  ASSERT_TRUE(OpenDevice(kGmux, d));
  cl_int err;
  std::string log;
  cl_program p = BuildProgram(
      d, "__kernel void add(__global uint* x, uint k) { x[get_global_id(0)] += k; }", &log);
  ASSERT_NE(p, nullptr) << log;
  cl_kernel add = clCreateKernel(p, "add", &err);
  ASSERT_EQ(err, CL_SUCCESS);
  constexpr size_t kBytes = size_t{48} << 20, kN = kBytes / 4;
  cl_mem x = clCreateBuffer(d.context, CL_MEM_READ_WRITE, kBytes, nullptr, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  const auto src = Pattern(kN, 77);
  ASSERT_EQ(clEnqueueWriteBuffer(d.queue, x, CL_TRUE, 0, kBytes, src.data(), 0, nullptr, nullptr),
            CL_SUCCESS);
  std::vector<uint32_t> first(kN), second(kN), part(kN / 4);
  for (uint32_t round = 1; round <= 3; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    ASSERT_EQ(clEnqueueReadBuffer(d.queue, x, CL_FALSE, 0, kBytes, first.data(), 0, nullptr,
                                  nullptr), CL_SUCCESS);
    clSetKernelArg(add, 0, sizeof(cl_mem), &x);
    clSetKernelArg(add, 1, sizeof(round), &round);
    size_t global = kN;
    ASSERT_EQ(clEnqueueNDRangeKernel(d.queue, add, 1, nullptr, &global, nullptr, 0, nullptr,
                                     nullptr), CL_SUCCESS);
    ASSERT_EQ(clEnqueueReadBuffer(d.queue, x, CL_FALSE, kBytes / 2, kBytes / 4, part.data(), 0,
                                  nullptr, nullptr), CL_SUCCESS);
    ASSERT_EQ(clEnqueueReadBuffer(d.queue, x, CL_FALSE, 0, kBytes, second.data(), 0, nullptr,
                                  nullptr), CL_SUCCESS);
    ASSERT_EQ(clFinish(d.queue), CL_SUCCESS);
    const uint32_t before = (round - 1) * round / 2, after = round * (round + 1) / 2;
    size_t wrong_first = 0, wrong_second = 0, wrong_part = 0;
    for (size_t i = 0; i < kN; ++i) {
      wrong_first += first[i] != src[i] + before;
      wrong_second += second[i] != src[i] + after;
    }
    for (size_t i = 0; i < part.size(); ++i) wrong_part += part[i] != src[kN / 2 + i] + after;
    EXPECT_EQ(wrong_first, 0u) << "the read before the kernel";
    EXPECT_EQ(wrong_part, 0u) << "a part at an offset, after the kernel";
    EXPECT_EQ(wrong_second, 0u) << "the read after the kernel";
  }
  // A read behind a user event set to an error fails, and the session goes on.
  cl_event gate = clCreateUserEvent(d.context, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  cl_event read_ev = nullptr;
  ASSERT_EQ(clEnqueueReadBuffer(d.queue, x, CL_FALSE, 0, kBytes, first.data(), 1, &gate,
                                &read_ev), CL_SUCCESS);
  ASSERT_EQ(clSetUserEventStatus(gate, -7), CL_SUCCESS);
  clWaitForEvents(1, &read_ev);
  cl_int status = 0;
  ASSERT_EQ(clGetEventInfo(read_ev, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof(status), &status,
                           nullptr), CL_SUCCESS);
  EXPECT_LT(status, 0);
  clReleaseEvent(read_ev);
  clReleaseEvent(gate);
  clFinish(d.queue);
  ASSERT_EQ(clEnqueueReadBuffer(d.queue, x, CL_TRUE, kBytes - 4096, 4096, part.data(), 0, nullptr,
                                nullptr), CL_SUCCESS);
  EXPECT_EQ(part[0], src[kN - 1024] + 6);
  clReleaseMemObject(x);
  clReleaseKernel(add);
  clReleaseProgram(p);
}

}  // namespace
}  // namespace gmux::testing
