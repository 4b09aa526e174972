// gmuxd's server against raw protocol clients: handshake, version mismatch, malformed frames,
// unknown and foreign ids, absurd sizes, clients dying mid-transfer (nothing leaks), and the
// daemon keeps serving the others throughout.
#include "daemon/server.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "proto/event_profile.h"
#include "proto/shm_ring.h"

namespace gmux::daemon {
namespace {

namespace wire = proto::wire;

class RawClient {
 public:
  explicit RawClient(const std::string& path) {
    fd_ = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, path.c_str(), sizeof(a.sun_path) - 1);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
    timeval tv{20, 0};  // a broken daemon fails the test instead of hanging it
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  }
  // A TCP client of 127.0.0.1:port.
  explicit RawClient(uint16_t port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
    timeval tv{20, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  }
  ~RawClient() { Close(); }

  // Sends hello with `token` and returns the reply's status; `tenant` receives the tenant name.
  int32_t HelloWithToken(const std::string& token, std::string* tenant, std::string* message) {
    capnp::MallocMessageBuilder b;
    auto r = b.initRoot<wire::Request>();
    r.setSeq(1);
    auto h = r.initHello();
    h.setProtocolVersion(proto::kProtocolVersion);
    h.setToken(token);
    if (!Send(b).ok()) return INT32_MIN;
    auto m = Read();
    if (!m.ok()) return INT32_MIN;
    auto rep = m->root<wire::Reply>();
    if (rep.isHello()) *tenant = rep.getHello().getTenant();
    *message = rep.getMessage();
    return rep.getStatus();
  }
  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  bool connected() const { return connected_; }
  int fd() const { return fd_; }

  Status Send(capnp::MallocMessageBuilder& b) {
    return proto::WriteFrame(proto::Outlet(fd_, requests_), proto::FrameKind::kRequest, b);
  }
  Result<proto::Message> Read() { return proto::ReadFrame(fd_, proto::FrameKind::kReply); }

  // Sends and returns the reply's status (or INT32_MIN when the connection failed).
  int32_t Call(capnp::MallocMessageBuilder& b, std::string* message = nullptr) {
    if (b.getRoot<wire::Request>().getSeq() == 0) b.getRoot<wire::Request>().setSeq(next_seq_++);
    if (!Send(b).ok()) return INT32_MIN;
    auto m = Read();
    if (!m.ok()) return INT32_MIN;
    auto r = m->root<wire::Reply>();
    if (message != nullptr) *message = r.getMessage();
    return r.getStatus();
  }

  // A hello that offers data frames: whether the worker takes them (false on any failure).
  bool HelloWithDataFrames() {
    capnp::MallocMessageBuilder b;
    auto r = b.initRoot<wire::Request>();
    r.setSeq(1);
    auto h = r.initHello();
    h.setProtocolVersion(proto::kProtocolVersion);
    h.setDataFrames(true);
    if (!Send(b).ok()) return false;
    auto m = Read();
    if (!m.ok() || !m->root<wire::Reply>().isHello()) return false;
    return m->root<wire::Reply>().getHello().getDataFrames();
  }

  // Asks for replies through the ring of `capacity` bytes on `memfd` (-1: none passed) and
  // returns the status of the answer, which comes on the socket.
  int32_t ReplyRing(int memfd, uint64_t capacity) {
    capnp::MallocMessageBuilder b;
    auto r = b.initRoot<wire::Request>();
    r.setSeq(next_seq_++);
    r.setReplyRing(capacity);
    if (!proto::WriteFrame(proto::Outlet(fd_, requests_), proto::FrameKind::kRequest, b, {},
                           memfd)
             .ok()) {
      return INT32_MIN;
    }
    auto m = Read();
    return m.ok() ? m->root<wire::Reply>().getStatus() : INT32_MIN;
  }
  // Asks for requests through `ring` (the producer's end of the ring on `memfd`, -1: none
  // passed) and returns the status of the answer; on success every later request goes
  // through the ring.
  int32_t RequestRing(int memfd, uint64_t capacity, proto::ShmRing* ring) {
    capnp::MallocMessageBuilder b;
    auto r = b.initRoot<wire::Request>();
    r.setSeq(next_seq_++);
    r.setRequestRing(capacity);
    if (!proto::WriteFrame(proto::Outlet(fd_, requests_), proto::FrameKind::kRequest, b, {},
                           memfd)
             .ok()) {
      return INT32_MIN;
    }
    auto m = Read();
    if (!m.ok()) return INT32_MIN;
    const int32_t status = m->root<wire::Reply>().getStatus();
    if (status == 0) requests_ = ring;
    return status;
  }
  uint64_t NextSeq() { return next_seq_++; }

  int32_t Hello(uint32_t version = proto::kProtocolVersion) {
    capnp::MallocMessageBuilder b;
    auto r = b.initRoot<wire::Request>();
    r.setSeq(1);
    r.initHello().setProtocolVersion(version);
    return Call(b);
  }

  int32_t CreateContext(uint64_t id) {
    capnp::MallocMessageBuilder b;
    auto c = b.initRoot<wire::Request>().initCreateContext();
    c.setId(id);
    c.initDevices(1).set(0, 0);
    return Call(b);
  }

  int32_t CreateBuffer(uint64_t id, uint64_t ctx, uint64_t size) {
    capnp::MallocMessageBuilder b;
    auto c = b.initRoot<wire::Request>().initCreateBuffer();
    c.setId(id);
    c.setContext(ctx);
    c.setSize(size);
    return Call(b);
  }

  // Bytes [offset, offset + n) of buffer `mem`, read on `queue` as command `event` and answered
  // in one ReadData reply (reads up to 64 KiB); empty, with a failure recorded, otherwise.
  std::vector<uint8_t> ReadBytes(uint64_t queue, uint64_t mem, uint64_t offset, uint64_t n,
                                 uint64_t event) {
    capnp::MallocMessageBuilder rd;
    auto r = rd.initRoot<wire::Request>();
    r.setSeq(next_seq_++);
    auto e = r.initEnqueue();
    e.setQueue(queue);
    e.setEvent(event);
    auto rb = e.initReadBuffer();
    rb.setMem(mem);
    rb.setOffset(offset);
    rb.setSize(n);
    std::vector<uint8_t> got;
    EXPECT_TRUE(Send(rd).ok());
    auto m = Read();
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    if (!m.ok()) return got;
    auto rep = m->root<wire::Reply>();
    EXPECT_EQ(rep.getStatus(), 0) << rep.getMessage().cStr();
    EXPECT_TRUE(rep.isReadData());
    if (rep.isReadData()) {
      auto data = rep.getReadData().getData();
      got.assign(data.begin(), data.end());
    }
    return got;
  }

  int32_t CreateQueue(uint64_t id, uint64_t ctx) {
    capnp::MallocMessageBuilder b;
    auto c = b.initRoot<wire::Request>().initCreateQueue();
    c.setId(id);
    c.setContext(ctx);
    c.setDevice(0);
    return Call(b);
  }

  int64_t LiveBackendObjects() {
    capnp::MallocMessageBuilder b;
    b.initRoot<wire::Request>().setStats();
    b.getRoot<wire::Request>().setSeq(next_seq_++);
    if (!Send(b).ok()) return -1;
    auto m = Read();
    if (!m.ok()) return -1;
    return m->root<wire::Reply>().getStats().getLiveBackendObjects();
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
  uint64_t next_seq_ = 2;
  proto::ShmRing* requests_ = nullptr;  // the ring requests go through (RequestRing)
};

class ServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/gmux-daemon-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    DaemonOptions o;
    o.socket_path = dir_ + "/gmuxd.sock";
    o.max_bulk_bytes_per_session = 256ull << 20;
    auto s = Server::Create(o);
    if (!s.ok() && s.status().code() != StatusCode::kInvalidArgument) {
      GTEST_SKIP() << "no OpenCL backend: " << s.status().ToString();
    }
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server_ = std::move(s).value();
    ASSERT_TRUE(server_->Start().ok());
  }
  void TearDown() override {
    if (server_) server_->Stop();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::string socket() const { return dir_ + "/gmuxd.sock"; }

  std::string dir_;
  std::unique_ptr<Server> server_;
};

TEST_F(ServerTest, HandshakeListsTheBackendDevices) {
  RawClient c(socket());
  ASSERT_TRUE(c.connected());
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire::Request>();
  r.setSeq(1);
  r.initHello().setProtocolVersion(proto::kProtocolVersion);
  ASSERT_TRUE(c.Send(b).ok());
  auto m = c.Read();
  ASSERT_TRUE(m.ok());
  auto rep = m->root<wire::Reply>();
  EXPECT_EQ(rep.getStatus(), 0);
  ASSERT_TRUE(rep.isHello());
  EXPECT_EQ(rep.getHello().getDevices().size(), server_->backend().devices().size());
  EXPECT_EQ(std::string(rep.getHello().getTenant().cStr()), "uid-" + std::to_string(::getuid()));
}

TEST_F(ServerTest, WrongProtocolVersionGetsAClearError) {
  RawClient c(socket());
  EXPECT_EQ(c.Hello(99), CL_INVALID_OPERATION);
  // A frame header with another version is answered too, then the connection closes.
  RawClient d(socket());
  capnp::MallocMessageBuilder b;
  b.initRoot<wire::Request>().initHello().setProtocolVersion(proto::kProtocolVersion);
  auto bytes = proto::EncodeFrame(proto::FrameKind::kRequest, b);
  ASSERT_TRUE(bytes.ok());
  (*bytes)[4] = 7;
  ASSERT_EQ(::write(d.fd(), bytes->data(), bytes->size()), static_cast<ssize_t>(bytes->size()));
  auto m = d.Read();
  ASSERT_TRUE(m.ok());
  std::string msg = m->root<wire::Reply>().getMessage();
  EXPECT_NE(msg.find("version 7"), std::string::npos) << msg;
  EXPECT_FALSE(d.Read().ok());
}

TEST_F(ServerTest, MalformedFramesCloseOnlyTheOffender) {
  RawClient good(socket());
  ASSERT_EQ(good.Hello(), 0);
  for (int variant = 0; variant < 3; ++variant) {
    RawClient bad(socket());
    ASSERT_EQ(bad.Hello(), 0);
    std::vector<uint8_t> junk(64, 0xab);
    if (variant == 1) {
      // A valid header announcing more than the limit.
      uint8_t hdr[proto::kHeaderBytes];
      proto::EncodeHeader({proto::kProtocolVersion, proto::FrameKind::kRequest, 0xFFFFFF00u}, hdr);
      junk.assign(hdr, hdr + sizeof(hdr));
    } else if (variant == 2) {
      // A valid header followed by a payload that is not a message.
      uint8_t hdr[proto::kHeaderBytes];
      proto::EncodeHeader({proto::kProtocolVersion, proto::FrameKind::kRequest, 64}, hdr);
      junk.insert(junk.begin(), hdr, hdr + sizeof(hdr));
    }
    ASSERT_EQ(::write(bad.fd(), junk.data(), junk.size()), static_cast<ssize_t>(junk.size()));
    EXPECT_FALSE(bad.Read().ok()) << "variant " << variant;  // closed by the daemon
  }
  EXPECT_EQ(good.CreateContext(1), 0);
}

TEST_F(ServerTest, UnknownIdsAreErrors) {
  RawClient c(socket());
  ASSERT_EQ(c.Hello(), 0);
  EXPECT_EQ(c.CreateQueue(2, 12345), CL_INVALID_CONTEXT);
  EXPECT_EQ(c.CreateBuffer(3, 12345, 64), CL_INVALID_CONTEXT);
  capnp::MallocMessageBuilder b;
  auto e = b.initRoot<wire::Request>().initEnqueue();
  e.setQueue(777);
  e.setEvent(5);
  e.setMarker();
  EXPECT_EQ(c.Call(b), CL_INVALID_COMMAND_QUEUE);
  capnp::MallocMessageBuilder w;
  w.initRoot<wire::Request>().initWaitEvents(1).set(0, 4242);
  EXPECT_EQ(c.Call(w), CL_INVALID_EVENT);
  capnp::MallocMessageBuilder rel;
  auto r = rel.initRoot<wire::Request>().initRelease();
  r.setKind(wire::ObjectKind::MEM);
  r.setId(99);
  EXPECT_EQ(c.Call(rel), CL_INVALID_VALUE);
  EXPECT_EQ(c.CreateContext(1), 0);
  EXPECT_EQ(c.CreateContext(1), CL_INVALID_VALUE) << "an id in use";
}

// waitEventsProfiled (proto/event_profile.h): the answer carries each listed event's times, in
// order, the same as the event's GetInfo of every time at once; unknown or no ids are errors,
// as for waitEvents, and the session keeps serving.
TEST_F(ServerTest, AProfiledWaitCarriesTheEventsTimes) {
  RawClient c(socket());
  ASSERT_EQ(c.Hello(), 0);
  ASSERT_EQ(c.CreateContext(1), 0);
  ASSERT_EQ(c.CreateQueue(2, 1), 0);
  capnp::MallocMessageBuilder m;
  auto e = m.initRoot<wire::Request>().initEnqueue();
  e.setQueue(2);
  e.setEvent(5);
  e.setKeepEvent(true);
  e.setMarker();
  ASSERT_TRUE(c.Send(m).ok());
  capnp::MallocMessageBuilder w;
  auto req = w.initRoot<wire::Request>();
  req.setSeq(900);
  auto ids = req.initWaitEventsProfiled(2);
  ids.set(0, 5);
  ids.set(1, 5);
  ASSERT_TRUE(c.Send(w).ok());
  auto reply = c.Read();
  ASSERT_TRUE(reply.ok());
  auto r = reply->root<wire::Reply>();
  EXPECT_EQ(r.getSeq(), 900u);
  ASSERT_EQ(r.getStatus(), CL_SUCCESS) << r.getMessage().cStr();
  ASSERT_TRUE(r.isInfo());
  constexpr size_t kEach = proto::EventProfile::kWireBytes;
  const std::vector<uint8_t> got(r.getInfo().begin(), r.getInfo().end());
  ASSERT_EQ(got.size(), 2 * kEach);
  auto first = proto::EventProfile::Decode(got.data(), kEach);
  ASSERT_TRUE(first.has_value());
  EXPECT_TRUE(first->Has(CL_PROFILING_COMMAND_START));
  EXPECT_TRUE(first->Has(CL_PROFILING_COMMAND_END));
  EXPECT_LE(first->Get(CL_PROFILING_COMMAND_START), first->Get(CL_PROFILING_COMMAND_END));
  EXPECT_TRUE(std::equal(got.begin(), got.begin() + kEach, got.begin() + kEach));
  capnp::MallocMessageBuilder g;
  auto greq = g.initRoot<wire::Request>();
  greq.setSeq(901);
  auto gi = greq.initGetInfo();
  gi.setKind(wire::ObjectKind::EVENT);
  gi.setId(5);
  gi.setParam(proto::kProfilingAllParam);
  ASSERT_TRUE(c.Send(g).ok());
  auto info = c.Read();
  ASSERT_TRUE(info.ok());
  ASSERT_TRUE(info->root<wire::Reply>().isInfo());
  const auto one = info->root<wire::Reply>().getInfo();
  EXPECT_TRUE(one.size() == kEach && std::equal(one.begin(), one.end(), got.begin()));

  capnp::MallocMessageBuilder unknown;
  unknown.initRoot<wire::Request>().initWaitEventsProfiled(1).set(0, 4242);
  EXPECT_EQ(c.Call(unknown), CL_INVALID_EVENT);
  capnp::MallocMessageBuilder none;
  none.initRoot<wire::Request>().initWaitEventsProfiled(0);
  EXPECT_EQ(c.Call(none), CL_INVALID_VALUE);
  EXPECT_EQ(c.CreateContext(3), 0);
}

TEST_F(ServerTest, ASessionCannotNameAnotherSessionsObjects) {
  RawClient a(socket()), b(socket());
  ASSERT_EQ(a.Hello(), 0);
  ASSERT_EQ(b.Hello(), 0);
  ASSERT_EQ(a.CreateContext(10), 0);
  ASSERT_EQ(a.CreateBuffer(11, 10, 4096), 0);
  EXPECT_EQ(b.CreateQueue(12, 10), CL_INVALID_CONTEXT);
  capnp::MallocMessageBuilder rel;
  auto r = rel.initRoot<wire::Request>().initRelease();
  r.setKind(wire::ObjectKind::MEM);
  r.setId(11);
  EXPECT_EQ(b.Call(rel), CL_INVALID_VALUE);
  // The same ids are free in b's own table.
  EXPECT_EQ(b.CreateContext(10), 0);
  EXPECT_EQ(b.CreateBuffer(11, 10, 4096), 0);
  // And a's objects are intact.
  EXPECT_EQ(a.CreateQueue(13, 10), 0);
}

TEST_F(ServerTest, AbsurdSizesAreRefused) {
  RawClient c(socket());
  ASSERT_EQ(c.Hello(), 0);
  ASSERT_EQ(c.CreateContext(1), 0);
  EXPECT_NE(c.CreateBuffer(2, 1, 1ull << 62), 0);
  capnp::MallocMessageBuilder bb;
  auto begin = bb.initRoot<wire::Request>().initBulkBegin();
  begin.setToken(9);
  begin.setSize(1ull << 62);
  EXPECT_EQ(c.Call(bb), CL_OUT_OF_RESOURCES);
  // Bulk data outside its transfer.
  capnp::MallocMessageBuilder b2;
  auto b2b = b2.initRoot<wire::Request>().initBulkBegin();
  b2b.setToken(10);
  b2b.setSize(16);
  EXPECT_EQ(c.Call(b2), 0);
  capnp::MallocMessageBuilder b3;
  auto d = b3.initRoot<wire::Request>().initBulkData();
  d.setToken(10);
  d.setOffset(8);
  d.initData(16);
  EXPECT_EQ(c.Call(b3), CL_INVALID_VALUE);
  // A read beyond the buffer.
  ASSERT_EQ(c.CreateBuffer(3, 1, 64), 0);
  ASSERT_EQ(c.CreateQueue(4, 1), 0);
  capnp::MallocMessageBuilder rd;
  auto e = rd.initRoot<wire::Request>().initEnqueue();
  e.setQueue(4);
  e.setEvent(77);
  auto rb = e.initReadBuffer();
  rb.setMem(3);
  rb.setOffset(32);
  rb.setSize(~0ull - 16);
  EXPECT_EQ(c.Call(rd), CL_INVALID_VALUE);
  EXPECT_EQ(c.CreateContext(5), 0) << "the session still works";
}

// Bulk data as data frames (proto/frame.h): odd lengths fill a write, a read comes back as
// data frames to a client that offered to read them, and data frames naming an unknown token
// or out of their transfer's order are errors for their sender, whose session goes on.
TEST_F(ServerTest, DataFramesCarryTransfersAndMisplacedOnesAreErrors) {
  RawClient c(socket());
  ASSERT_TRUE(c.HelloWithDataFrames());
  ASSERT_EQ(c.CreateContext(1), 0);
  ASSERT_EQ(c.CreateQueue(2, 1), 0);
  ASSERT_EQ(c.CreateBuffer(3, 1, 200'000), 0);
  std::vector<uint8_t> data(40);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 7 + 1);
  capnp::MallocMessageBuilder bb;
  auto begin = bb.initRoot<wire::Request>().initBulkBegin();
  begin.setToken(10);
  begin.setSize(40);
  ASSERT_EQ(c.Call(bb), 0);
  ASSERT_TRUE(proto::WriteDataFrame(c.fd(), {10, 0, 13, false}, data.data()).ok());
  ASSERT_TRUE(proto::WriteDataFrame(c.fd(), {10, 13, 27, false}, data.data() + 13).ok());
  capnp::MallocMessageBuilder wr;
  auto we = wr.initRoot<wire::Request>().initEnqueue();
  we.setQueue(2);
  we.setEvent(20);
  auto wb = we.initWriteBuffer();
  wb.setMem(3);
  wb.setOffset(8);
  wb.setSize(40);
  wb.setBulk(10);
  ASSERT_TRUE(c.Send(wr).ok());  // seq 0: answered only on failure
  capnp::MallocMessageBuilder rd;
  auto re = rd.initRoot<wire::Request>();
  re.setSeq(30);
  auto ree = re.initEnqueue();
  ree.setQueue(2);
  ree.setEvent(21);
  auto rb = ree.initReadBuffer();
  rb.setMem(3);
  rb.setOffset(8);
  rb.setSize(100'000);  // above the size answered in one message
  ASSERT_TRUE(c.Send(rd).ok());

  struct Sink : proto::DataSink {
    uint8_t* Place(const proto::DataFrame& f) override {
      frames.push_back(f);
      return f.offset + f.bytes <= bytes.size() ? bytes.data() + f.offset : nullptr;
    }
    void Placed(const proto::DataFrame&, bool) override {}
    std::vector<proto::DataFrame> frames;
    std::vector<uint8_t> bytes = std::vector<uint8_t>(100'000);
  } sink;
  proto::FrameReader reader(c.fd(), proto::FrameKind::kReply, {});
  reader.SetDataSink(&sink);
  auto got = reader.NextOrData(nullptr);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_FALSE(got->has_value()) << "a reply instead of the data: status "
                                 << (*got)->root<wire::Reply>().getStatus();
  ASSERT_EQ(sink.frames.size(), 1u);
  EXPECT_EQ(sink.frames[0].id, 30u);
  EXPECT_EQ(sink.frames[0].bytes, 100'000u);
  EXPECT_TRUE(sink.frames[0].last);
  EXPECT_EQ(std::vector<uint8_t>(sink.bytes.begin(), sink.bytes.begin() + 40), data);

  // A data frame of a token never begun: an unasked error (seq 0).
  ASSERT_TRUE(proto::WriteDataFrame(c.fd(), {999, 0, 8, false}, data.data()).ok());
  auto unasked = reader.Next(nullptr);
  ASSERT_TRUE(unasked.ok()) << unasked.status().ToString();
  EXPECT_EQ(unasked->root<wire::Reply>().getSeq(), 0u);
  EXPECT_EQ(unasked->root<wire::Reply>().getStatus(), CL_INVALID_VALUE);
  EXPECT_NE(std::string(unasked->root<wire::Reply>().getMessage().cStr()).find("bulk token"),
            std::string::npos);
  // Out of order: the write naming the token is refused.
  capnp::MallocMessageBuilder b2;
  auto b2b = b2.initRoot<wire::Request>().initBulkBegin();
  b2b.setToken(11);
  b2b.setSize(16);
  ASSERT_TRUE(c.Send(b2).ok());
  ASSERT_TRUE(proto::WriteDataFrame(c.fd(), {11, 8, 8, false}, data.data()).ok());
  capnp::MallocMessageBuilder w2;
  auto w2r = w2.initRoot<wire::Request>();
  w2r.setSeq(31);
  auto w2e = w2r.initEnqueue();
  w2e.setQueue(2);
  w2e.setEvent(22);
  auto w2b = w2e.initWriteBuffer();
  w2b.setMem(3);
  w2b.setSize(16);
  w2b.setBulk(11);
  ASSERT_TRUE(c.Send(w2).ok());
  auto refused = reader.Next(nullptr);
  ASSERT_TRUE(refused.ok()) << refused.status().ToString();
  EXPECT_EQ(refused->root<wire::Reply>().getSeq(), 31u);
  EXPECT_EQ(refused->root<wire::Reply>().getStatus(), CL_INVALID_VALUE);
  // Refused for the misplaced chunk itself, not later for a transfer left short.
  EXPECT_NE(std::string(refused->root<wire::Reply>().getMessage().cStr()).find("out of order"),
            std::string::npos)
      << refused->root<wire::Reply>().getMessage().cStr();
  // The session still works.
  capnp::MallocMessageBuilder cc;
  auto ccr = cc.initRoot<wire::Request>();
  ccr.setSeq(32);
  auto ccc = ccr.initCreateContext();
  ccc.setId(5);
  ccc.initDevices(1).set(0, 0);
  ASSERT_TRUE(c.Send(cc).ok());
  auto ok = reader.Next(nullptr);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->root<wire::Reply>().getSeq(), 32u);
  EXPECT_EQ(ok->root<wire::Reply>().getStatus(), 0);
}

// Inline data announced for a plain write (BulkBegin.destMem) may be received straight into
// that buffer (docs/protocol.md, "Writes received in place"): it serves that write only, and an
// announcement naming what is not a buffer of the session's, or a range outside it, is staged
// as any other data.
TEST_F(ServerTest, DataAnnouncedForAWriteServesOnlyThatWrite) {
  RawClient c(socket());
  ASSERT_EQ(c.Hello(), 0);
  ASSERT_EQ(c.CreateContext(1), 0);
  ASSERT_EQ(c.CreateQueue(2, 1), 0);
  constexpr uint64_t kBytes = 2u << 20;
  ASSERT_EQ(c.CreateBuffer(3, 1, kBytes), 0);
  ASSERT_EQ(c.CreateBuffer(4, 1, kBytes), 0);
  uint64_t next_event = 100;
  auto send_data = [&](uint64_t token, uint64_t size, uint64_t dest, uint64_t dest_offset,
                       uint8_t seed) {
    capnp::MallocMessageBuilder bb;
    auto begin = bb.initRoot<wire::Request>().initBulkBegin();
    begin.setToken(token);
    begin.setSize(size);
    begin.setDestMem(dest);
    begin.setDestOffset(dest_offset);
    ASSERT_EQ(c.Call(bb), 0);
    capnp::MallocMessageBuilder bd;
    auto d = bd.initRoot<wire::Request>().initBulkData();
    d.setToken(token);
    auto bytes = d.initData(size);
    for (size_t i = 0; i < size; ++i) bytes[i] = static_cast<uint8_t>(i * 13 + seed);
    ASSERT_EQ(c.Call(bd), 0);
  };
  auto write = [&](uint64_t token, uint64_t mem, uint64_t offset, uint64_t size,
                   std::string* message = nullptr) {
    capnp::MallocMessageBuilder wr;
    auto e = wr.initRoot<wire::Request>().initEnqueue();
    e.setQueue(2);
    e.setEvent(next_event++);
    auto wb = e.initWriteBuffer();
    wb.setMem(mem);
    wb.setOffset(offset);
    wb.setSize(size);
    wb.setBulk(token);
    return c.Call(wr, message);
  };
  // Bytes [offset, offset + n) of `mem`, read back in one reply.
  auto read = [&](uint64_t mem, uint64_t offset, uint64_t n) {
    return c.ReadBytes(2, mem, offset, n, next_event++);
  };
  auto expected = [](uint64_t n, uint8_t seed) {
    std::vector<uint8_t> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 13 + seed);
    return v;
  };
  constexpr uint64_t kPart = 1u << 20;
  std::string message;
  // Announced for buffer 3 at 0, used for buffer 4, or for buffer 3 at another offset: refused.
  send_data(10, kPart, 3, 0, 1);
  EXPECT_EQ(write(10, 4, 0, kPart, &message), CL_INVALID_VALUE);
  EXPECT_NE(message.find("another write"), std::string::npos) << message;
  send_data(11, kPart, 3, 0, 2);
  EXPECT_EQ(write(11, 3, 4096, kPart), CL_INVALID_VALUE);
  // Or as a buffer's initial data.
  send_data(12, kPart, 3, 0, 3);
  {
    capnp::MallocMessageBuilder b;
    auto cb = b.initRoot<wire::Request>().initCreateBuffer();
    cb.setId(5);
    cb.setContext(1);
    cb.setSize(kPart);
    cb.setInitialData(12);
    EXPECT_EQ(c.Call(b, &message), CL_INVALID_VALUE);
    EXPECT_NE(message.find("used otherwise"), std::string::npos) << message;
  }
  // The write it was announced for lands, where it was announced.
  send_data(13, kPart, 3, kPart, 4);
  ASSERT_EQ(write(13, 3, kPart, kPart), 0);
  EXPECT_EQ(read(3, kPart, 4096), std::vector<uint8_t>(expected(4096, 4)));
  // Announcements naming an unknown buffer, a range past the end, or another session's idea of
  // a buffer are staged: the write still lands.
  send_data(14, kPart, 999, 0, 5);
  ASSERT_EQ(write(14, 4, 0, kPart), 0);
  EXPECT_EQ(read(4, 0, 4096), expected(4096, 5));
  send_data(15, kPart, 4, kBytes - 10, 6);
  ASSERT_EQ(write(15, 4, kPart, kPart), 0);
  EXPECT_EQ(read(4, kPart, 4096), expected(4096, 6));
  // The session still works.
  EXPECT_EQ(c.CreateContext(6), 0);
}

// A run of one-chunk writes streamed without waiting (a program's blocking 1 MiB writes over
// TCP, each returning once sent): the next write's data arrives while the previous write's
// command is still in the worker's batch. That command is handed over first and, being a write
// received in place itself (a marker), does not count as in flight, so the next data is received
// in place too instead of staged, however long the marker takes (docs/policies.md, "Transfers
// over TCP in place"). Seen from outside: data received in place for buffer 3 cannot serve a
// write of buffer 4, where staged data would have.
TEST_F(ServerTest, ARunOfOneChunkWritesIsReceivedInPlace) {
  RawClient c(socket());
  ASSERT_EQ(c.Hello(), 0);
  ASSERT_EQ(c.CreateContext(1), 0);
  ASSERT_EQ(c.CreateQueue(2, 1), 0);
  constexpr uint64_t kPart = 1u << 20;
  ASSERT_EQ(c.CreateBuffer(3, 1, 2 * kPart), 0);
  ASSERT_EQ(c.CreateBuffer(4, 1, 2 * kPart), 0);
  std::vector<uint8_t> stream;
  auto add = [&](capnp::MallocMessageBuilder& b) {
    auto bytes = proto::EncodeFrame(proto::FrameKind::kRequest, b);
    ASSERT_TRUE(bytes.ok());
    stream.insert(stream.end(), bytes->begin(), bytes->end());
  };
  // Data for buffer 3 at `offset`, not answered (no seq), as a streaming client sends it.
  auto add_data = [&](uint64_t token, uint64_t offset, uint8_t seed) {
    capnp::MallocMessageBuilder bb;
    auto begin = bb.initRoot<wire::Request>().initBulkBegin();
    begin.setToken(token);
    begin.setSize(kPart);
    begin.setDestMem(3);
    begin.setDestOffset(offset);
    add(bb);
    capnp::MallocMessageBuilder bd;
    auto d = bd.initRoot<wire::Request>().initBulkData();
    d.setToken(token);
    auto bytes = d.initData(kPart);
    for (size_t i = 0; i < kPart; ++i) bytes[i] = static_cast<uint8_t>(i * 13 + seed);
    add(bd);
  };
  auto write_of = [&](capnp::MallocMessageBuilder& wr, uint64_t token, uint64_t mem,
                      uint64_t offset, uint64_t event) {
    auto e = wr.initRoot<wire::Request>().initEnqueue();
    e.setQueue(2);
    e.setEvent(event);
    auto wb = e.initWriteBuffer();
    wb.setMem(mem);
    wb.setOffset(offset);
    wb.setSize(kPart);
    wb.setBulk(token);
  };
  // The first write's data, sent and taken in (the worker then finds nothing more to read).
  add_data(20, 0, 1);
  ASSERT_TRUE(proto::WriteAll(c.fd(), stream).ok());
  stream.clear();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  // Its command and the next write's announcement in one send: nothing between them lets the
  // worker hand its batch over.
  capnp::MallocMessageBuilder first;
  write_of(first, 20, 3, 0, 100);
  add(first);
  add_data(21, kPart, 2);
  ASSERT_TRUE(proto::WriteAll(c.fd(), stream).ok());
  capnp::MallocMessageBuilder misused;
  write_of(misused, 21, 4, kPart, 101);
  std::string message;
  EXPECT_EQ(c.Call(misused, &message), CL_INVALID_VALUE)
      << "the second write's data was staged, not received in place";
  EXPECT_NE(message.find("another write"), std::string::npos) << message;
  // The first write landed, and the session still works.
  std::vector<uint8_t> expected(4096);
  for (size_t i = 0; i < expected.size(); ++i) expected[i] = static_cast<uint8_t>(i * 13 + 1);
  EXPECT_EQ(c.ReadBytes(2, 3, 0, 4096, 102), expected);
}

// A read of a buffer with the worker's own storage is sent from the buffer, and completes only
// once sent; a client that does not read its replies must not hold the device, so past a
// deadline the rest is copied out and the read completes. A write queued behind the read then
// changes the buffer, and the read still returns the bytes from before it.
TEST_F(ServerTest, AReadSentFromItsBufferKeepsItsBytesWhenTheClientIsSlow) {
  RawClient c(socket());
  ASSERT_TRUE(c.HelloWithDataFrames());
  ASSERT_EQ(c.CreateContext(1), 0);
  ASSERT_EQ(c.CreateQueue(2, 1), 0);
  constexpr uint64_t kBytes = 16u << 20, kChunk = 4u << 20;
  ASSERT_EQ(c.CreateBuffer(3, 1, kBytes), 0);
  auto pattern = [](uint8_t seed) {
    std::vector<uint8_t> v(kBytes);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint8_t>((i >> 3) * 29 + seed);
    return v;
  };
  const auto a = pattern(1), b = pattern(2);
  uint64_t event = 50;
  // A write of `data`, announced for the buffer, not answered (seq 0).
  auto write = [&](uint64_t token, const std::vector<uint8_t>& data) {
    capnp::MallocMessageBuilder bb;
    auto begin = bb.initRoot<wire::Request>().initBulkBegin();
    begin.setToken(token);
    begin.setSize(kBytes);
    begin.setDestMem(3);
    ASSERT_TRUE(c.Send(bb).ok());
    for (uint64_t at = 0; at < kBytes; at += kChunk) {
      ASSERT_TRUE(proto::WriteDataFrame(c.fd(), {token, at, static_cast<uint32_t>(kChunk), false},
                                        data.data() + at).ok());
    }
    capnp::MallocMessageBuilder wr;
    auto e = wr.initRoot<wire::Request>().initEnqueue();
    e.setQueue(2);
    e.setEvent(event++);
    auto wb = e.initWriteBuffer();
    wb.setMem(3);
    wb.setSize(kBytes);
    wb.setBulk(token);
    ASSERT_TRUE(c.Send(wr).ok());
  };
  auto send_read = [&](uint64_t seq) {
    capnp::MallocMessageBuilder rd;
    auto r = rd.initRoot<wire::Request>();
    r.setSeq(seq);
    auto e = r.initEnqueue();
    e.setQueue(2);
    e.setEvent(event++);
    auto rb = e.initReadBuffer();
    rb.setMem(3);
    rb.setSize(kBytes);
    ASSERT_TRUE(c.Send(rd).ok());
  };
  struct Sink : proto::DataSink {
    uint8_t* Place(const proto::DataFrame& f) override {
      if (f.offset + f.bytes > bytes.size()) return nullptr;
      if (f.last) done = true;
      return bytes.data() + f.offset;
    }
    void Placed(const proto::DataFrame&, bool) override {}
    std::vector<uint8_t> bytes = std::vector<uint8_t>(kBytes);
    bool done = false;
  };
  proto::FrameReader reader(c.fd(), proto::FrameKind::kReply, {});
  auto read_all = [&](Sink& sink) {
    reader.SetDataSink(&sink);
    while (!sink.done) {
      auto got = reader.NextOrData(nullptr);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      if (got->has_value()) {
        FAIL() << "a reply instead of the data: status "
               << (*got)->root<wire::Reply>().getStatus();
      }
    }
  };
  ASSERT_NO_FATAL_FAILURE(write(10, a));
  ASSERT_NO_FATAL_FAILURE(send_read(100));
  ASSERT_NO_FATAL_FAILURE(write(11, b));
  // Not reading for a while: the read cannot be sent whole meanwhile.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  Sink first;
  ASSERT_NO_FATAL_FAILURE(read_all(first));
  EXPECT_TRUE(first.bytes == a) << "the read saw the write queued after it";
  ASSERT_NO_FATAL_FAILURE(send_read(101));
  Sink second;
  ASSERT_NO_FATAL_FAILURE(read_all(second));
  EXPECT_TRUE(second.bytes == b) << "the write after the read did not land";
}

TEST_F(ServerTest, RepliesComeThroughTheRingAndABrokenRingEndsOnlyItsSession) {
  RawClient a(socket());
  RawClient b(socket());
  ASSERT_EQ(a.Hello(), 0);
  ASSERT_EQ(b.Hello(), 0);
  int memfd = -1;
  auto ring = proto::ShmRing::CreateConsumer(proto::kRingMinBytes, a.fd(), &memfd);
  ASSERT_TRUE(ring.ok()) << ring.status().message();
  const int spare = ::dup(memfd);  // the client's own second view, to break the ring with
  ASSERT_EQ(a.ReplyRing(memfd, proto::kRingMinBytes), 0);
  ::close(memfd);
  proto::FrameReader replies(a.fd(), proto::FrameKind::kReply, {});
  ASSERT_TRUE(replies.ReadFromRing(ring->get()).ok());
  // An answer, an unasked error and a refused second ring all come through the ring now, in
  // order.
  {
    capnp::MallocMessageBuilder m;
    auto rel = m.initRoot<wire::Request>().initRelease();  // no seq: its error comes unasked
    rel.setKind(wire::ObjectKind::CONTEXT);
    rel.setId(424242);
    ASSERT_TRUE(a.Send(m).ok());
  }
  {
    capnp::MallocMessageBuilder m;
    m.initRoot<wire::Request>().setStats();
    m.getRoot<wire::Request>().setSeq(a.NextSeq());
    ASSERT_TRUE(a.Send(m).ok());
  }
  int again = -1;
  auto second = proto::ShmRing::CreateConsumer(proto::kRingMinBytes, a.fd(), &again);
  ASSERT_TRUE(second.ok());
  {
    capnp::MallocMessageBuilder m;
    auto r = m.initRoot<wire::Request>();
    r.setSeq(a.NextSeq());
    r.setReplyRing(proto::kRingMinBytes);
    ASSERT_TRUE(proto::WriteFrame(a.fd(), proto::FrameKind::kRequest, m, {}, again).ok());
    ::close(again);
  }
  auto unasked = replies.Next(nullptr);
  ASSERT_TRUE(unasked.ok()) << unasked.status().message();
  EXPECT_EQ(unasked->root<wire::Reply>().getSeq(), 0u);
  EXPECT_EQ(unasked->root<wire::Reply>().getStatus(), CL_INVALID_VALUE);
  auto stats = replies.Next(nullptr);
  ASSERT_TRUE(stats.ok()) << stats.status().message();
  EXPECT_TRUE(stats->root<wire::Reply>().isStats());
  auto refused = replies.Next(nullptr);
  ASSERT_TRUE(refused.ok()) << refused.status().message();
  EXPECT_EQ(refused->root<wire::Reply>().getStatus(), CL_INVALID_OPERATION);
  // The client moves its read position past what was written: the worker ends the session at
  // its next reply, and serves the other client as before.
  void* p = ::mmap(nullptr, proto::kRingHeaderBytes, PROT_READ | PROT_WRITE, MAP_SHARED, spare,
                   0);
  ASSERT_NE(p, MAP_FAILED);
  const uint64_t bogus = 1ull << 40;
  std::memcpy(static_cast<uint8_t*>(p) + 128, &bogus, sizeof(bogus));
  {
    capnp::MallocMessageBuilder m;
    m.initRoot<wire::Request>().setStats();
    m.getRoot<wire::Request>().setSeq(a.NextSeq());
    ASSERT_TRUE(a.Send(m).ok());
  }
  char byte;
  ssize_t got;
  while ((got = ::recv(a.fd(), &byte, 1, 0)) > 0) {
  }
  EXPECT_EQ(got, 0);  // the end of the stream, not the 20 s timeout
  ::munmap(p, proto::kRingHeaderBytes);
  ::close(spare);
  EXPECT_EQ(b.CreateContext(1), 0);
  EXPECT_EQ(b.CreateQueue(2, 1), 0);
}

TEST_F(ServerTest, RequestsComeThroughTheRingAndABrokenRingEndsOnlyItsSession) {
  RawClient a(socket());
  RawClient b(socket());
  ASSERT_EQ(a.Hello(), 0);
  ASSERT_EQ(b.Hello(), 0);
  int memfd = -1;
  auto ring = proto::ShmRing::CreateProducer(proto::kRingMinBytes, a.fd(), &memfd);
  ASSERT_TRUE(ring.ok()) << ring.status().message();
  const int spare = ::dup(memfd);  // the client's own second view, to break the ring with
  ASSERT_EQ(a.RequestRing(memfd, proto::kRingMinBytes, ring->get()), 0);
  ::close(memfd);
  // Served through the ring now (answers on the socket); a second ring is refused.
  EXPECT_EQ(a.CreateContext(1), 0);
  EXPECT_EQ(a.CreateQueue(2, 1), 0);
  int again = -1;
  auto second = proto::ShmRing::CreateProducer(proto::kRingMinBytes, a.fd(), &again);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(a.RequestRing(again, proto::kRingMinBytes, second->get()), CL_INVALID_OPERATION);
  ::close(again);
  // A request with a descriptor (a reply ring), which goes on the socket beside the ring.
  int replies_fd = -1;
  auto replies_ring = proto::ShmRing::CreateConsumer(proto::kRingMinBytes, a.fd(), &replies_fd);
  ASSERT_TRUE(replies_ring.ok());
  ASSERT_EQ(a.ReplyRing(replies_fd, proto::kRingMinBytes), 0);
  ::close(replies_fd);
  proto::FrameReader replies(a.fd(), proto::FrameKind::kReply, {});
  ASSERT_TRUE(replies.ReadFromRing(replies_ring->get()).ok());
  {
    capnp::MallocMessageBuilder m;
    m.initRoot<wire::Request>().setStats();
    m.getRoot<wire::Request>().setSeq(a.NextSeq());
    ASSERT_TRUE(a.Send(m).ok());
  }
  auto stats = replies.Next(nullptr);
  ASSERT_TRUE(stats.ok()) << stats.status().message();
  EXPECT_TRUE(stats->root<wire::Reply>().isStats());
  // The client moves the ring's write position far ahead and rings: the worker ends the
  // session (never reads outside the ring), and serves the other client as before.
  void* p = ::mmap(nullptr, proto::kRingHeaderBytes, PROT_READ | PROT_WRITE, MAP_SHARED, spare,
                   0);
  ASSERT_NE(p, MAP_FAILED);
  const uint64_t bogus = 1ull << 40;
  std::memcpy(static_cast<uint8_t*>(p) + 64, &bogus, sizeof(bogus));
  const char bell = 1;
  ASSERT_EQ(::send(a.fd(), &bell, 1, MSG_NOSIGNAL), 1);
  char byte;
  ssize_t got;
  while ((got = ::recv(a.fd(), &byte, 1, 0)) > 0) {
  }
  // The end of the stream (a reset: the worker left bytes unread), not the 20 s timeout.
  EXPECT_TRUE(got == 0 || errno == ECONNRESET) << std::strerror(errno);
  ::munmap(p, proto::kRingHeaderBytes);
  ::close(spare);
  EXPECT_EQ(b.CreateContext(1), 0);
  EXPECT_EQ(b.CreateQueue(2, 1), 0);
}

// A client that passes its own end of the connection to its worker (a lone byte with the
// descriptor, no frame) and exits: the worker keeps no such descriptor (only regular files,
// which memfds are), so it sees its client go and the session ends, with or without a request
// ring. Kept, the descriptor held the connection open for ever and the session counted against
// max_sessions.
TEST_F(ServerTest, AClientPassingItsOwnSocketStillEndsItsSession) {
  for (const bool ring : {false, true}) {
    SCOPED_TRACE(ring ? "request ring" : "socket");
    RawClient c(socket());
    ASSERT_EQ(c.Hello(), 0);
    std::unique_ptr<proto::ShmRing> requests;
    if (ring) {
      int memfd = -1;
      auto r = proto::ShmRing::CreateProducer(proto::kRingMinBytes, c.fd(), &memfd);
      ASSERT_TRUE(r.ok());
      requests = std::move(*r);
      ASSERT_EQ(c.RequestRing(memfd, proto::kRingMinBytes, requests.get()), 0);
      ::close(memfd);
    }
    EXPECT_EQ(c.CreateContext(1), 0);
    ASSERT_TRUE(proto::SendDescriptor(c.fd(), c.fd()).ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the worker reads it
    c.Close();
    EXPECT_TRUE(server_->WaitForNoSessions(std::chrono::seconds(10)))
        << "the session outlived its client";
  }
}

TEST_F(ServerTest, RingsTheWorkerCannotTrustAreRefused) {
  RawClient c(socket());
  ASSERT_EQ(c.Hello(), 0);
  EXPECT_EQ(c.ReplyRing(-1, proto::kRingMinBytes), CL_INVALID_VALUE);  // no memfd
  int fd = ::memfd_create("ring", MFD_ALLOW_SEALING);  // not sealed: could be shrunk
  ASSERT_EQ(::ftruncate(fd, proto::kRingHeaderBytes + proto::kRingMinBytes), 0);
  EXPECT_EQ(c.ReplyRing(fd, proto::kRingMinBytes), CL_INVALID_VALUE);
  ASSERT_EQ(::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
  EXPECT_EQ(c.ReplyRing(fd, proto::kRingMinBytes * 2), CL_INVALID_VALUE);  // smaller than said
  EXPECT_EQ(c.ReplyRing(fd, proto::kRingMinBytes + 8), CL_INVALID_VALUE);  // not a power of 2
  ::close(fd);
  // The same for a request ring.
  EXPECT_EQ(c.RequestRing(-1, proto::kRingMinBytes, nullptr), CL_INVALID_VALUE);
  fd = ::memfd_create("ring", MFD_ALLOW_SEALING);
  ASSERT_EQ(::ftruncate(fd, proto::kRingHeaderBytes + proto::kRingMinBytes), 0);
  EXPECT_EQ(c.RequestRing(fd, proto::kRingMinBytes, nullptr), CL_INVALID_VALUE);
  ASSERT_EQ(::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
  EXPECT_EQ(c.RequestRing(fd, proto::kRingMinBytes * 2, nullptr), CL_INVALID_VALUE);
  ::close(fd);
  // Still served on the socket.
  EXPECT_EQ(c.CreateContext(1), 0);
}

TEST_F(ServerTest, ClientsDyingMidTransferLeakNothing) {
  RawClient probe(socket());
  ASSERT_EQ(probe.Hello(), 0);
  ASSERT_TRUE(server_->WaitForNoSessions(std::chrono::milliseconds(1)) == false);
  const int64_t baseline = probe.LiveBackendObjects();
  ASSERT_GE(baseline, 0);
  auto rss_kb = [] {
    std::ifstream f("/proc/self/statm");
    long pages = 0, resident = 0;
    f >> pages >> resident;
    return resident * (::sysconf(_SC_PAGESIZE) / 1024);
  };
  long rss_before = 0;
  for (int i = 0; i < 40; ++i) {
    if (i == 5) rss_before = rss_kb();  // after allocator warm-up
    RawClient c(socket());
    ASSERT_EQ(c.Hello(), 0);
    ASSERT_EQ(c.CreateContext(1), 0);
    ASSERT_EQ(c.CreateQueue(2, 1), 0);
    ASSERT_EQ(c.CreateBuffer(3, 1, 1 << 20), 0);
    // Begin a 4 MiB upload and die halfway through a data frame.
    capnp::MallocMessageBuilder bb;
    auto begin = bb.initRoot<wire::Request>().initBulkBegin();
    begin.setToken(5);
    begin.setSize(4 << 20);
    ASSERT_TRUE(c.Send(bb).ok());
    capnp::MallocMessageBuilder bd;
    auto d = bd.initRoot<wire::Request>().initBulkData();
    d.setToken(5);
    d.initData(1 << 20);
    auto frame = proto::EncodeFrame(proto::FrameKind::kRequest, bd);
    ASSERT_TRUE(frame.ok());
    ASSERT_GT(::write(c.fd(), frame->data(), frame->size() / 2), 0);
    c.Close();
  }
  // The probe session stays; every other session must be gone with its objects.
  for (int i = 0; i < 6000 && server_->SessionCount() > 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(server_->SessionCount(), 1u);
  EXPECT_EQ(probe.LiveBackendObjects(), baseline);
  long growth_kb = rss_kb() - rss_before;
  EXPECT_LT(growth_kb, 64 * 1024) << "daemon memory grew by " << growth_kb << " KiB";
}

// The counted limits are the tenant's, across its sessions: each session gets a share, and the
// shares follow the sessions as they come and go.
TEST_F(ServerTest, ATenantsLimitsAreSharedByItsSessions) {
  server_->Stop();
  server_.reset();
  DaemonOptions o;
  o.socket_path = socket();
  o.limits.max_objects = 8;
  auto s = Server::Create(o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  server_ = std::move(s).value();
  ASSERT_TRUE(server_->Start().ok());
  // Creates buffers until one is refused; returns how many were made.
  auto fill = [](RawClient& c, uint64_t first_id) {
    int made = 0;
    while (made < 100 && c.CreateBuffer(first_id + made, 1, 64) == 0) ++made;
    return made;
  };
  RawClient a(socket());
  ASSERT_EQ(a.Hello(), 0);
  ASSERT_EQ(a.CreateContext(1), 0);
  EXPECT_EQ(fill(a, 100), 7) << "alone, a session has the whole limit (8 objects)";
  RawClient b(socket());
  ASSERT_EQ(b.Hello(), 0);
  ASSERT_EQ(b.CreateContext(1), 0);
  EXPECT_EQ(fill(b, 100), 3) << "two sessions: 4 objects each";
  EXPECT_EQ(fill(a, 200), 0) << "the first session is above its new share";
  a.Close();
  for (int i = 0; i < 500 && server_->SessionCount() > 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(server_->SessionCount(), 1u);
  // The new share travels from the broker to the worker: give it a moment.
  int more = 0;
  for (int i = 0; i < 200 && more == 0; ++i) {
    more = fill(b, 300 + 10 * static_cast<uint64_t>(i));
    if (more == 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(more, 4) << "alone again, the session has the whole limit";
}

// A daemon that also listens on TCP (127.0.0.1, port 0) with two token-identified tenants.
class TcpServerTest : public ::testing::Test {
 protected:
  void StartServer(UnknownTokens unknown) {
    char tmpl[] = "/tmp/gmux-daemon-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    ::chmod(tmpl, 0755);  // TCP tenants' workers run as worker_user and keep their cache here
    DaemonOptions o;
    o.socket_path = dir_ + "/gmuxd.sock";
    o.listen = "127.0.0.1:0";
    o.plain_tcp = true;  // raw protocol frames over TCP (TLS has tests of its own)
    o.unknown_tokens = unknown;
    o.default_tenant = "guests";
    o.tenants = {{"alice", 2.0, {}, {}, {"alice-secret"}}, {"bob", 1.0, {}, {}, {"bob-secret", "bob-2"}}};
    auto s = Server::Create(o);
    if (!s.ok() && s.status().code() != StatusCode::kInvalidArgument) {
      GTEST_SKIP() << "no OpenCL backend: " << s.status().ToString();
    }
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server_ = std::move(s).value();
    ASSERT_TRUE(server_->Start().ok());
    ASSERT_NE(server_->tcp_port(), 0);
  }
  void TearDown() override {
    if (server_) server_->Stop();
    std::error_code ec;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
  }

  std::string dir_;
  std::unique_ptr<Server> server_;
};

TEST_F(TcpServerTest, TokensNameTheirTenants) {
  StartServer(UnknownTokens::kReject);
  std::string tenant, msg;
  RawClient a(server_->tcp_port());
  ASSERT_TRUE(a.connected());
  ASSERT_EQ(a.HelloWithToken("alice-secret", &tenant, &msg), 0) << msg;
  EXPECT_EQ(tenant, "alice");
  EXPECT_EQ(a.CreateContext(1), 0);
  RawClient b(server_->tcp_port());
  ASSERT_EQ(b.HelloWithToken("bob-2", &tenant, &msg), 0) << msg;
  EXPECT_EQ(tenant, "bob");
}

TEST_F(TcpServerTest, UnknownOrMissingTokensAreRejected) {
  StartServer(UnknownTokens::kReject);
  std::string tenant, msg;
  for (const char* token : {"alice-secreT", "alice-secret-", "", "bob"}) {
    RawClient c(server_->tcp_port());
    ASSERT_TRUE(c.connected());
    EXPECT_EQ(c.HelloWithToken(token, &tenant, &msg), CL_INVALID_OPERATION) << token;
    EXPECT_NE(msg.find("token"), std::string::npos) << msg;
    EXPECT_FALSE(c.Read().ok());  // and the connection is closed
  }
  // The Unix socket is unaffected: local peers still get their own tenant.
  RawClient local(dir_ + "/gmuxd.sock");
  EXPECT_EQ(local.Hello(), 0);
}

TEST_F(TcpServerTest, UnknownTokensCanShareTheDefaultTenant) {
  StartServer(UnknownTokens::kShared);
  std::string tenant, msg;
  RawClient c(server_->tcp_port());
  ASSERT_EQ(c.HelloWithToken("whoever", &tenant, &msg), 0) << msg;
  EXPECT_EQ(tenant, "guests");
  EXPECT_EQ(c.CreateContext(1), 0);
  RawClient a(server_->tcp_port());
  ASSERT_EQ(a.HelloWithToken("alice-secret", &tenant, &msg), 0) << msg;
  EXPECT_EQ(tenant, "alice");
}

TEST_F(TcpServerTest, SharedMemoryIsRefusedOverTcp) {
  StartServer(UnknownTokens::kReject);
  std::string tenant, msg;
  RawClient c(server_->tcp_port());
  ASSERT_EQ(c.HelloWithToken("alice-secret", &tenant, &msg), 0) << msg;
  capnp::MallocMessageBuilder b;
  auto bb = b.initRoot<wire::Request>().initBulkBegin();
  bb.setToken(5);
  bb.setSize(1 << 20);
  bb.setShm(true);
  EXPECT_EQ(c.Call(b), CL_INVALID_VALUE);
  EXPECT_EQ(c.CreateContext(1), 0);  // still served
}

}  // namespace
}  // namespace gmux::daemon

namespace gmux::daemon {
namespace {

// A control reply goes out within one deadline however the peer reads: a peer that reads a
// little at a time (and so lets every single send make progress) cannot hold the broker.
TEST(SendBeforeTest, ASlowReaderDoesNotExtendTheDeadline) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  std::atomic<bool> stop{false};
  std::thread reader([&] {
    char buf[4096];
    while (!stop) {
      if (::recv(sv[1], buf, sizeof(buf), MSG_DONTWAIT) == 0) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  });
  std::vector<uint8_t> big(64u << 20, 0x5a);  // 64 MiB at 400 KiB/s: minutes
  Status s = SendBefore(sv[0], big,
                        std::chrono::steady_clock::now() + std::chrono::milliseconds(300));
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("in time"), std::string::npos) << s.message();
  stop = true;
  ::close(sv[0]);
  reader.join();
  ::close(sv[1]);
  // A reader that keeps up gets everything.
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  std::vector<uint8_t> small(1u << 20, 0x33);
  size_t got = 0;
  std::thread fast([&] {
    char buf[65536];
    ssize_t n;
    while ((n = ::recv(sv[1], buf, sizeof(buf), 0)) > 0) got += static_cast<size_t>(n);
  });
  EXPECT_TRUE(SendBefore(sv[0], small, std::chrono::steady_clock::now() +
                                           std::chrono::seconds(60)).ok());
  ::close(sv[0]);
  fast.join();
  ::close(sv[1]);
  EXPECT_EQ(got, small.size());
}

// The scheduling policy of each thread of this process's gmux-worker children, by worker, the
// main thread first.
std::vector<std::vector<std::pair<pid_t, int>>> WorkerThreadPolicies() {
  std::vector<std::vector<std::pair<pid_t, int>>> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(e.path() / "stat");
    std::string line;
    if (!std::getline(stat, line)) continue;
    // pid (comm) state ppid ...
    const size_t close = line.rfind(')');
    const size_t open = line.find('(');
    if (close == std::string::npos || open == std::string::npos) continue;
    const std::string comm = line.substr(open + 1, close - open - 1);
    long ppid = 0;
    char state = 0;
    if (std::sscanf(line.c_str() + close + 1, " %c %ld", &state, &ppid) != 2) continue;
    if (comm != "gmux-worker" || ppid != ::getpid() || state == 'Z' || state == 'X') continue;
    std::vector<std::pair<pid_t, int>> threads;
    std::error_code ec;
    for (const auto& t : std::filesystem::directory_iterator(e.path() / "task", ec)) {
      const pid_t tid = static_cast<pid_t>(std::stol(t.path().filename()));
      threads.emplace_back(tid, ::sched_getscheduler(tid));
    }
    // The main thread (its tid is the pid) first.
    const pid_t pid = static_cast<pid_t>(std::stol(name));
    std::partition(threads.begin(), threads.end(), [&](const auto& t) { return t.first == pid; });
    out.push_back(std::move(threads));
  }
  return out;
}

// The threads the backend starts in a worker (PoCL's compute threads) run as SCHED_BATCH, so
// that they do not preempt the worker's dispatching thread when its enqueue wakes them; the
// worker's own threads keep the default policy. `[backend] threads = "normal"` leaves them all
// at the default.
TEST(WorkerThreadsTest, TheBackendsThreadsRunAsBatchUnlessConfiguredOtherwise) {
  for (const bool batch : {true, false}) {
    SCOPED_TRACE(batch ? "batch" : "normal");
    char tmpl[] = "/tmp/gmux-daemon-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    const std::string dir = tmpl;
    DaemonOptions o;
    o.socket_path = dir + "/gmuxd.sock";
    o.backend.batch_threads = batch;
    auto s = Server::Create(o);
    if (!s.ok() && s.status().code() != StatusCode::kInvalidArgument) {
      GTEST_SKIP() << "no OpenCL backend: " << s.status().ToString();
    }
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    ASSERT_TRUE((*s)->Start().ok());
    {
      RawClient c(o.socket_path);
      ASSERT_EQ(c.Hello(), 0);
      ASSERT_EQ(c.CreateContext(1), 0);
      ASSERT_EQ(c.CreateQueue(2, 1), 0);
      // A spare worker may be starting, or opening its backend (its main thread batch
      // meanwhile): looked at once every worker has opened it (its main thread back at the
      // default, its backend's threads started), within 5 s.
      auto opened = [](const std::vector<std::pair<pid_t, int>>& threads) {
        return threads.size() > 1 && threads.front().second == SCHED_OTHER;
      };
      auto workers = WorkerThreadPolicies();
      for (int i = 0; i < 500; ++i) {
        if (std::all_of(workers.begin(), workers.end(), opened)) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        workers = WorkerThreadPolicies();
      }
      ASSERT_FALSE(workers.empty());
      for (const auto& threads : workers) {
        size_t batch_threads = 0;
        for (const auto& [tid, policy] : threads) {
          ASSERT_TRUE(policy == SCHED_OTHER || policy == SCHED_BATCH) << policy;
          if (policy == SCHED_BATCH) ++batch_threads;
        }
        // The first thread is the worker's main thread, which reads its client.
        ASSERT_FALSE(threads.empty());
        EXPECT_EQ(threads.front().second, SCHED_OTHER);
        if (batch) {
          EXPECT_GE(batch_threads, 1u) << "PoCL starts its compute threads when it opens";
          EXPECT_LT(batch_threads, threads.size());
        } else {
          EXPECT_EQ(batch_threads, 0u);
        }
      }
    }
    (*s)->Stop();
    // This server's workers are gone before the next one's are looked at.
    for (int i = 0; i < 500 && !WorkerThreadPolicies().empty(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
}

}  // namespace
}  // namespace gmux::daemon
