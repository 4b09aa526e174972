// Samplers.
#include "icd/common.h"

namespace gmux::icd {

namespace {

cl_sampler MakeSampler(cl_context ctx, cl_bool normalized, cl_addressing_mode addressing,
                       cl_filter_mode filter, std::vector<cl_sampler_properties> properties,
                       cl_int* err) {
  if (!Valid(ctx)) return Fail(err, CL_INVALID_CONTEXT);
  Connection& c = Conn();
  auto smp = std::make_unique<_cl_sampler>();
  smp->id = c.NextId();
  smp->context = ctx;
  smp->normalized_coords = normalized;
  smp->addressing = addressing;
  smp->filter = filter;
  smp->properties = std::move(properties);
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire::Request>().initCreateSampler();
  r.setId(smp->id);
  r.setContext(ctx->id);
  r.setNormalizedCoords(normalized != CL_FALSE);
  r.setAddressingMode(addressing);
  r.setFilterMode(filter);
  // A round trip: invalid modes (and devices without images) are reported here.
  if (cl_int e = c.Call(b); e != CL_SUCCESS) return Fail(err, e);
  RetainContext(ctx);
  SetErr(err, CL_SUCCESS);
  return smp.release();
}

}  // namespace

cl_sampler CL_API_CALL CreateSampler(cl_context ctx, cl_bool normalized,
                                     cl_addressing_mode addressing, cl_filter_mode filter,
                                     cl_int* err) {
  return MakeSampler(ctx, normalized, addressing, filter, {}, err);
}

// The properties not given take OpenCL's defaults: normalized coordinates, CL_ADDRESS_CLAMP,
// CL_FILTER_NEAREST (OpenCL 3.0, 5.7.1). An unknown or repeated property is CL_INVALID_VALUE.
cl_sampler CL_API_CALL CreateSamplerWithProperties(cl_context ctx,
                                                   const cl_sampler_properties* props,
                                                   cl_int* err) {
  cl_bool normalized = CL_TRUE;
  cl_addressing_mode addressing = CL_ADDRESS_CLAMP;
  cl_filter_mode filter = CL_FILTER_NEAREST;
  std::vector<cl_sampler_properties> list;
  if (props != nullptr) {
    for (const cl_sampler_properties* p = props; *p != 0; p += 2) {
      for (size_t i = 0; i < list.size(); i += 2) {
        if (list[i] == p[0]) return Fail(err, CL_INVALID_VALUE);
      }
      switch (p[0]) {
        case CL_SAMPLER_NORMALIZED_COORDS: normalized = static_cast<cl_bool>(p[1]); break;
        case CL_SAMPLER_ADDRESSING_MODE: addressing = static_cast<cl_addressing_mode>(p[1]); break;
        case CL_SAMPLER_FILTER_MODE: filter = static_cast<cl_filter_mode>(p[1]); break;
        default: return Fail(err, CL_INVALID_VALUE);
      }
      list.push_back(p[0]);
      list.push_back(p[1]);
    }
    list.push_back(0);
  }
  return MakeSampler(ctx, normalized, addressing, filter, std::move(list), err);
}

cl_int CL_API_CALL RetainSampler(cl_sampler s) { return Retain(s); }
cl_int CL_API_CALL ReleaseSampler(cl_sampler s) { return Release(s); }

void Destroy(_cl_sampler* s) {
  cl_context ctx = s->context;
  delete s;
  ReleaseContext(ctx);
}

cl_int CL_API_CALL GetSamplerInfo(cl_sampler s, cl_sampler_info param, size_t size, void* value,
                                  size_t* size_ret) {
  if (!Valid(s)) return CL_INVALID_SAMPLER;
  switch (param) {
    case CL_SAMPLER_REFERENCE_COUNT: return Scalar(RefCount(s), size, value, size_ret);
    case CL_SAMPLER_CONTEXT: return Scalar(s->context, size, value, size_ret);
    case CL_SAMPLER_NORMALIZED_COORDS: return Scalar(s->normalized_coords, size, value, size_ret);
    case CL_SAMPLER_ADDRESSING_MODE: return Scalar(s->addressing, size, value, size_ret);
    case CL_SAMPLER_FILTER_MODE: return Scalar(s->filter, size, value, size_ret);
    case CL_SAMPLER_PROPERTIES: return Array(s->properties, size, value, size_ret);
    default: return CL_INVALID_VALUE;
  }
}

}  // namespace gmux::icd
