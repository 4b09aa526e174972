#include "daemon/control.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cstring>

namespace gmux::daemon::ctl {

Status Send(int fd, Type type, const void* records, size_t record_bytes, size_t count,
            int pass_fd, bool dont_wait, size_t* sent_out) {
  if (sent_out != nullptr) *sent_out = 0;
  const size_t per = record_bytes == 0 ? count : (kMaxMessageBytes - sizeof(Header)) / record_bytes;
  const auto* p = static_cast<const uint8_t*>(records);
  size_t sent = 0;
  do {
    const size_t n = record_bytes == 0 ? count : std::min(per, count - sent);
    Header h{static_cast<uint32_t>(type), static_cast<uint32_t>(n)};
    iovec iov[2] = {{&h, sizeof(h)},
                    {const_cast<uint8_t*>(p + sent * record_bytes), n * record_bytes}};
    msghdr m{};
    m.msg_iov = iov;
    m.msg_iovlen = n * record_bytes > 0 ? 2 : 1;
    alignas(cmsghdr) char cbuf[CMSG_SPACE(sizeof(int))] = {};
    if (pass_fd >= 0 && sent == 0) {
      m.msg_control = cbuf;
      m.msg_controllen = sizeof(cbuf);
      cmsghdr* c = CMSG_FIRSTHDR(&m);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(c), &pass_fd, sizeof(int));
    }
    ssize_t r;
    do {
      r = ::sendmsg(fd, &m, MSG_NOSIGNAL | (dont_wait ? MSG_DONTWAIT : 0));
    } while (r < 0 && errno == EINTR);
    if (r < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return ResourceExhausted("control channel full");
      return Unavailable(std::string("control channel: ") + std::strerror(errno));
    }
    sent += n;
    if (sent_out != nullptr) *sent_out = sent;
    if (record_bytes == 0) break;
  } while (sent < count);
  return Status::Ok();
}

Result<Message> Receive(int fd, bool dont_wait) {
  // One datagram of at most kMaxMessageBytes; MSG_TRUNC reports a longer one, which is malformed.
  thread_local std::vector<uint8_t> buf(kMaxMessageBytes);
  iovec iov{buf.data(), buf.size()};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  alignas(cmsghdr) char cbuf[CMSG_SPACE(sizeof(int) * 4)] = {};
  m.msg_control = cbuf;
  m.msg_controllen = sizeof(cbuf);
  ssize_t r;
  do {
    r = ::recvmsg(fd, &m, MSG_CMSG_CLOEXEC | (dont_wait ? MSG_DONTWAIT : 0));
  } while (r < 0 && errno == EINTR);
  if (r < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) return ResourceExhausted("nothing to read");
    return Unavailable(std::string("control channel: ") + std::strerror(errno));
  }
  Message out;
  for (cmsghdr* c = CMSG_FIRSTHDR(&m); c != nullptr; c = CMSG_NXTHDR(&m, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < n; ++i) {
      int f = -1;
      std::memcpy(&f, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      if (out.fd < 0) {
        out.fd = f;
      } else {
        ::close(f);
      }
    }
  }
  if (r == 0) {
    if (out.fd >= 0) ::close(out.fd);
    return Unavailable("control channel closed");
  }
  auto fail = [&](const char* why) -> Result<Message> {
    if (out.fd >= 0) ::close(out.fd);
    return DataLoss(std::string("control channel: ") + why);
  };
  if ((m.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0) return fail("message too long");
  if (static_cast<size_t>(r) < sizeof(Header)) return fail("short message");
  Header h;
  std::memcpy(&h, buf.data(), sizeof(h));
  if (h.type < static_cast<uint32_t>(Type::kWorkerUp) ||
      h.type > static_cast<uint32_t>(Type::kLast)) {
    return fail("unknown message type");
  }
  out.type = static_cast<Type>(h.type);
  out.body.assign(buf.begin() + sizeof(Header), buf.begin() + r);
  return out;
}

Status Pair(int fds[2]) {
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds) != 0) {
    return Unavailable(std::string("socketpair: ") + std::strerror(errno));
  }
  // Room for bursts of releases and completions without blocking either side.
  int size = 1 << 20;
  for (int i = 0; i < 2; ++i) {
    ::setsockopt(fds[i], SOL_SOCKET, SO_SNDBUF, &size, sizeof(size));
    ::setsockopt(fds[i], SOL_SOCKET, SO_RCVBUF, &size, sizeof(size));
  }
  return Status::Ok();
}

}  // namespace gmux::daemon::ctl
