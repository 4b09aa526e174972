#include "proto/frame.h"

#include "common/sealed_memfd.h"
#include "proto/shm_ring.h"
#include "proto/spin_wait.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <kj/exception.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

namespace gmux::proto {
namespace {

uint32_t LoadU32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
         static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
}
uint16_t LoadU16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | p[1] << 8);
}
void StoreU32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void StoreU16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
}

std::string ErrnoText(int err) { return std::string(std::strerror(err)); }

// Reads exactly n bytes. Returns the number read before EOF (< n on EOF) or an error.
Result<size_t> ReadFully(int fd, void* buf, size_t n) {
  auto* p = static_cast<uint8_t*>(buf);
  size_t got = 0;
  while (got < n) {
    ssize_t r = ::read(fd, p + got, n - got);
    if (r > 0) {
      got += static_cast<size_t>(r);
    } else if (r == 0) {
      return got;
    } else if (errno == EINTR) {
      continue;
    } else if (errno == ECONNRESET) {
      return got;
    } else {
      return Unavailable("read: " + ErrnoText(errno));
    }
  }
  return got;
}

// `fd`'s SO_RCVTIMEO in milliseconds (rounded up), or -1 when it has none.
int ReceiveTimeoutMs(int fd) {
  timeval tv{};
  socklen_t len = sizeof(tv);
  if (::getsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, &len) == 0 &&
      (tv.tv_sec != 0 || tv.tv_usec != 0)) {
    return static_cast<int>(tv.tv_sec * 1000 + (tv.tv_usec + 999) / 1000);
  }
  return -1;
}

// A timeout for WaitReadable: the socket's own SO_RCVTIMEO, read when a wait begins.
constexpr int kSocketTimeout = -2;

// Waits until `fd` is readable, within `timeout_ms` (-1: no limit; kSocketTimeout: the socket's
// SO_RCVTIMEO); false (errno EAGAIN) when that passed. A thread blocked in read() on a Unix
// stream socket is woken each time its peer reads what this side sent (the kernel's write-space
// wake-up does not say what it is for); poll() sleeps through those: one wake-up per message
// instead of two.
bool WaitReadable(int fd, int timeout_ms) {
  if (timeout_ms == kSocketTimeout) timeout_ms = ReceiveTimeoutMs(fd);
  pollfd p{fd, POLLIN, 0};
  for (;;) {
    int r = ::poll(&p, 1, timeout_ms);
    if (r > 0) return true;  // readable, or an error or hang-up the read reports
    if (r == 0) {
      errno = EAGAIN;
      return false;
    }
    if (errno != EINTR) return true;  // let the read say what is wrong
  }
}

// How RecvSome treats a socket with nothing to read: return at once, wait (in poll), or wait
// without trying first (the caller has just found it empty: one recvmsg fewer per wait).
enum class Wait { kNo, kYes, kPollFirst };

// RecvSome's answer when told not to wait and nothing has arrived.
constexpr size_t kNothingYet = SIZE_MAX;

// One recvmsg of what has arrived on `fd`, at most `n` bytes into `buf`: the bytes read, 0 at
// the end of the stream (a reset included), kNothingYet when nothing is there and `wait` is
// Wait::kNo. Each descriptor passed with the bytes goes to `on_fd(fd, bytes read)`, which owns it.
// What is there is taken at once; otherwise the wait is in poll() (WaitReadable).
// `timeout_ms` bounds each wait (as WaitReadable's).
template <typename OnFd>
Result<size_t> RecvSome(int fd, uint8_t* buf, size_t n, Wait wait, int timeout_ms,
                        const OnFd& on_fd) {
  if (wait == Wait::kPollFirst && !WaitReadable(fd, timeout_ms)) {
    return Unavailable("recvmsg: " + ErrnoText(errno));
  }
  for (;;) {
    iovec iov{buf, n};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)];
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    ssize_t r = ::recvmsg(fd, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (wait == Wait::kNo) return kNothingYet;
        if (!WaitReadable(fd, timeout_ms)) return Unavailable("recvmsg: " + ErrnoText(errno));
        continue;
      }
      if (errno == ECONNRESET) return size_t{0};
      return Unavailable("recvmsg: " + ErrnoText(errno));
    }
    ForEachKeptDescriptor(msg, [&](int passed) { on_fd(passed, static_cast<size_t>(r)); });
    return static_cast<size_t>(r);
  }
}

// RecvSome from the socket, or with `ring`, from the ring (which passes no descriptors; the
// socket then brings only doorbells, and its end the end of the stream once the ring is empty).
template <typename OnFd>
Result<size_t> RecvFrom(int fd, ShmRing* ring, uint8_t* buf, size_t n, Wait wait, int timeout_ms,
                        const OnFd& on_fd) {
  if (ring == nullptr) return RecvSome(fd, buf, n, wait, timeout_ms, on_fd);
  for (;;) {
    GMUX_ASSIGN_OR_RETURN(size_t got, ring->Read(buf, n));
    if (got > 0) return got;
    if (wait == Wait::kNo) return kNothingYet;
    bool closed = false;
    if (!ring->WaitReadable(timeout_ms, &closed)) {
      if (closed) return size_t{0};
      return Unavailable("reply ring: " + ErrnoText(EAGAIN));
    }
  }
}

// Reads exactly n bytes (ReadFully), from `ring` when there is one.
Result<size_t> ReadFullyFrom(int fd, ShmRing* ring, uint8_t* buf, size_t n, int timeout_ms) {
  if (ring == nullptr) return ReadFully(fd, buf, n);
  size_t got = 0;
  while (got < n) {
    GMUX_ASSIGN_OR_RETURN(size_t r, RecvFrom(fd, ring, buf + got, n - got, Wait::kYes, timeout_ms,
                                             [](int, size_t) {}));
    if (r == 0) break;
    got += r;
  }
  return got;
}

// Reads the header with recvmsg so a descriptor passed with the frame is received (the kernel
// delivers it with the frame's first byte). Every descriptor but the first kept one is closed.
Result<size_t> ReadHeader(int fd, uint8_t* buf, size_t n, int* fd_out) {
  size_t got = 0;
  auto keep_first = [&](int passed, size_t) {
    if (fd_out != nullptr && *fd_out < 0) {
      *fd_out = passed;
    } else {
      ::close(passed);
    }
  };
  while (got < n) {
    GMUX_ASSIGN_OR_RETURN(const size_t r,
                          RecvSome(fd, buf + got, n - got, Wait::kYes, kSocketTimeout,
                                   keep_first));
    if (r == 0) return got;
    got += r;
  }
  return got;
}

}  // namespace

Status FrameLimits::Validate() const {
  if (max_payload_bytes < 64 || max_payload_bytes % 8 != 0) {
    return InvalidArgument("max_payload_bytes must be a multiple of 8 and at least 64");
  }
  if (nesting_limit < 4) return InvalidArgument("nesting_limit must be at least 4");
  if (traversal_factor < 2) return InvalidArgument("traversal_factor must be at least 2");
  return Status::Ok();
}

void EncodeHeader(const FrameHeader& header, uint8_t out[kHeaderBytes]) {
  StoreU32(out, kMagic);
  StoreU16(out + 4, header.version);
  StoreU16(out + 6, static_cast<uint16_t>(header.kind));
  StoreU32(out + 8, header.payload_bytes);
  StoreU32(out + 12, header.flags);
}

Result<FrameHeader> DecodeHeader(std::span<const uint8_t> bytes, const FrameLimits& limits) {
  if (bytes.size() < kHeaderBytes) return DataLoss("truncated frame header");
  const uint8_t* p = bytes.data();
  if (LoadU32(p) != kMagic) return DataLoss("bad frame magic (not a gmux peer?)");
  FrameHeader h;
  h.version = LoadU16(p + 4);
  if (h.version != kProtocolVersion) {
    return FailedPrecondition("protocol version " + std::to_string(h.version) +
                              " is not supported; this side speaks version " +
                              std::to_string(kProtocolVersion));
  }
  uint16_t kind = LoadU16(p + 6);
  if (kind != static_cast<uint16_t>(FrameKind::kRequest) &&
      kind != static_cast<uint16_t>(FrameKind::kReply) &&
      kind != static_cast<uint16_t>(FrameKind::kData)) {
    return InvalidArgument("unknown frame kind " + std::to_string(kind));
  }
  h.kind = static_cast<FrameKind>(kind);
  h.payload_bytes = LoadU32(p + 8);
  h.flags = LoadU32(p + 12);
  if ((h.flags & ~kFrameFlagDescriptor) != 0) return DataLoss("unknown frame header flags");
  if (h.payload_bytes > limits.max_payload_bytes) {
    return ResourceExhausted("frame payload of " + std::to_string(h.payload_bytes) +
                             " bytes exceeds the limit of " +
                             std::to_string(limits.max_payload_bytes));
  }
  if (h.payload_bytes == 0 || h.payload_bytes % 8 != 0) {
    return DataLoss("frame payload length " + std::to_string(h.payload_bytes) +
                    " is not a positive multiple of 8");
  }
  return h;
}

Message::Message(kj::Array<capnp::word> words, const FrameLimits& limits)
    : words_(kj::mv(words)) {
  capnp::ReaderOptions options;
  options.traversalLimitInWords = static_cast<uint64_t>(words_.size()) * limits.traversal_factor + 64;
  options.nestingLimit = limits.nesting_limit;
  reader_ = std::make_unique<capnp::FlatArrayMessageReader>(words_.asPtr(), options);
}

Result<Message> DecodePayload(kj::Array<capnp::word> words, FrameKind kind,
                              const FrameLimits& limits) {
  size_t n = words.size();
  Result<Message> out = DataLoss("unreachable");
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() {
    Message m(kj::mv(words), limits);
    // FlatArrayMessageReader has checked the segment table against the array; totalSize()
    // follows every pointer, so a malformed pointer anywhere fails here and not later.
    capnp::MessageSize size;
    if (kind == FrameKind::kRequest) {
      size = m.root<wire::Request>().totalSize();
    } else {
      size = m.root<wire::Reply>().totalSize();
    }
    if (size.wordCount > n) {
      out = DataLoss("message claims more words than its frame holds");
      return;
    }
    out = std::move(m);
  })) {
    return DataLoss(std::string("malformed message: ") + e->getDescription().cStr());
  }
  return out;
}

Result<Message> DecodeFrame(std::span<const uint8_t> bytes, FrameKind kind,
                            const FrameLimits& limits) {
  GMUX_ASSIGN_OR_RETURN(FrameHeader h, DecodeHeader(bytes, limits));
  if (h.kind != kind) return InvalidArgument("unexpected frame kind");
  if (bytes.size() - kHeaderBytes < h.payload_bytes) return DataLoss("truncated frame payload");
  if (bytes.size() - kHeaderBytes > h.payload_bytes) return DataLoss("trailing bytes after frame");
  auto words = kj::heapArray<capnp::word>(h.payload_bytes / sizeof(capnp::word));
  std::memcpy(words.begin(), bytes.data() + kHeaderBytes, h.payload_bytes);
  return DecodePayload(kj::mv(words), kind, limits);
}

namespace {

struct Encoded {
  uint8_t header[kHeaderBytes];
  kj::Array<capnp::word> table;  // the segment table
  kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>> segments;
  size_t payload_bytes = 0;
};

Status Prepare(FrameKind kind, capnp::MessageBuilder& message, const FrameLimits& limits,
               Encoded& e) {
  e.segments = message.getSegmentsForOutput();
  size_t nseg = e.segments.size();
  // Segment table: u32 count-1, then u32 size per segment, padded to a word.
  size_t table_words = (nseg + 2) / 2;
  e.table = kj::heapArray<capnp::word>(table_words);
  std::memset(e.table.begin(), 0, table_words * sizeof(capnp::word));
  auto* t = reinterpret_cast<uint8_t*>(e.table.begin());
  StoreU32(t, static_cast<uint32_t>(nseg - 1));
  size_t total = table_words * sizeof(capnp::word);
  for (size_t i = 0; i < nseg; ++i) {
    StoreU32(t + 4 + 4 * i, static_cast<uint32_t>(e.segments[i].size()));
    total += e.segments[i].size() * sizeof(capnp::word);
  }
  if (total > limits.max_payload_bytes) {
    return ResourceExhausted("message of " + std::to_string(total) +
                             " bytes exceeds the frame limit");
  }
  e.payload_bytes = total;
  EncodeHeader({kProtocolVersion, kind, static_cast<uint32_t>(total)}, e.header);
  return Status::Ok();
}

}  // namespace

Result<std::vector<uint8_t>> EncodeFrame(FrameKind kind, capnp::MessageBuilder& message,
                                         const FrameLimits& limits) {
  Encoded e;
  GMUX_RETURN_IF_ERROR(Prepare(kind, message, limits, e));
  std::vector<uint8_t> out(kHeaderBytes + e.payload_bytes);
  std::memcpy(out.data(), e.header, kHeaderBytes);
  size_t at = kHeaderBytes;
  std::memcpy(out.data() + at, e.table.begin(), e.table.size() * sizeof(capnp::word));
  at += e.table.size() * sizeof(capnp::word);
  for (auto seg : e.segments) {
    std::memcpy(out.data() + at, seg.begin(), seg.size() * sizeof(capnp::word));
    at += seg.size() * sizeof(capnp::word);
  }
  return out;
}

namespace {

std::vector<iovec> FrameIov(Encoded& e) {
  std::vector<iovec> iov;
  iov.reserve(e.segments.size() + 2);
  iov.push_back({e.header, kHeaderBytes});
  iov.push_back({e.table.begin(), e.table.size() * sizeof(capnp::word)});
  for (auto seg : e.segments) {
    iov.push_back({const_cast<capnp::word*>(seg.begin()), seg.size() * sizeof(capnp::word)});
  }
  return iov;
}

// Attaches `fd` (SCM_RIGHTS) to `msg`, in `control` (CMSG_SPACE(sizeof(int)) bytes).
void AttachDescriptor(msghdr& msg, char* control, int fd) {
  std::memset(control, 0, CMSG_SPACE(sizeof(int)));
  msg.msg_control = control;
  msg.msg_controllen = CMSG_SPACE(sizeof(int));
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
}

// Sends iov[first...] (advancing `first` and the partly sent entry); with `dont_wait`, returns
// Ok with `first` < iov.size() when the socket is full.
Status SendIov(Outlet out, std::vector<iovec>& iov, size_t& first, int pass_fd, bool dont_wait) {
  if (out.ring != nullptr) {
    // A descriptor cannot travel the ring: it goes on the socket just before the frame, whose
    // header says a descriptor goes with it (the reader takes the next one there).
    if (pass_fd >= 0 && first == 0 && iov[0].iov_len == kHeaderBytes) {
      GMUX_RETURN_IF_ERROR(SendDescriptor(out.fd, pass_fd));
      auto* header = static_cast<uint8_t*>(iov[0].iov_base);
      StoreU32(header + 12, LoadU32(header + 12) | kFrameFlagDescriptor);
    }
    return out.ring->Write(iov.data(), iov.size(), &first,
                           dont_wait ? std::chrono::steady_clock::time_point::min()
                                     : std::chrono::steady_clock::time_point::max());
  }
  const int fd = out.fd;
  while (first < iov.size()) {
    msghdr msg{};
    msg.msg_iov = iov.data() + first;
    msg.msg_iovlen = std::min<size_t>(iov.size() - first, IOV_MAX);
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
    if (pass_fd >= 0 && first == 0 && iov[0].iov_len == kHeaderBytes) {
      AttachDescriptor(msg, control, pass_fd);
    }
    ssize_t w = ::sendmsg(fd, &msg, MSG_NOSIGNAL | (dont_wait ? MSG_DONTWAIT : 0));
    if (w < 0) {
      if (errno == EINTR) continue;
      if (dont_wait && (errno == EAGAIN || errno == EWOULDBLOCK)) return Status::Ok();
      return Unavailable("send: " + ErrnoText(errno));
    }
    auto left = static_cast<size_t>(w);
    while (first < iov.size() && left >= iov[first].iov_len) {
      left -= iov[first].iov_len;
      ++first;
    }
    if (left > 0) {
      iov[first].iov_base = static_cast<uint8_t*>(iov[first].iov_base) + left;
      iov[first].iov_len -= left;
    }
  }
  return Status::Ok();
}

}  // namespace

Status SendDescriptor(int socket, int fd) {
  char byte = 2;
  iovec iov{&byte, 1};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  AttachDescriptor(msg, control, fd);
  for (;;) {
    if (::sendmsg(socket, &msg, MSG_NOSIGNAL) == 1) return Status::Ok();
    if (errno != EINTR) return Unavailable("send: " + ErrnoText(errno));
  }
}

Status WriteFrame(Outlet out, FrameKind kind, capnp::MessageBuilder& message,
                  const FrameLimits& limits, int pass_fd) {
  Encoded e;
  GMUX_RETURN_IF_ERROR(Prepare(kind, message, limits, e));
  std::vector<iovec> iov = FrameIov(e);
  size_t first = 0;
  return SendIov(out, iov, first, pass_fd, /*dont_wait=*/false);
}

Result<std::vector<uint8_t>> WriteFrameNow(Outlet out, FrameKind kind, capnp::MessageBuilder& message,
                                           const FrameLimits& limits) {
  Encoded e;
  GMUX_RETURN_IF_ERROR(Prepare(kind, message, limits, e));
  std::vector<iovec> iov = FrameIov(e);
  size_t first = 0;
  GMUX_RETURN_IF_ERROR(SendIov(out, iov, first, -1, /*dont_wait=*/true));
  std::vector<uint8_t> rest;
  for (size_t i = first; i < iov.size(); ++i) {
    const auto* b = static_cast<const uint8_t*>(iov[i].iov_base);
    rest.insert(rest.end(), b, b + iov[i].iov_len);
  }
  return rest;
}

Status WriteAll(Outlet out, std::span<const uint8_t> bytes) {
  std::vector<iovec> iov = {{const_cast<uint8_t*>(bytes.data()), bytes.size()}};
  size_t first = 0;
  return SendIov(out, iov, first, -1, /*dont_wait=*/false);
}

namespace {
// A data frame's bytes as iovecs: the header and prefix (encoded into `head`), `data`, and the
// padding to a whole word. kResourceExhausted when it would exceed `limits`.
Status DataFrameIov(const DataFrame& f, const uint8_t* data, const FrameLimits& limits,
                    uint8_t (&head)[kHeaderBytes + kDataPrefixBytes], std::vector<iovec>& iov) {
  const size_t padded = (static_cast<size_t>(f.bytes) + 7) / 8 * 8;
  const size_t payload = kDataPrefixBytes + padded;
  if (payload > limits.max_payload_bytes) {
    return ResourceExhausted("data frame of " + std::to_string(payload) +
                             " bytes exceeds the frame limit");
  }
  std::memset(head, 0, sizeof(head));
  EncodeHeader({kProtocolVersion, FrameKind::kData, static_cast<uint32_t>(payload)}, head);
  uint8_t* prefix = head + kHeaderBytes;
  StoreU32(prefix, static_cast<uint32_t>(f.id));
  StoreU32(prefix + 4, static_cast<uint32_t>(f.id >> 32));
  StoreU32(prefix + 8, static_cast<uint32_t>(f.offset));
  StoreU32(prefix + 12, static_cast<uint32_t>(f.offset >> 32));
  StoreU32(prefix + 16, f.bytes);
  StoreU32(prefix + 20, f.last ? 1u : 0u);
  static constexpr uint8_t kZeros[8] = {};
  iov = {{head, sizeof(head)}};
  if (f.bytes != 0) iov.push_back({const_cast<uint8_t*>(data), f.bytes});
  if (padded != f.bytes) iov.push_back({const_cast<uint8_t*>(kZeros), padded - f.bytes});
  return Status::Ok();
}
}  // namespace

Status WriteDataFrame(Outlet out, const DataFrame& f, const uint8_t* data,
                      const FrameLimits& limits) {
  uint8_t head[kHeaderBytes + kDataPrefixBytes];
  std::vector<iovec> iov;
  GMUX_RETURN_IF_ERROR(DataFrameIov(f, data, limits, head, iov));
  size_t first = 0;
  return SendIov(out, iov, first, -1, /*dont_wait=*/false);
}

Status WriteDataFrameUntil(Outlet out, const DataFrame& f, const uint8_t* data,
                           std::chrono::steady_clock::time_point deadline,
                           std::vector<uint8_t>* rest, const FrameLimits& limits) {
  rest->clear();
  uint8_t head[kHeaderBytes + kDataPrefixBytes];
  std::vector<iovec> iov;
  GMUX_RETURN_IF_ERROR(DataFrameIov(f, data, limits, head, iov));
  size_t first = 0;
  for (;;) {
    if (out.ring != nullptr) {
      GMUX_RETURN_IF_ERROR(out.ring->Write(iov.data(), iov.size(), &first, deadline));
      if (first == iov.size()) return Status::Ok();
      break;
    }
    GMUX_RETURN_IF_ERROR(SendIov(out, iov, first, -1, /*dont_wait=*/true));
    if (first == iov.size()) return Status::Ok();
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) break;
    pollfd p{out.fd, POLLOUT, 0};
    const auto ms = std::chrono::ceil<std::chrono::milliseconds>(deadline - now).count();
    if (::poll(&p, 1, static_cast<int>(std::min<int64_t>(ms, 1000))) < 0 && errno != EINTR) {
      return Unavailable("poll: " + ErrnoText(errno));
    }
  }
  for (size_t i = first; i < iov.size(); ++i) {
    const auto* b = static_cast<const uint8_t*>(iov[i].iov_base);
    rest->insert(rest->end(), b, b + iov[i].iov_len);
  }
  return Status::Ok();
}

Result<Message> ReadFrame(int fd, FrameKind kind, const FrameLimits& limits,
                          FrameHeader* header_out, int* fd_out) {
  uint8_t hdr[kHeaderBytes];
  if (fd_out != nullptr) *fd_out = -1;
  GMUX_ASSIGN_OR_RETURN(size_t got, ReadHeader(fd, hdr, kHeaderBytes, fd_out));
  if (got == 0) return Unavailable("peer closed the connection");
  if (got < kHeaderBytes) return DataLoss("connection closed inside a frame header");
  if (header_out != nullptr && got >= 8) {
    header_out->version = LoadU16(hdr + 4);
  }
  GMUX_ASSIGN_OR_RETURN(FrameHeader h, DecodeHeader({hdr, kHeaderBytes}, limits));
  if (header_out != nullptr) *header_out = h;
  if (h.kind != kind) return InvalidArgument("unexpected frame kind");
  auto words = kj::heapArray<capnp::word>(h.payload_bytes / sizeof(capnp::word));
  GMUX_ASSIGN_OR_RETURN(size_t body, ReadFully(fd, words.begin(), h.payload_bytes));
  if (body < h.payload_bytes) return DataLoss("connection closed inside a frame payload");
  return DecodePayload(kj::mv(words), kind, limits);
}

namespace {
constexpr size_t kReadBufferBytes = 256u << 10;
}  // namespace

FrameReader::FrameReader(int fd, FrameKind kind, const FrameLimits& limits)
    : fd_(fd),
      kind_(kind),
      limits_(limits),
      timeout_ms_(ReceiveTimeoutMs(fd)),
      buf_(kReadBufferBytes) {}

FrameReader::~FrameReader() {
  for (const Passed& p : passed_) ::close(p.fd);
}

bool FrameReader::Fill(bool wait, Status& error, bool& eof) {
  if (begin_ == end_) {
    begin_ = end_ = 0;
  } else if (end_ == buf_.size()) {
    std::memmove(buf_.data(), buf_.data() + begin_, buffered());
    end_ -= begin_;
    begin_ = 0;
  }
  const uint64_t from = offset_ + buffered();
  // As if the read found nothing: the caller waits next.
  if (std::exchange(expect_quiet_, false) && !wait) return false;
  auto recv = [&](Wait how) {
    return RecvFrom(fd_, ring_, buf_.data() + end_, buf_.size() - end_, how, timeout_ms_,
                    [&](int passed, size_t bytes) {
                      passed_.push_back({passed, from, from + bytes});
                    });
  };
  Result<size_t> r = size_t{0};
  if (wait && std::exchange(spin_next_wait_, false) && spin_ != nullptr) {
    // The wait after an answer: reads without waiting while the spin's policy allows, each
    // turn a recvmsg (no poll() before it: one system call per look), then sleeps; the time
    // until the request came, spun or slept, is the policy's to judge.
    if (!spin_->WaitFor(
            [&] {
              r = recv(Wait::kNo);
              return !r.ok() || *r != kNothingYet;
            },
            others_need_cpu_)) {
      r = recv(Wait::kPollFirst);
    }
    spin_->Arrived();
  } else {
    // Waiting comes only after a read without waiting found nothing (Next): straight to poll.
    r = recv(wait ? Wait::kPollFirst : Wait::kNo);
  }
  if (!r.ok()) {
    error = r.status();
    return false;
  }
  if (*r == kNothingYet) return false;
  if (*r == 0) {
    eof = true;
    return false;
  }
  end_ += *r;
  return true;
}

Status FrameReader::ReadFromRing(ShmRing* ring) {
  if (buffered() != 0) {
    return DataLoss("the peer sent more on the socket before its ring was answered");
  }
  ring_ = ring;
  return Status::Ok();
}

int FrameReader::FrameFd(uint32_t flags, uint64_t at, uint64_t bytes) {
  if (ring_ != nullptr) {
    // Its descriptor came on the socket before the frame went into the ring.
    return (flags & kFrameFlagDescriptor) != 0 ? ring_->TakePassedFd() : -1;
  }
  return passed_.empty() ? -1 : TakeFd(at, bytes);
}

bool FrameReader::HasFrame() const {
  if (buffered() < kHeaderBytes) return false;
  Result<FrameHeader> h = DecodeHeader({buf_.data() + begin_, kHeaderBytes}, limits_);
  return !h.ok() || buffered() - kHeaderBytes >= h->payload_bytes;
}

int FrameReader::TakeFd(uint64_t at, uint64_t bytes) {
  int out = -1;
  for (auto it = passed_.begin(); it != passed_.end();) {
    // Ours: this frame begins in the read that brought it and no later frame does.
    if (out < 0 && at >= it->from && at < it->to && at + bytes >= it->to) {
      out = it->fd;
      it = passed_.erase(it);
    } else if (it->to <= at + bytes) {
      ::close(it->fd);  // every frame of that read has come and gone without it
      it = passed_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

bool FrameReader::Take(uint8_t* to, size_t n, Status& error, bool& told,
                       const std::function<void()>& before_wait) {
  uint8_t drop[4096];
  auto dest = [&](size_t at) { return to != nullptr ? to + at : drop; };
  auto step = [&](size_t at) { return to != nullptr ? n - at : std::min(n - at, sizeof(drop)); };
  size_t at = std::min(n, buffered());
  if (to != nullptr && at != 0) std::memcpy(to, buf_.data() + begin_, at);
  begin_ += at;
  offset_ += at;
  // The rest straight from the socket: what it has now, then (after before_wait) waiting.
  // A descriptor that comes with these bytes belongs to no frame: closed.
  auto close_passed = [](int passed, size_t) { ::close(passed); };
  while (at < n) {
    Result<size_t> r = RecvFrom(fd_, ring_, dest(at), step(at), Wait::kNo, timeout_ms_,
                                close_passed);
    if (!r.ok()) {
      error = r.status();
      return false;
    }
    if (*r == kNothingYet) {
      if (before_wait && !told) {
        told = true;
        before_wait();
      }
      r = RecvFrom(fd_, ring_, dest(at), step(at), Wait::kPollFirst, timeout_ms_,
                   close_passed);
      if (!r.ok()) {
        error = r.status();
        return false;
      }
    }
    if (*r == 0) return false;
    at += *r;
    offset_ += *r;
  }
  return true;
}

Status FrameReader::TakeData(uint32_t payload_bytes, bool& told,
                             const std::function<void()>& before_wait) {
  Status error = Status::Ok();
  const uint64_t at = offset_;
  if (payload_bytes < kDataPrefixBytes) return DataLoss("data frame shorter than its prefix");
  uint8_t head[kHeaderBytes + kDataPrefixBytes];
  if (!Take(head, sizeof(head), error, told, before_wait)) {
    return error.ok() ? DataLoss("connection closed inside a frame payload") : error;
  }
  const uint8_t* p = head + kHeaderBytes;
  DataFrame f;
  f.id = LoadU32(p) | static_cast<uint64_t>(LoadU32(p + 4)) << 32;
  f.offset = LoadU32(p + 8) | static_cast<uint64_t>(LoadU32(p + 12)) << 32;
  f.bytes = LoadU32(p + 16);
  const uint32_t flags = LoadU32(p + 20);
  const size_t padded = payload_bytes - kDataPrefixBytes;
  if ((static_cast<size_t>(f.bytes) + 7) / 8 * 8 != padded) {
    return DataLoss("data frame length " + std::to_string(f.bytes) +
                    " does not match its payload of " + std::to_string(payload_bytes) + " bytes");
  }
  if ((flags & ~1u) != 0) return DataLoss("unknown data frame flags");
  f.last = (flags & 1u) != 0;
  uint8_t* to = sink_->Place(f);
  bool ok = Take(to, f.bytes, error, told, before_wait);
  if (to != nullptr) sink_->Placed(f, ok);
  uint8_t pad[8];
  if (ok) ok = Take(pad, padded - f.bytes, error, told, before_wait);
  if (!ok) return error.ok() ? DataLoss("connection closed inside a frame payload") : error;
  // Descriptors never go with data.
  if (int passed = FrameFd(LoadU32(head + 12), at, kHeaderBytes + payload_bytes); passed >= 0) {
    ::close(passed);
  }
  return Status::Ok();
}

Result<Message> FrameReader::Next(int* fd_out, const std::function<void()>& before_wait) {
  for (;;) {
    GMUX_ASSIGN_OR_RETURN(std::optional<Message> m, NextOrData(fd_out, before_wait));
    if (m) return std::move(*m);
  }
}

Result<std::optional<Message>> FrameReader::NextOrData(int* fd_out,
                                                       const std::function<void()>& before_wait) {
  if (fd_out != nullptr) *fd_out = -1;
  Status error = Status::Ok();
  bool eof = false;
  bool told = false;
  // Fills the buffer: what the socket has now, else (after before_wait) waiting for it.
  auto more = [&]() -> bool {
    if (Fill(/*wait=*/false, error, eof)) return true;
    if (eof || !error.ok()) return false;
    if (before_wait && !told) {
      told = true;
      before_wait();
    }
    return Fill(/*wait=*/true, error, eof);
  };
  while (buffered() < kHeaderBytes) {
    if (!more()) {
      if (!error.ok()) return error;
      if (buffered() == 0) return Unavailable("peer closed the connection");
      return DataLoss("connection closed inside a frame header");
    }
  }
  GMUX_ASSIGN_OR_RETURN(FrameHeader h,
                        DecodeHeader({buf_.data() + begin_, kHeaderBytes}, limits_));
  if (h.kind == FrameKind::kData && sink_ != nullptr) {
    GMUX_RETURN_IF_ERROR(TakeData(h.payload_bytes, told, before_wait));
    return std::optional<Message>();
  }
  if (h.kind != kind_) return InvalidArgument("unexpected frame kind");
  const uint64_t at = offset_;
  const size_t frame = kHeaderBytes + h.payload_bytes;
  auto words = kj::heapArray<capnp::word>(h.payload_bytes / sizeof(capnp::word));
  auto* dst = reinterpret_cast<uint8_t*>(words.begin());
  if (frame <= buf_.size()) {
    // A frame that fits the buffer is gathered there.
    if (buf_.size() - begin_ < frame) {
      std::memmove(buf_.data(), buf_.data() + begin_, buffered());
      end_ -= begin_;
      begin_ = 0;
    }
    while (buffered() < frame) {
      if (!more()) {
        if (!error.ok()) return error;
        return DataLoss("connection closed inside a frame payload");
      }
    }
    std::memcpy(dst, buf_.data() + begin_ + kHeaderBytes, h.payload_bytes);
    begin_ += frame;
    offset_ += frame;
  } else {
    // Larger: what is buffered (all of it this frame's), then the rest straight into the
    // message.
    const size_t have = buffered() - kHeaderBytes;
    std::memcpy(dst, buf_.data() + begin_ + kHeaderBytes, have);
    begin_ = end_ = 0;
    offset_ += kHeaderBytes + have;
    // What the socket has now; then, if the rest is still to come, before_wait (the worker
    // hands over its queued commands instead of holding them while a large frame arrives).
    // A descriptor sent with a body's bytes belongs to no frame (a frame's comes with its
    // first bytes): closed.
    const size_t rest = h.payload_bytes - have;
    size_t body = 0;
    bool ended = false;
    while (body < rest && !ended) {
      GMUX_ASSIGN_OR_RETURN(size_t r, RecvFrom(fd_, ring_, dst + have + body, rest - body,
                                               Wait::kNo, timeout_ms_,
                                               [](int passed, size_t) { ::close(passed); }));
      if (r == kNothingYet) break;
      ended = r == 0;
      body += r;
    }
    if (body < rest && !ended) {
      if (before_wait && !told) {
        told = true;
        before_wait();
      }
      GMUX_ASSIGN_OR_RETURN(size_t waited, ReadFullyFrom(fd_, ring_, dst + have + body,
                                                         rest - body, timeout_ms_));
      body += waited;
    }
    offset_ += body;
    if (body < rest) return DataLoss("connection closed inside a frame payload");
  }
  const int passed = FrameFd(h.flags, at, frame);
  if (fd_out != nullptr) {
    *fd_out = passed;
  } else if (passed >= 0) {
    ::close(passed);
  }
  GMUX_ASSIGN_OR_RETURN(Message m, DecodePayload(kj::mv(words), kind_, limits_));
  return std::optional<Message>(std::move(m));
}

}  // namespace gmux::proto
