// With no daemon listening, the gmux platform is listed with no devices; nothing hangs.
#include <gtest/gtest.h>

#include "runtime/runtime_env.h"

namespace gmux::testing {
namespace {

TEST(NoDaemonTest, PlatformHasNoDevicesAndNothingHangs) {
  cl_platform_id p = FindPlatform(kGmux);
  ASSERT_NE(p, nullptr);
  cl_uint n = 99;
  cl_device_id d = nullptr;
  EXPECT_EQ(clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 1, &d, &n), CL_DEVICE_NOT_FOUND);
  cl_int err = CL_SUCCESS;
  cl_context_properties props[] = {CL_CONTEXT_PLATFORM, reinterpret_cast<cl_context_properties>(p), 0};
  cl_context c = clCreateContextFromType(props, CL_DEVICE_TYPE_ALL, nullptr, nullptr, &err);
  EXPECT_EQ(c, nullptr);
  EXPECT_NE(err, CL_SUCCESS);
  // The backend platform is still usable beside it.
  EXPECT_NE(FindPlatform(kNative), nullptr);
}

}  // namespace
}  // namespace gmux::testing
