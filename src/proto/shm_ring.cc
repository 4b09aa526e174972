#include "proto/shm_ring.h"

#include "common/sealed_memfd.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <string>

namespace gmux::proto {

struct ShmRing::Header {
  uint64_t magic;
  uint64_t capacity;
  alignas(64) std::atomic<uint64_t> head;
  alignas(64) std::atomic<uint64_t> tail;
  alignas(64) std::atomic<uint32_t> consumer_sleeping;
  alignas(64) std::atomic<uint32_t> producer_waiting;
  std::atomic<uint32_t> space_seq;
  alignas(64) std::atomic<uint32_t> producer_cpu;  // the producer's CPU + 1; 0: not said
};
static_assert(sizeof(std::atomic<uint64_t>) == 8 && std::atomic<uint64_t>::is_always_lock_free);
static_assert(std::atomic<uint32_t>::is_always_lock_free);

namespace {

bool PowerOfTwoWithin(size_t n) {
  return n >= kRingMinBytes && n <= kRingMaxBytes && (n & (n - 1)) == 0;
}

std::string Failed(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

// Waits while *word == expected, at most `timeout` (the word is in memory shared with another
// process: not FUTEX_PRIVATE).
void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::nanoseconds timeout) {
  timespec ts{static_cast<time_t>(timeout.count() / 1000000000),
              static_cast<long>(timeout.count() % 1000000000)};
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void FutexWakeAll(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr,
            0);
}

// A producer waiting for room looks at the ring at least this often, whatever the consumer
// does: a consumer that never wakes it delays only its own replies.
constexpr std::chrono::milliseconds kSpaceWaitSlice{10};

}  // namespace

Result<std::unique_ptr<ShmRing>> ShmRing::Create(const char* what, const char* memfd_name,
                                                size_t capacity, int socket, int* pass_fd) {
  *pass_fd = -1;
  if (!PowerOfTwoWithin(capacity)) {
    return InvalidArgument(std::string(what) + " capacity out of bounds");
  }
  int fd = ::memfd_create(memfd_name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return Unavailable(Failed("memfd_create"));
  const size_t bytes = kRingHeaderBytes + capacity;
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0 ||
      ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    Status s = Unavailable(Failed(what));
    ::close(fd);
    return s;
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    Status s = ResourceExhausted(Failed((std::string("mmap ") + what).c_str()));
    ::close(fd);
    return s;
  }
  auto r = std::unique_ptr<ShmRing>(new ShmRing(what));
  r->map_ = p;
  r->map_bytes_ = bytes;
  r->capacity_ = capacity;
  r->socket_ = socket;
  r->header()->magic = kRingMagic;
  r->header()->capacity = capacity;
  *pass_fd = fd;
  return r;
}

Result<std::unique_ptr<ShmRing>> ShmRing::Open(const char* what, int fd, size_t capacity,
                                              int socket) {
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  if (!PowerOfTwoWithin(capacity)) {
    return InvalidArgument(std::string(what) + " of " + std::to_string(capacity) +
                           " bytes: a power of two from " + std::to_string(kRingMinBytes) +
                           " to " + std::to_string(kRingMaxBytes) + " expected");
  }
  const size_t bytes = kRingHeaderBytes + capacity;
  GMUX_RETURN_IF_ERROR(CheckSealedMemfd(fd, bytes, what, "its capacity"));
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return ResourceExhausted(Failed((std::string("mmap ") + what).c_str()));
  auto r = std::unique_ptr<ShmRing>(new ShmRing(what));
  r->map_ = p;
  r->map_bytes_ = bytes;
  r->capacity_ = capacity;
  r->socket_ = socket;
  if (r->header()->head.load() != 0 || r->header()->tail.load() != 0) {
    return InvalidArgument(std::string(what) + " already in use");
  }
  return r;
}

Result<std::unique_ptr<ShmRing>> ShmRing::CreateConsumer(size_t capacity, int socket,
                                                         int* pass_fd) {
  return Create("reply ring", "gmux-replies", capacity, socket, pass_fd);
}

Result<std::unique_ptr<ShmRing>> ShmRing::OpenProducer(int fd, size_t capacity, int socket) {
  return Open("reply ring", fd, capacity, socket);
}

Result<std::unique_ptr<ShmRing>> ShmRing::CreateProducer(size_t capacity, int socket,
                                                         int* pass_fd) {
  auto ring = Create("request ring", "gmux-requests", capacity, socket, pass_fd);
  if (ring.ok()) (*ring)->says_cpu_ = true;
  return ring;
}

Result<std::unique_ptr<ShmRing>> ShmRing::OpenConsumer(int fd, size_t capacity, int socket) {
  return Open("request ring", fd, capacity, socket);
}

ShmRing::~ShmRing() {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
  for (int fd : passed_) ::close(fd);
}

void ShmRing::Doorbell() {
  if (header()->consumer_sleeping.exchange(0) == 0) return;
  // Never waits: a socket full of doorbells wakes the consumer as well as one more would.
  const char bell = 1;
  while (::send(socket_, &bell, 1, MSG_DONTWAIT | MSG_NOSIGNAL) < 0 && errno == EINTR) {
  }
}

Status ShmRing::Write(iovec* iov, size_t count, size_t* first,
                      std::chrono::steady_clock::time_point wait_until) {
  Header* h = header();
  for (;;) {
    while (*first < count && iov[*first].iov_len == 0) ++*first;
    if (closed_.load(std::memory_order_relaxed)) {
      return Unavailable(std::string(what_) + " closed");
    }
    const uint64_t tail = h->tail.load(std::memory_order_acquire);
    if (tail > position_ || position_ - tail > capacity_) {
      // The session ends: its reader sees the socket close.
      closed_ = true;
      ::shutdown(socket_, SHUT_RDWR);
      return DataLoss(std::string(what_) +
                      " broken: the peer's read position is outside the stream");
    }
    size_t room = capacity_ - static_cast<size_t>(position_ - tail);
    bool wrote = false;
    while (*first < count && room > 0) {
      iovec& v = iov[*first];
      const size_t n = std::min(v.iov_len, room);
      const size_t at = static_cast<size_t>(position_ & (capacity_ - 1));
      const size_t part = std::min(n, capacity_ - at);
      const auto* src = static_cast<const uint8_t*>(v.iov_base);
      std::memcpy(data() + at, src, part);
      if (part < n) std::memcpy(data(), src + part, n - part);
      position_ += n;
      room -= n;
      wrote = true;
      if (n == v.iov_len) {
        ++*first;
        while (*first < count && iov[*first].iov_len == 0) ++*first;
      } else {
        v.iov_base = const_cast<uint8_t*>(src) + n;
        v.iov_len -= n;
      }
    }
    if (wrote) {
      // Where the client runs (its worker keeps its own threads off that CPU:
      // common/cpu_apart.h). Written only when it changed, so the line stays in both caches.
      const int cpu = says_cpu_ ? ::sched_getcpu() : -1;
      if (cpu >= 0 && cpu != cpu_) {
        cpu_ = cpu;
        h->producer_cpu.store(static_cast<uint32_t>(cpu) + 1, std::memory_order_relaxed);
      }
      // seq_cst on both sides (here and in WaitReadable): the consumer either sees the bytes
      // before it sleeps or has said it sleeps before they were published.
      h->head.store(position_, std::memory_order_seq_cst);
      if (h->consumer_sleeping.load(std::memory_order_seq_cst) != 0) Doorbell();
    }
    if (*first == count) return Status::Ok();
    const auto now = std::chrono::steady_clock::now();
    if (now >= wait_until) return Status::Ok();
    const uint32_t seen = h->space_seq.load(std::memory_order_acquire);
    h->producer_waiting.store(1, std::memory_order_seq_cst);
    if (h->tail.load(std::memory_order_seq_cst) != tail || closed_.load()) continue;
    FutexWait(&h->space_seq, seen,
              std::min<std::chrono::nanoseconds>(wait_until - now, kSpaceWaitSlice));
    if (h->tail.load(std::memory_order_acquire) == tail && PeerGone()) {
      closed_ = true;
      return Unavailable(std::string(what_) + ": the peer is gone");
    }
  }
}

void ShmRing::Close() {
  closed_ = true;
  header()->space_seq.fetch_add(1);
  FutexWakeAll(&header()->space_seq);
}

Result<size_t> ShmRing::Read(uint8_t* to, size_t n) {
  Header* h = header();
  const uint64_t head = h->head.load(std::memory_order_acquire);
  if (head < position_ || head - position_ > capacity_) {
    return DataLoss(std::string(what_) +
                    " broken: the peer's write position is outside the stream");
  }
  const size_t m = std::min(n, static_cast<size_t>(head - position_));
  if (m == 0) return size_t{0};
  if (to != nullptr) {
    const size_t at = static_cast<size_t>(position_ & (capacity_ - 1));
    const size_t part = std::min(m, capacity_ - at);
    std::memcpy(to, data() + at, part);
    if (part < m) std::memcpy(to + part, data(), m - part);
  }
  position_ += m;
  h->tail.store(position_, std::memory_order_seq_cst);
  if (h->producer_waiting.load(std::memory_order_seq_cst) != 0) {
    h->producer_waiting.store(0);
    h->space_seq.fetch_add(1);
    FutexWakeAll(&h->space_seq);
  }
  return m;
}

bool ShmRing::Readable() const {
  return header()->head.load(std::memory_order_acquire) != position_;
}

int ShmRing::ProducerCpu() const {
  const uint32_t v = header()->producer_cpu.load(std::memory_order_relaxed);
  return v == 0 || v > CPU_SETSIZE ? -1 : static_cast<int>(v - 1);
}

bool ShmRing::WaitReadable(int timeout_ms, bool* closed) {
  *closed = false;
  Header* h = header();
  const auto deadline = timeout_ms < 0 ? std::chrono::steady_clock::time_point::max()
                                       : std::chrono::steady_clock::now() +
                                             std::chrono::milliseconds(timeout_ms);
  for (;;) {
    h->consumer_sleeping.store(1, std::memory_order_seq_cst);
    if (h->head.load(std::memory_order_seq_cst) != position_) {
      h->consumer_sleeping.store(0, std::memory_order_relaxed);
      return true;
    }
    int wait_ms = -1;
    if (timeout_ms >= 0) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      wait_ms = static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(left.count(), INT_MAX)));
    }
    pollfd p{socket_, POLLIN, 0};
    const int r = ::poll(&p, 1, wait_ms);
    if (r < 0 && errno != EINTR) {
      *closed = true;
    } else if (r > 0) {
      // Doorbells carry nothing: one read takes every bell there is (a stream socket, and the
      // producer rings once per sleep). Reading on until EAGAIN cost a system call on every
      // wait; a bell rung after this read makes a later poll return at once and is taken then.
      // The end of the stream means the producer is gone.
      if (!DrainSocket()) *closed = true;
    }
    h->consumer_sleeping.store(0, std::memory_order_relaxed);
    if (Readable()) return true;
    if (*closed) return false;
    if (r == 0 && timeout_ms >= 0 && std::chrono::steady_clock::now() >= deadline) return false;
  }
}

bool ShmRing::DrainSocket() {
  char bells[256];
  for (;;) {
    iovec iov{bells, sizeof(bells)};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)];
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    const ssize_t k = ::recvmsg(socket_, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (k < 0 && errno == EINTR) continue;
    if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) return false;
    if (k < 0) return true;
    ForEachKeptDescriptor(msg, [&](int fd) {
      if (passed_.size() < kMaxPassedFds) {
        passed_.push_back(fd);
      } else {
        ::close(fd);
      }
    });
    return true;
  }
}

int ShmRing::TakePassedFd() {
  // A read stops after the byte a descriptor came with: read until one is there or the
  // socket has nothing more.
  for (int reads = 0; passed_.empty() && reads < 64; ++reads) {
    pollfd p{socket_, POLLIN, 0};
    if (::poll(&p, 1, 0) <= 0 || (p.revents & POLLIN) == 0) break;
    if (!DrainSocket()) break;
  }
  if (passed_.empty()) return -1;
  const int fd = passed_.front();
  passed_.pop_front();
  return fd;
}

bool ShmRing::PeerGone() const {
  pollfd p{socket_, POLLRDHUP, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

}  // namespace gmux::proto
