// The checks before a process maps memory an untrusted peer passed it as a file descriptor.
#pragma once

#include <sys/socket.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "common/status.h"

namespace gmux {

// Whether `fd` may be mapped for `bytes` bytes without the peer being able to make the mapping
// fault: a memfd sealed against shrinking (a shrunk file turns the mapping's pages into SIGBUS),
// not on huge pages (which fault even sealed when their pages are not reserved), at least
// `bytes` long. kInvalidArgument otherwise: "<what> must be ..." / "<what> is smaller than
// <size_name>". Does not take the descriptor.
Status CheckSealedMemfd(int fd, uint64_t bytes, const std::string& what,
                        const std::string& size_name);

// Whether a descriptor a peer passed may be kept: only a regular file (a memfd is one), the
// only kind a gmux peer passes. Anything else is closed here and false returned: a socket kept
// could be the peer's own end of the connection it came on (or hold it in flight), which would
// then never close, and the session would outlive its client.
bool KeepPassedDescriptor(int fd);

// Calls `keep(fd)` for each descriptor a received message `msg` brought (SCM_RIGHTS) that
// KeepPassedDescriptor keeps; the others are closed.
template <typename Keep>
void ForEachKeptDescriptor(msghdr& msg, const Keep& keep) {
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      if (KeepPassedDescriptor(fd)) keep(fd);
    }
  }
}

}  // namespace gmux
