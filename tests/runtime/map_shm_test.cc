// Large buffer mappings through gmux: on a buffer on shared memory (the default for local
// clients on a device that works on host memory in place), a blocking mapping is the buffer
// itself; otherwise, and for non-blocking ones, they live in the client's pooled shared memory
// (the daemon reads into it, unmap writes back from it). Every mapping kind keeps OpenCL's
// semantics while the pooled buffers are reused across mappings, reads and writes. Built twice:
// map_shm_copy_test turns buffers on shared memory off (GMUX_BUFFER_STORAGE=0).
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "runtime/runtime_env.h"

namespace gmux::testing {
namespace {

// Whether `p` lies in a mapping of a buffer on shared memory.
bool InStorage(const void* p) {
  const auto at = reinterpret_cast<uintptr_t>(p);
  for (const auto& [from, to] : StorageMappings()) {
    if (at >= from && at < to) return true;
  }
  return false;
}

bool StorageOff() { return EnvIs("GMUX_BUFFER_STORAGE", "0"); }

TEST(MapShmTest, MappingsReuseSharedBuffersAndKeepSemantics) {
  ClDevice d;
  ASSERT_TRUE(OpenDevice(kGmux, d));
  const size_t n = (3u << 20) / 4;  // 3 MiB: above the shared-memory threshold
  cl_int err;
  cl_mem m = clCreateBuffer(d.context, CL_MEM_READ_WRITE, n * 4, nullptr, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  for (uint32_t round = 0; round < 4; ++round) {
    // Write-invalidate: no read; everything written through the mapping arrives.
    auto* w = static_cast<uint32_t*>(clEnqueueMapBuffer(
        d.queue, m, CL_TRUE, CL_MAP_WRITE_INVALIDATE_REGION, 0, n * 4, 0, nullptr, nullptr, &err));
    ASSERT_EQ(err, CL_SUCCESS);
    for (size_t i = 0; i < n; ++i) w[i] = static_cast<uint32_t>(i * 3 + round);
    ASSERT_EQ(clEnqueueUnmapMemObject(d.queue, m, w, 0, nullptr, nullptr), CL_SUCCESS);

    // A read-only mapping at an offset sees it; scribbling on it must not reach the device.
    const size_t off = 12345;
    auto* r = static_cast<uint32_t*>(clEnqueueMapBuffer(d.queue, m, CL_TRUE, CL_MAP_READ,
                                                        off * 4, (n - off) * 4, 0, nullptr,
                                                        nullptr, &err));
    ASSERT_EQ(err, CL_SUCCESS);
    for (size_t i = 0; i < n - off; i += 997) {
      ASSERT_EQ(r[i], static_cast<uint32_t>((i + off) * 3 + round)) << i;
    }
    // A blocking mapping of a buffer on shared memory is the buffer itself.
    EXPECT_EQ(InStorage(r), !StorageOff());
    // Writing through a read-only mapping is undefined in OpenCL. Copied, it does not reach the
    // buffer; in place it does, as natively on a CPU device.
    if (StorageOff()) r[0] = 0xdeadbeef;
    ASSERT_EQ(clEnqueueUnmapMemObject(d.queue, m, r, 0, nullptr, nullptr), CL_SUCCESS);

    // A plain read (which may reuse the buffer the read-only mapping gave back) is unchanged.
    std::vector<uint32_t> back(n, 0);
    ASSERT_EQ(clEnqueueReadBuffer(d.queue, m, CL_TRUE, 0, n * 4, back.data(), 0, nullptr, nullptr),
              CL_SUCCESS);
    ASSERT_EQ(back[off], static_cast<uint32_t>(off * 3 + round));
    ASSERT_EQ(back[n - 1], static_cast<uint32_t>((n - 1) * 3 + round));

    // A non-blocking read-write mapping, completed by its event, writes back on unmap.
    cl_event ev;
    auto* rw = static_cast<uint32_t*>(clEnqueueMapBuffer(d.queue, m, CL_FALSE,
                                                         CL_MAP_READ | CL_MAP_WRITE, 0, n * 4,
                                                         0, nullptr, &ev, &err));
    ASSERT_EQ(err, CL_SUCCESS);
    ASSERT_EQ(clWaitForEvents(1, &ev), CL_SUCCESS);
    clReleaseEvent(ev);
    ASSERT_EQ(rw[7], static_cast<uint32_t>(7 * 3 + round));
    rw[7] = 77;
    ASSERT_EQ(clEnqueueUnmapMemObject(d.queue, m, rw, 0, nullptr, nullptr), CL_SUCCESS);
    uint32_t v = 0;
    ASSERT_EQ(clEnqueueReadBuffer(d.queue, m, CL_TRUE, 28, 4, &v, 0, nullptr, nullptr), CL_SUCCESS);
    ASSERT_EQ(v, 77u);
  }
  ASSERT_EQ(clFinish(d.queue), CL_SUCCESS);
  clReleaseMemObject(m);
}

}  // namespace
}  // namespace gmux::testing
