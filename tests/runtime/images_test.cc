// Images and samplers through gmux, compared with the same calls on PoCL directly: image
// support and formats as the backend reports them, 2D/3D images created with and without host
// data, read/write of sub-regions with pitches, copy, fill, image<->buffer copies, map/unmap,
// image info, and a kernel sampling one image with a host-created sampler into another.
// clCreateImage2D/3D are exercised too (OpenCL 1.1 entry points, deprecated in 1.2).
#define CL_USE_DEPRECATED_OPENCL_1_1_APIS
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/runtime_env.h"

namespace gmux::testing {
namespace {

std::vector<uint8_t> Pixels(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  uint32_t x = seed;
  for (auto& e : v) {
    x = x * 1664525u + 1013904223u;
    e = static_cast<uint8_t>(x >> 24);
  }
  return v;
}

bool ImageSupport(const ClDevice& d) {
  cl_bool b = CL_FALSE;
  clGetDeviceInfo(d.device, CL_DEVICE_IMAGE_SUPPORT, sizeof(b), &b, nullptr);
  return b == CL_TRUE;
}

TEST(ImagesTest, ImageSupportAndFormatsMatchTheBackend) {
  ClDevice g, n;
  ASSERT_TRUE(OpenDevice(kGmux, g));
  ASSERT_TRUE(OpenDevice(kNative, n));
  EXPECT_EQ(ImageSupport(g), ImageSupport(n));
  for (cl_mem_object_type t : {CL_MEM_OBJECT_IMAGE2D, CL_MEM_OBJECT_IMAGE3D}) {
    cl_uint ng = 0, nn = 0;
    ASSERT_EQ(clGetSupportedImageFormats(g.context, CL_MEM_READ_WRITE, t, 0, nullptr, &ng), CL_SUCCESS);
    ASSERT_EQ(clGetSupportedImageFormats(n.context, CL_MEM_READ_WRITE, t, 0, nullptr, &nn), CL_SUCCESS);
    ASSERT_EQ(ng, nn);
    std::vector<cl_image_format> fg(ng), fn(nn);
    if (ng == 0) continue;
    ASSERT_EQ(clGetSupportedImageFormats(g.context, CL_MEM_READ_WRITE, t, ng, fg.data(), nullptr), CL_SUCCESS);
    ASSERT_EQ(clGetSupportedImageFormats(n.context, CL_MEM_READ_WRITE, t, nn, fn.data(), nullptr), CL_SUCCESS);
    for (cl_uint i = 0; i < ng; ++i) {
      EXPECT_EQ(fg[i].image_channel_order, fn[i].image_channel_order);
      EXPECT_EQ(fg[i].image_channel_data_type, fn[i].image_channel_data_type);
    }
  }
}

const char* kSampleSource = R"(
__kernel void shift_invert(__read_only image2d_t src, __write_only image2d_t dst, sampler_t s) {
  int2 p = (int2)(get_global_id(0), get_global_id(1));
  uint4 v = read_imageui(src, s, p + (int2)(1, -1));   // clamped at the edges
  write_imageui(dst, p, (uint4)(255) - v);
}
)";

// Everything one platform computes, in order, for comparison.
struct ImageResults {
  std::vector<uint8_t> initial, region, copied, filled, via_buffer, mapped, sampled, volume;
  size_t width = 0, height = 0, element = 0, depth = 0;
  cl_mem_object_type type = 0;
  cl_uint sampler_addressing = 0;
};

void RunImages(const std::string& platform, ImageResults& out) {
  ClDevice d;
  ASSERT_TRUE(OpenDevice(platform, d));
  if (!ImageSupport(d)) GTEST_SKIP() << "backend without images";
  const size_t w = 37, h = 23;
  cl_image_format fmt{CL_RGBA, CL_UNSIGNED_INT8};
  cl_image_desc desc{};
  desc.image_type = CL_MEM_OBJECT_IMAGE2D;
  desc.image_width = w;
  desc.image_height = h;
  auto host = Pixels(w * h * 4, 5);
  cl_int err;
  cl_mem a = clCreateImage(d.context, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, &fmt, &desc, host.data(), &err);
  ASSERT_EQ(err, CL_SUCCESS);
  auto host_b = Pixels(w * h * 4, 13);  // defined contents: uninitialised images may differ
  cl_mem b = clCreateImage(d.context, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, &fmt, &desc,
                           host_b.data(), &err);
  ASSERT_EQ(err, CL_SUCCESS);
  size_t origin[3] = {0, 0, 0}, full[3] = {w, h, 1};
  out.initial.assign(w * h * 4, 0);
  ASSERT_EQ(clEnqueueReadImage(d.queue, a, CL_TRUE, origin, full, 0, 0, out.initial.data(), 0, nullptr, nullptr), CL_SUCCESS);

  // A sub-region written with a padded row pitch, read back with another.
  size_t ro[3] = {3, 4, 0}, rr[3] = {11, 7, 1};
  const size_t in_pitch = 11 * 4 + 12, out_pitch = 11 * 4 + 4;
  auto patch = Pixels(in_pitch * 7, 9);
  ASSERT_EQ(clEnqueueWriteImage(d.queue, a, CL_FALSE, ro, rr, in_pitch, 0, patch.data(), 0, nullptr, nullptr), CL_SUCCESS);
  out.region.assign(out_pitch * 7, 0);
  ASSERT_EQ(clEnqueueReadImage(d.queue, a, CL_TRUE, ro, rr, out_pitch, 0, out.region.data(), 0, nullptr, nullptr), CL_SUCCESS);

  // Copy a region of a into b, fill part of b, read b.
  size_t co[3] = {20, 10, 0}, cr[3] = {15, 12, 1};
  ASSERT_EQ(clEnqueueCopyImage(d.queue, a, b, origin, co, cr, 0, nullptr, nullptr), CL_SUCCESS);
  cl_uint4 color = {{1, 2, 3, 4}};
  size_t fo[3] = {0, 0, 0}, fr[3] = {10, 5, 1};
  ASSERT_EQ(clEnqueueFillImage(d.queue, b, &color, fo, fr, 0, nullptr, nullptr), CL_SUCCESS);
  out.copied.assign(w * h * 4, 0);
  ASSERT_EQ(clEnqueueReadImage(d.queue, b, CL_TRUE, origin, full, 0, 0, out.copied.data(), 0, nullptr, nullptr), CL_SUCCESS);
  out.filled.assign(out.copied.begin(), out.copied.begin() + 10 * 4);

  // Image -> buffer -> image.
  cl_mem buf = clCreateBuffer(d.context, CL_MEM_READ_WRITE, w * h * 4 + 64, nullptr, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  ASSERT_EQ(clEnqueueCopyImageToBuffer(d.queue, a, buf, ro, rr, 64, 0, nullptr, nullptr), CL_SUCCESS);
  size_t bo[3] = {1, 1, 0};
  ASSERT_EQ(clEnqueueCopyBufferToImage(d.queue, buf, b, 64, bo, rr, 0, nullptr, nullptr), CL_SUCCESS);
  out.via_buffer.assign(w * h * 4, 0);
  ASSERT_EQ(clEnqueueReadImage(d.queue, b, CL_TRUE, origin, full, 0, 0, out.via_buffer.data(), 0, nullptr, nullptr), CL_SUCCESS);

  // Map a region for writing, change it, unmap, read the whole image.
  size_t row_pitch = 0;
  size_t mo[3] = {5, 5, 0}, mr[3] = {6, 3, 1};
  auto* p = static_cast<uint8_t*>(clEnqueueMapImage(d.queue, b, CL_TRUE, CL_MAP_READ | CL_MAP_WRITE, mo, mr,
                                                    &row_pitch, nullptr, 0, nullptr, nullptr, &err));
  ASSERT_EQ(err, CL_SUCCESS);
  ASSERT_GE(row_pitch, 6u * 4);
  for (size_t y = 0; y < 3; ++y) {
    for (size_t x = 0; x < 6 * 4; ++x) p[y * row_pitch + x] = static_cast<uint8_t>(p[y * row_pitch + x] ^ 0x5a);
  }
  ASSERT_EQ(clEnqueueUnmapMemObject(d.queue, b, p, 0, nullptr, nullptr), CL_SUCCESS);
  out.mapped.assign(w * h * 4, 0);
  ASSERT_EQ(clEnqueueReadImage(d.queue, b, CL_TRUE, origin, full, 0, 0, out.mapped.data(), 0, nullptr, nullptr), CL_SUCCESS);

  // A kernel reading through a host sampler.
  cl_sampler s = clCreateSampler(d.context, CL_FALSE, CL_ADDRESS_CLAMP_TO_EDGE, CL_FILTER_NEAREST, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  ASSERT_EQ(clGetSamplerInfo(s, CL_SAMPLER_ADDRESSING_MODE, sizeof(out.sampler_addressing),
                             &out.sampler_addressing, nullptr), CL_SUCCESS);
  std::string log;
  cl_program prog = BuildProgram(d, kSampleSource, &log);
  ASSERT_NE(prog, nullptr) << log;
  cl_kernel k = clCreateKernel(prog, "shift_invert", &err);
  ASSERT_EQ(err, CL_SUCCESS);
  ASSERT_EQ(clSetKernelArg(k, 0, sizeof(cl_mem), &a), CL_SUCCESS);
  ASSERT_EQ(clSetKernelArg(k, 1, sizeof(cl_mem), &b), CL_SUCCESS);
  ASSERT_EQ(clSetKernelArg(k, 2, sizeof(cl_sampler), &s), CL_SUCCESS);
  size_t gs[2] = {w, h};
  ASSERT_EQ(clEnqueueNDRangeKernel(d.queue, k, 2, nullptr, gs, nullptr, 0, nullptr, nullptr), CL_SUCCESS);
  out.sampled.assign(w * h * 4, 0);
  ASSERT_EQ(clEnqueueReadImage(d.queue, b, CL_TRUE, origin, full, 0, 0, out.sampled.data(), 0, nullptr, nullptr), CL_SUCCESS);

  ASSERT_EQ(clGetImageInfo(a, CL_IMAGE_WIDTH, sizeof(size_t), &out.width, nullptr), CL_SUCCESS);
  ASSERT_EQ(clGetImageInfo(a, CL_IMAGE_HEIGHT, sizeof(size_t), &out.height, nullptr), CL_SUCCESS);
  ASSERT_EQ(clGetImageInfo(a, CL_IMAGE_ELEMENT_SIZE, sizeof(size_t), &out.element, nullptr), CL_SUCCESS);
  ASSERT_EQ(clGetMemObjectInfo(a, CL_MEM_TYPE, sizeof(out.type), &out.type, nullptr), CL_SUCCESS);
  cl_image_format got{};
  ASSERT_EQ(clGetImageInfo(a, CL_IMAGE_FORMAT, sizeof(got), &got, nullptr), CL_SUCCESS);
  EXPECT_EQ(got.image_channel_order, static_cast<cl_channel_order>(CL_RGBA));

  // A 3D image from host data with padded pitches, read back tightly.
  const size_t vw = 9, vh = 5, vd = 4, vrow = 9 * 4 + 8, vslice = vrow * 6;
  cl_image_format ffmt{CL_R, CL_FLOAT};
  std::vector<float> vol(vslice * vd / 4);
  for (size_t i = 0; i < vol.size(); ++i) vol[i] = static_cast<float>(i) * 0.5f;
  cl_mem v = clCreateImage3D(d.context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, &ffmt, vw, vh, vd, vrow,
                             vslice, vol.data(), &err);
  ASSERT_EQ(err, CL_SUCCESS);
  size_t vreg[3] = {vw, vh, vd};
  out.volume.assign(vw * vh * vd * 4, 0);
  ASSERT_EQ(clEnqueueReadImage(d.queue, v, CL_TRUE, origin, vreg, 0, 0, out.volume.data(), 0, nullptr, nullptr), CL_SUCCESS);
  ASSERT_EQ(clGetImageInfo(v, CL_IMAGE_DEPTH, sizeof(size_t), &out.depth, nullptr), CL_SUCCESS);

  ASSERT_EQ(clFinish(d.queue), CL_SUCCESS);
  clReleaseMemObject(v);
  clReleaseKernel(k);
  clReleaseProgram(prog);
  clReleaseSampler(s);
  clReleaseMemObject(buf);
  clReleaseMemObject(b);
  clReleaseMemObject(a);
}

TEST(ImagesTest, ImageOperationsMatchNative) {
  ImageResults g, n;
  RunImages(kNative, n);
  if (IsSkipped() || HasFatalFailure()) return;
  RunImages(kGmux, g);
  if (HasFatalFailure()) return;
  EXPECT_EQ(g.initial, n.initial);
  EXPECT_EQ(g.region, n.region);
  EXPECT_EQ(g.copied, n.copied);
  EXPECT_EQ(g.filled, n.filled);
  EXPECT_EQ(g.via_buffer, n.via_buffer);
  EXPECT_EQ(g.mapped, n.mapped);
  EXPECT_EQ(g.sampled, n.sampled);
  EXPECT_EQ(g.volume, n.volume);
  EXPECT_EQ(g.width, n.width);
  EXPECT_EQ(g.height, n.height);
  EXPECT_EQ(g.element, n.element);
  EXPECT_EQ(g.depth, n.depth);
  EXPECT_EQ(g.type, static_cast<cl_mem_object_type>(CL_MEM_OBJECT_IMAGE2D));
  EXPECT_EQ(g.sampler_addressing, n.sampler_addressing);
  // The results are not trivially equal: the fill and the kernel left their marks.
  EXPECT_EQ(n.filled[0], 1);
  EXPECT_EQ(n.filled[3], 4);
  EXPECT_NE(n.sampled, n.mapped);
}

// A pitch that says nothing about the layout (the slice pitch of a 2D image, the row pitch of a
// 1D one) may be anything; it must not make gmux pad the image to that size, nor read past what
// the program gave. The image holds exactly the program's pixels.
TEST(ImagesTest, PitchesBeyondOneRowOrSliceAreNotPadded) {
  ClDevice d;
  ASSERT_TRUE(OpenDevice(kGmux, d));
  if (!ImageSupport(d)) GTEST_SKIP() << "backend without images";
  cl_image_format fmt{CL_RGBA, CL_UNSIGNED_INT8};
  const size_t w = 5, h = 3;
  auto host = Pixels(w * h * 4, 21);
  cl_image_desc desc{};
  desc.image_type = CL_MEM_OBJECT_IMAGE2D;
  desc.image_width = w;
  desc.image_height = h;
  desc.image_slice_pitch = size_t{1} << 39;
  cl_int err = CL_SUCCESS;
  cl_mem img = clCreateImage(d.context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, &fmt, &desc,
                             host.data(), &err);
  if (err == CL_SUCCESS) {
    std::vector<uint8_t> back(host.size());
    size_t o[3] = {0, 0, 0}, r[3] = {w, h, 1};
    ASSERT_EQ(clEnqueueReadImage(d.queue, img, CL_TRUE, o, r, 0, 0, back.data(), 0, nullptr,
                                 nullptr),
              CL_SUCCESS);
    EXPECT_EQ(back, host);
    clReleaseMemObject(img);
  } else {
    EXPECT_EQ(img, nullptr);
  }
  cl_image_desc one{};
  one.image_type = CL_MEM_OBJECT_IMAGE1D;
  one.image_width = w;
  one.image_row_pitch = size_t{1} << 39;
  img = clCreateImage(d.context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, &fmt, &one, host.data(),
                      &err);
  if (err == CL_SUCCESS) {
    std::vector<uint8_t> back(w * 4);
    size_t o[3] = {0, 0, 0}, r[3] = {w, 1, 1};
    ASSERT_EQ(clEnqueueReadImage(d.queue, img, CL_TRUE, o, r, 0, 0, back.data(), 0, nullptr,
                                 nullptr),
              CL_SUCCESS);
    EXPECT_TRUE(std::equal(back.begin(), back.end(), host.begin()));
    clReleaseMemObject(img);
  }
  // The session still serves.
  cl_mem buf = clCreateBuffer(d.context, CL_MEM_READ_WRITE, 64, nullptr, &err);
  EXPECT_EQ(err, CL_SUCCESS);
  if (buf != nullptr) clReleaseMemObject(buf);
}

TEST(ImagesTest, BufferCallsRefuseImagesAndImageCallsRefuseBuffers) {
  ClDevice d;
  ASSERT_TRUE(OpenDevice(kGmux, d));
  if (!ImageSupport(d)) GTEST_SKIP() << "backend without images";
  cl_int err;
  cl_image_format fmt{CL_RGBA, CL_UNORM_INT8};
  cl_mem img = clCreateImage2D(d.context, CL_MEM_READ_WRITE, &fmt, 8, 8, 0, nullptr, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  cl_mem buf = clCreateBuffer(d.context, CL_MEM_READ_WRITE, 256, nullptr, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  std::vector<uint8_t> host(256);
  EXPECT_NE(clEnqueueReadBuffer(d.queue, img, CL_TRUE, 0, 16, host.data(), 0, nullptr, nullptr), CL_SUCCESS);
  size_t o[3] = {0, 0, 0}, r[3] = {2, 2, 1};
  EXPECT_EQ(clEnqueueReadImage(d.queue, buf, CL_TRUE, o, r, 0, 0, host.data(), 0, nullptr, nullptr),
            CL_INVALID_MEM_OBJECT);
  // A pitch smaller than a row is refused before anything is sent.
  EXPECT_EQ(clEnqueueReadImage(d.queue, img, CL_TRUE, o, r, 4, 0, host.data(), 0, nullptr, nullptr),
            CL_INVALID_VALUE);
  // A region outside the image fails: at the call or, as the backend finds it, in its event.
  size_t big[3] = {9, 1, 1};
  cl_event ev = nullptr;
  cl_int e = clEnqueueWriteImage(d.queue, img, CL_FALSE, o, big, 0, 0, host.data(), 0, nullptr, &ev);
  if (e == CL_SUCCESS) {
    EXPECT_NE(clWaitForEvents(1, &ev), CL_SUCCESS);
    clReleaseEvent(ev);
  }
  // The session is still usable.
  EXPECT_EQ(clEnqueueReadImage(d.queue, img, CL_TRUE, o, r, 0, 0, host.data(), 0, nullptr, nullptr), CL_SUCCESS);
  clReleaseMemObject(buf);
  clReleaseMemObject(img);
}

}  // namespace
}  // namespace gmux::testing
