// The policy parts of gmuxd's config: a policy per device with its parameters, checked at load
// with errors that name the file, the line and the key.
#include <gtest/gtest.h>

#include "daemon/config.h"

namespace gmux::daemon {
namespace {

TEST(SchedulerConfigTest, PolicyPerDeviceWithParameters) {
  auto o = ParseDaemonConfig(R"(
[scheduler]
policy = "credit"
params = { slice_max_ms = 8 }

[[scheduler.device]]
index = 1
policy = "split"
params = { beta = 256 }

[[scheduler.device]]
index = 2
)",
                             "g.toml");
  ASSERT_TRUE(o.ok()) << o.status().message();
  EXPECT_EQ(o->policy, "credit");
  EXPECT_EQ(o->policy_params.at("slice_max_ms"), 8);
  ASSERT_EQ(o->device_policies.size(), 2u);
  EXPECT_EQ(o->device_policies.at(1).name, "split");
  EXPECT_EQ(o->device_policies.at(1).params.at("beta"), 256);
  EXPECT_EQ(o->device_policies.at(2).name, "credit");  // same policy: the [scheduler] params
  EXPECT_EQ(o->device_policies.at(2).params.at("slice_max_ms"), 8);
  auto specs = DevicePolicySpecs(*o);
  EXPECT_EQ(specs.at(1).name, "split");
}

TEST(SchedulerConfigTest, BadPolicyOrParameterNamesFileLineAndKey) {
  auto bad_name = ParseDaemonConfig("[scheduler]\npolicy = \"lottery\"\n", "g.toml");
  ASSERT_FALSE(bad_name.ok());
  EXPECT_NE(bad_name.status().message().find("g.toml:2"), std::string::npos)
      << bad_name.status().message();
  EXPECT_NE(bad_name.status().message().find("policy"), std::string::npos);

  auto bad_param = ParseDaemonConfig(
      "[scheduler]\npolicy = \"split\"\n\n[[scheduler.device]]\nindex = 0\npolicy = \"split\"\n"
      "params = { beta = -1 }\n",
      "g.toml");
  ASSERT_FALSE(bad_param.ok());
  EXPECT_NE(bad_param.status().message().find("g.toml:7"), std::string::npos)
      << bad_param.status().message();
  EXPECT_NE(bad_param.status().message().find("beta"), std::string::npos);

  auto twice = ParseDaemonConfig(
      "[[scheduler.device]]\nindex = 0\n[[scheduler.device]]\nindex = 0\n", "g.toml");
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.status().message().find("g.toml:4"), std::string::npos)
      << twice.status().message();
}

}  // namespace
}  // namespace gmux::daemon
