// Writes the seed corpus of frame_fuzz: one file per frame, each a small, valid, encoded gmux
// Request or Reply of the kind a real session sends (hello, getInfo, object creation, bulk data,
// every enqueue shape, the replies the ICD reads), plus one Request spread over several segments.
//
//   frame_corpus_gen OUTDIR    (fuzz/corpus/frame/ is its output, checked in)
//
// Regenerate the checked-in seeds after a schema change; docs/testing.md says how.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "proto/frame.h"

namespace {

using gmux::proto::EncodeFrame;
using gmux::proto::FrameKind;
namespace wire = gmux::proto::wire;

struct Seed {
  const char* name;
  FrameKind kind;
  std::function<void(capnp::MessageBuilder&)> build;
  uint32_t first_segment_words = capnp::SUGGESTED_FIRST_SEGMENT_WORDS;
};

void Region(capnp::List<uint64_t>::Builder list, uint64_t a, uint64_t b, uint64_t c) {
  list.set(0, a);
  list.set(1, b);
  list.set(2, c);
}

void NdRange(capnp::MessageBuilder& b) {
  auto req = b.initRoot<wire::Request>();
  req.setSeq(7);
  auto e = req.initEnqueue();
  e.setQueue(3);
  e.setEvent(9);
  e.setKeepEvent(true);
  auto wait = e.initWaitList(2);
  wait.set(0, 4);
  wait.set(1, 5);
  auto nd = e.initNdrange();
  nd.setKernel(11);
  nd.setWorkDim(2);
  nd.initGlobalOffset(2).set(0, 16);
  auto global = nd.initGlobalSize(2);
  global.set(0, 1024);
  global.set(1, 64);
  auto local = nd.initLocalSize(2);
  local.set(0, 64);
  local.set(1, 1);
  auto args = nd.initArgs(5);
  args[0].setMem(12);
  uint8_t value[4] = {1, 2, 3, 4};
  args[1].setValue(kj::arrayPtr(value, 4));
  args[2].setNullMem();
  args[3].setLocal(256);
  args[4].setSampler(13);
}

std::vector<Seed> Seeds() {
  std::vector<Seed> s;
  auto request = [&s](const char* name, std::function<void(wire::Request::Builder)> fill) {
    s.push_back({name, FrameKind::kRequest, [fill](capnp::MessageBuilder& b) {
                   auto req = b.initRoot<wire::Request>();
                   req.setSeq(1);
                   fill(req);
                 }});
  };
  auto reply = [&s](const char* name, std::function<void(wire::Reply::Builder)> fill) {
    s.push_back({name, FrameKind::kReply, [fill](capnp::MessageBuilder& b) {
                   auto rep = b.initRoot<wire::Reply>();
                   rep.setSeq(1);
                   fill(rep);
                 }});
  };

  request("request-hello", [](auto r) {
    auto h = r.initHello();
    h.setProtocolVersion(gmux::proto::kProtocolVersion);
    h.setClientName("clinfo");
    h.setPid(4242);
  });
  request("request-hello-token", [](auto r) {
    auto h = r.initHello();
    h.setProtocolVersion(gmux::proto::kProtocolVersion);
    h.setClientName("tenant");
    h.setToken("test-token-7f3a");
  });
  request("request-get-info-device", [](auto r) {
    auto g = r.initGetInfo();
    g.setKind(wire::ObjectKind::DEVICE);
    g.setId(0);
    g.setParam(0x102B);  // CL_DEVICE_NAME
  });
  request("request-get-info-kernel-arg", [](auto r) {
    auto g = r.initGetInfo();
    g.setKind(wire::ObjectKind::KERNEL);
    g.setId(11);
    g.setParam(0x1196);  // CL_KERNEL_ARG_ADDRESS_QUALIFIER
    g.setArgIndex(1);
    g.setDevice(0);
    g.setHasDevice(true);
  });
  request("request-create-context", [](auto r) {
    auto c = r.initCreateContext();
    c.setId(2);
    c.initDevices(1).set(0, 0);
  });
  request("request-create-queue", [](auto r) {
    auto q = r.initCreateQueue();
    q.setId(3);
    q.setContext(2);
    q.setProperties(1);  // CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE
  });
  request("request-create-buffer", [](auto r) {
    auto c = r.initCreateBuffer();
    c.setId(12);
    c.setContext(2);
    c.setFlags(1);  // CL_MEM_READ_WRITE
    c.setSize(4096);
    c.setInitialData(100);
  });
  request("request-create-sub-buffer", [](auto r) {
    auto c = r.initCreateSubBuffer();
    c.setId(14);
    c.setParent(12);
    c.setOrigin(1024);
    c.setSize(1024);
  });
  request("request-bulk-begin", [](auto r) {
    auto b = r.initBulkBegin();
    b.setToken(100);
    b.setSize(64);
  });
  request("request-bulk-data", [](auto r) {
    auto b = r.initBulkData();
    b.setToken(100);
    b.setOffset(0);
    uint8_t data[64];
    for (int i = 0; i < 64; ++i) data[i] = static_cast<uint8_t>(i);
    b.setData(kj::arrayPtr(data, sizeof(data)));
  });
  request("request-create-program-source", [](auto r) {
    auto p = r.initCreateProgramWithSource();
    p.setId(5);
    p.setContext(2);
    p.setSource("__kernel void add(__global int* a, int k) { a[get_global_id(0)] += k; }");
  });
  request("request-create-program-binary", [](auto r) {
    auto p = r.initCreateProgramWithBinary();
    p.setId(6);
    p.setContext(2);
    p.initDevices(1).set(0, 0);
    uint8_t bin[16] = {0x7f, 'E', 'L', 'F'};
    p.initBinaries(1).set(0, kj::arrayPtr(bin, sizeof(bin)));
  });
  request("request-build-program", [](auto r) {
    auto p = r.initBuildProgram();
    p.setProgram(5);
    p.setOptions("-cl-std=CL1.2");
  });
  request("request-compile-program", [](auto r) {
    auto p = r.initCompileProgram();
    p.setProgram(5);
    p.initDevices(1).set(0, 0);
    p.setOptions("-DN=4");
    p.initHeaders(1).set(0, 7);
    p.initHeaderNames(1).set(0, "common.h");
  });
  request("request-link-program", [](auto r) {
    auto p = r.initLinkProgram();
    p.setId(8);
    p.setContext(2);
    auto in = p.initInputs(2);
    in.set(0, 5);
    in.set(1, 6);
  });
  request("request-create-kernel", [](auto r) {
    auto k = r.initCreateKernel();
    k.setId(11);
    k.setProgram(5);
    k.setName("add");
  });
  request("request-user-event", [](auto r) {
    auto e = r.initCreateUserEvent();
    e.setId(20);
    e.setContext(2);
  });
  request("request-set-user-event-status", [](auto r) {
    auto e = r.initSetUserEventStatus();
    e.setId(20);
    e.setStatus(0);
  });
  request("request-write-buffer-rect", [](auto r) {
    auto e = r.initEnqueue();
    e.setQueue(3);
    e.setEvent(21);
    auto w = e.initWriteBuffer();
    w.setMem(12);
    w.setSize(256);
    w.setBulk(101);
    w.setIsRect(true);
    auto rect = w.initRect();
    Region(rect.initBufferOrigin(3), 4, 2, 0);
    Region(rect.initHostOrigin(3), 0, 0, 0);
    Region(rect.initRegion(3), 16, 4, 1);
    rect.setBufferRowPitch(64);
    rect.setHostRowPitch(16);
  });
  request("request-read-buffer-shm", [](auto r) {
    auto e = r.initEnqueue();
    e.setQueue(3);
    e.setEvent(22);
    e.initWaitList(1).set(0, 21);
    auto rd = e.initReadBuffer();
    rd.setMem(12);
    rd.setSize(4096);
    rd.setShm(true);
  });
  request("request-copy-buffer", [](auto r) {
    auto e = r.initEnqueue();
    e.setQueue(3);
    e.setEvent(23);
    auto c = e.initCopyBuffer();
    c.setSrc(12);
    c.setDst(14);
    c.setSize(512);
  });
  request("request-fill-buffer", [](auto r) {
    auto e = r.initEnqueue();
    e.setQueue(3);
    e.setEvent(24);
    auto f = e.initFillBuffer();
    f.setMem(12);
    uint8_t pattern[4] = {0xde, 0xad, 0xbe, 0xef};
    f.setPattern(kj::arrayPtr(pattern, sizeof(pattern)));
    f.setSize(4096);
  });
  request("request-marker", [](auto r) {
    auto e = r.initEnqueue();
    e.setQueue(3);
    e.setEvent(25);
    e.setMarker();
  });
  request("request-create-image", [](auto r) {
    auto c = r.initCreateImage();
    c.setId(30);
    c.setContext(2);
    c.setChannelOrder(0x10B5);     // CL_RGBA
    c.setChannelDataType(0x10D2);  // CL_UNORM_INT8
    auto d = c.initDesc();
    d.setType(0x10F1);  // CL_MEM_OBJECT_IMAGE2D
    d.setWidth(64);
    d.setHeight(32);
  });
  request("request-fill-image", [](auto r) {
    auto e = r.initEnqueue();
    e.setQueue(3);
    e.setEvent(26);
    auto f = e.initFillImage();
    f.setMem(30);
    uint8_t color[16] = {};
    f.setColor(kj::arrayPtr(color, sizeof(color)));
    Region(f.initOrigin(3), 0, 0, 0);
    Region(f.initRegion(3), 64, 32, 1);
  });
  request("request-create-sampler", [](auto r) {
    auto c = r.initCreateSampler();
    c.setId(13);
    c.setContext(2);
    c.setAddressingMode(0x1131);  // CL_ADDRESS_CLAMP_TO_EDGE
    c.setFilterMode(0x1140);      // CL_FILTER_NEAREST
  });
  request("request-finish", [](auto r) { r.setFinish(3); });
  request("request-wait-events", [](auto r) {
    auto w = r.initWaitEvents(2);
    w.set(0, 9);
    w.set(1, 22);
  });
  request("request-stats", [](auto r) { r.setStats(); });
  request("request-release", [](auto r) {
    auto rel = r.initRelease();
    rel.setKind(wire::ObjectKind::MEM);
    rel.setId(12);
  });
  request("request-shm-forget", [](auto r) { r.setShmForget(123456); });
  s.push_back({"request-enqueue-ndrange", FrameKind::kRequest, NdRange});
  // The same launch with a tiny fixed first segment: a multi-segment message with far pointers.
  s.push_back({"request-enqueue-ndrange-segments", FrameKind::kRequest, NdRange, 4});

  reply("reply-hello", [](auto r) {
    auto h = r.initHello();
    h.setProtocolVersion(gmux::proto::kProtocolVersion);
    h.setTenant("default");
    h.setSession(1);
    auto d = h.initDevices(1);
    d[0].setIndex(0);
    d[0].setName("cpu-haswell");
    d[0].setType(2);  // CL_DEVICE_TYPE_CPU
  });
  reply("reply-info", [](auto r) {
    uint8_t info[8] = {0, 0, 0, 1};
    r.setInfo(kj::arrayPtr(info, sizeof(info)));
  });
  reply("reply-error", [](auto r) {
    r.setStatus(-38);  // CL_INVALID_MEM_OBJECT
    r.setMessage("unknown mem 12");
    r.setNone();
  });
  reply("reply-kernel", [](auto r) {
    auto k = r.initKernel();
    k.setNumArgs(2);
    auto q = k.initArgAddressQualifiers(2);
    q.set(0, 0x119B);  // CL_KERNEL_ARG_ADDRESS_GLOBAL
    q.set(1, 0x119E);  // CL_KERNEL_ARG_ADDRESS_PRIVATE
  });
  reply("reply-read-data", [](auto r) {
    auto d = r.initReadData();
    uint8_t data[32] = {1, 2, 3};
    d.setData(kj::arrayPtr(data, sizeof(data)));
    d.setLast(true);
  });
  reply("reply-binary-status", [](auto r) { r.initBinaryStatus(1).set(0, 0); });
  reply("reply-stats", [](auto r) {
    auto st = r.initStats();
    st.setSessions(2);
    st.setScheduler("{\"devices\":[]}");
  });
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUTDIR\n", argv[0]);
    return 2;
  }
  for (const Seed& seed : Seeds()) {
    capnp::MallocMessageBuilder builder(seed.first_segment_words,
                                        seed.first_segment_words < 64
                                            ? capnp::AllocationStrategy::FIXED_SIZE
                                            : capnp::AllocationStrategy::GROW_HEURISTICALLY);
    seed.build(builder);
    auto bytes = EncodeFrame(seed.kind, builder);
    if (!bytes.ok()) {
      std::fprintf(stderr, "%s: %s\n", seed.name, bytes.status().ToString().c_str());
      return 1;
    }
    std::string path = std::string(argv[1]) + "/" + seed.name;
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(bytes->data()),
              static_cast<std::streamsize>(bytes->size()));
    if (!out) {
      std::fprintf(stderr, "cannot write %s\n", path.c_str());
      return 1;
    }
  }
  // Data frames (kind 3): an odd length with the last flag, and an empty one.
  for (uint32_t length : {13u, 0u}) {
    const size_t padded = (length + 7) / 8 * 8;
    std::vector<uint8_t> f(gmux::proto::kHeaderBytes + gmux::proto::kDataPrefixBytes + padded, 0);
    gmux::proto::EncodeHeader({gmux::proto::kProtocolVersion, gmux::proto::FrameKind::kData,
                               static_cast<uint32_t>(gmux::proto::kDataPrefixBytes + padded)},
                              f.data());
    uint8_t* p = f.data() + gmux::proto::kHeaderBytes;
    const uint64_t id = 5, offset = 64;
    const uint32_t flags = length != 0 ? 1 : 0;
    std::memcpy(p, &id, 8);  // little-endian hosts, as the frame's fields
    std::memcpy(p + 8, &offset, 8);
    std::memcpy(p + 16, &length, 4);
    std::memcpy(p + 20, &flags, 4);
    for (uint32_t i = 0; i < length; ++i) p[gmux::proto::kDataPrefixBytes + i] = uint8_t(i * 3);
    std::string path = std::string(argv[1]) + (length != 0 ? "/data-frame" : "/data-frame-empty");
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(f.data()), static_cast<std::streamsize>(f.size()));
    if (!out) {
      std::fprintf(stderr, "cannot write %s\n", path.c_str());
      return 1;
    }
  }
  return 0;
}
