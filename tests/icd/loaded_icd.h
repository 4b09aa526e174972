// The built libgmux-icd.so under test, loaded with dlopen (no OpenCL loader in between) and
// connected to a FakeDaemon of this process, plus the fixture the ICD tests share.
//
// The ICD has one connection per process, opened at the first device query from GMUX_SOCKET
// (read once, then). So there is one FakeDaemon per test process, started with the ICD's first
// use: Icd() sets GMUX_SOCKET to the fake's socket and GMUX_SHM=0 (transfers travel inline,
// never as passed descriptors) before that query. Every OpenCL call goes through the dispatch
// table, the first member of every ICD object.
#pragma once

#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl_icd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "icd/fake_daemon.h"

namespace gmux::testing {

struct LoadedIcd {
  FakeDaemon* daemon = nullptr;
  const cl_icd_dispatch* cl = nullptr;  // the table every ICD object starts with
  cl_platform_id platform = nullptr;
  cl_device_id device = nullptr;  // the fake's first device
  std::string error;              // why loading failed (the fields above are then null)
};

// Starts the fake daemon and loads and connects the ICD, once per process (thread-safe); later
// calls return the same. The fake lives until the process exits.
const LoadedIcd& Icd();

// Runs `call` on a thread of its own and returns its result, or nullopt when it has not returned
// within `limit` (a hang: the thread is left behind, blocked). The limit only guards against
// hanging the test; a working ICD returns in microseconds.
std::optional<cl_int> ReturnsWithin(std::chrono::seconds limit, std::function<cl_int()> call);

// A handler that answers GetInfo(DEVICE, `param`) with `answer(seq)` and every other request as
// FakeDaemon::Default does.
FakeDaemon::Handler OnDeviceInfo(cl_device_info param, std::function<Response(uint64_t)> answer);

// The bytes of a value, for info replies.
template <typename T>
std::vector<uint8_t> Bytes(const T& v) {
  const auto* p = reinterpret_cast<const uint8_t*>(&v);
  return std::vector<uint8_t>(p, p + sizeof(T));
}

// Base fixture: a context and an in-order queue on the fake's device, made before each test and
// released after it. Making them takes round trips, which also flush whatever an earlier test
// left batched in the ICD, so the record of requests the test sees (cleared last in SetUp) holds
// only its own. The handler is reset to FakeDaemon::Default before and after each test.
class IcdTest : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;

  const cl_icd_dispatch& cl() const { return *Icd().cl; }
  FakeDaemon& daemon() const { return *Icd().daemon; }
  cl_device_id device() const { return Icd().device; }

  // A round trip (a marker, then clFinish on queue_): once it returns, the fake has handled every
  // request the ICD sent or batched before it. The fake sees kSyncKinds. Returns the first
  // error, else clFinish's result.
  cl_int Sync();

  cl_context ctx_ = nullptr;
  cl_command_queue queue_ = nullptr;
};

}  // namespace gmux::testing
