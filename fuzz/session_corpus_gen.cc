// Writes the seed corpus of session_fuzz: one file per request sequence, each in session_fuzz's
// input format (session_input.h), doing what an application does through the ICD after its
// hello: create a context and queues, buffers (initial data and writes through inline bulk data
// or shared memory), programs (from source, from a binary, compiled with a header and linked),
// kernels, every enqueue shape with its arguments, user events, waits, reads, queries, releases;
// plus one sequence of requests the session must refuse.
//
//   session_corpus_gen OUTDIR    (fuzz/corpus/session/ is its output, checked in)
//
// Regenerate the checked-in seeds after a schema change; docs/testing.md says how.
#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>

#include <capnp/message.h>
#include <capnp/serialize.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "proto/frame.h"
#include "session_input.h"

namespace {

namespace wire = gmux::proto::wire;
namespace in = gmux::fuzz::session;
using Req = wire::Request::Builder;
using Enq = wire::Enqueue::Builder;

// Ids used throughout: context 1, queue 2 (in order) or 3 (out of order), buffers 10.., programs
// 20.., kernels 30.., events 40.., samplers 50, images 60.., bulk tokens 100...
constexpr uint64_t kCtx = 1, kQueue = 2, kOooQueue = 3;

class Seed {
 public:
  // One request; `answered` gives it a seq (the client waits for its reply).
  Seed& Add(bool answered, const std::function<void(Req)>& fill, uint8_t flags = 0) {
    capnp::MallocMessageBuilder b;
    auto r = b.initRoot<wire::Request>();
    if (answered) r.setSeq(++seq_);
    fill(r);
    auto words = capnp::messageToFlatArray(b);
    auto bytes = words.asBytes();
    uint32_t w = in::FrameWord(bytes.size(), flags);
    uint8_t le[4];
    std::memcpy(le, &w, 4);
    out_.insert(out_.end(), le, le + 4);
    out_.insert(out_.end(), bytes.begin(), bytes.end());
    return *this;
  }
  Seed& Enqueue(bool answered, uint64_t queue, uint64_t event, bool keep,
                std::vector<uint64_t> waits, const std::function<void(Enq)>& fill,
                uint8_t flags = 0) {
    return Add(
        answered,
        [&](Req r) {
          auto e = r.initEnqueue();
          e.setQueue(queue);
          e.setEvent(event);
          e.setKeepEvent(keep);
          auto w = e.initWaitList(static_cast<unsigned>(waits.size()));
          for (unsigned i = 0; i < waits.size(); ++i) w.set(i, waits[i]);
          fill(e);
        },
        flags);
  }

  // Common steps.
  Seed& Context() {
    return Add(true, [](Req r) {
      auto c = r.initCreateContext();
      c.setId(kCtx);
      c.initDevices(1).set(0, 0);
    });
  }
  Seed& Queue(uint64_t id, uint64_t properties) {
    return Add(true, [=](Req r) {
      auto q = r.initCreateQueue();
      q.setId(id);
      q.setContext(kCtx);
      q.setDevice(0);
      q.setProperties(properties);
    });
  }
  // BulkBegin and BulkData of `n` bytes (a counting pattern) under `token`.
  // With `data_frame`, the data goes as a data frame (in::kAsDataFrame).
  Seed& Bulk(uint64_t token, size_t n, bool data_frame = false) {
    Add(false, [=](Req r) {
      auto b = r.initBulkBegin();
      b.setToken(token);
      b.setSize(n);
    });
    std::vector<uint8_t> data(n);
    for (size_t i = 0; i < n; ++i) data[i] = static_cast<uint8_t>(i * 7 + 1);
    return Add(false, [&](Req r) {
      auto d = r.initBulkData();
      d.setToken(token);
      d.setOffset(0);
      d.setData(kj::arrayPtr(data.data(), data.size()));
    }, data_frame ? in::kAsDataFrame : 0);
  }
  Seed& Buffer(uint64_t id, uint64_t size, uint64_t init_token = 0) {
    return Add(true, [=](Req r) {
      auto c = r.initCreateBuffer();
      c.setId(id);
      c.setContext(kCtx);
      c.setFlags(CL_MEM_READ_WRITE);
      c.setSize(size);
      c.setInitialData(init_token);
    });
  }
  Seed& Source(uint64_t id, size_t source) {
    return Add(true, [=](Req r) {
      auto p = r.initCreateProgramWithSource();
      p.setId(id);
      p.setContext(kCtx);
      p.setSource(std::string(in::kSources[source]));
    });
  }
  Seed& Build(uint64_t program, size_t options) {
    return Add(true, [=](Req r) {
      auto b = r.initBuildProgram();
      b.setProgram(program);
      b.setOptions(std::string(in::kOptions[options]));
    });
  }
  Seed& Kernel(uint64_t id, uint64_t program, const char* name) {
    return Add(true, [=](Req r) {
      auto k = r.initCreateKernel();
      k.setId(id);
      k.setProgram(program);
      k.setName(name);
    });
  }
  Seed& Info(wire::ObjectKind kind, uint64_t id, uint32_t param, bool device = false,
             uint32_t arg = 0) {
    return Add(true, [=](Req r) {
      auto g = r.initGetInfo();
      g.setKind(kind);
      g.setId(id);
      g.setParam(param);
      g.setHasDevice(device);
      g.setDevice(0);
      g.setArgIndex(arg);
    });
  }
  Seed& Read(uint64_t queue, uint64_t event, uint64_t mem, uint64_t offset, uint64_t size) {
    return Enqueue(true, queue, event, false, {}, [=](Enq e) {
      auto rd = e.initReadBuffer();
      rd.setMem(mem);
      rd.setOffset(offset);
      rd.setSize(size);
    });
  }
  Seed& Finish(uint64_t queue) {
    return Add(true, [=](Req r) { r.setFinish(queue); });
  }
  Seed& Release(wire::ObjectKind kind, uint64_t id) {
    return Add(false, [=](Req r) {
      auto rel = r.initRelease();
      rel.setKind(kind);
      rel.setId(id);
    });
  }

  const std::vector<uint8_t>& bytes() const { return out_; }

 private:
  uint64_t seq_ = 1;  // 1 was the hello's
  std::vector<uint8_t> out_;
};

void List(capnp::List<uint64_t>::Builder l, std::initializer_list<uint64_t> v) {
  unsigned i = 0;
  for (uint64_t x : v) l.set(i++, x);
}

// An NDRange launch: sizes, then the arguments (filled by `args`).
void NdRange(Enq e, uint64_t kernel, std::initializer_list<uint64_t> global,
             std::initializer_list<uint64_t> local, std::initializer_list<uint64_t> offset,
             unsigned nargs,
             const std::function<void(capnp::List<wire::KernelArg>::Builder)>& args) {
  auto nd = e.initNdrange();
  nd.setKernel(kernel);
  nd.setWorkDim(static_cast<uint32_t>(global.size()));
  List(nd.initGlobalSize(static_cast<unsigned>(global.size())), global);
  List(nd.initLocalSize(static_cast<unsigned>(local.size())), local);
  List(nd.initGlobalOffset(static_cast<unsigned>(offset.size())), offset);
  args(nd.initArgs(nargs));
}

void Value(wire::KernelArg::Builder a, const void* v, size_t n) {
  a.setValue(kj::arrayPtr(static_cast<const kj::byte*>(v), n));
}

struct Named {
  const char* name;
  Seed seed;
};

std::vector<Named> Seeds() {
  using K = wire::ObjectKind;
  std::vector<Named> s;

  // Buffers only: initial data, a write, a fill, a copy, a read, finish, releases.
  {
    Seed q;
    q.Context().Queue(kQueue, 0).Bulk(100, 64).Buffer(10, 64, 100).Buffer(11, 64);
    q.Bulk(101, 32, /*data_frame=*/true);
    q.Enqueue(false, kQueue, 40, false, {}, [](Enq e) {
      auto w = e.initWriteBuffer();
      w.setMem(10);
      w.setOffset(16);
      w.setSize(32);
      w.setBulk(101);
    });
    q.Enqueue(false, kQueue, 41, false, {}, [](Enq e) {
      auto f = e.initFillBuffer();
      f.setMem(10);
      uint8_t pattern[4] = {0xde, 0xad, 0xbe, 0xef};
      f.setPattern(kj::arrayPtr(pattern, 4));
      f.setOffset(0);
      f.setSize(16);
    });
    q.Enqueue(false, kQueue, 42, false, {}, [](Enq e) {
      auto c = e.initCopyBuffer();
      c.setSrc(10);
      c.setDst(11);
      c.setSize(64);
    });
    q.Read(kQueue, 43, 11, 0, 64).Finish(kQueue);
    q.Release(K::MEM, 10).Release(K::MEM, 11).Release(K::QUEUE, kQueue).Release(K::CONTEXT, kCtx);
    s.push_back({"buffer-roundtrip", q});
  }

  // A program from source, a kernel, a launch with a buffer and a value, its event and profile.
  {
    Seed q;
    q.Context().Queue(kQueue, CL_QUEUE_PROFILING_ENABLE).Buffer(10, 256);
    q.Source(20, 0).Build(20, 0).Kernel(30, 20, "add");
    q.Info(K::KERNEL, 30, CL_KERNEL_ARG_ADDRESS_QUALIFIER, false, 0);
    q.Info(K::KERNEL, 30, CL_KERNEL_FUNCTION_NAME);
    q.Info(K::PROGRAM, 20, CL_PROGRAM_BUILD_STATUS, true);
    q.Enqueue(false, kQueue, 40, true, {}, [](Enq e) {
      NdRange(e, 30, {64}, {8}, {}, 2, [](auto a) {
        a[0].setMem(10);
        int32_t k = 5;
        Value(a[1], &k, sizeof(k));
      });
    });
    q.Add(true, [](Req r) { List(r.initWaitEventsProfiled(2), {40, 40}); });
    q.Info(K::EVENT, 40, CL_PROFILING_COMMAND_END);
    q.Info(K::EVENT, 40, 0x80000001u);  // every profiling time at once (proto/event_profile.h)
    q.Info(K::EVENT, 40, CL_EVENT_COMMAND_EXECUTION_STATUS);
    q.Read(kQueue, 41, 10, 0, 4).Finish(kQueue);
    q.Release(K::KERNEL, 30).Release(K::PROGRAM, 20).Release(K::EVENT, 40).Release(K::MEM, 10);
    q.Release(K::QUEUE, kQueue).Release(K::CONTEXT, kCtx);
    s.push_back({"kernel-add", q});
  }

  // Launches split into chunks: 1D and 2D with a local size, one without, one with an offset.
  {
    Seed q;
    q.Context().Queue(kQueue, 0).Buffer(10, 64).Source(20, 0).Build(20, 1).Kernel(30, 20, "add");
    auto args = [](auto a) {
      a[0].setMem(10);
      int32_t k = 1;
      Value(a[1], &k, sizeof(k));
    };
    q.Enqueue(false, kQueue, 40, false, {}, [&](Enq e) {
      NdRange(e, 30, {4096}, {64}, {}, 2, args);
    });
    q.Enqueue(false, kQueue, 41, false, {}, [&](Enq e) {
      NdRange(e, 30, {64, 32}, {8, 4}, {}, 2, args);
    });
    q.Enqueue(false, kQueue, 42, false, {}, [&](Enq e) {
      NdRange(e, 30, {1024}, {}, {}, 2, args);
    });
    q.Enqueue(false, kQueue, 43, false, {}, [&](Enq e) {
      NdRange(e, 30, {16, 16, 8}, {4, 4, 2}, {1, 2, 3}, 2, args);
    });
    q.Read(kQueue, 44, 10, 0, 1).Finish(kQueue);
    s.push_back({"kernel-split", q});
  }

  // A __local argument, a NULL buffer, an out-of-order queue with a barrier and a marker.
  {
    Seed q;
    q.Context().Queue(kOooQueue, CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE).Buffer(10, 16);
    q.Source(20, 1).Build(20, 4).Kernel(30, 20, "local_copy");
    q.Info(K::KERNEL, 30, CL_KERNEL_WORK_GROUP_SIZE, true);
    q.Info(K::KERNEL, 30, CL_KERNEL_LOCAL_MEM_SIZE, true);
    auto launch = [](bool null_out) {
      return [null_out](Enq e) {
        NdRange(e, 30, {32}, {4}, {}, 3, [null_out](auto a) {
          if (null_out) {
            a[0].setNullMem();
          } else {
            a[0].setMem(10);
          }
          a[1].setLocal(16);
          uint32_t n = 9;
          Value(a[2], &n, sizeof(n));
        });
      };
    };
    q.Enqueue(false, kOooQueue, 40, true, {}, launch(false));
    q.Enqueue(false, kOooQueue, 41, true, {}, [](Enq e) { e.setBarrier(); });
    q.Enqueue(false, kOooQueue, 42, true, {}, launch(true));
    q.Enqueue(false, kOooQueue, 43, true, {40, 42}, [](Enq e) { e.setMarker(); });
    q.Add(true, [](Req r) { List(r.initWaitEventsProfiled(2), {41, 43}); });
    q.Read(kOooQueue, 44, 10, 0, 16).Finish(kOooQueue);
    s.push_back({"kernel-local-ooo", q});
  }

  // Images and a sampler: formats, initial data, every image command, a kernel taking a sampler.
  {
    Seed q;
    q.Context().Queue(kQueue, 0);
    q.Add(true, [](Req r) {
      auto f = r.initImageFormats();
      f.setContext(kCtx);
      f.setFlags(CL_MEM_READ_WRITE);
      f.setImageType(CL_MEM_OBJECT_IMAGE2D);
    });
    auto image = [](uint64_t id, uint64_t init) {
      return [=](Req r) {
        auto c = r.initCreateImage();
        c.setId(id);
        c.setContext(kCtx);
        c.setFlags(CL_MEM_READ_WRITE);
        c.setChannelOrder(CL_RGBA);
        c.setChannelDataType(CL_UNORM_INT8);
        auto d = c.initDesc();
        d.setType(CL_MEM_OBJECT_IMAGE2D);
        d.setWidth(16);
        d.setHeight(16);
        c.setInitialData(init);
      };
    };
    q.Bulk(100, 16 * 16 * 4).Add(true, image(60, 100)).Add(true, image(61, 0));
    q.Add(true, [](Req r) {
      auto c = r.initCreateSampler();
      c.setId(50);
      c.setContext(kCtx);
      c.setNormalizedCoords(false);
      c.setAddressingMode(CL_ADDRESS_CLAMP_TO_EDGE);
      c.setFilterMode(CL_FILTER_NEAREST);
    });
    q.Buffer(10, 1024).Source(20, 2).Build(20, 0).Kernel(30, 20, "sampled");
    q.Enqueue(false, kQueue, 40, false, {}, [](Enq e) {
      NdRange(e, 30, {4, 4}, {}, {}, 3, [](auto a) {
        a[0].setMem(10);
        a[1].setSampler(50);
        int32_t k = 3;
        Value(a[2], &k, sizeof(k));
      });
    });
    q.Enqueue(true, kQueue, 41, false, {}, [](Enq e) {
      auto r = e.initReadImage();
      r.setMem(60);
      List(r.initOrigin(3), {0, 0, 0});
      List(r.initRegion(3), {16, 16, 1});
    });
    q.Bulk(101, 4 * 4 * 4);
    q.Enqueue(false, kQueue, 42, false, {}, [](Enq e) {
      auto w = e.initWriteImage();
      w.setMem(60);
      List(w.initOrigin(3), {2, 2, 0});
      List(w.initRegion(3), {4, 4, 1});
      w.setBulk(101);
    });
    q.Enqueue(false, kQueue, 43, false, {}, [](Enq e) {
      auto f = e.initFillImage();
      f.setMem(61);
      float color[4] = {0.5f, 0.25f, 1.0f, 1.0f};
      f.setColor(kj::arrayPtr(reinterpret_cast<const kj::byte*>(color), sizeof(color)));
      List(f.initOrigin(3), {0, 0, 0});
      List(f.initRegion(3), {8, 8, 1});
    });
    q.Enqueue(false, kQueue, 44, false, {}, [](Enq e) {
      auto c = e.initCopyImage();
      c.setSrc(60);
      c.setDst(61);
      List(c.initSrcOrigin(3), {0, 0, 0});
      List(c.initDstOrigin(3), {8, 8, 0});
      List(c.initRegion(3), {8, 8, 1});
    });
    q.Enqueue(false, kQueue, 45, false, {}, [](Enq e) {
      auto c = e.initCopyImageToBuffer();
      c.setImage(61);
      c.setBuffer(10);
      List(c.initOrigin(3), {0, 0, 0});
      List(c.initRegion(3), {16, 16, 1});
      c.setOffset(0);
    });
    q.Enqueue(false, kQueue, 46, false, {}, [](Enq e) {
      auto c = e.initCopyBufferToImage();
      c.setImage(60);
      c.setBuffer(10);
      List(c.initOrigin(3), {4, 4, 0});
      List(c.initRegion(3), {4, 4, 1});
      c.setOffset(64);
    });
    q.Info(K::MEM, 60, CL_IMAGE_WIDTH).Info(K::MEM, 60, CL_MEM_SIZE).Finish(kQueue);
    q.Release(K::SAMPLER, 50).Release(K::MEM, 60).Release(K::MEM, 61);
    s.push_back({"image-sampler", q});
  }

  // Image regions whose end wraps around (origin + region past 2^64), which a backend checking
  // the end against the image's size would let through, and a buffer offset likewise.
  {
    Seed q;
    q.Context().Queue(kQueue, 0).Buffer(10, 1024);
    auto image = [](uint64_t id) {
      return [=](Req r) {
        auto c = r.initCreateImage();
        c.setId(id);
        c.setContext(kCtx);
        c.setFlags(CL_MEM_READ_WRITE);
        c.setChannelOrder(CL_RGBA);
        c.setChannelDataType(CL_UNORM_INT8);
        auto d = c.initDesc();
        d.setType(CL_MEM_OBJECT_IMAGE2D);
        d.setWidth(16);
        d.setHeight(16);
      };
    };
    q.Add(true, image(60)).Add(true, image(61)).Bulk(100, 4 * 4 * 4);
    const uint64_t wrap = ~uint64_t{0} - 2;  // + 4 wraps to 1
    q.Enqueue(false, kQueue, 40, false, {}, [=](Enq e) {
      auto w = e.initWriteImage();
      w.setMem(60);
      List(w.initOrigin(3), {2, wrap, 0});
      List(w.initRegion(3), {4, 4, 1});
      w.setBulk(100);
    });
    q.Enqueue(true, kQueue, 41, false, {}, [=](Enq e) {
      auto rd = e.initReadImage();
      rd.setMem(60);
      List(rd.initOrigin(3), {wrap, 0, 0});
      List(rd.initRegion(3), {4, 4, 1});
    });
    q.Enqueue(false, kQueue, 42, false, {}, [=](Enq e) {
      auto f = e.initFillImage();
      f.setMem(61);
      uint8_t color[16] = {};
      f.setColor(kj::arrayPtr(color, sizeof(color)));
      List(f.initOrigin(3), {0, wrap, 0});
      List(f.initRegion(3), {8, 8, 1});
    });
    q.Enqueue(false, kQueue, 43, false, {}, [=](Enq e) {
      auto c = e.initCopyImage();
      c.setSrc(60);
      c.setDst(61);
      List(c.initSrcOrigin(3), {0, 0, 0});
      List(c.initDstOrigin(3), {wrap, 0, 0});
      List(c.initRegion(3), {4, 4, 1});
    });
    q.Enqueue(false, kQueue, 44, false, {}, [=](Enq e) {
      auto c = e.initCopyImageToBuffer();
      c.setImage(60);
      c.setBuffer(10);
      List(c.initOrigin(3), {0, 0, 0});
      List(c.initRegion(3), {4, 4, 1});
      c.setOffset(~uint64_t{0} - 8);
    });
    q.Enqueue(false, kQueue, 45, false, {}, [=](Enq e) {
      auto c = e.initCopyBufferToImage();
      c.setImage(61);
      c.setBuffer(10);
      List(c.initOrigin(3), {0, wrap, 0});
      List(c.initRegion(3), {4, 4, 1});
      c.setOffset(0);
    });
    q.Finish(kQueue);
    s.push_back({"image-wrapped-regions", q});
  }

  // compileProgram with an embedded header, linkProgram, a kernel of the linked program; then
// what the session must refuse: a binary program as a header, building a linked program, and
// linking a program whose compile failed.
  {
    Seed q;
    q.Context().Queue(kQueue, 0).Buffer(10, 8).Source(21, 5).Source(20, 4);
    q.Add(true, [](Req r) {
      auto c = r.initCompileProgram();
      c.setProgram(20);
      c.setOptions("");
      List(c.initHeaders(1), {21});
      c.initHeaderNames(1).set(0, std::string(in::kHeaderNames[0]));
    });
    q.Add(true, [](Req r) {
      auto l = r.initLinkProgram();
      l.setId(22);
      l.setContext(kCtx);
      l.setOptions("");
      List(l.initInputs(1), {20});
    });
    q.Info(K::PROGRAM, 22, CL_PROGRAM_BUILD_LOG, true);
    q.Info(K::PROGRAM, 22, CL_PROGRAM_KERNEL_NAMES);
    q.Kernel(30, 22, "inc");
    q.Enqueue(false, kQueue, 40, false, {}, [](Enq e) {
      NdRange(e, 30, {8}, {}, {}, 1, [](auto a) { a[0].setMem(10); });
    });
    q.Read(kQueue, 41, 10, 0, 8).Finish(kQueue);
    // A header must be a program from source: one from a binary has none.
    q.Add(true, [](Req r) {
      auto p = r.initCreateProgramWithBinary();
      p.setId(23);
      p.setContext(kCtx);
      p.initDevices(1).set(0, 0);
      uint8_t b[1] = {0};
      p.initBinaries(1).set(0, kj::arrayPtr(b, 1));
    });
    q.Add(true, [](Req r) {
      auto c = r.initCompileProgram();
      c.setProgram(20);
      List(c.initHeaders(1), {23});
      c.initHeaderNames(1).set(0, std::string(in::kHeaderNames[0]));
    });
    // A linked program is not built again (its binaries read first), and a program whose
    // compile failed (no header this time) is not linked.
    q.Info(K::PROGRAM, 22, CL_PROGRAM_BINARY_SIZES).Info(K::PROGRAM, 22, CL_PROGRAM_BINARIES);
    q.Build(22, 0);
    q.Add(true, [](Req r) {
      auto c = r.initCompileProgram();
      c.setProgram(20);
    });
    q.Add(true, [](Req r) {
      auto l = r.initLinkProgram();
      l.setId(24);
      l.setContext(kCtx);
      List(l.initInputs(1), {20});
    });
    s.push_back({"compile-link", q});
  }

  // Programs from binaries (the harness puts in real ones: byte 0 and 3 pick the binaries of
  // sources 0 and 3), their binaries queried back, a launch with a required work-group size.
  {
    Seed q;
    q.Context().Queue(kQueue, 0).Buffer(10, 8);
    auto binary = [](uint64_t id, uint8_t pick) {
      return [=](Req r) {
        auto p = r.initCreateProgramWithBinary();
        p.setId(id);
        p.setContext(kCtx);
        p.initDevices(1).set(0, 0);
        uint8_t b[1] = {pick};
        p.initBinaries(1).set(0, kj::arrayPtr(b, 1));
      };
    };
    q.Add(true, binary(20, 0)).Build(20, 0).Add(true, binary(21, 3)).Build(21, 0);
    q.Info(K::PROGRAM, 20, CL_PROGRAM_BINARY_SIZES).Info(K::PROGRAM, 20, CL_PROGRAM_BINARIES);
    q.Kernel(30, 20, "add").Kernel(31, 21, "fixed").Kernel(32, 21, "nop");
    q.Info(K::KERNEL, 31, CL_KERNEL_COMPILE_WORK_GROUP_SIZE, true);
    q.Enqueue(false, kQueue, 40, false, {}, [](Enq e) {
      NdRange(e, 30, {16}, {4}, {}, 2, [](auto a) {
        a[0].setMem(10);
        int32_t k = 2;
        Value(a[1], &k, sizeof(k));
      });
    });
    q.Enqueue(false, kQueue, 41, false, {}, [](Enq e) {
      NdRange(e, 31, {8}, {4}, {}, 3, [](auto a) {
        a[0].setMem(10);
        int32_t x = 7;
        Value(a[1], &x, sizeof(x));
        float v[4] = {1, 2, 3, 4};
        Value(a[2], v, sizeof(v));
      });
    });
    q.Enqueue(false, kQueue, 42, false, {}, [](Enq e) {
      NdRange(e, 32, {1}, {}, {}, 0, [](auto) {});
    });
    q.Read(kQueue, 43, 10, 0, 8).Finish(kQueue);
    s.push_back({"program-binary", q});
  }

  // User events: commands held behind one until it is set, and behind one set to an error.
  {
    Seed q;
    q.Context().Queue(kQueue, 0).Buffer(10, 64);
    q.Add(true, [](Req r) {
      auto u = r.initCreateUserEvent();
      u.setId(45);
      u.setContext(kCtx);
    });
    q.Enqueue(false, kQueue, 40, true, {45}, [](Enq e) { e.setMarker(); });
    q.Enqueue(false, kQueue, 41, true, {40}, [](Enq e) {
      auto f = e.initFillBuffer();
      f.setMem(10);
      uint8_t p = 7;
      f.setPattern(kj::arrayPtr(&p, 1));
      f.setSize(64);
    });
    q.Info(K::EVENT, 41, CL_EVENT_COMMAND_EXECUTION_STATUS);
    q.Add(false, [](Req r) {
      auto st = r.initSetUserEventStatus();
      st.setId(45);
      st.setStatus(CL_COMPLETE);
    });
    q.Add(true, [](Req r) { List(r.initWaitEvents(2), {40, 41}); });
    q.Add(true, [](Req r) {
      auto u = r.initCreateUserEvent();
      u.setId(46);
      u.setContext(kCtx);
    });
    q.Bulk(100, 8);
    q.Enqueue(false, kQueue, 42, true, {46}, [](Enq e) {
      auto w = e.initWriteBuffer();
      w.setMem(10);
      w.setSize(8);
      w.setBulk(100);
    });
    q.Add(false, [](Req r) {
      auto st = r.initSetUserEventStatus();
      st.setId(46);
      st.setStatus(-1);
    });
    q.Add(true, [](Req r) { List(r.initWaitEvents(1), {42}); });
    q.Read(kQueue, 43, 10, 0, 64).Finish(kQueue).Release(K::EVENT, 45).Release(K::EVENT, 46);
    s.push_back({"user-events", q});
  }

  // Shared memory: a bulk upload from a sealed memfd, a read into one (the same memfd again),
  // shmForget, and an unsealed memfd the session must refuse.
  {
    Seed q;
    q.Context().Queue(kQueue, 0).Buffer(10, 4096);
    q.Add(
        false,
        [](Req r) {
          auto b = r.initBulkBegin();
          b.setToken(100);
          b.setSize(4096);
          b.setShm(true);
        },
        in::MemfdFlags(1, true));
    q.Enqueue(true, kQueue, 40, false, {}, [](Enq e) {
      auto w = e.initWriteBuffer();
      w.setMem(10);
      w.setSize(4096);
      w.setBulk(100);
    });
    q.Enqueue(
        true, kQueue, 41, false, {},
        [](Enq e) {
          auto rd = e.initReadBuffer();
          rd.setMem(10);
          rd.setOffset(1024);
          rd.setSize(2048);
          rd.setShm(true);
        },
        static_cast<uint8_t>(in::MemfdFlags(1, true) | in::kReuseMemfd));
    q.Add(false, [](Req r) { r.setShmForget(1); });
    q.Add(
        false,
        [](Req r) {
          auto b = r.initBulkBegin();
          b.setToken(101);
          b.setSize(4096);
          b.setShm(true);
        },
        in::MemfdFlags(1, false));
    q.Finish(kQueue);
    s.push_back({"shared-memory", q});
  }

  // Rectangular writes, reads and copies, and a sub-buffer.
  {
    Seed q;
    q.Context().Queue(kQueue, 0).Buffer(10, 1024).Buffer(11, 1024);
    auto rect = [](wire::Rect::Builder r) {
      List(r.initBufferOrigin(3), {4, 2, 0});
      List(r.initHostOrigin(3), {0, 0, 0});
      List(r.initRegion(3), {8, 4, 1});
      r.setBufferRowPitch(64);
      r.setHostRowPitch(8);
    };
    q.Bulk(100, 32);
    q.Enqueue(false, kQueue, 40, false, {}, [&](Enq e) {
      auto w = e.initWriteBuffer();
      w.setMem(10);
      w.setBulk(100);
      w.setIsRect(true);
      rect(w.initRect());
    });
    q.Enqueue(true, kQueue, 41, false, {}, [&](Enq e) {
      auto rd = e.initReadBuffer();
      rd.setMem(10);
      rd.setIsRect(true);
      rect(rd.initRect());
    });
    q.Enqueue(false, kQueue, 42, false, {}, [&](Enq e) {
      auto c = e.initCopyBuffer();
      c.setSrc(10);
      c.setDst(11);
      c.setIsRect(true);
      rect(c.initRect());
    });
    q.Add(true, [](Req r) {
      auto c = r.initCreateSubBuffer();
      c.setId(12);
      c.setParent(11);
      c.setFlags(CL_MEM_READ_WRITE);
      c.setOrigin(256);
      c.setSize(256);
    });
    q.Info(K::MEM, 12, CL_MEM_OFFSET).Read(kQueue, 43, 12, 0, 256).Finish(kQueue);
    s.push_back({"rect-subbuffer", q});
  }

  // Queries and requests the session answers with an error (or ends on: hello comes last), and
  // an empty bulk transfer filled by an empty chunk.
  {
    Seed q;
    q.Add(false, [](Req r) {
      auto b = r.initBulkBegin();
      b.setToken(7);
      b.setSize(0);
    });
    q.Add(true, [](Req r) {
      auto d = r.initBulkData();
      d.setToken(7);
      d.setOffset(0);
    });
    q.Info(K::PLATFORM, 0, CL_PLATFORM_NAME).Info(K::DEVICE, 0, CL_DEVICE_NAME);
    q.Info(K::DEVICE, 0, CL_DEVICE_PLATFORM).Info(K::DEVICE, 7, CL_DEVICE_NAME);
    q.Add(true, [](Req r) { r.setStats(); });
    q.Context().Info(K::CONTEXT, kCtx, CL_CONTEXT_NUM_DEVICES).Info(K::QUEUE, kQueue, 0);
    q.Queue(kQueue, 0xff).Buffer(10, 0).Release(K::MEM, 99);
    q.Add(true, [](Req r) {
      auto d = r.initBulkData();
      d.setToken(5);
      d.setOffset(8);
    });
    q.Enqueue(true, 9, 40, true, {}, [](Enq e) { e.setMarker(); });
    q.Queue(kQueue, 0).Enqueue(true, kQueue, 41, true, {77}, [](Enq e) { e.setMarker(); });
    q.Enqueue(true, kQueue, 42, true, {}, [](Enq e) {
      NdRange(e, 30, {4}, {}, {}, 0, [](auto) {});
    });
    q.Add(true, [](Req r) { List(r.initWaitEvents(1), {41}); });
    q.Add(true, [](Req r) {
      auto h = r.initHello();
      h.setProtocolVersion(gmux::proto::kProtocolVersion);
      h.setClientName("again");
    });
    s.push_back({"errors", q});
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUTDIR\n", argv[0]);
    return 2;
  }
  for (const Named& n : Seeds()) {
    std::string path = std::string(argv[1]) + "/" + n.name;
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(n.seed.bytes().data()),
              static_cast<std::streamsize>(n.seed.bytes().size()));
    if (!out) {
      std::fprintf(stderr, "cannot write %s\n", path.c_str());
      return 1;
    }
  }
  return 0;
}
