// The ICD's OpenCL entry points against a fake daemon: which calls the ICD answers itself and
// which reach the daemon. Foreign, stale and wrong-kind handles are rejected without a request;
// context, queue, buffer and reference-count queries are answered client-side; device info is
// asked once; kernel arguments are checked against the daemon's KernelReply; a blocking read
// assembles the daemon's inline chunks; an unasked error report surfaces at the next clFinish;
// a clFinish or a wait with nothing outstanding asks nothing.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "icd/loaded_icd.h"
#include "proto/event_profile.h"

namespace gmux::testing {
namespace {

namespace wire = proto::wire;

// Stands in for a handle the ICD did not make: the real dispatch pointer, then zeros.
struct ForgedHandle {
  const cl_icd_dispatch* dispatch;
  uint64_t rest[15];
};

// A byte copy of a live object's first bytes (dispatch pointer, id): still not an object.
struct CopiedHandle {
  alignas(16) unsigned char bytes[64];
};

CopiedHandle CopyOf(const void* live) {
  CopiedHandle c;
  std::memcpy(c.bytes, live, sizeof(c.bytes));
  return c;
}

template <typename H>
H As(void* p) {
  return reinterpret_cast<H>(p);
}

// What IcdTest::Sync sends.
const std::vector<wire::Request::Which> kSyncKinds = {wire::Request::ENQUEUE,
                                                      wire::Request::FINISH};

std::vector<wire::Request::Which> Kinds(const std::vector<SeenRequest>& seen) {
  std::vector<wire::Request::Which> out;
  for (const auto& s : seen) out.push_back(s.which);
  return out;
}

using IcdHandleTest = IcdTest;

TEST_F(IcdHandleTest, ForeignStaleAndWrongKindContextsAreRejectedWithoutARequest) {
  cl_int err = CL_SUCCESS;
  cl_device_id dev = device();
  cl_context released = cl().clCreateContext(nullptr, 1, &dev, nullptr, nullptr, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  ASSERT_EQ(cl().clReleaseContext(released), CL_SUCCESS);
  ForgedHandle forged{&cl(), {}};
  CopiedHandle copy = CopyOf(ctx_);
  const std::vector<cl_context> bad = {nullptr, As<cl_context>(&forged),
                                       As<cl_context>(copy.bytes),
                                       reinterpret_cast<cl_context>(queue_), released};
  ASSERT_EQ(Sync(), CL_SUCCESS);  // the release, batched until now, reaches the daemon
  daemon().ClearSeen();
  for (size_t i = 0; i < bad.size(); ++i) {
    SCOPED_TRACE("bad context #" + std::to_string(i));
    cl_uint n = 99;
    EXPECT_EQ(cl().clGetContextInfo(bad[i], CL_CONTEXT_NUM_DEVICES, sizeof(n), &n, nullptr),
              CL_INVALID_CONTEXT);
    EXPECT_EQ(n, 99u);
    EXPECT_EQ(cl().clRetainContext(bad[i]), CL_INVALID_CONTEXT);
    EXPECT_EQ(cl().clReleaseContext(bad[i]), CL_INVALID_CONTEXT);
    err = CL_SUCCESS;
    EXPECT_EQ(cl().clCreateBuffer(bad[i], CL_MEM_READ_WRITE, 64, nullptr, &err), nullptr);
    EXPECT_EQ(err, CL_INVALID_CONTEXT);
    err = CL_SUCCESS;
    EXPECT_EQ(cl().clCreateCommandQueueWithProperties(bad[i], dev, nullptr, &err), nullptr);
    EXPECT_EQ(err, CL_INVALID_CONTEXT);
  }
  cl_uint n = 0;
  EXPECT_EQ(cl().clGetContextInfo(ctx_, CL_CONTEXT_NUM_DEVICES, sizeof(n), &n, nullptr),
            CL_SUCCESS);
  EXPECT_EQ(n, 1u);
  ASSERT_EQ(Sync(), CL_SUCCESS);
  EXPECT_EQ(Kinds(daemon().Seen()), kSyncKinds);
}

TEST_F(IcdHandleTest, ForeignStaleAndWrongKindKernelsAreRejectedWithoutAGetInfo) {
  ScopedHandler handler(daemon(), [](wire::Request::Reader r) {
    if (r.isGetInfo() && r.getGetInfo().getKind() == wire::ObjectKind::KERNEL) {
      return Response::WithInfo(r.getSeq(), {'\0'});
    }
    return FakeDaemon::Default(r);
  });
  const char* src = "kernel void k() {}";
  cl_int err = CL_SUCCESS;
  cl_program p = cl().clCreateProgramWithSource(ctx_, 1, &src, nullptr, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  cl_kernel live = cl().clCreateKernel(p, "k", &err);
  ASSERT_EQ(err, CL_SUCCESS);
  cl_kernel released = cl().clCreateKernel(p, "k", &err);
  ASSERT_EQ(err, CL_SUCCESS);
  ASSERT_EQ(cl().clReleaseKernel(released), CL_SUCCESS);
  ForgedHandle forged{&cl(), {}};
  CopiedHandle copy = CopyOf(live);
  const std::vector<cl_kernel> bad = {nullptr, As<cl_kernel>(&forged), As<cl_kernel>(copy.bytes),
                                      reinterpret_cast<cl_kernel>(p), released};
  ASSERT_EQ(Sync(), CL_SUCCESS);
  daemon().ClearSeen();
  char attrs[16] = "untouched";
  for (size_t i = 0; i < bad.size(); ++i) {
    SCOPED_TRACE("bad kernel #" + std::to_string(i));
    EXPECT_EQ(cl().clGetKernelInfo(bad[i], CL_KERNEL_ATTRIBUTES, sizeof(attrs), attrs, nullptr),
              CL_INVALID_KERNEL);
    cl_int v = 1;
    EXPECT_EQ(cl().clSetKernelArg(bad[i], 0, sizeof(v), &v), CL_INVALID_KERNEL);
  }
  EXPECT_STREQ(attrs, "untouched");
  ASSERT_EQ(Sync(), CL_SUCCESS);
  EXPECT_EQ(daemon().CountInfo(wire::ObjectKind::KERNEL, CL_KERNEL_ATTRIBUTES), 0u);
  // The same query on the live kernel does reach the daemon.
  EXPECT_EQ(cl().clGetKernelInfo(live, CL_KERNEL_ATTRIBUTES, sizeof(attrs), attrs, nullptr),
            CL_SUCCESS);
  EXPECT_STREQ(attrs, "");
  EXPECT_EQ(daemon().CountInfo(wire::ObjectKind::KERNEL, CL_KERNEL_ATTRIBUTES), 1u);
  EXPECT_EQ(cl().clReleaseKernel(live), CL_SUCCESS);
  EXPECT_EQ(cl().clReleaseProgram(p), CL_SUCCESS);
}

TEST_F(IcdHandleTest, StaleEventsAreRejectedWithoutARequest) {
  ScopedHandler handler(daemon(), [](wire::Request::Reader r) {
    if (r.isGetInfo() && r.getGetInfo().getKind() == wire::ObjectKind::EVENT) {
      return Response::WithInfo(r.getSeq(), Bytes<cl_int>(CL_COMPLETE));
    }
    return FakeDaemon::Default(r);
  });
  cl_event live = nullptr;
  cl_event released = nullptr;
  ASSERT_EQ(cl().clEnqueueMarkerWithWaitList(queue_, 0, nullptr, &live), CL_SUCCESS);
  ASSERT_EQ(cl().clEnqueueMarkerWithWaitList(queue_, 0, nullptr, &released), CL_SUCCESS);
  ASSERT_EQ(cl().clReleaseEvent(released), CL_SUCCESS);
  ASSERT_EQ(Sync(), CL_SUCCESS);
  daemon().ClearSeen();
  cl_int status = 42;
  EXPECT_EQ(cl().clGetEventInfo(released, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof(status),
                                &status, nullptr),
            CL_INVALID_EVENT);
  EXPECT_EQ(cl().clWaitForEvents(1, &released), CL_INVALID_EVENT);
  EXPECT_EQ(cl().clEnqueueMarkerWithWaitList(queue_, 1, &released, nullptr),
            CL_INVALID_EVENT_WAIT_LIST);
  EXPECT_EQ(status, 42);
  ASSERT_EQ(Sync(), CL_SUCCESS);
  EXPECT_EQ(Kinds(daemon().Seen()), kSyncKinds);
  // The live event's status is the daemon's.
  EXPECT_EQ(cl().clGetEventInfo(live, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof(status), &status,
                                nullptr),
            CL_SUCCESS);
  EXPECT_EQ(status, CL_COMPLETE);
  EXPECT_EQ(daemon().CountInfo(wire::ObjectKind::EVENT, CL_EVENT_COMMAND_EXECUTION_STATUS), 1u);
  EXPECT_EQ(cl().clReleaseEvent(live), CL_SUCCESS);
}

using IcdLocalInfoTest = IcdTest;

TEST_F(IcdLocalInfoTest, ContextQueueBufferAndReferenceCountsSendNoRequest) {
  cl_int err = CL_SUCCESS;
  cl_mem m = cl().clCreateBuffer(ctx_, CL_MEM_READ_ONLY | CL_MEM_HOST_NO_ACCESS, 4096, nullptr,
                                 &err);
  ASSERT_EQ(err, CL_SUCCESS);
  daemon().ClearSeen();

  cl_device_id devs[2] = {nullptr, nullptr};
  size_t size = 0;
  EXPECT_EQ(cl().clGetContextInfo(ctx_, CL_CONTEXT_DEVICES, sizeof(devs), devs, &size),
            CL_SUCCESS);
  EXPECT_EQ(size, sizeof(cl_device_id));
  EXPECT_EQ(devs[0], device());
  cl_context qctx = nullptr;
  EXPECT_EQ(cl().clGetCommandQueueInfo(queue_, CL_QUEUE_CONTEXT, sizeof(qctx), &qctx, nullptr),
            CL_SUCCESS);
  EXPECT_EQ(qctx, ctx_);
  cl_device_id qdev = nullptr;
  EXPECT_EQ(cl().clGetCommandQueueInfo(queue_, CL_QUEUE_DEVICE, sizeof(qdev), &qdev, nullptr),
            CL_SUCCESS);
  EXPECT_EQ(qdev, device());
  size_t msize = 0;
  EXPECT_EQ(cl().clGetMemObjectInfo(m, CL_MEM_SIZE, sizeof(msize), &msize, nullptr), CL_SUCCESS);
  EXPECT_EQ(msize, 4096u);
  cl_mem_flags flags = 0;
  EXPECT_EQ(cl().clGetMemObjectInfo(m, CL_MEM_FLAGS, sizeof(flags), &flags, nullptr), CL_SUCCESS);
  EXPECT_EQ(flags, static_cast<cl_mem_flags>(CL_MEM_READ_ONLY | CL_MEM_HOST_NO_ACCESS));
  cl_context mctx = nullptr;
  EXPECT_EQ(cl().clGetMemObjectInfo(m, CL_MEM_CONTEXT, sizeof(mctx), &mctx, nullptr), CL_SUCCESS);
  EXPECT_EQ(mctx, ctx_);

  auto ctx_refs = [&] {
    cl_uint n = 0;
    EXPECT_EQ(cl().clGetContextInfo(ctx_, CL_CONTEXT_REFERENCE_COUNT, sizeof(n), &n, nullptr),
              CL_SUCCESS);
    return n;
  };
  auto mem_refs = [&] {
    cl_uint n = 0;
    EXPECT_EQ(cl().clGetMemObjectInfo(m, CL_MEM_REFERENCE_COUNT, sizeof(n), &n, nullptr),
              CL_SUCCESS);
    return n;
  };
  // The context is held by the test, the queue and the buffer.
  EXPECT_EQ(ctx_refs(), 3u);
  EXPECT_EQ(cl().clRetainContext(ctx_), CL_SUCCESS);
  EXPECT_EQ(ctx_refs(), 4u);
  EXPECT_EQ(cl().clReleaseContext(ctx_), CL_SUCCESS);
  EXPECT_EQ(ctx_refs(), 3u);
  EXPECT_EQ(mem_refs(), 1u);
  EXPECT_EQ(cl().clRetainMemObject(m), CL_SUCCESS);
  EXPECT_EQ(mem_refs(), 2u);
  EXPECT_EQ(cl().clReleaseMemObject(m), CL_SUCCESS);
  EXPECT_EQ(mem_refs(), 1u);
  cl_uint qrefs = 0;
  EXPECT_EQ(cl().clRetainCommandQueue(queue_), CL_SUCCESS);
  EXPECT_EQ(cl().clGetCommandQueueInfo(queue_, CL_QUEUE_REFERENCE_COUNT, sizeof(qrefs), &qrefs,
                                       nullptr),
            CL_SUCCESS);
  EXPECT_EQ(qrefs, 2u);
  EXPECT_EQ(cl().clReleaseCommandQueue(queue_), CL_SUCCESS);

  ASSERT_EQ(Sync(), CL_SUCCESS);
  EXPECT_EQ(Kinds(daemon().Seen()), kSyncKinds);

  // The last release does tell the daemon, and the context loses the buffer's reference.
  EXPECT_EQ(cl().clReleaseMemObject(m), CL_SUCCESS);
  EXPECT_EQ(ctx_refs(), 2u);
  ASSERT_EQ(Sync(), CL_SUCCESS);
  EXPECT_EQ(daemon().Count(wire::Request::RELEASE), 1u);
}

TEST_F(IcdLocalInfoTest, DeviceInfoIsAskedOnceAndCached) {
  ScopedHandler handler(daemon(), OnDeviceInfo(CL_DEVICE_MAX_COMPUTE_UNITS, [](uint64_t seq) {
                          return Response::WithInfo(seq, Bytes<cl_uint>(12));
                        }));
  cl_uint first = 0;
  cl_uint second = 0;
  size_t size = 0;
  EXPECT_EQ(cl().clGetDeviceInfo(device(), CL_DEVICE_MAX_COMPUTE_UNITS, sizeof(first), &first,
                                 nullptr),
            CL_SUCCESS);
  EXPECT_EQ(cl().clGetDeviceInfo(device(), CL_DEVICE_MAX_COMPUTE_UNITS, sizeof(second), &second,
                                 nullptr),
            CL_SUCCESS);
  EXPECT_EQ(cl().clGetDeviceInfo(device(), CL_DEVICE_MAX_COMPUTE_UNITS, 0, nullptr, &size),
            CL_SUCCESS);
  EXPECT_EQ(first, 12u);
  EXPECT_EQ(second, 12u);
  EXPECT_EQ(size, sizeof(cl_uint));
  ASSERT_EQ(Sync(), CL_SUCCESS);
  EXPECT_EQ(daemon().CountInfo(wire::ObjectKind::DEVICE, CL_DEVICE_MAX_COMPUTE_UNITS), 1u);
}

// ---- kernel arguments ----

constexpr uint32_t kNumArgs = 40;

class IcdKernelArgsTest : public IcdTest {
 protected:
  // The daemon's KernelReply for every kernel: kNumArgs private (by-value) arguments.
  static Response KernelOf40(wire::Request::Reader r) {
    if (!r.isCreateKernel()) return FakeDaemon::Default(r);
    Response resp;
    auto kr = resp.AddReply(r.getSeq()).initKernel();
    kr.setNumArgs(kNumArgs);
    auto quals = kr.initArgAddressQualifiers(kNumArgs);
    for (unsigned i = 0; i < kNumArgs; ++i) quals.set(i, CL_KERNEL_ARG_ADDRESS_PRIVATE);
    return resp;
  }

  void MakeKernel() {
    const char* src = "kernel void k40(int a0 /* ... a39 */) {}";
    cl_int err = CL_SUCCESS;
    program_ = cl().clCreateProgramWithSource(ctx_, 1, &src, nullptr, &err);
    ASSERT_EQ(err, CL_SUCCESS);
    kernel_ = cl().clCreateKernel(program_, "k40", &err);
    ASSERT_EQ(err, CL_SUCCESS);
  }

  void TearDown() override {
    if (kernel_ != nullptr) cl().clReleaseKernel(kernel_);
    if (program_ != nullptr) cl().clReleaseProgram(program_);
    IcdTest::TearDown();
  }

  cl_program program_ = nullptr;
  cl_kernel kernel_ = nullptr;
};

TEST_F(IcdKernelArgsTest, ArgumentIndexesFollowTheDaemonsKernelReply) {
  ScopedHandler handler(daemon(), KernelOf40);
  ASSERT_NO_FATAL_FAILURE(MakeKernel());
  cl_uint n = 0;
  EXPECT_EQ(cl().clGetKernelInfo(kernel_, CL_KERNEL_NUM_ARGS, sizeof(n), &n, nullptr), CL_SUCCESS);
  EXPECT_EQ(n, kNumArgs);
  cl_int v = 39;
  EXPECT_EQ(cl().clSetKernelArg(kernel_, kNumArgs - 1, sizeof(v), &v), CL_SUCCESS);
  EXPECT_EQ(cl().clSetKernelArg(kernel_, kNumArgs, sizeof(v), &v), CL_INVALID_ARG_INDEX);
  EXPECT_EQ(cl().clSetKernelArg(kernel_, 0xFFFFFFFFu, sizeof(v), &v), CL_INVALID_ARG_INDEX);
}

TEST_F(IcdKernelArgsTest, LaunchWithAnUnsetArgumentFailsWithoutAnEnqueue) {
  std::atomic<int> sent_args{-1};
  std::atomic<int32_t> sent_last{0};
  ScopedHandler handler(daemon(), [&](wire::Request::Reader r) {
    if (r.isEnqueue() && r.getEnqueue().isNdrange()) {
      auto args = r.getEnqueue().getNdrange().getArgs();
      sent_args = static_cast<int>(args.size());
      if (args.size() == kNumArgs && args[kNumArgs - 1].isValue() &&
          args[kNumArgs - 1].getValue().size() == sizeof(int32_t)) {
        int32_t v = 0;
        std::memcpy(&v, args[kNumArgs - 1].getValue().begin(), sizeof(v));
        sent_last = v;
      }
    }
    return KernelOf40(r);
  });
  ASSERT_NO_FATAL_FAILURE(MakeKernel());
  for (cl_int i = 0; i < static_cast<cl_int>(kNumArgs); ++i) {
    if (i == 17) continue;
    ASSERT_EQ(cl().clSetKernelArg(kernel_, static_cast<cl_uint>(i), sizeof(i), &i), CL_SUCCESS);
  }
  const size_t global = 64;
  daemon().ClearSeen();
  EXPECT_EQ(cl().clEnqueueNDRangeKernel(queue_, kernel_, 1, nullptr, &global, nullptr, 0, nullptr,
                                        nullptr),
            CL_INVALID_KERNEL_ARGS);
  ASSERT_EQ(Sync(), CL_SUCCESS);
  EXPECT_EQ(daemon().Count(wire::Request::ENQUEUE), 1u);  // Sync's marker only
  EXPECT_EQ(sent_args.load(), -1);

  // With the argument set the launch goes out, every argument with it.
  cl_int v17 = 17;
  ASSERT_EQ(cl().clSetKernelArg(kernel_, 17, sizeof(v17), &v17), CL_SUCCESS);
  EXPECT_EQ(cl().clEnqueueNDRangeKernel(queue_, kernel_, 1, nullptr, &global, nullptr, 0, nullptr,
                                        nullptr),
            CL_SUCCESS);
  ASSERT_EQ(Sync(), CL_SUCCESS);
  EXPECT_EQ(daemon().Count(wire::Request::ENQUEUE), 3u);  // the launch and two Sync markers
  EXPECT_EQ(sent_args.load(), static_cast<int>(kNumArgs));
  EXPECT_EQ(sent_last.load(), 39);
}

// The sizes the daemon's KernelReply gives by-value arguments are enforced at the call; an
// argument whose size it does not know (0, or a reply without the list) takes any size.
TEST_F(IcdKernelArgsTest, ByValueSizesFromTheKernelReplyAreEnforcedAtTheCall) {
  ScopedHandler handler(daemon(), [](wire::Request::Reader r) {
    if (!r.isCreateKernel()) return FakeDaemon::Default(r);
    Response resp;
    auto kr = resp.AddReply(r.getSeq()).initKernel();
    kr.setNumArgs(3);
    auto quals = kr.initArgAddressQualifiers(3);
    for (unsigned i = 0; i < 3; ++i) quals.set(i, CL_KERNEL_ARG_ADDRESS_PRIVATE);
    auto sizes = kr.initArgValueSizes(2);  // shorter than the arguments: the last unknown
    sizes.set(0, 4);
    sizes.set(1, 0);
    return resp;
  });
  ASSERT_NO_FATAL_FAILURE(MakeKernel());
  const int64_t v = 7;
  EXPECT_EQ(cl().clSetKernelArg(kernel_, 0, 8, &v), CL_INVALID_ARG_SIZE);
  EXPECT_EQ(cl().clSetKernelArg(kernel_, 0, 2, &v), CL_INVALID_ARG_SIZE);
  EXPECT_EQ(cl().clSetKernelArg(kernel_, 0, 4, &v), CL_SUCCESS);
  EXPECT_EQ(cl().clSetKernelArg(kernel_, 1, 8, &v), CL_SUCCESS);
  EXPECT_EQ(cl().clSetKernelArg(kernel_, 1, 3, &v), CL_SUCCESS);
  EXPECT_EQ(cl().clSetKernelArg(kernel_, 2, 6, &v), CL_SUCCESS);
  EXPECT_EQ(cl().clSetKernelArg(kernel_, 1, 0, &v), CL_INVALID_ARG_SIZE);
  EXPECT_EQ(cl().clSetKernelArg(kernel_, 0, 4, nullptr), CL_INVALID_ARG_VALUE);
  EXPECT_EQ(cl().clSetKernelArg(kernel_, 1, 8, nullptr), CL_INVALID_ARG_VALUE);
}

// ---- transfers and errors ----

using IcdReadBufferTest = IcdTest;

TEST_F(IcdReadBufferTest, BlockingReadReceivesTheInlineChunks) {
  std::atomic<uint64_t> asked_offset{0};
  std::atomic<uint64_t> asked_size{0};
  std::atomic<bool> asked_shm{true};
  ScopedHandler handler(daemon(), [&](wire::Request::Reader r) {
    if (!r.isEnqueue() || !r.getEnqueue().isReadBuffer()) return FakeDaemon::Default(r);
    auto rb = r.getEnqueue().getReadBuffer();
    asked_offset = rb.getOffset();
    asked_size = rb.getSize();
    asked_shm = rb.getShm();
    // Byte i of the destination is 100 + i, in two chunks (the second one first).
    const uint64_t half = rb.getSize() / 2;
    std::vector<uint8_t> data(rb.getSize());
    for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(100 + i);
    Response resp;
    auto second = resp.AddReply(r.getSeq()).initReadData();
    second.setOffset(half);
    second.setData(kj::arrayPtr(data.data() + half, data.size() - half));
    auto first = resp.AddReply(r.getSeq()).initReadData();
    first.setOffset(0);
    first.setData(kj::arrayPtr(data.data(), half));
    first.setLast(true);
    return resp;
  });
  cl_int err = CL_SUCCESS;
  cl_mem m = cl().clCreateBuffer(ctx_, CL_MEM_READ_WRITE, 64, nullptr, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  daemon().ClearSeen();
  std::vector<uint8_t> dst(48 + 8, 0xCC);
  EXPECT_EQ(cl().clEnqueueReadBuffer(queue_, m, CL_TRUE, 8, 48, dst.data(), 0, nullptr, nullptr),
            CL_SUCCESS);
  for (size_t i = 0; i < 48; ++i) ASSERT_EQ(dst[i], static_cast<uint8_t>(100 + i)) << "byte " << i;
  for (size_t i = 48; i < dst.size(); ++i) EXPECT_EQ(dst[i], 0xCC) << "byte " << i;
  EXPECT_EQ(asked_offset.load(), 8u);
  EXPECT_EQ(asked_size.load(), 48u);
  EXPECT_FALSE(asked_shm.load());
  auto seen = daemon().Seen();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].which, wire::Request::ENQUEUE);
  EXPECT_NE(seen[0].seq, 0u);
  EXPECT_FALSE(seen[0].passed_fd);
  EXPECT_EQ(cl().clReleaseMemObject(m), CL_SUCCESS);
}

class IcdAsyncErrorTest : public IcdTest {
 protected:
  // A posted command: fills `m`'s 64 bytes with 7s.
  cl_int Fill(cl_mem m) {
    const cl_int pattern = 7;
    return cl().clEnqueueFillBuffer(queue_, m, &pattern, sizeof(pattern), 0, 64, 0, nullptr,
                                    nullptr);
  }
};

TEST_F(IcdAsyncErrorTest, UnaskedErrorReportIsReturnedByTheNextFinishOnce) {
  ScopedHandler handler(daemon(), [](wire::Request::Reader r) {
    if (r.isEnqueue() && r.getEnqueue().isFillBuffer()) {
      // A posted command failed on the daemon: it reports so unasked (seq 0).
      Response resp;
      auto rep = resp.AddReply(0);
      rep.setStatus(CL_MEM_OBJECT_ALLOCATION_FAILURE);
      rep.setMessage("fake: no device memory");
      return resp;
    }
    return FakeDaemon::Default(r);
  });
  cl_int err = CL_SUCCESS;
  cl_mem m = cl().clCreateBuffer(ctx_, CL_MEM_READ_WRITE, 64, nullptr, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  daemon().ClearSeen();
  EXPECT_EQ(Fill(m), CL_SUCCESS);
  EXPECT_EQ(cl().clFinish(queue_), CL_MEM_OBJECT_ALLOCATION_FAILURE);
  // Nothing enqueued since: the second clFinish asks nothing and has no error to return.
  EXPECT_EQ(cl().clFinish(queue_), CL_SUCCESS);
  auto seen = daemon().Seen();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].which, wire::Request::ENQUEUE);
  EXPECT_EQ(seen[0].seq, 0u);
  EXPECT_EQ(seen[1].which, wire::Request::FINISH);
  EXPECT_EQ(cl().clReleaseMemObject(m), CL_SUCCESS);
}

// clFinish asks the daemon only while a command of its queue is not known to be done: not on a
// new queue, nor after a finish, a blocking read or a wait that covered every command.
TEST_F(IcdAsyncErrorTest, AFinishWithNothingOutstandingSendsNoRequest) {
  cl_int err = CL_SUCCESS;
  cl_mem m = cl().clCreateBuffer(ctx_, CL_MEM_READ_WRITE, 64, nullptr, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  daemon().ClearSeen();
  EXPECT_EQ(cl().clFinish(queue_), CL_SUCCESS);
  EXPECT_EQ(daemon().Count(wire::Request::FINISH), 0u);
  EXPECT_EQ(Fill(m), CL_SUCCESS);
  EXPECT_EQ(cl().clFinish(queue_), CL_SUCCESS);
  EXPECT_EQ(cl().clFinish(queue_), CL_SUCCESS);
  EXPECT_EQ(daemon().Count(wire::Request::FINISH), 1u);
  // A fill, then a blocking read behind it on the in-order queue: the read's answer settles both.
  EXPECT_EQ(Fill(m), CL_SUCCESS);
  std::vector<uint8_t> dst(64);
  EXPECT_EQ(cl().clEnqueueReadBuffer(queue_, m, CL_TRUE, 0, 64, dst.data(), 0, nullptr, nullptr),
            CL_SUCCESS);
  EXPECT_EQ(cl().clFinish(queue_), CL_SUCCESS);
  EXPECT_EQ(daemon().Count(wire::Request::FINISH), 1u);
  // Posted requests batched meanwhile still leave at the finish (as a flush): the release
  // arrives with nothing else sent after it.
  EXPECT_EQ(cl().clReleaseMemObject(m), CL_SUCCESS);
  EXPECT_EQ(cl().clFinish(queue_), CL_SUCCESS);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (daemon().Count(wire::Request::RELEASE) == 0 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(daemon().Count(wire::Request::RELEASE), 1u);
  EXPECT_EQ(daemon().Count(wire::Request::FINISH), 1u);
}

// A finished command's profiling times come all at once (proto/event_profile.h): reading its
// start and end is one request, and a second read of either none. Before it finished the answer
// is the worker's (not available) and nothing is kept; a value the worker did not give (here
// CL_PROFILING_COMMAND_COMPLETE) is asked alone.
TEST_F(IcdAsyncErrorTest, ProfilingTimesAreAskedOnceForAllValues) {
  std::atomic<bool> complete{false};
  ScopedHandler handler(daemon(), [&complete](wire::Request::Reader r) {
    if (r.isGetInfo() && r.getGetInfo().getKind() == wire::ObjectKind::EVENT) {
      const uint32_t p = r.getGetInfo().getParam();
      if (!complete.load()) {
        return Response::WithStatus(r.getSeq(), CL_PROFILING_INFO_NOT_AVAILABLE);
      }
      if (p == proto::kProfilingAllParam) {
        proto::EventProfile all;
        for (uint32_t i = 0; i < 4; ++i) all.value[i] = 100 + 10 * i;
        all.available = 0xF;  // QUEUED .. END
        return Response::WithInfo(r.getSeq(), all.Encode());
      }
      if (p == CL_PROFILING_COMMAND_COMPLETE) {
        const cl_ulong t = 155;
        std::vector<uint8_t> v(sizeof(t));
        std::memcpy(v.data(), &t, sizeof(t));
        return Response::WithInfo(r.getSeq(), v);
      }
    }
    return FakeDaemon::Default(r);
  });
  cl_int err = CL_SUCCESS;
  const cl_queue_properties props[] = {CL_QUEUE_PROPERTIES, CL_QUEUE_PROFILING_ENABLE, 0};
  cl_command_queue q =
      cl().clCreateCommandQueueWithProperties(ctx_, device(), props, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  cl_event ev = nullptr;
  ASSERT_EQ(cl().clEnqueueMarkerWithWaitList(q, 0, nullptr, &ev), CL_SUCCESS);
  daemon().ClearSeen();
  cl_ulong t = 0;
  EXPECT_EQ(cl().clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_START, sizeof(t), &t, nullptr),
            CL_PROFILING_INFO_NOT_AVAILABLE);
  EXPECT_EQ(daemon().Count(wire::Request::GET_INFO), 1u);  // not asked again alone
  complete = true;
  EXPECT_EQ(cl().clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_START, sizeof(t), &t, nullptr),
            CL_SUCCESS);
  EXPECT_EQ(t, 120u);
  EXPECT_EQ(cl().clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_END, sizeof(t), &t, nullptr),
            CL_SUCCESS);
  EXPECT_EQ(t, 130u);
  EXPECT_EQ(cl().clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_QUEUED, sizeof(t), &t, nullptr),
            CL_SUCCESS);
  EXPECT_EQ(t, 100u);
  EXPECT_EQ(daemon().CountInfo(wire::ObjectKind::EVENT, proto::kProfilingAllParam), 2u);
  EXPECT_EQ(daemon().Count(wire::Request::GET_INFO), 2u);
  size_t size = 0;
  EXPECT_EQ(cl().clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_SUBMIT, 0, nullptr, &size),
            CL_SUCCESS);
  EXPECT_EQ(size, sizeof(cl_ulong));
  EXPECT_EQ(cl().clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_END, 4, &t, nullptr),
            CL_INVALID_VALUE);  // too small for a cl_ulong, as natively
  EXPECT_EQ(cl().clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_COMPLETE, sizeof(t), &t, nullptr),
            CL_SUCCESS);
  EXPECT_EQ(t, 155u);
  EXPECT_EQ(daemon().CountInfo(wire::ObjectKind::EVENT, CL_PROFILING_COMMAND_COMPLETE), 1u);
  EXPECT_EQ(cl().clGetEventProfilingInfo(ev, 0x1234, sizeof(t), &t, nullptr), CL_INVALID_VALUE);
  EXPECT_EQ(cl().clReleaseEvent(ev), CL_SUCCESS);
  EXPECT_EQ(cl().clReleaseCommandQueue(q), CL_SUCCESS);
}

// A wait for events of a profiling queue asks for their times with it (waitEventsProfiled): an
// event whose times came needs no query after; one without (available 0) and a wait whose answer
// is malformed fall back to the query. A queue without profiling waits plainly.
TEST_F(IcdAsyncErrorTest, AWaitBringsTheProfilingTimesOfItsEvents) {
  std::atomic<int> mode{0};  // 0: times for the first event only; 1: a malformed answer
  ScopedHandler handler(daemon(), [&mode](wire::Request::Reader r) {
    if (r.isWaitEventsProfiled()) {
      const size_t n = r.getWaitEventsProfiled().size();
      std::vector<uint8_t> info;
      for (size_t i = 0; i < n; ++i) {
        proto::EventProfile p;
        if (i == 0) {
          for (uint32_t k = 0; k < proto::kProfilingValues; ++k) p.value[k] = 1000 + k;
          p.available = 0x1F;
        }
        auto one = p.Encode();
        info.insert(info.end(), one.begin(), one.end());
      }
      if (mode.load() == 1) info.resize(info.size() - 1);
      return Response::WithInfo(r.getSeq(), info);
    }
    if (r.isGetInfo() && r.getGetInfo().getParam() == proto::kProfilingAllParam) {
      proto::EventProfile p;
      for (uint32_t k = 0; k < proto::kProfilingValues; ++k) p.value[k] = 2000 + k;
      p.available = 0x1F;
      return Response::WithInfo(r.getSeq(), p.Encode());
    }
    return FakeDaemon::Default(r);
  });
  cl_int err = CL_SUCCESS;
  const cl_queue_properties props[] = {CL_QUEUE_PROPERTIES, CL_QUEUE_PROFILING_ENABLE, 0};
  cl_command_queue q = cl().clCreateCommandQueueWithProperties(ctx_, device(), props, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  cl_event ev[2] = {};
  ASSERT_EQ(cl().clEnqueueMarkerWithWaitList(q, 0, nullptr, &ev[0]), CL_SUCCESS);
  ASSERT_EQ(cl().clEnqueueMarkerWithWaitList(q, 0, nullptr, &ev[1]), CL_SUCCESS);
  daemon().ClearSeen();
  ASSERT_EQ(cl().clWaitForEvents(2, ev), CL_SUCCESS);
  EXPECT_EQ(daemon().Count(wire::Request::WAIT_EVENTS_PROFILED), 1u);
  cl_ulong t = 0;
  EXPECT_EQ(cl().clGetEventProfilingInfo(ev[0], CL_PROFILING_COMMAND_START, sizeof(t), &t, nullptr),
            CL_SUCCESS);
  EXPECT_EQ(t, 1002u);
  EXPECT_EQ(cl().clGetEventProfilingInfo(ev[0], CL_PROFILING_COMMAND_COMPLETE, sizeof(t), &t,
                                         nullptr),
            CL_SUCCESS);
  EXPECT_EQ(t, 1004u);
  EXPECT_EQ(daemon().Count(wire::Request::GET_INFO), 0u);
  EXPECT_EQ(cl().clGetEventProfilingInfo(ev[1], CL_PROFILING_COMMAND_END, sizeof(t), &t, nullptr),
            CL_SUCCESS);
  EXPECT_EQ(t, 2003u);
  EXPECT_EQ(daemon().Count(wire::Request::GET_INFO), 1u);
  // Both kept now: waiting again sends nothing.
  ASSERT_EQ(cl().clWaitForEvents(2, ev), CL_SUCCESS);
  EXPECT_EQ(daemon().Count(wire::Request::WAIT_EVENTS_PROFILED), 1u);

  mode = 1;
  cl_event e2 = nullptr;
  ASSERT_EQ(cl().clEnqueueMarkerWithWaitList(q, 0, nullptr, &e2), CL_SUCCESS);
  daemon().ClearSeen();
  ASSERT_EQ(cl().clWaitForEvents(1, &e2), CL_SUCCESS);
  EXPECT_EQ(cl().clGetEventProfilingInfo(e2, CL_PROFILING_COMMAND_START, sizeof(t), &t, nullptr),
            CL_SUCCESS);
  EXPECT_EQ(t, 2002u);  // the malformed answer was not kept
  EXPECT_EQ(daemon().Count(wire::Request::GET_INFO), 1u);

  // Without profiling on the queue, a plain wait.
  cl_event e3 = nullptr;
  ASSERT_EQ(cl().clEnqueueMarkerWithWaitList(queue_, 0, nullptr, &e3), CL_SUCCESS);
  daemon().ClearSeen();
  ASSERT_EQ(cl().clWaitForEvents(1, &e3), CL_SUCCESS);
  EXPECT_EQ(daemon().Count(wire::Request::WAIT_EVENTS), 1u);
  EXPECT_EQ(daemon().Count(wire::Request::WAIT_EVENTS_PROFILED), 0u);
  for (cl_event e : {ev[0], ev[1], e2, e3}) EXPECT_EQ(cl().clReleaseEvent(e), CL_SUCCESS);
  EXPECT_EQ(cl().clReleaseCommandQueue(q), CL_SUCCESS);
}

// A kernel timed with clFinish: on an in-order profiling queue whose last command has an event
// without times, the finish is a profiled wait for that command, so the profiling queries after
// it send nothing. Anything else (another last command, the event released, no profiling, the
// command failed) is a plain finish; out of order: FeaturesTest.ATimedKernelFinishedThenQueried.
TEST_F(IcdAsyncErrorTest, AFinishBringsTheTimesOfTheLastCommand) {
  std::atomic<bool> fail{false};
  ScopedHandler handler(daemon(), [&fail](wire::Request::Reader r) {
    if (r.isWaitEventsProfiled()) {
      if (fail.load()) {
        return Response::WithStatus(r.getSeq(), CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST);
      }
      std::vector<uint8_t> info;
      for (size_t i = 0; i < r.getWaitEventsProfiled().size(); ++i) {
        proto::EventProfile p;
        for (uint32_t k = 0; k < proto::kProfilingValues; ++k) p.value[k] = 3000 + k;
        p.available = 0x1F;
        auto one = p.Encode();
        info.insert(info.end(), one.begin(), one.end());
      }
      return Response::WithInfo(r.getSeq(), info);
    }
    return FakeDaemon::Default(r);
  });
  cl_int err = CL_SUCCESS;
  const cl_queue_properties props[] = {CL_QUEUE_PROPERTIES, CL_QUEUE_PROFILING_ENABLE, 0};
  cl_command_queue q = cl().clCreateCommandQueueWithProperties(ctx_, device(), props, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  // clFinish(queue) succeeds, having sent `waits` profiled waits and `finishes` finishes.
  auto finish_sends = [&](cl_command_queue queue, size_t waits, size_t finishes) {
    daemon().ClearSeen();
    EXPECT_EQ(cl().clFinish(queue), CL_SUCCESS);
    EXPECT_EQ(daemon().Count(wire::Request::WAIT_EVENTS_PROFILED), waits);
    EXPECT_EQ(daemon().Count(wire::Request::FINISH), finishes);
  };
  cl_event ev = nullptr;
  ASSERT_EQ(cl().clEnqueueMarkerWithWaitList(q, 0, nullptr, &ev), CL_SUCCESS);
  finish_sends(q, 1, 0);
  cl_ulong t = 0;
  EXPECT_EQ(cl().clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_START, sizeof(t), &t, nullptr),
            CL_SUCCESS);
  EXPECT_EQ(t, 3002u);
  EXPECT_EQ(cl().clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_END, sizeof(t), &t, nullptr),
            CL_SUCCESS);
  EXPECT_EQ(t, 3003u);
  EXPECT_EQ(daemon().Count(wire::Request::GET_INFO), 0u);
  cl_int status = 0;
  EXPECT_EQ(cl().clGetEventInfo(ev, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof(status), &status,
                                nullptr),
            CL_SUCCESS);
  EXPECT_EQ(status, CL_COMPLETE);
  // Everything known complete: the next finish asks nothing; the event's own count is as it was.
  finish_sends(q, 0, 0);
  cl_uint refs = 0;
  EXPECT_EQ(cl().clGetEventInfo(ev, CL_EVENT_REFERENCE_COUNT, sizeof(refs), &refs, nullptr),
            CL_SUCCESS);
  EXPECT_EQ(refs, 1u);

  // The last command has no event.
  cl_event e2 = nullptr;
  ASSERT_EQ(cl().clEnqueueMarkerWithWaitList(q, 0, nullptr, &e2), CL_SUCCESS);
  ASSERT_EQ(cl().clEnqueueMarkerWithWaitList(q, 0, nullptr, nullptr), CL_SUCCESS);
  finish_sends(q, 0, 1);
  // Its event released before the finish.
  cl_event e3 = nullptr;
  ASSERT_EQ(cl().clEnqueueMarkerWithWaitList(q, 0, nullptr, &e3), CL_SUCCESS);
  EXPECT_EQ(cl().clReleaseEvent(e3), CL_SUCCESS);
  finish_sends(q, 0, 1);
  // No profiling on the queue.
  cl_event e4 = nullptr;
  ASSERT_EQ(cl().clEnqueueMarkerWithWaitList(queue_, 0, nullptr, &e4), CL_SUCCESS);
  finish_sends(queue_, 0, 1);
  // The command failed: the wait says so, and a plain finish answers as it always did.
  fail = true;
  cl_event e6 = nullptr;
  ASSERT_EQ(cl().clEnqueueMarkerWithWaitList(q, 0, nullptr, &e6), CL_SUCCESS);
  finish_sends(q, 1, 1);
  for (cl_event e : {ev, e2, e4, e6}) EXPECT_EQ(cl().clReleaseEvent(e), CL_SUCCESS);
  EXPECT_EQ(cl().clReleaseCommandQueue(q), CL_SUCCESS);
}

// An event waited for without error is complete from then on: waiting for it again or asking its
// status sends nothing. One that failed is asked again.
TEST_F(IcdAsyncErrorTest, AnEventWaitedForIsKnownCompleteAfterwards) {
  std::atomic<bool> fail{false};
  ScopedHandler handler(daemon(), [&fail](wire::Request::Reader r) {
    if (r.isWaitEvents() && fail.load()) {
      return Response::WithStatus(r.getSeq(), CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST);
    }
    return FakeDaemon::Default(r);
  });
  cl_event ev = nullptr;
  ASSERT_EQ(cl().clEnqueueMarkerWithWaitList(queue_, 0, nullptr, &ev), CL_SUCCESS);
  daemon().ClearSeen();
  EXPECT_EQ(cl().clWaitForEvents(1, &ev), CL_SUCCESS);
  EXPECT_EQ(cl().clWaitForEvents(1, &ev), CL_SUCCESS);
  cl_int status = 42;
  EXPECT_EQ(cl().clGetEventInfo(ev, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof(status), &status,
                                nullptr),
            CL_SUCCESS);
  EXPECT_EQ(status, CL_COMPLETE);
  EXPECT_EQ(daemon().Count(wire::Request::WAIT_EVENTS), 1u);
  EXPECT_EQ(daemon().Count(wire::Request::GET_INFO), 0u);
  // A wait that the daemon answers with an error leaves its event unknown: asked each time.
  fail = true;
  cl_event failing = nullptr;
  ASSERT_EQ(cl().clEnqueueMarkerWithWaitList(queue_, 0, nullptr, &failing), CL_SUCCESS);
  EXPECT_EQ(cl().clWaitForEvents(1, &failing), CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST);
  EXPECT_EQ(cl().clWaitForEvents(1, &failing), CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST);
  EXPECT_EQ(daemon().Count(wire::Request::WAIT_EVENTS), 3u);
  EXPECT_EQ(cl().clReleaseEvent(failing), CL_SUCCESS);
  EXPECT_EQ(cl().clReleaseEvent(ev), CL_SUCCESS);
}

}  // namespace
}  // namespace gmux::testing
