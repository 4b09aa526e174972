// Residency on the real backend (PoCL through its dispatch table, no daemon): a session's
// allocations leave the device and come back with their contents, dependents (sub-buffers, a 1D
// image on a buffer) are made again on what they lie in, the session's handles stay the same
// objects, and released allocations are collected once nothing holds them.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <numeric>
#include <vector>

#include "daemon/backend.h"
#include "daemon/cl_ref.h"
#include "daemon/residency.h"

namespace gmux::daemon {
namespace {

class ResidencyTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto b = Backend::Open(BackendOptions{});
    if (!b.ok()) return;
    backend_ = std::move(b).value().release();
  }
  void SetUp() override {
    if (backend_ == nullptr) GTEST_SKIP() << "no OpenCL backend";
    const cl_icd_dispatch& cl = backend_->cl();
    dev_ = backend_->devices()[0];
    cl_int err = CL_SUCCESS;
    ctx_ = Adopt(cl.clCreateContext(nullptr, 1, &dev_, nullptr, nullptr, &err));
    ASSERT_EQ(err, CL_SUCCESS);
    q_ = Adopt(cl.clCreateCommandQueue(ctx_->h, dev_, 0, &err));
    ASSERT_EQ(err, CL_SUCCESS);
  }

  const cl_icd_dispatch& cl() const { return backend_->cl(); }

  std::shared_ptr<Residency::Allocation> AddBuffer(Residency& r, const std::vector<uint32_t>& data) {
    cl_int err = CL_SUCCESS;
    cl_mem m = cl().clCreateBuffer(ctx_->h, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR,
                                   data.size() * 4, const_cast<uint32_t*>(data.data()), &err);
    EXPECT_EQ(err, CL_SUCCESS);
    Residency::Allocation a;
    a.kind = Residency::Kind::kBuffer;
    a.mem = Adopt(m);
    a.context = ctx_;
    a.devices = {0};
    a.flags = CL_MEM_READ_WRITE;
    a.bytes = data.size() * 4;
    auto lock = r.Lock();
    return r.AddLocked(std::move(a));
  }

  std::vector<uint32_t> Read(const Ref<cl_mem>& m, size_t words) {
    std::vector<uint32_t> out(words);
    EXPECT_EQ(cl().clEnqueueReadBuffer(q_->h, m->h, CL_TRUE, 0, words * 4, out.data(), 0, nullptr,
                                       nullptr),
              CL_SUCCESS);
    return out;
  }

  static Backend* backend_;
  cl_device_id dev_ = nullptr;
  Ref<cl_context> ctx_;
  Ref<cl_command_queue> q_;
};
Backend* ResidencyTest::backend_ = nullptr;

TEST_F(ResidencyTest, BuffersAndSubBuffersComeBackWithTheirContents) {
  Residency r(cl(), backend_->devices());
  std::vector<uint32_t> data(1 << 16);
  std::iota(data.begin(), data.end(), 7u);
  auto buf = AddBuffer(r, data);
  Ref<cl_mem> held = buf->mem;  // as a command would hold it
  std::shared_ptr<Residency::Allocation> sub;
  {
    auto lock = r.Lock();
    cl_buffer_region region{data.size() * 2, data.size() * 2};
    cl_int err = CL_SUCCESS;
    cl_mem m = cl().clCreateSubBuffer(buf->mem->h, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION,
                                      &region, &err);
    ASSERT_EQ(err, CL_SUCCESS);
    Residency::Allocation a;
    a.kind = Residency::Kind::kSubBuffer;
    a.mem = Adopt(m);
    a.context = ctx_;
    a.devices = {0};
    a.flags = CL_MEM_READ_WRITE;
    a.parent = buf;
    a.region = region;
    sub = r.AddLocked(std::move(a));
  }
  const int64_t live = LiveBackendObjects();
  EXPECT_FALSE(r.Evicted(0));
  Residency::Moved out = r.Evict(0);
  EXPECT_EQ(out.error, CL_SUCCESS);
  EXPECT_EQ(out.objects, 1u);  // the sub-buffer is made again, not saved
  EXPECT_EQ(out.bytes, data.size() * 4);
  EXPECT_TRUE(r.Evicted(0));
  EXPECT_EQ(buf->mem->h, nullptr);
  EXPECT_EQ(sub->mem->h, nullptr);
  EXPECT_EQ(held.get(), buf->mem.get()) << "the session's object is the same Held";
  Residency::Moved in = r.Restore(0);
  EXPECT_EQ(in.error, CL_SUCCESS);
  EXPECT_EQ(in.objects, 1u);
  EXPECT_FALSE(r.Evicted(0));
  ASSERT_NE(held->h, nullptr);
  EXPECT_EQ(Read(held, data.size()), data);
  std::vector<uint32_t> second(data.begin() + data.size() / 2, data.end());
  EXPECT_EQ(Read(sub->mem, second.size()), second);
  EXPECT_EQ(LiveBackendObjects(), live) << "no backend reference gained or lost";
  const Residency::Totals t = r.totals();
  EXPECT_EQ(t.evictions, 1u);
  EXPECT_EQ(t.restores, 1u);
  EXPECT_EQ(t.bytes_out, data.size() * 4);
  EXPECT_EQ(t.bytes_in, data.size() * 4);
}

TEST_F(ResidencyTest, AnImageOnABufferIsMadeAgainOnTheRestoredBuffer) {
  cl_bool images = CL_FALSE;
  cl().clGetDeviceInfo(dev_, CL_DEVICE_IMAGE_SUPPORT, sizeof(images), &images, nullptr);
  if (images != CL_TRUE) GTEST_SKIP() << "backend without images";
  Residency r(cl(), backend_->devices());
  std::vector<uint32_t> data(4096);
  std::iota(data.begin(), data.end(), 100u);
  auto buf = AddBuffer(r, data);
  std::shared_ptr<Residency::Allocation> img;
  {
    auto lock = r.Lock();
    cl_image_format fmt{CL_RGBA, CL_UNSIGNED_INT8};
    cl_image_desc desc{};
    desc.image_type = CL_MEM_OBJECT_IMAGE1D_BUFFER;
    desc.image_width = data.size();
    desc.buffer = buf->mem->h;
    cl_int err = CL_SUCCESS;
    cl_mem m = cl().clCreateImage(ctx_->h, CL_MEM_READ_ONLY, &fmt, &desc, nullptr, &err);
    if (m == nullptr) GTEST_SKIP() << "no 1D image buffers (" << err << ")";
    Residency::Allocation a;
    a.kind = Residency::Kind::kImageOnBuffer;
    a.mem = Adopt(m);
    a.context = ctx_;
    a.devices = {0};
    a.flags = CL_MEM_READ_ONLY;
    a.format = fmt;
    a.desc = desc;
    a.desc.buffer = nullptr;
    a.parent = buf;
    img = r.AddLocked(std::move(a));
  }
  ASSERT_EQ(r.Evict(0).error, CL_SUCCESS);
  // The session asks about the image while it is off the device: it comes back on demand.
  {
    auto lock = r.Lock();
    ASSERT_EQ(r.UseLocked(img), CL_SUCCESS);
  }
  ASSERT_NE(img->mem->h, nullptr);
  ASSERT_NE(buf->mem->h, nullptr) << "what the image lies in came back first";
  std::vector<uint32_t> back(data.size());
  const size_t origin[3] = {0, 0, 0}, region[3] = {data.size(), 1, 1};
  ASSERT_EQ(cl().clEnqueueReadImage(q_->h, img->mem->h, CL_TRUE, origin, region, 0, 0, back.data(),
                                    0, nullptr, nullptr),
            CL_SUCCESS);
  EXPECT_EQ(back, data);
  EXPECT_TRUE(r.Evicted(0)) << "the device flag clears at the next Restore";
  EXPECT_EQ(r.Restore(0).objects, 0u);
  EXPECT_FALSE(r.Evicted(0));
}

TEST_F(ResidencyTest, ReleasedAllocationsGoOnceNothingHoldsThem) {
  Residency r(cl(), backend_->devices());
  std::vector<uint32_t> data(1024, 1u);
  const int64_t before = LiveBackendObjects();
  auto buf = AddBuffer(r, data);
  Ref<cl_mem> command_ref = buf->mem;  // a queued command still holds the object
  Residency::Allocation* raw = buf.get();
  buf.reset();  // the application released it
  {
    auto lock = r.Lock();
    r.ReleasedLocked(raw);
  }
  EXPECT_EQ(r.BytesOn(0), data.size() * 4) << "kept while a command holds it";
  EXPECT_EQ(LiveBackendObjects(), before + 1);
  command_ref.reset();  // the command completed
  r.CollectIfPending();
  EXPECT_EQ(r.BytesOn(0), 0u);
  EXPECT_EQ(LiveBackendObjects(), before);
  // Nothing left to move.
  EXPECT_EQ(r.Evict(0).objects, 0u);
}

}  // namespace
}  // namespace gmux::daemon
