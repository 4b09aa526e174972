#include "proto/shm_ring.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "proto/frame.h"

namespace gmux::proto {
namespace {

using Clock = std::chrono::steady_clock;

// A socket pair and a ring over it: `producer` writes on sv[0] (the worker's end), `consumer`
// reads on sv[1] (the client's).
struct Pair {
  int sv[2] = {-1, -1};
  std::unique_ptr<ShmRing> consumer;
  std::unique_ptr<ShmRing> producer;
  int spare_fd = -1;  // a duplicate of the memfd, for tests that play a hostile client

  explicit Pair(size_t capacity = kRingMinBytes, bool keep_fd = false) {
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    int fd = -1;
    auto c = ShmRing::CreateConsumer(capacity, sv[1], &fd);
    EXPECT_TRUE(c.ok()) << c.status().message();
    consumer = std::move(*c);
    if (keep_fd) spare_fd = ::dup(fd);
    auto p = ShmRing::OpenProducer(fd, capacity, sv[0]);
    EXPECT_TRUE(p.ok()) << p.status().message();
    producer = std::move(*p);
  }
  ~Pair() {
    for (int fd : {sv[0], sv[1], spare_fd}) {
      if (fd >= 0) ::close(fd);
    }
  }
};

// The other direction: the client produces (sv[0]), the worker consumes (sv[1]).
struct RequestPair {
  int sv[2] = {-1, -1};
  std::unique_ptr<ShmRing> producer;
  std::unique_ptr<ShmRing> consumer;
  int spare_fd = -1;

  explicit RequestPair(bool keep_fd = false) {
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    int fd = -1;
    auto p = ShmRing::CreateProducer(kRingMinBytes, sv[0], &fd);
    EXPECT_TRUE(p.ok()) << p.status().message();
    producer = std::move(*p);
    if (keep_fd) spare_fd = ::dup(fd);
    auto c = ShmRing::OpenConsumer(fd, kRingMinBytes, sv[1]);
    EXPECT_TRUE(c.ok()) << c.status().message();
    consumer = std::move(*c);
  }
  ~RequestPair() {
    for (int fd : {sv[0], sv[1], spare_fd}) {
      if (fd >= 0) ::close(fd);
    }
  }
};

Status WriteBytes(ShmRing& r, const uint8_t* p, size_t n, Clock::time_point until) {
  iovec iov{const_cast<uint8_t*>(p), n};
  size_t first = 0;
  return r.Write(&iov, 1, &first, until);
}

TEST(ShmRingTest, StreamsBytesInOrderAcrossTheWrap) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Pair pair;
  std::vector<uint8_t> sent(4u << 20);
  std::mt19937 rng(seed);
  for (auto& b : sent) b = static_cast<uint8_t>(rng());
  std::thread producer([&] {
    std::mt19937 r(seed + 1);
    size_t at = 0;
    while (at < sent.size()) {
      // Several entries per write, some empty, some larger than the ring.
      std::vector<iovec> iov;
      for (int k = 0; k < 3 && at < sent.size(); ++k) {
        const size_t n = std::min<size_t>(sent.size() - at, r() % 3 == 0 ? 0 : r() % 100000);
        iov.push_back({sent.data() + at, n});
        at += n;
      }
      size_t first = 0;
      ASSERT_TRUE(pair.producer->Write(iov.data(), iov.size(), &first, Clock::time_point::max())
                      .ok());
      ASSERT_EQ(first, iov.size());
    }
  });
  std::vector<uint8_t> got;
  std::mt19937 r(seed + 2);
  while (got.size() < sent.size()) {
    std::vector<uint8_t> chunk(1 + r() % 70000);
    auto n = pair.consumer->Read(chunk.data(), chunk.size());
    ASSERT_TRUE(n.ok());
    if (*n == 0) {
      bool closed = false;
      ASSERT_TRUE(pair.consumer->WaitReadable(-1, &closed));
      continue;
    }
    got.insert(got.end(), chunk.begin(), chunk.begin() + static_cast<long>(*n));
  }
  producer.join();
  EXPECT_TRUE(got == sent);
}

TEST(ShmRingTest, ASleepingReaderIsWokenByTheDoorbell) {
  Pair pair;
  std::atomic<bool> woke{false};
  std::thread reader([&] {
    bool closed = false;
    woke = pair.consumer->WaitReadable(-1, &closed);
  });
  const uint8_t byte = 42;
  ASSERT_TRUE(WriteBytes(*pair.producer, &byte, 1, Clock::time_point::max()).ok());
  reader.join();
  EXPECT_TRUE(woke);
  uint8_t out = 0;
  auto n = pair.consumer->Read(&out, 1);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 1u);
  EXPECT_EQ(out, 42);
}

TEST(ShmRingTest, AWriteThatMayNotWaitTakesWhatFits) {
  Pair pair;
  std::vector<uint8_t> big(kRingMinBytes + 1000, 7);
  iovec iov{big.data(), big.size()};
  size_t first = 0;
  ASSERT_TRUE(pair.producer->Write(&iov, 1, &first, Clock::time_point::min()).ok());
  EXPECT_EQ(first, 0u);
  EXPECT_EQ(iov.iov_len, 1000u);  // the rest, for the caller to keep
  // A bounded wait gives up at its deadline with the rest still unwritten.
  ASSERT_TRUE(pair.producer
                  ->Write(&iov, 1, &first, Clock::now() + std::chrono::milliseconds(20))
                  .ok());
  EXPECT_EQ(iov.iov_len, 1000u);
  std::vector<uint8_t> out(kRingMinBytes);
  auto n = pair.consumer->Read(out.data(), out.size());
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, kRingMinBytes);
  ASSERT_TRUE(pair.producer->Write(&iov, 1, &first, Clock::time_point::min()).ok());
  EXPECT_EQ(first, 1u);
}

TEST(ShmRingTest, AReadPositionOutsideTheStreamEndsTheSession) {
  Pair pair(kRingMinBytes, /*keep_fd=*/true);
  // The client scribbles on the ring's header (its read position) from its own mapping.
  void* p = ::mmap(nullptr, kRingHeaderBytes, PROT_READ | PROT_WRITE, MAP_SHARED,
                   pair.spare_fd, 0);
  ASSERT_NE(p, MAP_FAILED);
  const uint64_t bogus = 1ull << 40;
  std::memcpy(static_cast<uint8_t*>(p) + 128, &bogus, sizeof(bogus));
  const uint8_t byte = 1;
  Status s = WriteBytes(*pair.producer, &byte, 1, Clock::time_point::max());
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.message();
  // The socket is shut: the worker's reader (and the client) see the end.
  char c;
  EXPECT_EQ(::recv(pair.sv[1], &c, 1, 0), 0);
  ::munmap(p, kRingHeaderBytes);
}

TEST(ShmRingTest, TheConsumerSeesWhichCpuTheProducerWroteFrom) {
  RequestPair pair(/*keep_fd=*/true);
  EXPECT_EQ(pair.consumer->ProducerCpu(), -1) << "nothing written yet";
  std::thread producer([&] {
    cpu_set_t allowed;
    CPU_ZERO(&allowed);
    ASSERT_EQ(::sched_getaffinity(0, sizeof(allowed), &allowed), 0);
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
      if (!CPU_ISSET(cpu, &allowed)) continue;
      cpu_set_t one;
      CPU_ZERO(&one);
      CPU_SET(cpu, &one);
      ASSERT_EQ(::sched_setaffinity(0, sizeof(one), &one), 0);
      const uint8_t byte = 7;
      ASSERT_TRUE(WriteBytes(*pair.producer, &byte, 1, Clock::time_point::max()).ok());
      EXPECT_EQ(pair.consumer->ProducerCpu(), cpu);
      uint8_t got = 0;
      ASSERT_EQ(*pair.consumer->Read(&got, 1), 1u);
    }
  });
  producer.join();
  // A reply ring's producer (the worker) says nothing: its client has no use for it.
  Pair replies;
  const uint8_t byte = 7;
  ASSERT_TRUE(WriteBytes(*replies.producer, &byte, 1, Clock::time_point::max()).ok());
  EXPECT_EQ(replies.consumer->ProducerCpu(), -1);
  // The client controls the word: a value that is no CPU number reads as unknown.
  void* p = ::mmap(nullptr, kRingHeaderBytes, PROT_READ | PROT_WRITE, MAP_SHARED,
                   pair.spare_fd, 0);
  ASSERT_NE(p, MAP_FAILED);
  for (uint32_t bogus : {0u, static_cast<uint32_t>(CPU_SETSIZE) + 1, 0xFFFFFFFFu}) {
    std::memcpy(static_cast<uint8_t*>(p) + 320, &bogus, sizeof(bogus));
    EXPECT_EQ(pair.consumer->ProducerCpu(), -1) << bogus;
  }
  ::munmap(p, kRingHeaderBytes);
}

TEST(ShmRingTest, CloseEndsAWriterWaitingForRoom) {
  Pair pair;
  std::vector<uint8_t> big(2 * kRingMinBytes, 1);
  Status s = Status::Ok();
  std::thread writer([&] { s = WriteBytes(*pair.producer, big.data(), big.size(),
                                          Clock::time_point::max()); });
  pair.producer->Close();
  writer.join();
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
}

TEST(ShmRingTest, TheReaderSeesTheWriterGoAfterWhatItWrote) {
  Pair pair;
  const uint8_t bytes[3] = {1, 2, 3};
  ASSERT_TRUE(WriteBytes(*pair.producer, bytes, 3, Clock::time_point::max()).ok());
  ::close(pair.sv[0]);
  pair.sv[0] = -1;
  bool closed = false;
  EXPECT_TRUE(pair.consumer->WaitReadable(-1, &closed));
  uint8_t out[3];
  ASSERT_EQ(*pair.consumer->Read(out, 3), 3u);
  EXPECT_FALSE(pair.consumer->WaitReadable(-1, &closed));
  EXPECT_TRUE(closed);
}

TEST(ShmRingTest, AWaitWithATimeoutEnds) {
  Pair pair;
  bool closed = false;
  EXPECT_FALSE(pair.consumer->WaitReadable(10, &closed));
  EXPECT_FALSE(closed);
}

TEST(ShmRingTest, TheWorkerRefusesRingsItCannotTrust) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  // Not sealed against shrinking: the client could make the worker fault.
  int fd = ::memfd_create("t", MFD_ALLOW_SEALING);
  ASSERT_EQ(::ftruncate(fd, kRingHeaderBytes + kRingMinBytes), 0);
  EXPECT_FALSE(ShmRing::OpenProducer(fd, kRingMinBytes, sv[0]).ok());
  // Smaller than the capacity it claims.
  fd = ::memfd_create("t", MFD_ALLOW_SEALING);
  ASSERT_EQ(::ftruncate(fd, kRingHeaderBytes + kRingMinBytes), 0);
  ASSERT_EQ(::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
  EXPECT_FALSE(ShmRing::OpenProducer(fd, 2 * kRingMinBytes, sv[0]).ok());
  // Capacities that are not a power of two, or out of bounds.
  for (size_t cap : {kRingMinBytes + 8, kRingMinBytes / 2, 2 * kRingMaxBytes, size_t{0}}) {
    int pass = -1;
    EXPECT_FALSE(ShmRing::CreateConsumer(cap, sv[1], &pass).ok()) << cap;
    fd = ::memfd_create("t", MFD_ALLOW_SEALING);
    ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(kRingHeaderBytes + 4 * kRingMaxBytes)), 0);
    ASSERT_EQ(::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
    EXPECT_FALSE(ShmRing::OpenProducer(fd, cap, sv[0]).ok()) << cap;
  }
  ::close(sv[0]);
  ::close(sv[1]);
}

// Frames through the ring read as they would through the socket, data frames (larger than the
// ring) included.
class CollectSink : public DataSink {
 public:
  uint8_t* Place(const DataFrame& f) override {
    if (got.size() < f.offset + f.bytes) got.resize(f.offset + f.bytes);
    return got.data() + f.offset;
  }
  void Placed(const DataFrame& f, bool complete) override { last = complete && f.last; }
  std::vector<uint8_t> got;
  bool last = false;
};

TEST(ShmRingTest, AFrameReaderReadsFramesThroughTheRing) {
  Pair pair;
  std::vector<uint8_t> data(3 * kRingMinBytes + 5);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 7);
  std::thread writer([&] {
    Outlet out{pair.sv[0], pair.producer.get()};
    for (uint64_t seq = 1; seq <= 50; ++seq) {
      capnp::MallocMessageBuilder b;
      auto r = b.initRoot<wire::Reply>();
      r.setSeq(seq);
      r.setMessage(std::string(seq * 100, 'x'));
      ASSERT_TRUE(WriteFrame(out, FrameKind::kReply, b).ok());
    }
    ASSERT_TRUE(WriteDataFrame(out, {99, 0, static_cast<uint32_t>(data.size()), true},
                               data.data())
                    .ok());
  });
  FrameReader reader(pair.sv[1], FrameKind::kReply, {});
  CollectSink sink;
  reader.SetDataSink(&sink);
  ASSERT_TRUE(reader.ReadFromRing(pair.consumer.get()).ok());
  for (uint64_t seq = 1; seq <= 50; ++seq) {
    auto m = reader.Next(nullptr);
    ASSERT_TRUE(m.ok()) << m.status().message();
    EXPECT_EQ(m->root<wire::Reply>().getSeq(), seq);
    EXPECT_EQ(m->root<wire::Reply>().getMessage().size(), seq * 100);
  }
  auto d = reader.NextOrData(nullptr);
  ASSERT_TRUE(d.ok());
  EXPECT_FALSE(d->has_value());
  EXPECT_TRUE(sink.last);
  EXPECT_TRUE(sink.got == data);
  writer.join();
  // The worker goes: the reader says the stream ended, as a socket's would.
  ::close(pair.sv[0]);
  pair.sv[0] = -1;
  auto end = reader.Next(nullptr);
  EXPECT_EQ(end.status().code(), StatusCode::kUnavailable);
}

// A request ring: frames with a descriptor get theirs (sent on the socket just before), in
// order, among frames without one and data frames larger than the ring; the worker's reader
// sleeps between bursts and is woken by doorbells.
TEST(ShmRingTest, RequestsComeThroughTheRingWithTheirDescriptors) {
  RequestPair pair;
  constexpr uint64_t kFrames = 60;
  std::vector<uint8_t> data(2 * kRingMinBytes + 3);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 13);
  std::thread writer([&] {
    Outlet out{pair.sv[0], pair.producer.get()};
    for (uint64_t seq = 1; seq <= kFrames; ++seq) {
      capnp::MallocMessageBuilder b;
      auto r = b.initRoot<wire::Request>();
      r.setSeq(seq);
      r.setStats();
      int fd = -1;
      if (seq % 3 == 0) {
        // Named by its size: 4 KiB times the frame's seq.
        fd = ::memfd_create("passed", MFD_CLOEXEC);
        ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(seq * 4096)), 0);
      }
      ASSERT_TRUE(WriteFrame(out, FrameKind::kRequest, b, {}, fd).ok());
      if (fd >= 0) ::close(fd);
      if (seq == kFrames / 2) {
        ASSERT_TRUE(WriteDataFrame(out, {7, 0, static_cast<uint32_t>(data.size()), true},
                                   data.data())
                        .ok());
      }
      // Now and then a pause, so the reader sleeps and needs the doorbell.
      if (seq % 10 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  FrameReader reader(pair.sv[1], FrameKind::kRequest, {});
  CollectSink sink;
  reader.SetDataSink(&sink);
  ASSERT_TRUE(reader.ReadFromRing(pair.consumer.get()).ok());
  for (uint64_t seq = 1; seq <= kFrames; ++seq) {
    int fd = -2;
    auto m = reader.Next(&fd);
    ASSERT_TRUE(m.ok()) << m.status().message();
    EXPECT_EQ(m->root<wire::Request>().getSeq(), seq);
    if (seq % 3 == 0) {
      ASSERT_GE(fd, 0) << seq;
      struct stat st {};
      ASSERT_EQ(::fstat(fd, &st), 0);
      EXPECT_EQ(static_cast<uint64_t>(st.st_size), seq * 4096) << "another frame's descriptor";
      ::close(fd);
    } else {
      EXPECT_EQ(fd, -1) << seq;
    }
  }
  writer.join();
  EXPECT_TRUE(sink.last);
  EXPECT_TRUE(sink.got == data);
}

// What a hostile client can do to its worker's ring: a frame that says it has a descriptor and
// sent none gets none (and the stream goes on); a write position outside the stream is a
// broken ring, never a read outside the mapping.
TEST(ShmRingTest, AClientBreakingItsRequestRingHarmsOnlyItsSession) {
  RequestPair pair(/*keep_fd=*/true);
  {
    capnp::MallocMessageBuilder b;
    b.initRoot<wire::Request>().setSeq(5);
    auto bytes = EncodeFrame(FrameKind::kRequest, b);
    ASSERT_TRUE(bytes.ok());
    (*bytes)[12] = kFrameFlagDescriptor;  // flagged, yet nothing on the socket
    ASSERT_TRUE(WriteAll(Outlet(pair.sv[0], pair.producer.get()), *bytes).ok());
  }
  FrameReader reader(pair.sv[1], FrameKind::kRequest, {});
  ASSERT_TRUE(reader.ReadFromRing(pair.consumer.get()).ok());
  int fd = -2;
  auto m = reader.Next(&fd);
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(m->root<wire::Request>().getSeq(), 5u);
  EXPECT_EQ(fd, -1);
  void* p = ::mmap(nullptr, kRingHeaderBytes, PROT_READ | PROT_WRITE, MAP_SHARED,
                   pair.spare_fd, 0);
  ASSERT_NE(p, MAP_FAILED);
  for (uint64_t bogus : {uint64_t{1} << 40, uint64_t{0}}) {
    std::memcpy(static_cast<uint8_t*>(p) + 64, &bogus, sizeof(bogus));  // the write position
    uint8_t out[16];
    auto n = pair.consumer->Read(out, sizeof(out));
    EXPECT_EQ(n.status().code(), StatusCode::kDataLoss) << bogus;
  }
  ::munmap(p, kRingHeaderBytes);
}

// The client's writer waiting for room in a full ring stops when its worker goes (the socket
// says so), instead of waiting for ever.
TEST(ShmRingTest, AWriterWaitingForRoomStopsWhenTheReaderGoes) {
  RequestPair pair;
  std::vector<uint8_t> big(2 * kRingMinBytes, 1);
  Status s = Status::Ok();
  std::thread writer([&] {
    s = WriteBytes(*pair.producer, big.data(), big.size(), Clock::time_point::max());
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  pair.consumer.reset();
  ::close(pair.sv[1]);
  pair.sv[1] = -1;
  writer.join();
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.message();
}

TEST(ShmRingTest, TheWorkerRefusesRequestRingsItCannotTrust) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  int fd = ::memfd_create("t", MFD_ALLOW_SEALING);  // not sealed against shrinking
  ASSERT_EQ(::ftruncate(fd, kRingHeaderBytes + kRingMinBytes), 0);
  EXPECT_FALSE(ShmRing::OpenConsumer(fd, kRingMinBytes, sv[1]).ok());
  fd = ::memfd_create("t", MFD_ALLOW_SEALING);
  ASSERT_EQ(::ftruncate(fd, kRingHeaderBytes + kRingMinBytes), 0);
  ASSERT_EQ(::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
  EXPECT_FALSE(ShmRing::OpenConsumer(fd, 2 * kRingMinBytes, sv[1]).ok());  // smaller than said
  ::close(sv[0]);
  ::close(sv[1]);
}

}  // namespace
}  // namespace gmux::proto
