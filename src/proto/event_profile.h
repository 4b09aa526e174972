// An event's profiling times in one answer, shared by the ICD (which asks once per event and
// keeps them) and gmuxd's worker (which answers). A finished command's times never change, so
// a program that reads its kernel's start and end (two clGetEventProfilingInfo calls, as timing
// code is written) pays no round trip beyond its wait, or one when it did not wait.
// Asked as a GetInfo of the event with the private parameter kProfilingAllParam, or with the
// wait itself (Request.waitEventsProfiled: the answer's `info` holds one EventProfile per event,
// in the wait list's order, none given for a command that did not complete); answered only
// once the command completed (as for one value: CL_PROFILING_INFO_NOT_AVAILABLE before). A
// value the backend does not give (say CL_PROFILING_COMMAND_COMPLETE on an older platform) is
// absent from `available`, and the ICD asks for it alone to report the backend's own error.
// Header-only.
#pragma once

#include <CL/cl.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

namespace gmux::proto {

// Outside the OpenCL parameter ranges (profiling info is 0x1280-0x1284; vendor extensions use
// 0x4000-0x7FFF and a few higher ranges, never the top bit).
inline constexpr uint32_t kProfilingAllParam = 0x80000001u;
// CL_PROFILING_COMMAND_QUEUED .. CL_PROFILING_COMMAND_COMPLETE.
inline constexpr uint32_t kProfilingFirst = CL_PROFILING_COMMAND_QUEUED;
inline constexpr size_t kProfilingValues = 5;

struct EventProfile {
  uint64_t value[kProfilingValues] = {};
  uint32_t available = 0;  // bit i: value[i] (param kProfilingFirst + i) was given
  // Its size on the wire (Encode).
  static constexpr size_t kWireBytes = sizeof(uint64_t) * kProfilingValues + sizeof(uint32_t);

  static bool Covers(uint32_t param) {
    return param >= kProfilingFirst && param < kProfilingFirst + kProfilingValues;
  }
  bool Has(uint32_t param) const {
    return Covers(param) && (available & (1u << (param - kProfilingFirst))) != 0;
  }
  uint64_t Get(uint32_t param) const { return value[param - kProfilingFirst]; }

  // Wire form: the five values, then the mask, native byte order as every info value
  // on the wire.
  std::vector<uint8_t> Encode() const {
    std::vector<uint8_t> out(kWireBytes);
    std::memcpy(out.data(), value, sizeof(value));
    std::memcpy(out.data() + sizeof(value), &available, sizeof(available));
    return out;
  }
  static std::optional<EventProfile> Decode(const uint8_t* p, size_t n) {
    EventProfile e;
    if (n != kWireBytes) return std::nullopt;
    std::memcpy(e.value, p, sizeof(e.value));
    std::memcpy(&e.available, p + sizeof(e.value), sizeof(e.available));
    if ((e.available >> kProfilingValues) != 0) return std::nullopt;
    return e;
  }
};

}  // namespace gmux::proto
