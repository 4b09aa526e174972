// The scheduling model shared by every policy: tenants and command blocks.
//
// Pure data. A command block is the unit a tenant submits (VMCG's "GPU command request block",
// Kang & Yu's kernel launch); a kernel block may be split into chunks of work-items.
#pragma once

#include <cstdint>
#include <string>

#include "common/ids.h"
#include "common/time.h"

namespace gmux::core {

struct Tenant {
  TenantId id = 0;
  std::string name;
  double weight = 1.0;  // relative share; > 0
};

enum class BlockKind { kKernel, kCopy, kMarker };

enum class Splittable { kNo, kYes };

struct CommandBlock {
  BlockId id = 0;  // unique within one policy instance
  TenantId tenant = 0;
  BlockKind kind = BlockKind::kKernel;
  uint64_t work_items = 0;   // kernels: global work size (all dimensions multiplied)
  uint64_t work_groups = 0;  // kernels: number of work-groups; work_items / work_groups = local size
  uint64_t bytes = 0;        // copies: bytes moved over the bus
  TimePoint arrival{};
  Splittable splittable = Splittable::kNo;  // kYes only for kernels whose split is invisible

  // Work-items per work-group (1 when unknown or not a kernel).
  uint64_t local_size() const {
    return (kind == BlockKind::kKernel && work_groups > 0) ? work_items / work_groups : 1;
  }
};

// A range of a block's work-items, [begin, end). A block that is not split is dispatched once
// with the whole range [0, work_items) (and [0, 0) for copies and markers).
struct WorkRange {
  uint64_t begin = 0;
  uint64_t end = 0;
  uint64_t size() const { return end - begin; }
  bool operator==(const WorkRange&) const = default;
};

// What a policy tells its driver to run next.
struct Dispatch {
  TenantId tenant = 0;
  BlockId block = 0;
  WorkRange range;
  bool last = true;  // this dispatch finishes the block (always true when not split)
};

// What the driver tells the policy when a dispatch has finished on the device.
struct Completion {
  TenantId tenant = 0;
  BlockId block = 0;
  WorkRange range;
  Duration device_time{0};  // measured START -> END on the device
  bool last = true;         // copied from the Dispatch
};

// Facts about the device a policy schedules (Kang & Yu Eq. 2 needs cores and wavefront width).
struct DeviceInfo {
  uint64_t compute_units = 1;    // CL_DEVICE_MAX_COMPUTE_UNITS; split's "GPU cores" = units x width
  uint64_t wavefront_width = 64; // threads per wavefront/warp; chunk sizes are multiples of it
  uint64_t memory_bytes = 0;     // device memory, for VMCG's memory share
  double bus_bytes_per_s = 0;    // host<->device bandwidth, for VMCG's bandwidth share
};

}  // namespace gmux::core
