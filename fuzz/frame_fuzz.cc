// libFuzzer target: one gmux frame (header + Cap'n Proto payload) from untrusted bytes, decoded
// the ways the daemon and the ICD decode what they read from a socket, with the daemon's default
// FrameLimits (DaemonOptions::frame default-constructs them; see src/daemon/config.h).
//
// Checked on every input, beyond "no sanitizer report":
//  - a frame DecodeFrame accepts has a header DecodeHeader accepts, naming the input's length;
//  - an accepted message can be read in full afterwards (every field, through Cap'n Proto's
//    stringifier) without a sanitizer report. Reading may still throw a kj::Exception (a Text
//    without its NUL, say, is not checked by decoding): gmuxd's session and handshake and the
//    ICD's receive loop catch those around every read, and so does this target;
//  - ReadFrame on a stream socket holding the same bytes agrees with DecodeFrame, and then sees
//    a clean end of stream;
//  - a data frame (kind 3) is never decoded as a message; a FrameReader with a sink accepts it
//    only with its sink told (Place, then Placed) and the bytes placed exactly the input's.
// gmuxd's broker decodes the frames before hello with DecodeHeader and DecodePayload under a
// 64 KiB payload cap; DecodeFrame is those two calls, and inputs here stay far below the cap.
// Seeds are in fuzz/corpus/frame/ (written by frame_corpus_gen); see docs/testing.md.
#include <sys/socket.h>
#include <unistd.h>

#include <kj/exception.h>
#include <kj/string.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <algorithm>
#include <cstdlib>
#include <span>
#include <vector>

#include "proto/frame.h"

namespace {

using gmux::StatusCode;
using gmux::proto::DecodeFrame;
using gmux::proto::DecodeHeader;
using gmux::proto::FrameHeader;
using gmux::proto::FrameKind;
using gmux::proto::FrameLimits;
using gmux::proto::kHeaderBytes;
using gmux::proto::Message;
using gmux::proto::ReadFrame;

const FrameLimits kDaemonLimits{};

// Inputs larger than this skip the socket check (they would not fit a socket's buffer whole).
constexpr size_t kMaxSocketBytes = 64 << 10;

[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "frame_fuzz: %s\n", what);
  std::abort();
}

template <typename Root>
void ReadEveryField(Message& m) {
  // An exception here is the answer "malformed request", as in Session's read loop.
  auto ignored = kj::runCatchingExceptions([&]() {
    auto text = kj::str(m.root<Root>());
    (void)text;
  });
  (void)ignored;
}

void ReadAccepted(Message& m, FrameKind kind) {
  if (kind == FrameKind::kRequest) {
    ReadEveryField<gmux::proto::wire::Request>(m);
  } else {
    ReadEveryField<gmux::proto::wire::Reply>(m);
  }
}

// The bytes, sent whole into a socket pair whose sending end is then closed: the reading end,
// or -1 when the input is too large to fit the socket's buffer.
int Streamed(std::span<const uint8_t> bytes) {
  if (bytes.size() > kMaxSocketBytes) return -1;
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) Fail("socketpair failed");
  int buffer = 4 * kMaxSocketBytes;
  ::setsockopt(fds[0], SOL_SOCKET, SO_SNDBUF, &buffer, sizeof(buffer));
  ::setsockopt(fds[1], SOL_SOCKET, SO_RCVBUF, &buffer, sizeof(buffer));
  ssize_t sent = bytes.empty() ? 0 : ::send(fds[0], bytes.data(), bytes.size(), MSG_DONTWAIT);
  ::close(fds[0]);
  if (sent != static_cast<ssize_t>(bytes.size())) {
    ::close(fds[1]);
    return -1;
  }
  return fds[1];
}

// Sends the bytes through a socket pair and reads them back with ReadFrame, as the daemon's
// session threads do. `header` and `accepted` are DecodeHeader's and DecodeFrame's verdicts on
// the same bytes.
void CheckReadFrame(std::span<const uint8_t> bytes, const gmux::Result<FrameHeader>& header,
                    FrameKind kind, bool accepted) {
  const int fd = Streamed(bytes);
  if (fd < 0) return;
  {
    int passed_fd = -1;
    auto first = ReadFrame(fd, kind, kDaemonLimits, nullptr, &passed_fd);
    if (passed_fd >= 0) Fail("ReadFrame returned a descriptor nobody passed");
    if (accepted) {
      if (!first.ok()) Fail("ReadFrame rejected a frame DecodeFrame accepted");
      ReadAccepted(*first, kind);
      auto next = ReadFrame(fd, kind, kDaemonLimits);
      if (next.ok() || next.status().code() != StatusCode::kUnavailable) {
        Fail("ReadFrame did not see a clean end after the only frame");
      }
    } else if (first.ok()) {
      // The stream held a valid frame followed by trailing bytes, which DecodeFrame rejects as
      // one frame and ReadFrame leaves for the next read.
      if (!header.ok() || kHeaderBytes + header->payload_bytes >= bytes.size()) {
        Fail("ReadFrame accepted a frame DecodeFrame rejected");
      }
      ReadAccepted(*first, kind);
    }
  }
  ::close(fd);
}

// A sink that takes every data frame into memory of its own and checks it is told of each.
class CheckingSink : public gmux::proto::DataSink {
 public:
  uint8_t* Place(const gmux::proto::DataFrame& f) override {
    if (placing_) Fail("Place twice without Placed");
    placing_ = true;
    ++frames;
    memory.assign(f.bytes, 0);
    if (f.bytes != 0) return memory.data();
    placing_ = false;  // nothing to place: no Placed follows
    return nullptr;
  }
  void Placed(const gmux::proto::DataFrame& f, bool all_in) override {
    if (!placing_ || f.bytes != memory.size()) Fail("Placed without its Place");
    placing_ = false;
    complete = all_in;
  }
  int frames = 0;
  bool complete = false;
  std::vector<uint8_t> memory;

 private:
  bool placing_ = false;
};

// A data frame (kind 3) read by a FrameReader with a sink, as the worker and the ICD read them:
// accepted only whole, its bytes exactly the input's, and the stream in step after it.
void CheckDataFrame(std::span<const uint8_t> bytes) {
  const int fd = Streamed(bytes);
  if (fd < 0) return;
  {
    gmux::proto::FrameReader reader(fd, FrameKind::kRequest, kDaemonLimits);
    CheckingSink sink;
    reader.SetDataSink(&sink);
    auto first = reader.NextOrData(nullptr);
    if (first.ok()) {
      if (first->has_value()) Fail("a data frame read as a message");
      if (sink.frames != 1) Fail("a data frame accepted without its Place");
      const size_t at = kHeaderBytes + gmux::proto::kDataPrefixBytes;
      if (!sink.memory.empty() &&
          (!sink.complete || at + sink.memory.size() > bytes.size() ||
           !std::equal(sink.memory.begin(), sink.memory.end(), bytes.begin() + at))) {
        Fail("a data frame's bytes differ from the input's");
      }
      // Then the rest of the input: anything but a crash or a hang.
      auto next = reader.NextOrData(nullptr);
      (void)next;
    }
  }
  ::close(fd);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const uint8_t> bytes(data, size);
  // The header alone, as ReadFrame checks it before reading (and allocating) the payload.
  auto header = DecodeHeader(bytes, kDaemonLimits);
  // A Request is what gmuxd reads; a frame whose header says Reply is decoded as the ICD would.
  FrameKind kind = header.ok() ? header->kind : FrameKind::kRequest;
  if (kind == FrameKind::kData) {
    // Never a message: read as the worker and the ICD read them.
    if (DecodeFrame(bytes, FrameKind::kRequest, kDaemonLimits).ok()) {
      Fail("DecodeFrame accepted a data frame as a request");
    }
    CheckDataFrame(bytes);
    return 0;
  }
  auto message = DecodeFrame(bytes, kind, kDaemonLimits);
  if (message.ok()) {
    if (!header.ok() || header->payload_bytes + kHeaderBytes != size) {
      Fail("DecodeFrame accepted a frame whose header does not describe it");
    }
    ReadAccepted(*message, kind);
  }
  CheckReadFrame(bytes, header, kind, message.ok());
  return 0;
}
