#include "proto/frame.h"

#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <thread>

#include "proto/spin_wait.h"

namespace gmux::proto {
namespace {

std::vector<uint8_t> SampleRequestFrame(uint64_t seq = 7) {
  capnp::MallocMessageBuilder b;
  auto req = b.initRoot<wire::Request>();
  req.setSeq(seq);
  auto e = req.initEnqueue();
  e.setQueue(3);
  e.setEvent(9);
  auto wl = e.initWaitList(2);
  wl.set(0, 4);
  wl.set(1, 5);
  auto nd = e.initNdrange();
  nd.setKernel(11);
  nd.setWorkDim(1);
  nd.initGlobalSize(1).set(0, 1024);
  auto args = nd.initArgs(2);
  args[0].setMem(12);
  uint8_t v[4] = {1, 2, 3, 4};
  args[1].setValue(kj::arrayPtr(v, 4));
  auto bytes = EncodeFrame(FrameKind::kRequest, b);
  EXPECT_TRUE(bytes.ok());
  return *bytes;
}

TEST(FrameTest, RoundTripsARequest) {
  auto bytes = SampleRequestFrame();
  auto m = DecodeFrame(bytes, FrameKind::kRequest, {});
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  auto req = m->root<wire::Request>();
  EXPECT_EQ(req.getSeq(), 7u);
  ASSERT_TRUE(req.isEnqueue());
  auto e = req.getEnqueue();
  EXPECT_EQ(e.getQueue(), 3u);
  ASSERT_EQ(e.getWaitList().size(), 2u);
  EXPECT_EQ(e.getWaitList()[1], 5u);
  auto args = e.getNdrange().getArgs();
  ASSERT_EQ(args.size(), 2u);
  EXPECT_EQ(args[0].getMem(), 12u);
  EXPECT_EQ(args[1].getValue().size(), 4u);
}

TEST(FrameTest, RejectsBadMagic) {
  auto bytes = SampleRequestFrame();
  bytes[0] ^= 0xff;
  auto m = DecodeFrame(bytes, FrameKind::kRequest, {});
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kDataLoss);
}

TEST(FrameTest, RejectsWrongVersionNamingBoth) {
  auto bytes = SampleRequestFrame();
  bytes[4] = 99;
  auto m = DecodeFrame(bytes, FrameKind::kRequest, {});
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(m.status().message().find("99"), std::string::npos);
  EXPECT_NE(m.status().message().find("version 1"), std::string::npos);
}

TEST(FrameTest, RejectsWrongKindAndReservedBits) {
  auto bytes = SampleRequestFrame();
  EXPECT_FALSE(DecodeFrame(bytes, FrameKind::kReply, {}).ok());
  auto b2 = bytes;
  b2[6] = 7;
  EXPECT_EQ(DecodeFrame(b2, FrameKind::kRequest, {}).status().code(),
            StatusCode::kInvalidArgument);
  auto b3 = bytes;
  b3[13] = 1;  // a flag nobody defined
  EXPECT_EQ(DecodeFrame(b3, FrameKind::kRequest, {}).status().code(), StatusCode::kDataLoss);
  // The one flag there is (a descriptor on the socket for a frame through a ring) decodes.
  auto b4 = bytes;
  b4[12] = kFrameFlagDescriptor;
  EXPECT_TRUE(DecodeFrame(b4, FrameKind::kRequest, {}).ok());
  auto h = DecodeHeader(std::span<const uint8_t>(b4.data(), kHeaderBytes), {});
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->flags, kFrameFlagDescriptor);
}

TEST(FrameTest, RejectsAbsurdLengthBeforeAllocating) {
  uint8_t hdr[kHeaderBytes];
  EncodeHeader({kProtocolVersion, FrameKind::kRequest, 0xFFFFFFF8u}, hdr);
  auto h = DecodeHeader(hdr, {});
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.status().code(), StatusCode::kResourceExhausted);
  EncodeHeader({kProtocolVersion, FrameKind::kRequest, 13}, hdr);
  EXPECT_EQ(DecodeHeader(hdr, {}).status().code(), StatusCode::kDataLoss);
  EncodeHeader({kProtocolVersion, FrameKind::kRequest, 0}, hdr);
  EXPECT_EQ(DecodeHeader(hdr, {}).status().code(), StatusCode::kDataLoss);
}

TEST(FrameTest, RejectsEveryTruncation) {
  auto bytes = SampleRequestFrame();
  for (size_t n = 0; n < bytes.size(); ++n) {
    auto m = DecodeFrame(std::span<const uint8_t>(bytes.data(), n), FrameKind::kRequest, {});
    EXPECT_FALSE(m.ok()) << "prefix of " << n << " bytes decoded";
  }
  bytes.push_back(0);
  EXPECT_FALSE(DecodeFrame(bytes, FrameKind::kRequest, {}).ok());
}

TEST(FrameTest, RejectsSegmentTableThatLies) {
  auto bytes = SampleRequestFrame();
  // Segment 0's size field claims far more words than the payload holds.
  uint32_t huge = 1u << 20;
  std::memcpy(bytes.data() + kHeaderBytes + 4, &huge, 4);
  auto m = DecodeFrame(bytes, FrameKind::kRequest, {});
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kDataLoss);
  // A segment count far beyond the payload.
  bytes = SampleRequestFrame();
  uint32_t many = 100000;
  std::memcpy(bytes.data() + kHeaderBytes, &many, 4);
  EXPECT_FALSE(DecodeFrame(bytes, FrameKind::kRequest, {}).ok());
}

TEST(FrameTest, CorruptedPayloadNeverCrashesAndIsMostlyRejected) {
  const uint32_t seed = 20240601;
  std::mt19937 rng(seed);
  auto good = SampleRequestFrame();
  int rejected = 0;
  for (int i = 0; i < 2000; ++i) {
    auto bytes = good;
    int flips = 1 + static_cast<int>(rng() % 8);
    for (int f = 0; f < flips; ++f) {
      size_t at = kHeaderBytes + rng() % (bytes.size() - kHeaderBytes);
      bytes[at] = static_cast<uint8_t>(rng());
    }
    auto m = DecodeFrame(bytes, FrameKind::kRequest, {});
    if (!m.ok()) {
      ++rejected;
      continue;
    }
    // Accepted messages must be safe to read in full.
    auto req = m->root<wire::Request>();
    (void)req.totalSize();
  }
  EXPECT_GT(rejected, 0) << "seed " << seed;
}

TEST(FrameTest, NestingLimitRejectsDeepMessages) {
  capnp::MallocMessageBuilder b;
  auto req = b.initRoot<wire::Request>();
  req.initEnqueue().initNdrange().initArgs(1)[0].setValue(kj::heapArray<kj::byte>(8));
  auto bytes = EncodeFrame(FrameKind::kRequest, b);
  ASSERT_TRUE(bytes.ok());
  FrameLimits tight;
  tight.nesting_limit = 4;
  EXPECT_FALSE(DecodeFrame(*bytes, FrameKind::kRequest, tight).ok());
  EXPECT_TRUE(DecodeFrame(*bytes, FrameKind::kRequest, {}).ok());
}

TEST(FrameTest, EncodeRefusesOversizedMessages) {
  capnp::MallocMessageBuilder b;
  auto req = b.initRoot<wire::Request>();
  req.initBulkData().initData(1 << 16);
  FrameLimits small;
  small.max_payload_bytes = 4096;
  auto bytes = EncodeFrame(FrameKind::kRequest, b, small);
  ASSERT_FALSE(bytes.ok());
  EXPECT_EQ(bytes.status().code(), StatusCode::kResourceExhausted);
}

class SocketPairTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds_), 0); }
  void TearDown() override {
    for (int fd : fds_) {
      if (fd >= 0) ::close(fd);
    }
  }
  int fds_[2] = {-1, -1};
};

TEST_F(SocketPairTest, WriteThenReadFrame) {
  capnp::MallocMessageBuilder b;
  auto rep = b.initRoot<wire::Reply>();
  rep.setSeq(42);
  rep.setStatus(-5);
  rep.setMessage("boom");
  ASSERT_TRUE(WriteFrame(fds_[0], FrameKind::kReply, b).ok());
  auto m = ReadFrame(fds_[1], FrameKind::kReply);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->root<wire::Reply>().getSeq(), 42u);
  EXPECT_EQ(m->root<wire::Reply>().getStatus(), -5);
  EXPECT_EQ(std::string(m->root<wire::Reply>().getMessage().cStr()), "boom");
}

TEST_F(SocketPairTest, CleanCloseIsUnavailableAndMidFrameCloseIsDataLoss) {
  ::close(fds_[0]);
  fds_[0] = -1;
  EXPECT_EQ(ReadFrame(fds_[1], FrameKind::kRequest).status().code(), StatusCode::kUnavailable);
  ::close(fds_[1]);
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds_), 0);
  auto bytes = SampleRequestFrame();
  ASSERT_EQ(::write(fds_[0], bytes.data(), bytes.size() - 8),
            static_cast<ssize_t>(bytes.size() - 8));
  ::close(fds_[0]);
  fds_[0] = -1;
  EXPECT_EQ(ReadFrame(fds_[1], FrameKind::kRequest).status().code(), StatusCode::kDataLoss);
}

TEST_F(SocketPairTest, WriteToClosedPeerIsUnavailableNotSigpipe) {
  ::close(fds_[1]);
  fds_[1] = -1;
  capnp::MallocMessageBuilder b;
  b.initRoot<wire::Reply>().setSeq(1);
  EXPECT_EQ(WriteFrame(fds_[0], FrameKind::kReply, b).code(), StatusCode::kUnavailable);
}

// A memfd holding one byte, `mark`: which descriptor a reader received.
int MarkedMemfd(char mark) {
  int fd = ::memfd_create("marked", MFD_CLOEXEC);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(::pwrite(fd, &mark, 1, 0), 1);
  return fd;
}
char MarkOf(int fd) {
  char c = 0;
  return ::pread(fd, &c, 1, 0) == 1 ? c : 0;
}
size_t OpenDescriptors() {
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

TEST_F(SocketPairTest, PassesADescriptorWithAFrame) {
  capnp::MallocMessageBuilder b;
  b.initRoot<wire::Request>().setSeq(3);
  int memfd = MarkedMemfd('x');
  ASSERT_TRUE(WriteFrame(fds_[0], FrameKind::kRequest, b, {}, memfd).ok());
  ::close(memfd);
  int got = -1;
  auto m = ReadFrame(fds_[1], FrameKind::kRequest, {}, nullptr, &got);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_GE(got, 0);
  EXPECT_EQ(MarkOf(got), 'x');
  ::close(got);
  // A descriptor nobody asked for is closed, not leaked.
  const size_t before = OpenDescriptors();
  memfd = MarkedMemfd('y');
  ASSERT_TRUE(WriteFrame(fds_[0], FrameKind::kRequest, b, {}, memfd).ok());
  ::close(memfd);
  ASSERT_TRUE(ReadFrame(fds_[1], FrameKind::kRequest).ok());
  EXPECT_EQ(OpenDescriptors(), before);
  // Only regular files (memfds) are kept: anything else is closed as it arrives (a socket
  // kept could be the peer's own end of the connection). A pipe's read end then reads EOF.
  int pipefd[2];
  ASSERT_EQ(::pipe(pipefd), 0);
  ASSERT_TRUE(WriteFrame(fds_[0], FrameKind::kRequest, b, {}, pipefd[1]).ok());
  ::close(pipefd[1]);
  got = -2;
  ASSERT_TRUE(ReadFrame(fds_[1], FrameKind::kRequest, {}, nullptr, &got).ok());
  EXPECT_EQ(got, -1);
  char c = 0;
  EXPECT_EQ(::read(pipefd[0], &c, 1), 0);
  ::close(pipefd[0]);
}

// A request frame with `seq` and `pad` bytes of data.
std::vector<uint8_t> SeqFrame(uint64_t seq, size_t pad = 0) {
  capnp::MallocMessageBuilder b;
  auto req = b.initRoot<wire::Request>();
  req.setSeq(seq);
  if (pad > 0) {
    std::vector<uint8_t> data(pad, static_cast<uint8_t>(seq));
    req.initBulkData().setData(kj::arrayPtr(data.data(), data.size()));
  }
  auto bytes = EncodeFrame(FrameKind::kRequest, b);
  EXPECT_TRUE(bytes.ok());
  return *bytes;
}

// Sends `bytes` in one sendmsg, with `pass` as SCM_RIGHTS when >= 0.
void SendWithFd(int fd, const std::vector<uint8_t>& bytes, int pass) {
  iovec iov{const_cast<uint8_t*>(bytes.data()), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  if (pass >= 0) {
    std::memset(control, 0, sizeof(control));
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &pass, sizeof(int));
  }
  ASSERT_EQ(::sendmsg(fd, &msg, 0), static_cast<ssize_t>(bytes.size()));
}

// Which memfd a received descriptor is: its mark, checked by seq.
TEST_F(SocketPairTest, ReaderTakesBatchesAndGivesEachDescriptorToItsFrame) {
  // Frames 1..3 in one send (no descriptor), frame 4 with memfd A in its own send, frames 5
  // and 6 in one send, frame 7 with memfd B, frame 8 alone: all sent before the first read, so
  // reads join them as the kernel allows. Descriptors must land on frames 4 and 7 only.
  const int a = MarkedMemfd('A');
  const int bp = MarkedMemfd('B');
  std::vector<uint8_t> batch;
  for (uint64_t s = 1; s <= 3; ++s) {
    auto f = SeqFrame(s, s * 40);
    batch.insert(batch.end(), f.begin(), f.end());
  }
  SendWithFd(fds_[0], batch, -1);
  SendWithFd(fds_[0], SeqFrame(4, 16), a);
  batch.clear();
  for (uint64_t s = 5; s <= 6; ++s) {
    auto f = SeqFrame(s);
    batch.insert(batch.end(), f.begin(), f.end());
  }
  SendWithFd(fds_[0], batch, -1);
  SendWithFd(fds_[0], SeqFrame(7), bp);
  SendWithFd(fds_[0], SeqFrame(8, 100), -1);
  ::close(a);
  ::close(bp);
  ::close(fds_[0]);
  fds_[0] = -1;

  FrameReader reader(fds_[1], FrameKind::kRequest, {});
  int waits = 0;
  for (uint64_t want = 1; want <= 8; ++want) {
    int got = -1;
    auto m = reader.Next(&got, [&] { ++waits; });
    ASSERT_TRUE(m.ok()) << want << ": " << m.status().ToString();
    EXPECT_EQ(m->root<wire::Request>().getSeq(), want);
    if (want == 4 || want == 7) {
      ASSERT_GE(got, 0) << "frame " << want << " lost its descriptor";
      EXPECT_EQ(MarkOf(got), want == 4 ? 'A' : 'B') << "frame " << want;
      ::close(got);
    } else {
      EXPECT_EQ(got, -1) << "frame " << want << " got a descriptor that was not its own";
    }
  }
  EXPECT_EQ(waits, 0);  // everything had arrived: nothing waited
  EXPECT_EQ(reader.Next(nullptr).status().code(), StatusCode::kUnavailable);
}

TEST_F(SocketPairTest, ReaderReadsFramesLargerThanItsBufferAndWaitsForTheRest) {
  // A frame of 3 MiB (larger than the reader's buffer) between two small ones, written by
  // another thread in small pieces: the reader waits (calling before_wait) and gets each whole.
  // The writer stops after the first frame until the reader has said it waits (for the next
  // header), so the wait happens however the two threads are scheduled.
  std::vector<uint8_t> all;
  size_t pause_at = 0;
  for (auto f : {SeqFrame(1, 10), SeqFrame(2, 3u << 20), SeqFrame(3, 10)}) {
    if (pause_at == 0) pause_at = f.size();
    all.insert(all.end(), f.begin(), f.end());
  }
  std::atomic<int> waits{0};
  std::thread writer([&] {
    bool paused = false;
    for (size_t at = 0; at < all.size();) {
      if (!paused && at >= pause_at) {
        paused = true;
        // Bounded, so that a reader that failed early cannot leave the writer hanging.
        for (int i = 0; i < 50'000 && waits.load() == 0; ++i) {
          std::this_thread::sleep_for(std::chrono::microseconds(200));
        }
      }
      size_t n = std::min<size_t>(all.size() - at, 100'003);
      if (at < pause_at) n = std::min(n, pause_at - at);  // the first frame alone
      ASSERT_EQ(::write(fds_[0], all.data() + at, n), static_cast<ssize_t>(n));
      at += n;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  FrameReader reader(fds_[1], FrameKind::kRequest, {});
  for (uint64_t want = 1; want <= 3; ++want) {
    auto m = reader.Next(nullptr, [&] { ++waits; });
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    auto r = m->root<wire::Request>();
    EXPECT_EQ(r.getSeq(), want);
    const size_t size = want == 2 ? 3u << 20 : 10;
    ASSERT_EQ(r.getBulkData().getData().size(), size);
    for (uint8_t v : r.getBulkData().getData()) ASSERT_EQ(v, static_cast<uint8_t>(want));
  }
  writer.join();
  EXPECT_GE(waits.load(), 1);
  // A close in the middle of a frame is data loss, between frames a clean end.
  auto f = SeqFrame(4, 64);
  ASSERT_EQ(::write(fds_[0], f.data(), f.size() - 8), static_cast<ssize_t>(f.size() - 8));
  ::close(fds_[0]);
  fds_[0] = -1;
  EXPECT_EQ(reader.Next(nullptr).status().code(), StatusCode::kDataLoss);
}

TEST_F(SocketPairTest, ReaderSaysItWaitsInsideAFrameLargerThanItsBuffer) {
  // A small frame, then the header and the first 100,000 bytes of a 3 MiB one, all in the
  // socket before the reader starts: it needs no wait until the large frame's body runs dry,
  // and must call before_wait there (the worker hands over its queued commands then). The rest
  // is written only once it has (bounded at 10 s, for a reader that never says so).
  std::vector<uint8_t> all;
  for (auto f : {SeqFrame(1, 10), SeqFrame(2, 3u << 20)}) all.insert(all.end(), f.begin(), f.end());
  const size_t first = SeqFrame(1, 10).size() + 100'000;
  ASSERT_EQ(::write(fds_[0], all.data(), first), static_cast<ssize_t>(first));
  std::atomic<int> waits{0};
  std::thread writer([&] {
    for (int i = 0; i < 50'000 && waits.load() == 0; ++i) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    for (size_t at = first; at < all.size();) {
      size_t n = std::min<size_t>(all.size() - at, 100'003);
      ASSERT_EQ(::write(fds_[0], all.data() + at, n), static_cast<ssize_t>(n));
      at += n;
    }
  });
  FrameReader reader(fds_[1], FrameKind::kRequest, {});
  auto one = reader.Next(nullptr, [&] { ++waits; });
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  EXPECT_EQ(waits.load(), 0);  // all there
  auto two = reader.Next(nullptr, [&] { ++waits; });
  writer.join();
  ASSERT_TRUE(two.ok()) << two.status().ToString();
  EXPECT_EQ(two->root<wire::Request>().getSeq(), 2u);
  ASSERT_EQ(two->root<wire::Request>().getBulkData().getData().size(), 3u << 20);
  for (uint8_t v : two->root<wire::Request>().getBulkData().getData()) ASSERT_EQ(v, 2);
  EXPECT_EQ(waits.load(), 1);
}

TEST_F(SocketPairTest, ReaderTellsWhetherAWholeFrameIsBuffered) {
  // The ICD reads replies through a reader and does not wait on the socket for one the reader
  // already holds: HasFrame() must be true exactly when Next() needs no read.
  FrameReader reader(fds_[1], FrameKind::kRequest, {});
  EXPECT_FALSE(reader.HasFrame());
  std::vector<uint8_t> bytes;
  for (auto f : {SeqFrame(1), SeqFrame(2), SeqFrame(3, 64)}) {
    bytes.insert(bytes.end(), f.begin(), f.end());
  }
  const size_t partial = bytes.size() - 40;  // frame 3 lacks its last 40 bytes
  ASSERT_EQ(::write(fds_[0], bytes.data(), partial), static_cast<ssize_t>(partial));
  int waits = 0;
  auto one = reader.Next(nullptr, [&] { ++waits; });
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  EXPECT_EQ(one->root<wire::Request>().getSeq(), 1u);
  EXPECT_TRUE(reader.HasFrame());  // frame 2 came with it
  auto two = reader.Next(nullptr, [&] { ++waits; });
  ASSERT_TRUE(two.ok()) << two.status().ToString();
  EXPECT_EQ(two->root<wire::Request>().getSeq(), 2u);
  EXPECT_EQ(waits, 0);
  EXPECT_FALSE(reader.HasFrame());  // only part of frame 3
  ASSERT_EQ(::write(fds_[0], bytes.data() + partial, 40), 40);
  EXPECT_FALSE(reader.HasFrame());  // its rest is in the socket, not read yet
  auto three = reader.Next(nullptr);
  ASSERT_TRUE(three.ok()) << three.status().ToString();
  EXPECT_EQ(three->root<wire::Request>().getSeq(), 3u);
  EXPECT_FALSE(reader.HasFrame());
  // A header it will refuse counts as a frame: Next() answers it without waiting.
  auto four = SeqFrame(4);
  std::vector<uint8_t> garbage(kHeaderBytes, 0xab);
  four.insert(four.end(), garbage.begin(), garbage.end());
  ASSERT_EQ(::write(fds_[0], four.data(), four.size()), static_cast<ssize_t>(four.size()));
  ASSERT_TRUE(reader.Next(nullptr).ok());
  EXPECT_TRUE(reader.HasFrame());
  auto bad = reader.Next(nullptr);
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.status().code(), StatusCode::kUnavailable);  // refused, not waited for
}

TEST_F(SocketPairTest, ReaderSpinsForTheRequestAfterAnAnswerOnlyWhileRequestsComeQuickly) {
  // The worker's session thread after it answered a blocking call (daemon/session.cc): the next
  // wait first spins by the SpinWait's policy. What is checked is which waits spun and that
  // every frame (and its descriptor) arrives, never how long anything took.
  FrameReader reader(fds_[1], FrameKind::kRequest, {});
  SpinWait spin(std::chrono::seconds(1), /*cpus=*/2);  // at most kMaxBudget (10 ms)
  reader.SpinAfterAnswers(&spin);
  // A wait that follows no answer sleeps at once.
  std::thread late([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    auto f = SeqFrame(1);
    ASSERT_EQ(::write(fds_[0], f.data(), f.size()), static_cast<ssize_t>(f.size()));
  });
  auto one = reader.Next(nullptr);
  late.join();
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  EXPECT_EQ(spin.spins(), 0u);
  // After an answer, the request that comes while the reader spins is read by the spin, with the
  // descriptor sent along with it.
  const int memfd = MarkedMemfd('y');
  reader.ExpectQuiet();
  std::thread soon([&] { SendWithFd(fds_[0], SeqFrame(2, 24), memfd); });
  int fd = -1;
  auto two = reader.Next(&fd);
  soon.join();
  ::close(memfd);
  ASSERT_TRUE(two.ok()) << two.status().ToString();
  EXPECT_EQ(two->root<wire::Request>().getSeq(), 2u);
  EXPECT_EQ(spin.spins(), 1u);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(MarkOf(fd), 'y');
  ::close(fd);
  // Requests that come later than the budget after their answers stop the spinning: after
  // kSlowToStop of them the waits sleep at once. (Each is sent 30 ms after the reader begins to
  // wait, three times the largest budget; a run so loaded that the reader began later than the
  // send counts as quick, and the loop goes on.)
  uint64_t seq = 3;
  for (int i = 0; i < 20 && spin.WillSpin(); ++i, ++seq) {
    reader.ExpectQuiet();
    std::thread slow([&, seq] {
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      auto f = SeqFrame(seq);
      ASSERT_EQ(::write(fds_[0], f.data(), f.size()), static_cast<ssize_t>(f.size()));
    });
    auto m = reader.Next(nullptr);
    slow.join();
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    EXPECT_EQ(m->root<wire::Request>().getSeq(), seq);
  }
  EXPECT_FALSE(spin.WillSpin());
  const uint64_t spun = spin.spins();
  // The next answer's wait does not spin; a quick request after it brings the spinning back.
  reader.ExpectQuiet();
  auto f = SeqFrame(seq);
  ASSERT_EQ(::write(fds_[0], f.data(), f.size()), static_cast<ssize_t>(f.size()));
  ASSERT_TRUE(reader.Next(nullptr).ok());
  EXPECT_EQ(spin.spins(), spun);
  EXPECT_TRUE(spin.WillSpin());
}

TEST_F(SocketPairTest, ReaderWaitsWithinTheSocketsReceiveTimeout) {
  // The reader reads SO_RCVTIMEO once, when it is made: a socket with one gives up waiting.
  timeval tv{0, 50'000};
  ASSERT_EQ(::setsockopt(fds_[1], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)), 0);
  FrameReader reader(fds_[1], FrameKind::kRequest, {});
  int waits = 0;
  EXPECT_EQ(reader.Next(nullptr, [&] { ++waits; }).status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(waits, 1);
}

TEST_F(SocketPairTest, ReaderRejectsABadHeaderAndAFrameOverTheLimit) {
  FrameLimits small;
  small.max_payload_bytes = 1024;
  auto big = SeqFrame(1, 4096);
  ASSERT_EQ(::write(fds_[0], big.data(), big.size()), static_cast<ssize_t>(big.size()));
  FrameReader reader(fds_[1], FrameKind::kRequest, small);
  EXPECT_EQ(reader.Next(nullptr).status().code(), StatusCode::kResourceExhausted);
  auto f = SeqFrame(2);
  ::close(fds_[1]);
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds_), 0);
  ASSERT_EQ(::write(fds_[0], f.data(), f.size()), static_cast<ssize_t>(f.size()));
  FrameReader reply_reader(fds_[1], FrameKind::kReply, {});
  EXPECT_EQ(reply_reader.Next(nullptr).status().code(), StatusCode::kInvalidArgument);
}

// Records the data frames a reader gives it, into memory of its own (or drops them).
class RecordingSink : public DataSink {
 public:
  uint8_t* Place(const DataFrame& f) override {
    placed.push_back(f);
    if (drop) return nullptr;
    if (memory.size() < f.offset + f.bytes) memory.resize(f.offset + f.bytes);
    return memory.data() + f.offset;
  }
  void Placed(const DataFrame& f, bool complete) override {
    done.push_back({f.id, complete});
  }
  bool drop = false;
  std::vector<DataFrame> placed;
  std::vector<std::pair<uint64_t, bool>> done;
  std::vector<uint8_t> memory;
};

std::vector<uint8_t> Pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  std::mt19937 rng(seed);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

TEST_F(SocketPairTest, DataFramesGoStraightToTheSinkBetweenMessages) {
  // A message, a small data frame of an odd length, a 3 MiB one written by another thread in
  // pieces (larger than the reader's buffer: the reader waits inside it), another message.
  const auto small = Pattern(13, 1);
  const auto large = Pattern(3u << 20, 2);
  std::thread writer([&] {
    auto f1 = SeqFrame(1, 10);
    ASSERT_EQ(::write(fds_[0], f1.data(), f1.size()), static_cast<ssize_t>(f1.size()));
    ASSERT_TRUE(WriteDataFrame(fds_[0], {77, 0, 13, false}, small.data()).ok());
    // The large frame through a second socket pair, then relayed slowly.
    int relay[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, relay), 0);
    std::thread inner([&] {
      ASSERT_TRUE(WriteDataFrame(relay[0], {78, 4096, 3u << 20, true}, large.data()).ok());
      ::close(relay[0]);
    });
    std::vector<uint8_t> chunk(100'003);
    for (;;) {
      ssize_t n = ::read(relay[1], chunk.data(), chunk.size());
      if (n <= 0) break;
      ASSERT_EQ(::write(fds_[0], chunk.data(), n), n);
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    inner.join();
    ::close(relay[1]);
    auto f2 = SeqFrame(2, 10);
    ASSERT_EQ(::write(fds_[0], f2.data(), f2.size()), static_cast<ssize_t>(f2.size()));
  });
  FrameReader reader(fds_[1], FrameKind::kRequest, {});
  RecordingSink sink;
  reader.SetDataSink(&sink);
  int waits = 0;
  auto one = reader.Next(nullptr, [&] { ++waits; });
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  EXPECT_EQ(one->root<wire::Request>().getSeq(), 1u);
  // NextOrData stops after each data frame.
  auto d1 = reader.NextOrData(nullptr, [&] { ++waits; });
  ASSERT_TRUE(d1.ok()) << d1.status().ToString();
  EXPECT_FALSE(d1->has_value());
  ASSERT_EQ(sink.placed.size(), 1u);
  EXPECT_EQ(sink.placed[0].id, 77u);
  EXPECT_EQ(sink.placed[0].bytes, 13u);
  EXPECT_FALSE(sink.placed[0].last);
  ASSERT_GE(sink.memory.size(), 13u);
  EXPECT_EQ(std::vector<uint8_t>(sink.memory.begin(), sink.memory.begin() + 13), small);
  // Next goes through the large data frame to the message after it.
  auto two = reader.Next(nullptr, [&] { ++waits; });
  writer.join();
  ASSERT_TRUE(two.ok()) << two.status().ToString();
  EXPECT_EQ(two->root<wire::Request>().getSeq(), 2u);
  ASSERT_EQ(sink.placed.size(), 2u);
  EXPECT_EQ(sink.placed[1].id, 78u);
  EXPECT_EQ(sink.placed[1].offset, 4096u);
  EXPECT_TRUE(sink.placed[1].last);
  ASSERT_EQ(sink.memory.size(), 4096u + (3u << 20));
  EXPECT_TRUE(std::equal(large.begin(), large.end(), sink.memory.begin() + 4096));
  ASSERT_EQ(sink.done.size(), 2u);
  EXPECT_TRUE(sink.done[0].second);
  EXPECT_TRUE(sink.done[1].second);
  EXPECT_GE(waits, 1);
}

TEST_F(SocketPairTest, DroppedDataFramesLeaveTheStreamInStep) {
  const auto data = Pattern(300'001, 3);  // larger than the reader's buffer, odd
  std::thread writer([&] {
    ASSERT_TRUE(WriteDataFrame(fds_[0], {5, 0, 300'001, true}, data.data()).ok());
    auto f = SeqFrame(9, 10);
    ASSERT_EQ(::write(fds_[0], f.data(), f.size()), static_cast<ssize_t>(f.size()));
  });
  FrameReader reader(fds_[1], FrameKind::kRequest, {});
  RecordingSink sink;
  sink.drop = true;
  reader.SetDataSink(&sink);
  auto m = reader.Next(nullptr);
  writer.join();
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->root<wire::Request>().getSeq(), 9u);
  EXPECT_EQ(sink.placed.size(), 1u);
  EXPECT_TRUE(sink.done.empty());  // nothing was placed
}

TEST_F(SocketPairTest, DataFramesAreRefusedWithoutASinkAndWhenMalformed) {
  const auto data = Pattern(64, 4);
  {
    ASSERT_TRUE(WriteDataFrame(fds_[0], {1, 0, 64, false}, data.data()).ok());
    FrameReader reader(fds_[1], FrameKind::kRequest, {});
    EXPECT_EQ(reader.Next(nullptr).status().code(), StatusCode::kInvalidArgument);
  }
  // Hand-made frames: a length that does not match the payload, unknown flags, a payload
  // shorter than the prefix, a frame over the limit.
  auto frame = [](uint32_t payload, uint32_t length, uint32_t flags) {
    std::vector<uint8_t> f(kHeaderBytes + std::max<uint32_t>(payload, 0));
    EncodeHeader({kProtocolVersion, FrameKind::kData, payload}, f.data());
    if (payload >= kDataPrefixBytes) {
      std::memcpy(f.data() + kHeaderBytes + 16, &length, 4);
      std::memcpy(f.data() + kHeaderBytes + 20, &flags, 4);
    }
    return f;
  };
  struct Case {
    std::vector<uint8_t> bytes;
    StatusCode code;
  };
  FrameLimits limit;
  limit.max_payload_bytes = 1024;
  for (const Case& c : {Case{frame(24 + 16, 17, 0), StatusCode::kDataLoss},
                        Case{frame(24 + 16, 8, 0), StatusCode::kDataLoss},
                        Case{frame(24 + 8, 8, 2), StatusCode::kDataLoss},
                        Case{frame(16, 0, 0), StatusCode::kDataLoss},
                        Case{frame(2048, 2024, 0), StatusCode::kResourceExhausted}}) {
    for (int fd : fds_) ::close(fd);
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds_), 0);
    ASSERT_EQ(::write(fds_[0], c.bytes.data(), c.bytes.size()),
              static_cast<ssize_t>(c.bytes.size()));
    FrameReader reader(fds_[1], FrameKind::kRequest, limit);
    RecordingSink sink;
    reader.SetDataSink(&sink);
    EXPECT_EQ(reader.Next(nullptr).status().code(), c.code);
    EXPECT_TRUE(sink.placed.empty());
  }
  // A writer refuses a frame over its limit.
  EXPECT_EQ(WriteDataFrame(fds_[0], {1, 0, 64, false}, data.data(), limit).code(),
            StatusCode::kOk);
  std::vector<uint8_t> big(2048);
  EXPECT_EQ(WriteDataFrame(fds_[0], {1, 0, 2048, false}, big.data(), limit).code(),
            StatusCode::kResourceExhausted);
}

TEST_F(SocketPairTest, DataFrameCutShortIsDataLossAndTheSinkIsTold) {
  const auto data = Pattern(1000, 5);
  int relay[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, relay), 0);
  ASSERT_TRUE(WriteDataFrame(relay[0], {3, 0, 1000, true}, data.data()).ok());
  std::vector<uint8_t> frame(kHeaderBytes + kDataPrefixBytes + 1000);
  ASSERT_EQ(::read(relay[1], frame.data(), frame.size()), static_cast<ssize_t>(frame.size()));
  ::close(relay[0]);
  ::close(relay[1]);
  ASSERT_EQ(::write(fds_[0], frame.data(), 500), 500);
  ::close(fds_[0]);
  fds_[0] = -1;
  FrameReader reader(fds_[1], FrameKind::kRequest, {});
  RecordingSink sink;
  reader.SetDataSink(&sink);
  EXPECT_EQ(reader.Next(nullptr).status().code(), StatusCode::kDataLoss);
  ASSERT_EQ(sink.done.size(), 1u);
  EXPECT_FALSE(sink.done[0].second);
}

}  // namespace
}  // namespace gmux::proto
