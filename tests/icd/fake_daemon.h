// FakeDaemon: an in-process stand-in for gmuxd, so the ICD can be tested without a daemon,
// a worker or a device.
//
// It listens on a Unix socket in a fresh temporary directory and serves one connection at a
// time on a thread of its own, reading the client's frames with gmux_proto's framing exactly as
// gmuxd does (batched frames one after another, a descriptor passed with a frame taken and
// closed). It answers the Hello itself with the configured devices and hands every other request
// to the test's handler, then sends what the handler returned: replies, raw bytes (garbage, a
// frame cut short), and possibly a hang-up. Every request is recorded, Hello included, so tests
// can assert on what reached the daemon and what did not.
//
// Thread-safe: a test sets the handler and reads the record while the serving thread runs. The
// handler runs on the serving thread, one request at a time, with the handler lock held (so
// SetHandler returns only once the previous handler has finished); it must not call back into
// the FakeDaemon. Destruction closes both sockets, joins the thread and removes the directory.
#pragma once

#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "proto/frame.h"

namespace gmux::testing {

struct FakeDevice {
  std::string name;
  cl_device_type type = CL_DEVICE_TYPE_GPU;
};

struct FakeDaemonOptions {
  // Announced in the HelloReply; device i gets the daemon index i.
  std::vector<FakeDevice> devices = {{"fake", CL_DEVICE_TYPE_GPU}};
  std::string tenant = "fake";
  // Announced: the fake answers waitEventsProfiled (its handler decides with what).
  bool profiled_waits = true;

  Status Validate() const;
};

// What the fake daemon sends for one request, in the order added, and whether it then closes the
// connection. Empty: nothing is sent (right for posted requests, whose seq is 0).
class Response {
 public:
  Response() = default;
  Response(Response&&) = default;
  Response& operator=(Response&&) = default;

  // Appends a Reply for `seq` (0: an unasked error report) with status CL_SUCCESS and the `none`
  // member set, for the caller to fill in. The builder stays valid while this Response lives.
  proto::wire::Reply::Builder AddReply(uint64_t seq);
  // Appends bytes sent exactly as given: a garbage frame, part of a frame, a header alone.
  void AddRaw(std::vector<uint8_t> bytes);
  // Closes the connection once everything added has been sent.
  void CloseAfter() { close_after_ = true; }

  // Convenience: a reply with only a status; an `info` reply carrying `bytes`.
  static Response WithStatus(uint64_t seq, cl_int status);
  static Response WithInfo(uint64_t seq, const std::vector<uint8_t>& bytes);

 private:
  friend class FakeDaemon;
  struct Item {
    std::unique_ptr<capnp::MallocMessageBuilder> reply;  // set, or `raw` is sent
    std::vector<uint8_t> raw;
  };
  std::vector<Item> items_;
  bool close_after_ = false;
};

// One request as the fake daemon received it.
struct SeenRequest {
  proto::wire::Request::Which which = proto::wire::Request::HELLO;
  uint64_t seq = 0;
  bool passed_fd = false;  // a descriptor came with the frame (shared-memory transfers)
  // GetInfo only: which object kind and parameter were asked for.
  proto::wire::ObjectKind info_kind = proto::wire::ObjectKind::PLATFORM;
  uint32_t info_param = 0;
};

class FakeDaemon {
 public:
  using Handler = std::function<Response(proto::wire::Request::Reader request)>;

  // Creates the temporary directory and the listening socket and starts serving. Errors name
  // the failing step (kInvalidArgument for bad options, kUnavailable for system calls).
  static Result<std::unique_ptr<FakeDaemon>> Start(FakeDaemonOptions options = {});
  ~FakeDaemon();
  FakeDaemon(const FakeDaemon&) = delete;
  FakeDaemon& operator=(const FakeDaemon&) = delete;

  // The socket path, for GMUX_SOCKET.
  const std::string& socket_path() const { return socket_path_; }

  // Replaces the handler (nullptr: Default). Returns after any call of the previous one ended.
  void SetHandler(Handler handler);

  // What the fake does unless told otherwise: nothing for posted requests (seq 0); for the rest
  // a CL_SUCCESS reply with `none`, except GetInfo (CL_PLATFORM_VERSION of the platform answers
  // "OpenCL 3.0 fake", anything else CL_INVALID_VALUE) and CreateKernel (a KernelReply with no
  // arguments). Handlers delegate the requests they do not care about here.
  static Response Default(proto::wire::Request::Reader request);

  // Every request received since the last ClearSeen, in arrival order.
  std::vector<SeenRequest> Seen() const;
  size_t Count(proto::wire::Request::Which which) const;
  size_t CountInfo(proto::wire::ObjectKind kind, uint32_t param) const;
  void ClearSeen();

  // Connections accepted so far.
  int connections() const;

 private:
  FakeDaemon() = default;
  void Serve();
  // Serves one accepted connection until it closes, the handler hangs up, or the fake stops.
  void ServeConnection(int fd);
  // Answers one request; false when the connection is to be closed (the handler hung up, or
  // the client is gone).
  bool Answer(int fd, proto::wire::Request::Reader request);
  Status Send(int fd, Response& response);

  FakeDaemonOptions options_;
  std::string dir_;
  std::string socket_path_;
  int listen_fd_ = -1;
  std::thread thread_;

  mutable std::mutex mu_;  // guards the fields below; never held while calling the handler
  int conn_fd_ = -1;       // the connection being served, for the destructor to shut down
  bool stopping_ = false;
  int connections_ = 0;
  std::vector<SeenRequest> seen_;

  std::mutex handler_mu_;  // held while the handler runs; guards handler_
  Handler handler_;
};

// Installs a handler for its lifetime and puts FakeDaemon::Default back when destroyed (after any
// call of the handler has ended). Declare it after the locals its handler refers to, so it goes
// first.
class ScopedHandler {
 public:
  ScopedHandler(FakeDaemon& daemon, FakeDaemon::Handler handler) : daemon_(daemon) {
    daemon_.SetHandler(std::move(handler));
  }
  ~ScopedHandler() { daemon_.SetHandler(nullptr); }
  ScopedHandler(const ScopedHandler&) = delete;
  ScopedHandler& operator=(const ScopedHandler&) = delete;

 private:
  FakeDaemon& daemon_;
};

}  // namespace gmux::testing
