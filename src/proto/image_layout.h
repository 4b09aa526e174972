// Host-memory layout of image regions, shared by the ICD (to size transfers) and gmuxd (to
// bound what the backend may touch in a staged buffer, never trusting the client's sizes).
// Header-only; the includer provides the OpenCL headers' constants.
#pragma once

#include <CL/cl.h>

#include <cstddef>
#include <cstdint>

namespace gmux::proto {

// Bytes of one pixel of `format`, or 0 for an unknown order or data type.
inline size_t ImageElementBytes(uint32_t channel_order, uint32_t channel_type) {
  size_t channels = 0;
  switch (channel_order) {
    case CL_R: case CL_A: case CL_INTENSITY: case CL_LUMINANCE: case CL_Rx:
#ifdef CL_DEPTH
    case CL_DEPTH:
#endif
      channels = 1;
      break;
    case CL_RG: case CL_RA: case CL_RGx:
      channels = 2;
      break;
    case CL_RGB: case CL_RGBx:
      channels = 3;
      break;
    case CL_RGBA: case CL_BGRA: case CL_ARGB:
#ifdef CL_ABGR
    case CL_ABGR:
#endif
      channels = 4;
      break;
    default:
      return 0;
  }
  switch (channel_type) {
    case CL_SNORM_INT8: case CL_UNORM_INT8: case CL_SIGNED_INT8: case CL_UNSIGNED_INT8:
      return channels;
    case CL_SNORM_INT16: case CL_UNORM_INT16: case CL_SIGNED_INT16: case CL_UNSIGNED_INT16:
    case CL_HALF_FLOAT:
      return 2 * channels;
    case CL_SIGNED_INT32: case CL_UNSIGNED_INT32: case CL_FLOAT:
      return 4 * channels;
    case CL_UNORM_SHORT_565: case CL_UNORM_SHORT_555:
      return channels == 3 ? 2 : 0;  // packed into 16 bits
    case CL_UNORM_INT_101010:
      return channels == 3 ? 4 : 0;  // packed into 32 bits
    default:
      return 0;
  }
}

// The end (exclusive) of a region of `region` pixels in host memory laid out with `row_pitch`
// and `slice_pitch` (0: tightly packed), for an image of `image_type`; false when the region is
// empty, a pitch is too small or the size overflows. For 1D image arrays region[1] counts
// array elements, stepped by the slice pitch, as in clEnqueueReadImage.
inline bool ImageHostBytes(uint32_t image_type, const size_t region[3], size_t element_bytes,
                           size_t row_pitch, size_t slice_pitch, uint64_t& end) {
  if (element_bytes == 0 || region[0] == 0 || region[1] == 0 || region[2] == 0) return false;
  size_t rows = region[1], slices = region[2];
  if (image_type == CL_MEM_OBJECT_IMAGE1D_ARRAY) {
    rows = 1;
    slices = region[1];
  }
  size_t width_bytes = 0;
  if (__builtin_mul_overflow(region[0], element_bytes, &width_bytes)) return false;
  size_t rp = row_pitch != 0 ? row_pitch : width_bytes;
  if (rp < width_bytes) return false;
  size_t min_slice = 0;
  if (__builtin_mul_overflow(rp, rows, &min_slice)) return false;
  size_t sp = slice_pitch != 0 ? slice_pitch : min_slice;
  if (sp < min_slice) return false;
  uint64_t a = 0, b = 0, sum = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(slices - 1), sp, &a) ||
      __builtin_mul_overflow(static_cast<uint64_t>(rows - 1), rp, &b) ||
      __builtin_add_overflow(a, b, &sum) || __builtin_add_overflow(sum, width_bytes, &sum) ||
      sum > (1ull << 40)) {
    return false;
  }
  end = sum;
  return true;
}

// The whole image's extent as a region (width, height or array size, depth or array size).
inline void ImageFullRegion(uint32_t image_type, size_t width, size_t height, size_t depth,
                            size_t array_size, size_t region[3]) {
  region[0] = width;
  region[1] = 1;
  region[2] = 1;
  switch (image_type) {
    case CL_MEM_OBJECT_IMAGE1D_ARRAY: region[1] = array_size; break;
    case CL_MEM_OBJECT_IMAGE2D: region[1] = height; break;
    case CL_MEM_OBJECT_IMAGE2D_ARRAY: region[1] = height; region[2] = array_size; break;
    case CL_MEM_OBJECT_IMAGE3D: region[1] = height; region[2] = depth; break;
    default: break;
  }
}

// The end (exclusive) of a rectangular region in a linear memory (the buffer side or the host
// side of clEnqueue{Read,Write,Copy}BufferRect), or false where OpenCL says CL_INVALID_VALUE:
// an empty region, a row pitch below region[0], a slice pitch below region[1] rows; or on
// overflow. Pitches of 0 take their OpenCL defaults and are written back.
inline bool RectEnd(const size_t origin[3], const size_t region[3], size_t& row_pitch,
                    size_t& slice_pitch, uint64_t& end) {
  if (region[0] == 0 || region[1] == 0 || region[2] == 0) return false;
  if (row_pitch == 0) row_pitch = region[0];
  size_t min_slice = 0;
  if (__builtin_mul_overflow(region[1], row_pitch, &min_slice)) return false;
  if (slice_pitch == 0) slice_pitch = min_slice;
  if (row_pitch < region[0] || slice_pitch < min_slice) return false;
  uint64_t z = 0, y = 0, x = 0, zs = 0, yr = 0, sum = 0;
  if (__builtin_add_overflow(origin[2], region[2] - 1, &z) ||
      __builtin_add_overflow(origin[1], region[1] - 1, &y) ||
      __builtin_add_overflow(origin[0], region[0], &x) ||
      __builtin_mul_overflow(z, slice_pitch, &zs) || __builtin_mul_overflow(y, row_pitch, &yr) ||
      __builtin_add_overflow(zs, yr, &sum) || __builtin_add_overflow(sum, x, &sum)) {
    return false;
  }
  if (sum > (1ull << 62)) return false;
  end = sum;
  return true;
}

}  // namespace gmux::proto
