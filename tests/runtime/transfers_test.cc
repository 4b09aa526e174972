// Large transfers through gmux (shared memory for local clients; transfers_inline_test runs the
// same with GMUX_SHM=0, inline in the stream): every byte arrives, in both directions, at
// offsets, through blocking and non-blocking calls and map/unmap.
#include <gtest/gtest.h>

#include <cstdint>
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

}  // namespace
}  // namespace gmux::testing
