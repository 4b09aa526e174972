// Copies of bulk data between an application's memory and a buffer's (gmux's own copies of a
// transfer: the ICD's into and out of a buffer on shared memory).
//
// At or above a size that cannot stay in the last-level cache, a copy with non-temporal stores
// (they do not read the destination's lines first nor evict the cache for data nobody reads
// soon). The C library's memcpy chooses its own way by thresholds meant for a bare machine: on
// a 2-core VM with a 32 MiB L3 it reports a 320 MiB shared cache and copies 256 MiB with a loop
// whose speed depends on the two addresses' offsets within a page (18-24 ms), where this one
// takes 14.5-15.7 ms for any offsets (docs/performance.md, "Large copies and reused buffers").
// Below the size, memcpy: the copy's data stays in the cache for whoever reads it next.
#pragma once

#include <cstddef>

namespace gmux {

// memcpy's contract (no overlap), any sizes and alignments.
void CopyBytes(void* dst, const void* src, size_t n);

// Copies of at least this many bytes use non-temporal stores (where the CPU has them): the
// last-level cache's size (sysfs), at least 8 MiB; 32 MiB when it is unknown.
size_t StreamingCopyBytes();

// The streaming copy itself, whatever the size (tests compare it with memcpy).
void StreamCopy(void* dst, const void* src, size_t n);

}  // namespace gmux
