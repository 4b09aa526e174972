// Images: formats, creation, info, and their transfers and maps.
#include "icd/common.h"

#include "proto/image_layout.h"

namespace gmux::icd {

cl_int CL_API_CALL GetSupportedImageFormats(cl_context ctx, cl_mem_flags flags,
                                            cl_mem_object_type type, cl_uint num_entries,
                                            cl_image_format* formats, cl_uint* num) {
  if (!Valid(ctx)) return CL_INVALID_CONTEXT;
  if (num_entries == 0 && formats != nullptr) return CL_INVALID_VALUE;
  Connection& c = Conn();
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire::Request>().initImageFormats();
  r.setContext(ctx->id);
  r.setFlags(flags);
  r.setImageType(type);
  std::optional<proto::Message> reply;
  cl_int err = c.Call(b, &reply);
  if (err != CL_SUCCESS) return err;
  if (!reply || !reply->root<wire::Reply>().isInfo()) return CL_OUT_OF_RESOURCES;
  auto info = reply->root<wire::Reply>().getInfo();
  std::vector<cl_image_format> all(info.size() / sizeof(cl_image_format));
  std::memcpy(all.data(), info.begin(), all.size() * sizeof(cl_image_format));
  if (formats != nullptr) {
    for (size_t i = 0; i < all.size() && i < num_entries; ++i) formats[i] = all[i];
  }
  if (num != nullptr) *num = static_cast<cl_uint>(all.size());
  return CL_SUCCESS;
}

namespace {

cl_mem MakeImage(cl_context ctx, cl_mem_flags flags, const cl_image_format* format,
                 const cl_image_desc* desc, void* host_ptr,
                 std::vector<cl_mem_properties> properties, cl_int* err) {
  if (!Valid(ctx)) return Fail(err, CL_INVALID_CONTEXT);
  if (format == nullptr) return Fail(err, CL_INVALID_IMAGE_FORMAT_DESCRIPTOR);
  if (desc == nullptr) return Fail(err, CL_INVALID_IMAGE_DESCRIPTOR);
  size_t element = proto::ImageElementBytes(format->image_channel_order,
                                            format->image_channel_data_type);
  if (element == 0) return Fail(err, CL_INVALID_IMAGE_FORMAT_DESCRIPTOR);
  bool needs_ptr = (flags & (CL_MEM_USE_HOST_PTR | CL_MEM_COPY_HOST_PTR)) != 0;
  if (needs_ptr != (host_ptr != nullptr)) return Fail(err, CL_INVALID_HOST_PTR);
  if (desc->buffer != nullptr && (!Valid(desc->buffer) || desc->buffer->is_image())) {
    SetErr(err, CL_INVALID_IMAGE_DESCRIPTOR);
    return nullptr;
  }
  cl_image_desc d = *desc;
  size_t region[3];
  proto::ImageFullRegion(static_cast<uint32_t>(d.image_type), d.image_width, d.image_height,
                         d.image_depth, d.image_array_size, region);
  uint64_t host_bytes = 0;
  if (needs_ptr) {
    if (!proto::ImageHostBytes(static_cast<uint32_t>(d.image_type), region, element,
                               d.image_row_pitch, d.image_slice_pitch, host_bytes)) {
      SetErr(err, CL_INVALID_IMAGE_SIZE);
      return nullptr;
    }
    // Keep the host layout with its defaults filled in (maps of USE_HOST_PTR images use it).
    if (d.image_row_pitch == 0) d.image_row_pitch = region[0] * element;
    if (d.image_slice_pitch == 0 && (d.image_type == CL_MEM_OBJECT_IMAGE3D ||
                                     d.image_type == CL_MEM_OBJECT_IMAGE2D_ARRAY)) {
      d.image_slice_pitch = d.image_row_pitch * d.image_height;
    } else if (d.image_slice_pitch == 0 && d.image_type == CL_MEM_OBJECT_IMAGE1D_ARRAY) {
      d.image_slice_pitch = d.image_row_pitch;
    }
  } else if (d.image_row_pitch != 0 || d.image_slice_pitch != 0) {
    SetErr(err, CL_INVALID_IMAGE_DESCRIPTOR);
    return nullptr;
  }
  Connection& c = Conn();
  uint64_t token = 0;
  ShmBuffer held;
  if (needs_ptr) {
    token = c.SendBulk(host_ptr, host_bytes, &held);
    if (token == 0) return Fail(err, CL_OUT_OF_RESOURCES);
  }
  auto m = NewMem(ctx, flags, 0, (flags & CL_MEM_USE_HOST_PTR) ? host_ptr : nullptr);
  m->type = d.image_type;
  m->format = *format;
  m->desc = d;
  m->element_bytes = element;
  m->properties = std::move(properties);
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire::Request>().initCreateImage();
  r.setId(m->id);
  r.setContext(ctx->id);
  r.setFlags(flags);
  r.setChannelOrder(format->image_channel_order);
  r.setChannelDataType(format->image_channel_data_type);
  auto wd = r.initDesc();
  wd.setType(d.image_type);
  wd.setWidth(d.image_width);
  wd.setHeight(d.image_height);
  wd.setDepth(d.image_depth);
  wd.setArraySize(d.image_array_size);
  wd.setRowPitch(needs_ptr ? desc->image_row_pitch : 0);
  wd.setSlicePitch(needs_ptr ? desc->image_slice_pitch : 0);
  wd.setBuffer(desc->buffer != nullptr ? desc->buffer->id : 0);
  r.setInitialData(token);
  cl_int e = c.Call(b);
  c.ReleaseShm(held);
  if (e != CL_SUCCESS) return Fail(err, e);
  if (desc->buffer != nullptr) {
    m->parent = desc->buffer;  // kept alive as long as the image, like a sub-buffer's parent
    desc->buffer->refs.fetch_add(1);
  }
  RetainContext(ctx);
  SetErr(err, CL_SUCCESS);
  return m.release();
}

}  // namespace

cl_mem CL_API_CALL CreateImage(cl_context ctx, cl_mem_flags flags, const cl_image_format* format,
                               const cl_image_desc* desc, void* host_ptr, cl_int* err) {
  return MakeImage(ctx, flags, format, desc, host_ptr, {}, err);
}

cl_mem CL_API_CALL CreateImageWithProperties(cl_context ctx, const cl_mem_properties* props,
                                             cl_mem_flags flags, const cl_image_format* format,
                                             const cl_image_desc* desc, void* host_ptr,
                                             cl_int* err) {
  std::vector<cl_mem_properties> list;
  if (cl_int e = MemProperties(props, list); e != CL_SUCCESS) return Fail(err, e);
  return MakeImage(ctx, flags, format, desc, host_ptr, std::move(list), err);
}

cl_mem CL_API_CALL CreateImage2D(cl_context ctx, cl_mem_flags flags, const cl_image_format* format,
                                 size_t width, size_t height, size_t row_pitch, void* host_ptr,
                                 cl_int* err) {
  cl_image_desc d{};
  d.image_type = CL_MEM_OBJECT_IMAGE2D;
  d.image_width = width;
  d.image_height = height;
  d.image_row_pitch = row_pitch;
  return CreateImage(ctx, flags, format, &d, host_ptr, err);
}

cl_mem CL_API_CALL CreateImage3D(cl_context ctx, cl_mem_flags flags, const cl_image_format* format,
                                 size_t width, size_t height, size_t depth, size_t row_pitch,
                                 size_t slice_pitch, void* host_ptr, cl_int* err) {
  cl_image_desc d{};
  d.image_type = CL_MEM_OBJECT_IMAGE3D;
  d.image_width = width;
  d.image_height = height;
  d.image_depth = depth;
  d.image_row_pitch = row_pitch;
  d.image_slice_pitch = slice_pitch;
  return CreateImage(ctx, flags, format, &d, host_ptr, err);
}

cl_int CL_API_CALL GetImageInfo(cl_mem m, cl_image_info param, size_t size, void* value,
                                size_t* size_ret) {
  if (!Valid(m) || !m->is_image()) return CL_INVALID_MEM_OBJECT;
  switch (param) {
    case CL_IMAGE_FORMAT: return Scalar(m->format, size, value, size_ret);
    case CL_IMAGE_ELEMENT_SIZE: return Scalar(m->element_bytes, size, value, size_ret);
    case CL_IMAGE_BUFFER:
      return Scalar<cl_mem>(m->desc.buffer != nullptr ? m->parent : nullptr, size, value, size_ret);
    default:
      return RemoteInfoOut(wire::ObjectKind::MEM, m->id, param, size, value, size_ret);
  }
}



namespace {

cl_int CheckImage(cl_command_queue q, cl_mem m) {
  if (cl_int e = CheckMem(q, m); e != CL_SUCCESS) return e;
  return m->is_image() ? CL_SUCCESS : CL_INVALID_MEM_OBJECT;
}

bool ValidTriple(const size_t* v) { return v != nullptr; }

// Host bytes of `region` of image m laid out with the given pitches (0 when invalid).
uint64_t ImageBytes(cl_mem m, const size_t region[3], size_t row_pitch, size_t slice_pitch) {
  uint64_t n = 0;
  if (!proto::ImageHostBytes(static_cast<uint32_t>(m->type), region, m->element_bytes, row_pitch,
                             slice_pitch, n)) {
    return 0;
  }
  return n;
}

// Reads `region` at `origin` into dst laid out with the given pitches (`bytes` host bytes). A
// tightly packed layout is read straight into dst (and may stay asynchronous); a layout with
// gaps is read into a staging copy whose region rows are then merged, so the application's bytes
// between rows stay untouched; such reads block (OpenCL allows a non-blocking call to block).
cl_int ReadImageInto(Enqueuer& enq, cl_mem m, const size_t origin[3], const size_t region[3],
                     size_t row_pitch, size_t slice_pitch, void* dst, size_t bytes, bool blocking) {
  auto r = enq.cmd().initReadImage();
  r.setMem(m->id);
  SetTriple(r.initOrigin(3), origin);
  SetTriple(r.initRegion(3), region);
  r.setRowPitch(row_pitch);
  r.setSlicePitch(slice_pitch);
  const bool array1d = m->type == CL_MEM_OBJECT_IMAGE1D_ARRAY;
  const size_t row_bytes = region[0] * m->element_bytes;
  const size_t rows = array1d ? 1 : region[1], slices = array1d ? region[1] : region[2];
  const size_t rp = row_pitch != 0 ? row_pitch : row_bytes;
  const size_t sp = slice_pitch != 0 ? slice_pitch : rp * rows;
  const bool dense = rp == row_bytes && (slices == 1 || sp == rp * rows);
  if (!dense) {
    std::vector<uint8_t> staging(bytes);
    uint64_t seq = enq.Begin(staging.data(), bytes, true);
    cl_int e = enq.WaitCompleted(seq);
    if (e == CL_SUCCESS) {
      for (size_t z = 0; z < slices; ++z) {
        for (size_t y = 0; y < rows; ++y) {
          size_t at = z * sp + y * rp;
          std::memcpy(static_cast<uint8_t*>(dst) + at, staging.data() + at, row_bytes);
        }
      }
    }
    return e;
  }
  uint64_t seq = 0;
  ShmBuffer buf;
  if (enq.conn().UseShm(bytes)) buf = enq.conn().AcquireShm(bytes);
  if (buf.valid()) r.setShm(true);
  seq = enq.Begin(dst, bytes, blocking, buf);
  return blocking ? enq.WaitCompleted(seq) : CL_SUCCESS;
}

}  // namespace

cl_int PostWriteImage(Enqueuer& enq, cl_mem m, const size_t origin[3], const size_t region[3],
                      size_t row_pitch, size_t slice_pitch, const void* src, size_t bytes,
                      cl_bool blocking) {
  ShmBuffer held;
  uint64_t token = enq.conn().SendBulk(src, bytes, &held);
  if (token == 0) return CL_OUT_OF_RESOURCES;
  auto w = enq.cmd().initWriteImage();
  w.setMem(m->id);
  SetTriple(w.initOrigin(3), origin);
  SetTriple(w.initRegion(3), region);
  w.setRowPitch(row_pitch);
  w.setSlicePitch(slice_pitch);
  w.setBulk(token);
  return enq.PostWrite(held, blocking, OnSharedMemory(m));
}


cl_int CL_API_CALL EnqueueReadImage(cl_command_queue q, cl_mem m, cl_bool blocking,
                                    const size_t* origin, const size_t* region, size_t row_pitch,
                                    size_t slice_pitch, void* ptr, cl_uint nwait,
                                    const cl_event* waits, cl_event* event) {
  if (cl_int e = CheckImage(q, m); e != CL_SUCCESS) return e;
  if (cl_int e = CheckHostAccess(m, true, false); e != CL_SUCCESS) return e;
  if (ptr == nullptr || !ValidTriple(origin) || !ValidTriple(region)) return CL_INVALID_VALUE;
  uint64_t bytes = ImageBytes(m, region, row_pitch, slice_pitch);
  if (bytes == 0) return CL_INVALID_VALUE;
  Enqueuer enq(q, nwait, waits, event, CL_COMMAND_READ_IMAGE);
  if (enq.err() != CL_SUCCESS) return enq.err();
  return ReadImageInto(enq, m, origin, region, row_pitch, slice_pitch, ptr, bytes, blocking);
}

cl_int CL_API_CALL EnqueueWriteImage(cl_command_queue q, cl_mem m, cl_bool blocking,
                                     const size_t* origin, const size_t* region,
                                     size_t row_pitch, size_t slice_pitch,
                                     const void* ptr, cl_uint nwait, const cl_event* waits,
                                     cl_event* event) {
  if (cl_int e = CheckImage(q, m); e != CL_SUCCESS) return e;
  if (cl_int e = CheckHostAccess(m, false, true); e != CL_SUCCESS) return e;
  if (ptr == nullptr || !ValidTriple(origin) || !ValidTriple(region)) return CL_INVALID_VALUE;
  uint64_t bytes = ImageBytes(m, region, row_pitch, slice_pitch);
  if (bytes == 0) return CL_INVALID_VALUE;
  Enqueuer enq(q, nwait, waits, event, CL_COMMAND_WRITE_IMAGE);
  if (enq.err() != CL_SUCCESS) return enq.err();
  // The data is copied out now, so a blocking write returns as soon as it is sent (PostWrite).
  return PostWriteImage(enq, m, origin, region, row_pitch, slice_pitch, ptr, bytes, blocking);
}

cl_int CL_API_CALL EnqueueCopyImage(cl_command_queue q, cl_mem src, cl_mem dst,
                                    const size_t* src_origin, const size_t* dst_origin,
                                    const size_t* region, cl_uint nwait, const cl_event* waits,
                                    cl_event* event) {
  if (cl_int e = CheckImage(q, src); e != CL_SUCCESS) return e;
  if (cl_int e = CheckImage(q, dst); e != CL_SUCCESS) return e;
  if (!ValidTriple(src_origin) || !ValidTriple(dst_origin) || !ValidTriple(region)) return CL_INVALID_VALUE;
  Enqueuer enq(q, nwait, waits, event, CL_COMMAND_COPY_IMAGE);
  if (enq.err() != CL_SUCCESS) return enq.err();
  auto c = enq.cmd().initCopyImage();
  c.setSrc(src->id);
  c.setDst(dst->id);
  SetTriple(c.initSrcOrigin(3), src_origin);
  SetTriple(c.initDstOrigin(3), dst_origin);
  SetTriple(c.initRegion(3), region);
  return enq.Post();
}

cl_int CL_API_CALL EnqueueFillImage(cl_command_queue q, cl_mem m, const void* color,
                                    const size_t* origin, const size_t* region, cl_uint nwait,
                                    const cl_event* waits, cl_event* event) {
  if (cl_int e = CheckImage(q, m); e != CL_SUCCESS) return e;
  if (color == nullptr || !ValidTriple(origin) || !ValidTriple(region)) return CL_INVALID_VALUE;
  Enqueuer enq(q, nwait, waits, event, CL_COMMAND_FILL_IMAGE);
  if (enq.err() != CL_SUCCESS) return enq.err();
  auto f = enq.cmd().initFillImage();
  f.setMem(m->id);
  // float4, int4 or uint4: always 16 bytes.
  f.setColor(kj::arrayPtr(static_cast<const kj::byte*>(color), 16));
  SetTriple(f.initOrigin(3), origin);
  SetTriple(f.initRegion(3), region);
  return enq.Post();
}

namespace {

cl_int CopyImageBuffer(cl_command_queue q, cl_mem image, cl_mem buffer, const size_t* origin,
                       const size_t* region, size_t offset, bool to_buffer, cl_uint nwait,
                       const cl_event* waits, cl_event* event) {
  if (cl_int e = CheckImage(q, image); e != CL_SUCCESS) return e;
  if (cl_int e = CheckMem(q, buffer); e != CL_SUCCESS) return e;
  if (buffer->is_image()) return CL_INVALID_MEM_OBJECT;
  if (!ValidTriple(origin) || !ValidTriple(region)) return CL_INVALID_VALUE;
  Enqueuer enq(q, nwait, waits, event,
               to_buffer ? CL_COMMAND_COPY_IMAGE_TO_BUFFER : CL_COMMAND_COPY_BUFFER_TO_IMAGE);
  if (enq.err() != CL_SUCCESS) return enq.err();
  auto c = to_buffer ? enq.cmd().initCopyImageToBuffer() : enq.cmd().initCopyBufferToImage();
  c.setImage(image->id);
  c.setBuffer(buffer->id);
  SetTriple(c.initOrigin(3), origin);
  SetTriple(c.initRegion(3), region);
  c.setOffset(offset);
  return enq.Post();
}

}  // namespace

cl_int CL_API_CALL EnqueueCopyImageToBuffer(cl_command_queue q, cl_mem src, cl_mem dst,
                                            const size_t* origin, const size_t* region,
                                            size_t dst_offset, cl_uint nwait,
                                            const cl_event* waits, cl_event* event) {
  return CopyImageBuffer(q, src, dst, origin, region, dst_offset, true, nwait, waits, event);
}

cl_int CL_API_CALL EnqueueCopyBufferToImage(cl_command_queue q, cl_mem src, cl_mem dst,
                                            size_t src_offset, const size_t* origin,
                                            const size_t* region, cl_uint nwait,
                                            const cl_event* waits, cl_event* event) {
  return CopyImageBuffer(q, dst, src, origin, region, src_offset, false, nwait, waits, event);
}

void* CL_API_CALL EnqueueMapImage(cl_command_queue q, cl_mem m, cl_bool blocking,
                                  cl_map_flags flags, const size_t* origin, const size_t* region,
                                  size_t* row_pitch, size_t* slice_pitch, cl_uint nwait,
                                  const cl_event* waits, cl_event* event, cl_int* err) {
  if (cl_int e = CheckImage(q, m); e != CL_SUCCESS) return Fail(err, e);
  if (!ValidTriple(origin) || !ValidTriple(region) || row_pitch == nullptr) {
    SetErr(err, CL_INVALID_VALUE);
    return nullptr;
  }
  bool layered = m->type == CL_MEM_OBJECT_IMAGE3D || m->type == CL_MEM_OBJECT_IMAGE2D_ARRAY ||
                 m->type == CL_MEM_OBJECT_IMAGE1D_ARRAY;
  if (layered && slice_pitch == nullptr) return Fail(err, CL_INVALID_VALUE);
  if (cl_int e = CheckMapAccess(m, flags); e != CL_SUCCESS) return Fail(err, e);
  Mapping map;
  map.flags = flags;
  for (int i = 0; i < 3; ++i) {
    map.origin[i] = origin[i];
    map.region[i] = region[i];
  }
  // The host layout: the application's own for USE_HOST_PTR images, else tightly packed.
  size_t read_row = 0, read_slice = 0;
  if (m->host_ptr != nullptr) {
    map.row_pitch = m->desc.image_row_pitch;
    map.slice_pitch = m->desc.image_slice_pitch;
    size_t y = m->type == CL_MEM_OBJECT_IMAGE1D_ARRAY ? 0 : origin[1];
    size_t z = m->type == CL_MEM_OBJECT_IMAGE1D_ARRAY ? origin[1] : origin[2];
    map.ptr = static_cast<uint8_t*>(m->host_ptr) + z * map.slice_pitch + y * map.row_pitch +
              origin[0] * m->element_bytes;
    read_row = m->type == CL_MEM_OBJECT_IMAGE1D_ARRAY ? 0 : map.row_pitch;
    read_slice = layered ? map.slice_pitch : 0;
  } else {
    map.row_pitch = region[0] * m->element_bytes;
    map.slice_pitch = m->type == CL_MEM_OBJECT_IMAGE1D_ARRAY ? map.row_pitch
                      : layered                             ? map.row_pitch * region[1]
                                                            : 0;
  }
  uint64_t bytes = ImageBytes(m, region, read_row, read_slice);
  if (bytes == 0) return Fail(err, CL_INVALID_VALUE);
  map.size = bytes;
  if (map.ptr == nullptr) {
    map.ptr = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    map.owned = true;
    if (map.ptr == nullptr) return Fail(err, CL_OUT_OF_HOST_MEMORY);
  }
  cl_int e;
  if ((flags & CL_MAP_WRITE_INVALIDATE_REGION) != 0) {
    e = Marker(q, nwait, waits, event, false, CL_COMMAND_MAP_IMAGE);
  } else {
    Enqueuer enq(q, nwait, waits, event, CL_COMMAND_MAP_IMAGE);
    e = enq.err();
    if (e == CL_SUCCESS) {
      e = ReadImageInto(enq, m, origin, region, read_row, read_slice, map.ptr, bytes, blocking);
    }
  }
  if (e != CL_SUCCESS) {
    if (map.owned) std::free(map.ptr);
    SetErr(err, e);
    return nullptr;
  }
  {
    std::lock_guard<std::mutex> lock(m->mu);
    m->maps.push_back(map);
  }
  *row_pitch = map.row_pitch;
  if (slice_pitch != nullptr) *slice_pitch = map.slice_pitch;
  SetErr(err, CL_SUCCESS);
  return map.ptr;
}
}  // namespace gmux::icd
