// The ICD against a daemon that breaks the protocol: replies of the wrong member or size, data
// beyond what was asked, replies nobody waits for, unreadable payloads, garbage and truncated
// frames, a frame over the limit, and a daemon hanging up mid-call. Each bad reply must turn into
// an OpenCL error for the call it answers, never a crash or a hang; where the connection survives
// the next call works, and where it cannot every call fails at once with CL_DEVICE_NOT_AVAILABLE.
//
// A broken connection stays broken for the rest of the process (the ICD has one), so those tests
// break it in a child process: a threadsafe death test re-executes this binary for the test, the
// fixture connects the child to a fake daemon of its own, and the child reports what its calls
// returned on stderr and exits 0 only when every call returned.
#include <capnp/any.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "icd/loaded_icd.h"

namespace gmux::testing {
namespace {

namespace wire = proto::wire;
using namespace std::chrono_literals;

// Only guards against a hang; every call here returns in microseconds.
constexpr std::chrono::seconds kHangLimit = 20s;

using IcdBadReplyTest = IcdTest;

TEST_F(IcdBadReplyTest, CreateKernelAnsweredWithInfoIsAnError) {
  ScopedHandler handler(daemon(), [](wire::Request::Reader r) {
    if (r.isCreateKernel()) return Response::WithInfo(r.getSeq(), {1, 2, 3, 4});
    return FakeDaemon::Default(r);
  });
  const char* src = "kernel void k() {}";
  cl_int err = CL_SUCCESS;
  cl_program p = cl().clCreateProgramWithSource(ctx_, 1, &src, nullptr, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  cl_kernel k = cl().clCreateKernel(p, "k", &err);
  EXPECT_EQ(k, nullptr);
  EXPECT_EQ(err, CL_OUT_OF_RESOURCES);
  EXPECT_EQ(daemon().Count(wire::Request::CREATE_KERNEL), 1u);
  EXPECT_EQ(cl().clReleaseProgram(p), CL_SUCCESS);
}

TEST_F(IcdBadReplyTest, InfoAnsweredWithNoneIsAnError) {
  ScopedHandler handler(
      daemon(), OnDeviceInfo(CL_DEVICE_MAX_CLOCK_FREQUENCY, [](uint64_t seq) {
        Response r;
        r.AddReply(seq);  // CL_SUCCESS with `none`: gmuxd always answers GetInfo with `info`
        return r;
      }));
  cl_uint v = 77;
  size_t size = 99;
  EXPECT_NE(cl().clGetDeviceInfo(device(), CL_DEVICE_MAX_CLOCK_FREQUENCY, sizeof(v), &v, &size),
            CL_SUCCESS)
      << "size " << size;
  EXPECT_EQ(v, 77u);
}

TEST_F(IcdBadReplyTest, ScalarInfoShorterThanItsTypeIsAnError) {
  ScopedHandler handler(daemon(), OnDeviceInfo(CL_DEVICE_ADDRESS_BITS, [](uint64_t seq) {
                          return Response::WithInfo(seq, {0x40, 0});
                        }));
  cl_uint v = 0xAAAAAAAA;
  size_t size = 99;
  EXPECT_NE(cl().clGetDeviceInfo(device(), CL_DEVICE_ADDRESS_BITS, sizeof(v), &v, &size),
            CL_SUCCESS)
      << "size " << size;
  EXPECT_EQ(v, 0xAAAAAAAAu);
}

TEST_F(IcdBadReplyTest, ScalarInfoLongerThanItsTypeIsAnErrorAndTheConnectionSurvives) {
  ScopedHandler handler(daemon(), [](wire::Request::Reader r) {
    if (r.isGetInfo() && r.getGetInfo().getParam() == CL_DEVICE_MAX_MEM_ALLOC_SIZE) {
      return Response::WithInfo(r.getSeq(), std::vector<uint8_t>(16, 0x11));
    }
    if (r.isGetInfo() && r.getGetInfo().getParam() == CL_DEVICE_GLOBAL_MEM_SIZE) {
      return Response::WithInfo(r.getSeq(), Bytes<cl_ulong>(1ull << 33));
    }
    return FakeDaemon::Default(r);
  });
  cl_ulong v = 5;
  // A value of the wrong size for its type breaks the protocol.
  EXPECT_EQ(cl().clGetDeviceInfo(device(), CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof(v), &v, nullptr),
            CL_OUT_OF_RESOURCES);
  EXPECT_EQ(v, 5u);
  EXPECT_EQ(cl().clGetDeviceInfo(device(), CL_DEVICE_GLOBAL_MEM_SIZE, sizeof(v), &v, nullptr),
            CL_SUCCESS);
  EXPECT_EQ(v, 1ull << 33);
}

TEST_F(IcdBadReplyTest, HugeInfoValueIsAnErrorAndTheConnectionSurvives) {
  constexpr size_t kHuge = 16u << 20;  // half the frame limit
  ScopedHandler handler(daemon(), [](wire::Request::Reader r) {
    if (r.isGetInfo() && r.getGetInfo().getParam() == CL_DEVICE_VENDOR) {
      return Response::WithInfo(r.getSeq(), std::vector<uint8_t>(kHuge, 0xEE));
    }
    if (r.isGetInfo() && r.getGetInfo().getParam() == CL_DEVICE_MAX_READ_IMAGE_ARGS) {
      return Response::WithInfo(r.getSeq(), Bytes<cl_uint>(5));
    }
    return FakeDaemon::Default(r);
  });
  char vendor[64] = "unchanged";
  size_t size = 0;
  EXPECT_EQ(cl().clGetDeviceInfo(device(), CL_DEVICE_VENDOR, sizeof(vendor), vendor, nullptr),
            CL_INVALID_VALUE);
  EXPECT_STREQ(vendor, "unchanged");
  EXPECT_EQ(cl().clGetDeviceInfo(device(), CL_DEVICE_VENDOR, 0, nullptr, &size), CL_SUCCESS);
  EXPECT_EQ(size, kHuge);
  cl_uint v = 7;
  EXPECT_EQ(cl().clGetDeviceInfo(device(), CL_DEVICE_MAX_READ_IMAGE_ARGS, sizeof(v), &v, nullptr),
            CL_SUCCESS);
  EXPECT_EQ(v, 5u);
}

TEST_F(IcdBadReplyTest, ReplyForAnUnknownSeqIsIgnored) {
  ScopedHandler handler(daemon(), OnDeviceInfo(CL_DEVICE_MAX_PARAMETER_SIZE, [](uint64_t seq) {
                          auto stray = Bytes<size_t>(111);
                          auto real = Bytes<size_t>(222);
                          Response r;
                          // First a reply to a seq the ICD never sent, then the real one.
                          r.AddReply(uint64_t{1} << 62)
                              .setInfo(kj::arrayPtr(stray.data(), stray.size()));
                          r.AddReply(seq).setInfo(kj::arrayPtr(real.data(), real.size()));
                          return r;
                        }));
  size_t v = 0;
  EXPECT_EQ(cl().clGetDeviceInfo(device(), CL_DEVICE_MAX_PARAMETER_SIZE, sizeof(v), &v, nullptr),
            CL_SUCCESS);
  EXPECT_EQ(v, 222u);
  EXPECT_EQ(Sync(), CL_SUCCESS);
}

// The reply frames and validates, but where the ICD reads a Data it finds a struct.
TEST_F(IcdBadReplyTest, UnreadableInfoPayloadIsAnErrorAndTheConnectionSurvives) {
  ScopedHandler handler(daemon(), [](wire::Request::Reader r) {
    if (r.isGetInfo() && r.getGetInfo().getParam() == CL_DEVICE_MAX_WRITE_IMAGE_ARGS) {
      Response resp;
      auto rep = resp.AddReply(r.getSeq());
      auto nine = Bytes<cl_uint>(9);
      rep.setInfo(kj::arrayPtr(nine.data(), nine.size()));
      capnp::AnyStruct::Builder any(kj::mv(rep));
      auto ptrs = any.getPointerSection();
      for (unsigned i = 0; i < ptrs.size(); ++i) {
        if (!ptrs[i].isNull()) ptrs[i].initAs<wire::Stats>().setSessions(7);
      }
      return resp;
    }
    if (r.isGetInfo() && r.getGetInfo().getParam() == CL_DEVICE_MAX_CONSTANT_BUFFER_SIZE) {
      return Response::WithInfo(r.getSeq(), Bytes<cl_ulong>(65536));
    }
    return FakeDaemon::Default(r);
  });
  cl_uint v = 3;
  EXPECT_EQ(cl().clGetDeviceInfo(device(), CL_DEVICE_MAX_WRITE_IMAGE_ARGS, sizeof(v), &v, nullptr),
            CL_OUT_OF_RESOURCES);
  EXPECT_EQ(v, 3u);
  cl_ulong c = 0;
  EXPECT_EQ(
      cl().clGetDeviceInfo(device(), CL_DEVICE_MAX_CONSTANT_BUFFER_SIZE, sizeof(c), &c, nullptr),
      CL_SUCCESS);
  EXPECT_EQ(c, 65536u);
}

TEST_F(IcdBadReplyTest, ReadDataBeyondTheDestinationIsAnErrorAndNothingIsWritten) {
  bool overflow = true;  // the first read gets too much, the second what it asked for
  ScopedHandler handler(daemon(), [&overflow](wire::Request::Reader r) {
    if (!r.isEnqueue() || !r.getEnqueue().isReadBuffer()) return FakeDaemon::Default(r);
    const uint64_t size = r.getEnqueue().getReadBuffer().getSize();
    Response resp;
    auto chunk = [&](uint64_t offset, size_t bytes, bool last) {
      std::vector<uint8_t> data(bytes, 0x5A);
      auto rd = resp.AddReply(r.getSeq()).initReadData();
      rd.setOffset(offset);
      rd.setData(kj::arrayPtr(data.data(), data.size()));
      rd.setLast(last);
    };
    if (overflow) {
      chunk(size / 2, size, false);  // ends size/2 bytes past the destination
      chunk(0, 0, true);             // the read ends here; the error found before it stands
    } else {
      chunk(0, size / 2, false);
      chunk(size / 2, size / 2, true);
    }
    overflow = false;
    return resp;
  });
  cl_int err = CL_SUCCESS;
  cl_mem m = cl().clCreateBuffer(ctx_, CL_MEM_READ_WRITE, 64, nullptr, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  std::vector<uint8_t> dst(32 + 16, 0x00);
  EXPECT_EQ(cl().clEnqueueReadBuffer(queue_, m, CL_TRUE, 0, 32, dst.data(), 0, nullptr, nullptr),
            CL_OUT_OF_RESOURCES);
  EXPECT_EQ(dst, std::vector<uint8_t>(48, 0x00));
  EXPECT_EQ(cl().clEnqueueReadBuffer(queue_, m, CL_TRUE, 0, 32, dst.data(), 0, nullptr, nullptr),
            CL_SUCCESS);
  std::vector<uint8_t> want(48, 0x00);
  std::fill_n(want.begin(), 32, uint8_t{0x5A});
  EXPECT_EQ(dst, want);
  EXPECT_EQ(cl().clReleaseMemObject(m), CL_SUCCESS);
}

// ---- the connection breaks (in a child process) ----

class IcdConnectionLossTest : public IcdTest {
 protected:
  void SetUp() override {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    IcdTest::SetUp();
  }

  static std::string Text(const std::optional<cl_int>& r) {
    return r ? std::to_string(*r) : std::string("hung");
  }

  // Runs in the child: with `handler` installed, calls `call` (which the handler answers badly)
  // and then clFinish, prints "call=<code> next=<code>" ("hung" for a call that did not return)
  // and exits, 0 when both returned.
  [[noreturn]] void BreakAndReport(FakeDaemon::Handler handler, std::function<cl_int()> call) {
    daemon().SetHandler(std::move(handler));
    auto first = ReturnsWithin(kHangLimit, std::move(call));
    auto next = first ? ReturnsWithin(kHangLimit, [this] { return cl().clFinish(queue_); })
                      : std::nullopt;
    std::fprintf(stderr, "call=%s next=%s\n", Text(first).c_str(), Text(next).c_str());
    std::fflush(stderr);
    if (!first || !next) std::_Exit(1);  // a thread is still blocked in the ICD
    std::exit(0);
  }

  // A device info query for BreakAndReport.
  std::function<cl_int()> QueryDevice(cl_device_info param) {
    return [this, param] {
      cl_uint v = 0;
      return cl().clGetDeviceInfo(device(), param, sizeof(v), &v, nullptr);
    };
  }
};

constexpr const char* kBothUnavailable = "call=-2 next=-2";

TEST_F(IcdConnectionLossTest, DaemonHangingUpMidCallFailsTheCall) {
  EXPECT_EXIT(BreakAndReport(OnDeviceInfo(CL_DEVICE_MAX_CONSTANT_ARGS,
                                          [](uint64_t) {
                                            Response r;
                                            r.CloseAfter();
                                            return r;
                                          }),
                             QueryDevice(CL_DEVICE_MAX_CONSTANT_ARGS)),
              ::testing::ExitedWithCode(0), kBothUnavailable);
}

TEST_F(IcdConnectionLossTest, DaemonHangingUpMidReadFailsTheBlockedRead) {
  auto handler = [](wire::Request::Reader r) {
    if (!r.isEnqueue() || !r.getEnqueue().isReadBuffer()) return FakeDaemon::Default(r);
    Response resp;
    std::vector<uint8_t> half(8, 0x33);
    auto rd = resp.AddReply(r.getSeq()).initReadData();
    rd.setData(kj::arrayPtr(half.data(), half.size()));
    rd.setLast(false);
    resp.CloseAfter();
    return resp;
  };
  auto read = [this] {
    cl_int err = CL_SUCCESS;
    cl_mem m = cl().clCreateBuffer(ctx_, CL_MEM_READ_WRITE, 16, nullptr, &err);
    if (err != CL_SUCCESS) return err;
    uint8_t dst[16] = {};
    return cl().clEnqueueReadBuffer(queue_, m, CL_TRUE, 0, sizeof(dst), dst, 0, nullptr, nullptr);
  };
  EXPECT_EXIT(BreakAndReport(handler, read), ::testing::ExitedWithCode(0), kBothUnavailable);
}

TEST_F(IcdConnectionLossTest, GarbageFrameFailsTheCall) {
  EXPECT_EXIT(BreakAndReport(OnDeviceInfo(CL_DEVICE_IMAGE_SUPPORT,
                                          [](uint64_t) {
                                            Response r;
                                            r.AddRaw(std::vector<uint8_t>(64, 0xA5));
                                            return r;
                                          }),
                             QueryDevice(CL_DEVICE_IMAGE_SUPPORT)),
              ::testing::ExitedWithCode(0), kBothUnavailable);
}

TEST_F(IcdConnectionLossTest, TruncatedFrameFailsTheCall) {
  auto handler = OnDeviceInfo(CL_DEVICE_MEM_BASE_ADDR_ALIGN, [](uint64_t seq) {
    capnp::MallocMessageBuilder b;
    auto rep = b.initRoot<wire::Reply>();
    rep.setSeq(seq);
    std::vector<uint8_t> info(64, 0x01);
    rep.setInfo(kj::arrayPtr(info.data(), info.size()));
    auto frame = proto::EncodeFrame(proto::FrameKind::kReply, b);
    Response r;
    if (frame.ok()) {
      frame->resize(frame->size() / 2);  // the header and part of the payload
      r.AddRaw(std::move(*frame));
    }
    r.CloseAfter();
    return r;
  });
  EXPECT_EXIT(BreakAndReport(handler, QueryDevice(CL_DEVICE_MEM_BASE_ADDR_ALIGN)),
              ::testing::ExitedWithCode(0), kBothUnavailable);
}

// A header announcing a payload over the ICD's limit: rejected unread, and the stream cannot be
// resynchronized after it, so the connection is given up (the daemon does not hang up here).
TEST_F(IcdConnectionLossTest, FrameOverTheLimitFailsTheCall) {
  auto handler = OnDeviceInfo(CL_DEVICE_GLOBAL_MEM_CACHELINE_SIZE, [](uint64_t) {
    std::vector<uint8_t> header(proto::kHeaderBytes);
    proto::EncodeHeader({proto::kProtocolVersion, proto::FrameKind::kReply,
                         2 * proto::kDefaultMaxPayloadBytes},
                        header.data());
    Response r;
    r.AddRaw(std::move(header));
    return r;
  });
  EXPECT_EXIT(BreakAndReport(handler, QueryDevice(CL_DEVICE_GLOBAL_MEM_CACHELINE_SIZE)),
              ::testing::ExitedWithCode(0), kBothUnavailable);
}

}  // namespace
}  // namespace gmux::testing
