// Identifier types shared by every layer.
#pragma once

#include <cstdint>

namespace gmux {

using TenantId = uint32_t;  // a tenant (VM, container, user); dense small integers in core
using BlockId = uint64_t;   // a command block, unique within one policy instance
using DeviceId = uint32_t;  // a physical device in a pool

inline constexpr TenantId kNoTenant = UINT32_MAX;

}  // namespace gmux
