#include "common/bulk_copy.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace gmux {

namespace {

// The size of the largest cache of CPU 0 from sysfs (0 when unknown). Not sysconf's
// _SC_LEVEL3_CACHE_SIZE: the C library reads it from CPUID, which a VM may fill in as it likes
// (320 MiB on a VM whose L3 is 32 MiB).
size_t LastLevelCacheBytes() {
  size_t best = 0;
  int best_level = 0;
  for (int i = 0; i < 8; ++i) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
    std::ifstream level_file(dir + "level"), type_file(dir + "type"), size_file(dir + "size");
    int level = 0;
    std::string type, size;
    if (!(level_file >> level) || !(type_file >> type) || !(size_file >> size)) break;
    if (type == "Instruction" || size.empty()) continue;
    size_t bytes = std::strtoull(size.c_str(), nullptr, 10);
    if (size.back() == 'K') bytes <<= 10;
    if (size.back() == 'M') bytes <<= 20;
    if (level > best_level) {
      best_level = level;
      best = bytes;
    }
  }
  return best;
}

}  // namespace

size_t StreamingCopyBytes() {
  static const size_t bytes = [] {
    const size_t llc = LastLevelCacheBytes();
    if (llc == 0) return size_t{32} << 20;
    return std::max(llc, size_t{8} << 20);
  }();
  return bytes;
}

void StreamCopy(void* dst, const void* src, size_t n) {
#if defined(__x86_64__)
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  // The head up to the destination's 16-byte boundary (stores must be aligned), then 64 bytes
  // (one cache line when aligned so) per step with unaligned loads, then the tail.
  const size_t head = std::min(n, (16 - (reinterpret_cast<uintptr_t>(d) & 15)) & 15);
  std::memcpy(d, s, head);
  d += head;
  s += head;
  n -= head;
  const size_t steps = n / 64;
  for (size_t i = 0; i < steps; ++i) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 48), e);
    s += 64;
    d += 64;
  }
  // Non-temporal stores are weakly ordered: visible to the other process (the worker, the
  // device) before anything this thread does next, as an ordinary copy's are.
  _mm_sfence();
  std::memcpy(d, s, n - steps * 64);
#else
  std::memcpy(dst, src, n);
#endif
}

void CopyBytes(void* dst, const void* src, size_t n) {
  if (n >= StreamingCopyBytes()) {
    StreamCopy(dst, src, n);
  } else {
    std::memcpy(dst, src, n);
  }
}

}  // namespace gmux
