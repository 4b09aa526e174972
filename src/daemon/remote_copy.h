// One copy per transfer: a worker copies straight between its local client's memory and the
// device (issue 9; docs/protocol.md, "One copy per transfer").
//
// A blocking clEnqueueWriteBuffer through shared memory costs two copies (the ICD's into the
// shared buffer, the backend's out of it) where native OpenCL makes one. With remote copy the
// ICD sends only the address: when the write runs, the worker maps the region of the device
// buffer (zero-copy on a CPU device; the driver's staging memory on a GPU) and copies from the
// client's pages into the mapping with process_vm_readv; reads go the other way with
// process_vm_writev. The kernel allows this when the worker may ptrace the client: the same
// uid (the worker runs as its client's uid when gmuxd is root), a dumpable client, and under
// Yama's ptrace_scope 1 the client naming gmuxd as its ptracer (the ICD does). The ICD proves
// it at hello with a probe (8 bytes of a cookie at an address of its own), which the worker
// must read back; otherwise transfers keep the shared-memory path.
//
// The client is named by a pidfd opened at assignment: once the client has exited, a copy is
// refused instead of touching whatever process reuses its pid. The client only ever names
// addresses of its own process, so a hostile client can make its worker read or write nothing
// but that client's memory; a bad address fails the transfer with an error, never the worker.
//
// The reverse (the client writing into its worker) is impossible by design: workers are not
// dumpable (gmux-worker sets PR_SET_DUMPABLE 0), so a tenant cannot ptrace or /proc/PID/mem its
// worker and forge what the worker reports to gmuxd.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "daemon/cl_ref.h"

namespace gmux::daemon {

class RemoteCopier {
 public:
  // The client `pid` if this process may copy from and to it: reads `cookie` at `probe` there.
  // Otherwise nullptr, with the reason in *why.
  static std::shared_ptr<RemoteCopier> Open(pid_t pid, uint64_t probe, uint64_t cookie,
                                            std::string* why);
  ~RemoteCopier();
  RemoteCopier(const RemoteCopier&) = delete;
  RemoteCopier& operator=(const RemoteCopier&) = delete;

  // `n` bytes from the client's memory at `remote` into `local`, or the other way. The error
  // names what failed (an address the client does not map, the client gone).
  Status Read(uint64_t remote, void* local, size_t n);
  Status Write(uint64_t remote, const void* local, size_t n);

  // Runs `job` on the copier's own thread, in the order posted (a large copy never runs on the
  // backend's callback thread, which other commands' completions need).
  void Post(std::function<void()> job);

 private:
  RemoteCopier(pid_t pid, int pidfd) : pid_(pid), pidfd_(pidfd) {}
  bool ClientGone() const;
  Status Copy(uint64_t remote, void* local, size_t n, bool to_client);
  Status CopyParallel(uint64_t remote, void* local, size_t n, bool to_client);
  static constexpr size_t kMaxCopyThreads = 2;
  static constexpr size_t kMinPartBytes = 2u << 20;

  // The copier thread's queue, shared with it: the thread may outlive this object (a job may
  // drop the last reference), so it touches only this.
  struct Queue {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::function<void()>> jobs;
    bool stop = false;
  };
  static void Loop(std::shared_ptr<Queue> q);

  const pid_t pid_;
  const int pidfd_;
  std::shared_ptr<Queue> queue_ = std::make_shared<Queue>();
  std::thread thread_;  // started by the first Post (guarded by queue_->mu)
};

// A transfer's state shared by its enqueue, the copy and the delivery (Command::remote).
struct RemoteTransfer {
  Ref<cl_event> map;                       // the first mapping's event: the command's START
  std::vector<Ref<cl_event>> pieces;       // every piece's events, kept until the command ends
  std::atomic<cl_int> status{CL_SUCCESS};  // the copy's failure, if any (set after `message`)
  std::string message;
};

// Enqueues a buffer transfer by remote copy on `cq` after `waits`: for each piece of at most
// kMapPieceBytes of [offset, offset+n) of `mem`, a map, the copy (once the map is done), then
// the unmap, held behind a user event until the copy is done, so the queue's later commands
// see the data; each piece waits for the one before. `*out` receives the last unmap's event
// (the command's END); `transfer->map` the first map's (its START).
inline constexpr size_t kMapPieceBytes = 64u << 20;
cl_int EnqueueRemoteCopy(cl_command_queue cq, cl_mem mem, bool to_device, size_t offset,
                         size_t n, uint64_t remote, std::shared_ptr<RemoteCopier> copier,
                         std::shared_ptr<RemoteTransfer> transfer,
                         const std::vector<cl_event>& waits, cl_event* out);

}  // namespace gmux::daemon
