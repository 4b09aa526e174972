#include "common/bulk_copy.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace gmux {
namespace {

// Every byte lands where memcpy would put it, and none around it is touched, for sizes around
// the 64-byte steps and offsets of both ends within a 16-byte line and a page.
TEST(BulkCopyTest, StreamCopyEqualsMemcpyForAnySizeAndAlignment) {
  std::vector<unsigned char> src(3 * 4096 + 256);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 131 + 7);
  const size_t sizes[] = {0, 1, 15, 16, 17, 63, 64, 65, 127, 128, 129, 1000, 4095, 4096, 8191};
  for (size_t n : sizes) {
    for (size_t so : {0u, 1u, 8u, 15u, 16u, 33u, 4000u}) {
      for (size_t dof : {0u, 1u, 7u, 16u, 48u, 63u, 4080u}) {
        std::vector<unsigned char> dst(src.size() + 8192, 0xA5);
        StreamCopy(dst.data() + dof, src.data() + so, n);
        for (size_t i = 0; i < dst.size(); ++i) {
          const bool inside = i >= dof && i < dof + n;
          const unsigned char want = inside ? src[so + (i - dof)] : 0xA5;
          ASSERT_EQ(dst[i], want) << "n=" << n << " src+" << so << " dst+" << dof << " at " << i;
        }
      }
    }
  }
}

TEST(BulkCopyTest, CopyBytesAtTheStreamingSizeCopiesEveryByte) {
  const size_t n = StreamingCopyBytes() + 4096 + 3;
  EXPECT_GE(StreamingCopyBytes(), size_t{8} << 20);
  std::vector<uint32_t> src(n / 4 + 1);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint32_t>(i * 2654435761u);
  std::vector<unsigned char> dst(n + 32, 0);
  CopyBytes(dst.data() + 5, reinterpret_cast<const unsigned char*>(src.data()) + 1, n);
  const auto* from = reinterpret_cast<const unsigned char*>(src.data()) + 1;
  EXPECT_EQ(0, std::memcmp(dst.data() + 5, from, n));
  EXPECT_EQ(dst[4], 0);
  EXPECT_EQ(dst[n + 5], 0);
}

}  // namespace
}  // namespace gmux
