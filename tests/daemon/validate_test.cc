// OpenCL 1.2 request validation (validate.h): one test per rule, with the overflow edges.
#include "daemon/validate.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <limits>
#include <vector>

namespace gmux::daemon {
namespace {

constexpr size_t kSizeMax = std::numeric_limits<size_t>::max();

DeviceLimits Device() {
  DeviceLimits d;
  d.max_work_item_dims = 3;
  d.max_work_item_sizes = {1024, 1024, 64};
  d.max_work_group_size = 1024;
  d.local_mem_size = 64 * 1024;
  d.address_bits = 64;
  d.max_mem_alloc_size = uint64_t{1} << 30;
  return d;
}

KernelLimits Kernel() {
  KernelLimits k;
  k.work_group_size = 512;
  k.local_mem_size = 1024;
  return k;
}

// ValidateNDRange on vectors; an empty vector is passed as nullptr.
ClStatus Launch(uint32_t dim, std::vector<size_t> global, std::vector<size_t> local = {},
                std::vector<size_t> offset = {}, const DeviceLimits& d = Device(),
                const KernelLimits& k = Kernel()) {
  return ValidateNDRange(d, k, dim, offset.empty() ? nullptr : offset.data(),
                         global.empty() ? nullptr : global.data(),
                         local.empty() ? nullptr : local.data());
}

TEST(ValidateNDRangeTest, AcceptsOrdinaryLaunches) {
  EXPECT_TRUE(Launch(1, {4096}).ok());
  EXPECT_TRUE(Launch(1, {4096}, {256}).ok());
  EXPECT_TRUE(Launch(2, {640, 480}, {16, 16}, {3, 5}).ok());
  EXPECT_TRUE(Launch(3, {64, 64, 64}, {8, 8, 8}).ok());
  EXPECT_TRUE(Launch(1, {3}).ok());  // no local size: any global size
}

TEST(ValidateNDRangeTest, WorkDimOutsideOneToThree) {
  EXPECT_EQ(Launch(0, {64}).code, CL_INVALID_WORK_DIMENSION);
  EXPECT_EQ(Launch(4, {64, 1, 1, 1}).code, CL_INVALID_WORK_DIMENSION);
  DeviceLimits two_d = Device();
  two_d.max_work_item_dims = 2;
  EXPECT_EQ(Launch(3, {4, 4, 4}, {}, {}, two_d).code, CL_INVALID_WORK_DIMENSION);
  EXPECT_TRUE(Launch(2, {4, 4}, {}, {}, two_d).ok());
}

TEST(ValidateNDRangeTest, GlobalSizeNullOrZero) {
  EXPECT_EQ(Launch(1, {}).code, CL_INVALID_GLOBAL_WORK_SIZE);
  EXPECT_EQ(Launch(2, {64, 0}).code, CL_INVALID_GLOBAL_WORK_SIZE);
  ClStatus s = Launch(3, {0, 1, 1});
  EXPECT_EQ(s.code, CL_INVALID_GLOBAL_WORK_SIZE);
  EXPECT_NE(s.message.find("global_work_size[0]"), std::string::npos) << s.message;
}

TEST(ValidateNDRangeTest, GlobalSizeBeyondADevicesSizeT) {
  DeviceLimits d32 = Device();
  d32.address_bits = 32;
  EXPECT_TRUE(Launch(1, {0xffffffffu}, {}, {}, d32).ok());
  EXPECT_EQ(Launch(1, {size_t{1} << 32}, {}, {}, d32).code, CL_INVALID_GLOBAL_WORK_SIZE);
  EXPECT_TRUE(Launch(1, {kSizeMax}).ok());
}

TEST(ValidateNDRangeTest, HugePrimeGlobalWithLocalOneIsValid) {
  // 2^61 - 1 work-items in groups of 1: nothing in the specification forbids it.
  EXPECT_TRUE(Launch(1, {(size_t{1} << 61) - 1}, {1}).ok());
}

TEST(ValidateNDRangeTest, WorkItemCountOverflowingUint64) {
  // Each size fits size_t; the product 2^80 does not fit 64 bits.
  const size_t big = size_t{1} << 40;
  ClStatus s = Launch(2, {big, big});
  EXPECT_EQ(s.code, CL_INVALID_GLOBAL_WORK_SIZE);
  EXPECT_NE(s.message.find("product"), std::string::npos) << s.message;
  EXPECT_EQ(Launch(3, {size_t{1} << 32, size_t{1} << 16, size_t{1} << 16}).code,
            CL_INVALID_GLOBAL_WORK_SIZE);
  // 2^32 * 2^16 * 2^15 = 2^63 fits.
  EXPECT_TRUE(Launch(3, {size_t{1} << 32, size_t{1} << 16, size_t{1} << 15}).ok());
}

TEST(ValidateNDRangeTest, OffsetPlusSizeBeyondADevicesSizeT) {
  EXPECT_EQ(Launch(1, {4}, {}, {kSizeMax - 1}).code, CL_INVALID_GLOBAL_OFFSET);
  EXPECT_EQ(Launch(1, {2}, {}, {kSizeMax - 1}).code, CL_INVALID_GLOBAL_OFFSET);
  EXPECT_TRUE(Launch(1, {1}, {}, {kSizeMax - 1}).ok());  // sum is exactly SIZE_MAX
  EXPECT_EQ(Launch(2, {8, 8}, {}, {0, kSizeMax}).code, CL_INVALID_GLOBAL_OFFSET);
  DeviceLimits d32 = Device();
  d32.address_bits = 32;
  EXPECT_EQ(Launch(1, {16}, {}, {0xfffffff0u + 1}, d32).code, CL_INVALID_GLOBAL_OFFSET);
  EXPECT_TRUE(Launch(1, {16}, {}, {0xfffffff0u - 1}, d32).ok());
}

TEST(ValidateNDRangeTest, LocalSizeZero) {
  EXPECT_EQ(Launch(1, {64}, {0}).code, CL_INVALID_WORK_GROUP_SIZE);
  EXPECT_EQ(Launch(2, {64, 64}, {8, 0}).code, CL_INVALID_WORK_GROUP_SIZE);
}

TEST(ValidateNDRangeTest, LocalSizeAboveTheDevicesWorkItemSizes) {
  ClStatus s = Launch(3, {64, 64, 128}, {1, 1, 128});
  EXPECT_EQ(s.code, CL_INVALID_WORK_ITEM_SIZE);
  EXPECT_NE(s.message.find("[2]"), std::string::npos) << s.message;
  EXPECT_EQ(Launch(1, {4096}, {2048}).code, CL_INVALID_WORK_ITEM_SIZE);
}

TEST(ValidateNDRangeTest, WorkGroupAboveTheDevicesLimit) {
  KernelLimits unlimited = Kernel();
  unlimited.work_group_size = 0;
  EXPECT_EQ(Launch(2, {1024, 1024}, {64, 32}, {}, Device(), unlimited).code,
            CL_INVALID_WORK_GROUP_SIZE);
  EXPECT_TRUE(Launch(2, {1024, 1024}, {32, 32}, {}, Device(), unlimited).ok());
}

TEST(ValidateNDRangeTest, WorkGroupProductIsExactBeyond32Bits) {
  // A local size divides its global size, so a work-group product that overflowed would have
  // failed the global product first; products up to 2^64 - 1 must be exact.
  DeviceLimits huge = Device();
  huge.max_work_item_sizes = {kSizeMax, kSizeMax, kSizeMax};
  huge.max_work_group_size = size_t{1} << 62;
  KernelLimits k = Kernel();
  k.work_group_size = 0;
  const size_t l = size_t{1} << 31;
  EXPECT_TRUE(Launch(2, {l, l}, {l, l}, {}, huge, k).ok());
  huge.max_work_group_size = (size_t{1} << 62) - 1;
  EXPECT_EQ(Launch(2, {l, l}, {l, l}, {}, huge, k).code, CL_INVALID_WORK_GROUP_SIZE);
  EXPECT_EQ(Launch(2, {size_t{1} << 32, size_t{1} << 32}, {l, l}, {}, huge, k).code,
            CL_INVALID_GLOBAL_WORK_SIZE);
}

TEST(ValidateNDRangeTest, WorkGroupAboveTheKernelsLimit) {
  ClStatus s = Launch(1, {4096}, {1024});  // device allows 1024, kernel 512
  EXPECT_EQ(s.code, CL_INVALID_WORK_GROUP_SIZE);
  EXPECT_NE(s.message.find("CL_KERNEL_WORK_GROUP_SIZE"), std::string::npos) << s.message;
  EXPECT_TRUE(Launch(1, {4096}, {512}).ok());
}

TEST(ValidateNDRangeTest, GlobalNotAMultipleOfLocal) {
  EXPECT_EQ(Launch(1, {100}, {64}).code, CL_INVALID_WORK_GROUP_SIZE);
  EXPECT_EQ(Launch(2, {64, 30}, {8, 4}).code, CL_INVALID_WORK_GROUP_SIZE);
}

TEST(ValidateNDRangeTest, RequiredWorkGroupSizeMustBeGiven) {
  KernelLimits k = Kernel();
  k.compile_work_group_size = {64, 1, 1};
  EXPECT_TRUE(Launch(1, {4096}, {64}, {}, Device(), k).ok());
  EXPECT_EQ(Launch(1, {4096}, {32}, {}, Device(), k).code, CL_INVALID_WORK_GROUP_SIZE);
  ClStatus none = Launch(1, {4096}, {}, {}, Device(), k);
  EXPECT_EQ(none.code, CL_INVALID_WORK_GROUP_SIZE);
  EXPECT_NE(none.message.find("reqd_work_group_size(64, 1, 1)"), std::string::npos)
      << none.message;
  // Dimensions past work_dim count as 1.
  k.compile_work_group_size = {8, 8, 1};
  EXPECT_EQ(Launch(1, {4096}, {8}, {}, Device(), k).code, CL_INVALID_WORK_GROUP_SIZE);
  EXPECT_TRUE(Launch(2, {64, 64}, {8, 8}, {}, Device(), k).ok());
}

TEST(ValidateLocalArgSizeTest, ZeroIsRejectedAtSetArgAndLargeIsNot) {
  EXPECT_EQ(ValidateLocalArgSize(0).code, CL_INVALID_ARG_SIZE);
  EXPECT_TRUE(ValidateLocalArgSize(1).ok());
  // Too large for any device: reported at launch (ValidateLocalMemory), not here.
  EXPECT_TRUE(ValidateLocalArgSize(kSizeMax).ok());
}

TEST(ValidateLocalMemoryTest, ArgumentsPlusKernelMustFitTheDevice) {
  const DeviceLimits d = Device();  // 64 KiB
  const KernelLimits k = Kernel();  // 1 KiB of its own
  std::vector<size_t> fits = {32 * 1024, 31 * 1024};
  EXPECT_TRUE(ValidateLocalMemory(d, k, fits).ok());
  EXPECT_TRUE(ValidateLocalMemory(d, k, {}).ok());
  std::vector<size_t> over = {32 * 1024, 31 * 1024 + 1};
  ClStatus s = ValidateLocalMemory(d, k, over);
  EXPECT_EQ(s.code, CL_OUT_OF_RESOURCES);
  EXPECT_NE(s.message.find("65537"), std::string::npos) << s.message;  // the total
  EXPECT_NE(s.message.find("65536"), std::string::npos) << s.message;
  std::vector<size_t> one_huge = {128 * 1024};
  EXPECT_EQ(ValidateLocalMemory(d, k, one_huge).code, CL_OUT_OF_RESOURCES);
}

TEST(ValidateLocalMemoryTest, KernelsOwnUseAloneCanExceedTheDevice) {
  KernelLimits k = Kernel();
  k.local_mem_size = 64 * 1024 + 1;
  EXPECT_EQ(ValidateLocalMemory(Device(), k, {}).code, CL_OUT_OF_RESOURCES);
}

TEST(ValidateLocalMemoryTest, OverflowingSumIsRejected) {
  std::vector<size_t> wrap = {kSizeMax, 2};  // wraps to 1 without the check
  EXPECT_EQ(ValidateLocalMemory(Device(), Kernel(), wrap).code, CL_OUT_OF_RESOURCES);
  KernelLimits k = Kernel();
  k.local_mem_size = std::numeric_limits<uint64_t>::max();
  std::vector<size_t> one = {1};
  EXPECT_EQ(ValidateLocalMemory(Device(), k, one).code, CL_OUT_OF_RESOURCES);
}

TEST(ValidateBufferSizeTest, ZeroOrAboveMaxAlloc) {
  EXPECT_EQ(ValidateBufferSize(Device(), 0).code, CL_INVALID_BUFFER_SIZE);
  EXPECT_TRUE(ValidateBufferSize(Device(), uint64_t{1} << 30).ok());
  EXPECT_EQ(ValidateBufferSize(Device(), (uint64_t{1} << 30) + 1).code, CL_INVALID_BUFFER_SIZE);
}

TEST(ValidateBufferRegionTest, InBoundsAndOverflow) {
  EXPECT_TRUE(ValidateBufferRegion(100, 0, 100).ok());
  EXPECT_TRUE(ValidateBufferRegion(100, 99, 1).ok());
  EXPECT_EQ(ValidateBufferRegion(100, 99, 2).code, CL_INVALID_VALUE);
  EXPECT_EQ(ValidateBufferRegion(100, 100, 0).code, CL_INVALID_VALUE);
  EXPECT_EQ(ValidateBufferRegion(100, 0, 0).code, CL_INVALID_VALUE);
  // offset + size wraps to 3 without the check.
  EXPECT_EQ(ValidateBufferRegion(100, std::numeric_limits<uint64_t>::max() - 1, 4).code,
            CL_INVALID_VALUE);
}

TEST(ValidateCopyBufferTest, RegionsAndOverlap) {
  EXPECT_TRUE(ValidateCopyBuffer(100, 0, 100, 50, 50, CopyBuffers::kSameBuffer).ok());
  EXPECT_EQ(ValidateCopyBuffer(100, 0, 100, 49, 50, CopyBuffers::kSameBuffer).code,
            CL_MEM_COPY_OVERLAP);
  EXPECT_EQ(ValidateCopyBuffer(100, 10, 100, 10, 1, CopyBuffers::kSameBuffer).code,
            CL_MEM_COPY_OVERLAP);
  EXPECT_TRUE(ValidateCopyBuffer(100, 10, 100, 10, 1, CopyBuffers::kDistinct).ok());
  ClStatus src = ValidateCopyBuffer(10, 5, 100, 0, 6, CopyBuffers::kDistinct);
  EXPECT_EQ(src.code, CL_INVALID_VALUE);
  EXPECT_EQ(src.message.rfind("source", 0), 0u) << src.message;
  ClStatus dst = ValidateCopyBuffer(100, 0, 10, 5, 6, CopyBuffers::kDistinct);
  EXPECT_EQ(dst.code, CL_INVALID_VALUE);
  EXPECT_EQ(dst.message.rfind("destination", 0), 0u) << dst.message;
}

TEST(ArgValueSizeTest, ScalarsAndVectorsHaveTheirSizeOthersAreUnknown) {
  EXPECT_EQ(ArgValueSize("char"), 1u);
  EXPECT_EQ(ArgValueSize("uchar"), 1u);
  EXPECT_EQ(ArgValueSize("short"), 2u);
  EXPECT_EQ(ArgValueSize("half"), 2u);
  EXPECT_EQ(ArgValueSize("int"), 4u);
  EXPECT_EQ(ArgValueSize("uint"), 4u);
  EXPECT_EQ(ArgValueSize("float"), 4u);
  EXPECT_EQ(ArgValueSize("long"), 8u);
  EXPECT_EQ(ArgValueSize("ulong"), 8u);
  EXPECT_EQ(ArgValueSize("double"), 8u);
  EXPECT_EQ(ArgValueSize("float4"), 16u);
  EXPECT_EQ(ArgValueSize("int2"), 8u);
  EXPECT_EQ(ArgValueSize("uchar16"), 16u);
  EXPECT_EQ(ArgValueSize("double8"), 64u);
  EXPECT_EQ(ArgValueSize("double16"), 128u);
  // Unknown here: structs, typedefs, pointers, images, samplers, malformed names.
  EXPECT_EQ(ArgValueSize("pair_t"), 0u);
  EXPECT_EQ(ArgValueSize("struct pair"), 0u);
  EXPECT_EQ(ArgValueSize("int*"), 0u);
  EXPECT_EQ(ArgValueSize("image2d_t"), 0u);
  EXPECT_EQ(ArgValueSize("sampler_t"), 0u);
  EXPECT_EQ(ArgValueSize("short3"), 0u) << "4 components' size or packed: the backend's";
  EXPECT_EQ(ArgValueSize("float5"), 0u);
  EXPECT_EQ(ArgValueSize("4"), 0u);
  EXPECT_EQ(ArgValueSize(""), 0u);
}

}  // namespace
}  // namespace gmux::daemon
