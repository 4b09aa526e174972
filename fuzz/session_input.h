// What session_fuzz and session_corpus_gen agree on: the input format and the fixed tables of
// tenant code the fuzzer runs (session_fuzz.cc explains both).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace gmux::fuzz::session {

// One frame of the input: a little-endian u32 word, then `length` payload bytes (fewer if the
// input ends first).
//   bits 0-23   length of the Cap'n Proto payload (a Request, flat encoding, no frame header)
//   bits 24-31  flags:
inline constexpr uint32_t kLengthMask = 0xFFFFFF;
inline constexpr int kFlagsShift = 24;
// Pass a memfd with the frame (as SCM_RIGHTS, as the ICD passes shared memory).
inline constexpr uint8_t kPassMemfd = 1u << 0;
// Seal it against shrinking (without: the session must refuse to map it).
inline constexpr uint8_t kSealMemfd = 1u << 1;
// Pass the previous frame's memfd again (the same inode: the session's kept mapping).
inline constexpr uint8_t kReuseMemfd = 1u << 2;
// Bits 3-7: the memfd's size in 4 KiB pages (0-31).
inline constexpr int kMemfdPagesShift = 3;
// Without kPassMemfd, bit 3 sends a BulkData request as a data frame (proto/frame.h) of the
// same token, offset and bytes, as the ICD sends bulk data to a worker that takes them.
inline constexpr uint8_t kAsDataFrame = 1u << 3;
inline constexpr size_t kMemfdPageBytes = 4096;

inline uint32_t FrameWord(size_t length, uint8_t flags) {
  return static_cast<uint32_t>(length & kLengthMask) |
         (static_cast<uint32_t>(flags) << kFlagsShift);
}
inline uint8_t MemfdFlags(size_t pages, bool sealed) {
  return static_cast<uint8_t>(kPassMemfd | (sealed ? kSealMemfd : 0) | (pages << kMemfdPagesShift));
}

// Program sources: tenant code is code, so the fuzzer runs only these (a program's source that
// is not one of them verbatim is replaced by the one its first byte picks). Each is memory-safe
// for any arguments, buffer sizes and launch shape: a kernel touches at most byte 0 of a global
// buffer (and checks the pointer for NULL) and byte 0 of a __local one, and loops nowhere.
//
// Argument kinds. PoCL 3.1 trusts the handle given to a handle-typed argument: a pointer-sized
// value given to a __global pointer or a sampler_t is dereferenced as an object's address (a
// crash in clSetKernelArg or at launch), a sampler given to a pointer argument is taken for a
// buffer (an assertion), and a buffer given to an image argument is dereferenced at launch. The
// session passes argument kinds through as the client sends them (it cannot know an argument's
// type: PoCL reports no argument info without -cl-kernel-arg-info), so a tenant can crash its own
// worker this way. To fuzz everything else, the kernels here keep to a layout that makes every
// other combination safe, and session_fuzz rewrites the two that are not:
//  - a pointer argument only at index kPointerArg (0), no image arguments, and no argument of 8
//    bytes passed by value: session_fuzz cuts every pointer-sized value to 4 bytes, and turns a
//    sampler at index 0 into a NULL buffer.
// Everything else (a buffer or image or NULL for a sampler or a __local argument, a sampler or
// buffer for a value, a __local size for a pointer, values of any other size) PoCL rejects or
// handles safely.
inline constexpr unsigned kPointerArg = 0;
inline constexpr std::string_view kSources[] = {
    // 0: splittable (only get_global_id); a value argument.
    "__kernel void add(__global uchar* a, int k) {\n"
    "  if (a != 0 && get_global_id(0) == 0 && get_global_id(1) == 0 && get_global_id(2) == 0)\n"
    "    a[0] = (uchar)(a[0] + k);\n"
    "}\n",
    // 1: a __local argument and a barrier; not splittable (get_group_id).
    "__kernel void local_copy(__global uchar* out, __local uchar* tmp, uint n) {\n"
    "  if (get_local_id(0) == 0 && get_local_id(1) == 0 && get_local_id(2) == 0)\n"
    "    tmp[0] = (uchar)(n + get_group_id(0));\n"
    "  barrier(CLK_LOCAL_MEM_FENCE);\n"
    "  if (out != 0 && get_global_id(0) == 0 && get_global_id(1) == 0 && get_global_id(2) == 0)\n"
    "    out[0] = tmp[0];\n"
    "}\n",
    // 2: a sampler argument.
    "__kernel void sampled(__global uchar* out, sampler_t s, int k) {\n"
    "  if (out != 0 && get_global_id(0) == 0) out[0] = (uchar)k;\n"
    "}\n",
    // 3: a required work-group size and a vector value; two kernels.
    "__kernel __attribute__((reqd_work_group_size(4, 1, 1)))\n"
    "void fixed(__global uchar* a, int x, float4 v) {\n"
    "  if (a != 0 && get_global_id(0) == 0) a[0] = (uchar)(x + (int)v.y);\n"
    "}\n"
    "__kernel void nop(void) {}\n",
    // 4: includes "k.h" (source 5), for compileProgram with an embedded header.
    "#include \"k.h\"\n"
    "__kernel void inc(__global uchar* a) {\n"
    "  if (a != 0 && get_global_id(0) == 0) a[0] = (uchar)(a[0] + K);\n"
    "}\n",
    // 5: the header.
    "#define K 3\n",
};
inline constexpr size_t kNumSources = sizeof(kSources) / sizeof(kSources[0]);

// Build, compile and link options (anything else is replaced by the one its first byte picks):
// options can define macros that change what the code does, or include files.
inline constexpr std::string_view kOptions[] = {
    "",
    "-cl-std=CL1.2",
    "-cl-fast-relaxed-math",
    "-cl-mad-enable -cl-no-signed-zeros",
    "-cl-kernel-arg-info",
    "-w -Werror",
    "-create-library",
    "-cl-opt-disable",
};
inline constexpr size_t kNumOptions = sizeof(kOptions) / sizeof(kOptions[0]);

// Embedded header names for compileProgram (PoCL writes each header to a file by this name).
inline constexpr std::string_view kHeaderNames[] = {"k.h", "inc/k.h"};
inline constexpr size_t kNumHeaderNames = sizeof(kHeaderNames) / sizeof(kHeaderNames[0]);

}  // namespace gmux::fuzz::session
