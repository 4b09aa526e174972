#include "daemon/remote_copy.h"

#include <poll.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cerrno>
#include <cstring>
#include <system_error>

namespace gmux::daemon {

namespace {

int PidfdOpen(pid_t pid) { return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)); }

}  // namespace

std::shared_ptr<RemoteCopier> RemoteCopier::Open(pid_t pid, uint64_t probe, uint64_t cookie,
                                                 std::string* why) {
  if (pid <= 0 || probe == 0) {
    *why = "no probe (a TCP client, or a client that does not offer remote copy)";
    return nullptr;
  }
  int fd = PidfdOpen(pid);
  if (fd < 0) {
    *why = std::string("pidfd_open: ") + std::strerror(errno);
    return nullptr;
  }
  std::shared_ptr<RemoteCopier> c(new RemoteCopier(pid, fd));
  // The pidfd is open, so if the probe still reads the cookie the pid was the client's when it
  // was opened: every later copy is checked against that process.
  uint64_t seen = 0;
  Status s = c->Read(probe, &seen, sizeof(seen));
  if (!s.ok()) {
    *why = s.message();
    return nullptr;
  }
  if (seen != cookie) {
    *why = "the probe did not hold the client's cookie";
    return nullptr;
  }
  return c;
}

RemoteCopier::~RemoteCopier() {
  {
    std::lock_guard<std::mutex> lock(queue_->mu);
    queue_->stop = true;
  }
  queue_->cv.notify_all();
  if (thread_.joinable()) {
    if (thread_.get_id() == std::this_thread::get_id()) {
      thread_.detach();  // the last job held the last reference; the loop ends by itself
    } else {
      thread_.join();
    }
  }
  ::close(pidfd_);
}

bool RemoteCopier::ClientGone() const {
  pollfd p{pidfd_, POLLIN, 0};
  return ::poll(&p, 1, 0) != 0;  // readable once the process has exited (or an error)
}

Status RemoteCopier::Copy(uint64_t remote, void* local, size_t n, bool to_client) {
  if (ClientGone()) return PermissionDenied("the client has exited");
  auto* at = static_cast<uint8_t*>(local);
  size_t done = 0;
  while (done < n) {
    iovec l{at + done, n - done};
    iovec r{reinterpret_cast<void*>(static_cast<uintptr_t>(remote + done)), n - done};
    ssize_t got = to_client ? ::process_vm_writev(pid_, &l, 1, &r, 1, 0)
                            : ::process_vm_readv(pid_, &l, 1, &r, 1, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      const int err = got < 0 ? errno : EFAULT;
      if (err == EPERM || err == ESRCH) {
        // The kernel no longer lets this worker in (the client changed its uid or made itself
        // not dumpable since hello): the client goes back to copying itself.
        return PermissionDenied(std::string("the application's memory is no longer open to its "
                                            "worker: ") + std::strerror(err));
      }
      char where[64];
      std::snprintf(where, sizeof(where), "0x%llx",
                    static_cast<unsigned long long>(remote + done));
      return InvalidArgument(std::string(to_client ? "cannot write" : "cannot read") + " " +
                             std::to_string(n - done) + " bytes at " + where +
                             " of the application: " + std::strerror(err) +
                             (err == EFAULT ? " (memory freed or unmapped before the transfer "
                                              "ran?)"
                                            : ""));
    }
    done += static_cast<size_t>(got);
  }
  return Status::Ok();
}

Status RemoteCopier::CopyParallel(uint64_t remote, void* local, size_t n, bool to_client) {
  // The kernel's copy runs at about half the speed of the C library's memcpy on one core (no
  // vector registers; per-page pinning), so large transfers are split over a few threads: the
  // client waits on the transfer, so its core is free (docs/performance.md, "One copy").
  const size_t parts = std::min<size_t>(kMaxCopyThreads, n / kMinPartBytes);
  if (parts <= 1) return Copy(remote, local, n, to_client);
  const size_t part = (n / parts + 4095) & ~size_t{4095};
  std::vector<Status> results(parts, Status::Ok());
  std::vector<std::thread> helpers;
  auto* at = static_cast<uint8_t*>(local);
  for (size_t i = 1; i < parts; ++i) {
    const size_t from = i * part;
    if (from >= n) break;
    const size_t len = i + 1 == parts ? n - from : std::min(part, n - from);  // the last: the rest
    try {
      helpers.emplace_back([this, &results, i, remote, at, from, len, to_client] {
        results[i] = Copy(remote + from, at + from, len, to_client);
      });
    } catch (const std::system_error&) {
      results[i] = Copy(remote + from, at + from, len, to_client);  // no thread: do it here
    }
  }
  results[0] = Copy(remote, local, std::min(part, n), to_client);
  for (auto& h : helpers) h.join();
  for (auto& r : results) {
    if (!r.ok()) return r;
  }
  return Status::Ok();
}

Status RemoteCopier::Read(uint64_t remote, void* local, size_t n) {
  return CopyParallel(remote, local, n, false);
}

Status RemoteCopier::Write(uint64_t remote, const void* local, size_t n) {
  return CopyParallel(remote, const_cast<void*>(local), n, true);
}

void RemoteCopier::Post(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> lock(queue_->mu);
    if (!thread_.joinable()) {
      try {
        thread_ = std::thread(Loop, queue_);
      } catch (const std::system_error&) {
        // No thread to be had (the tenant's limits): the copy runs here instead.
      }
    }
    if (thread_.joinable()) {
      queue_->jobs.push_back(std::move(job));
      queue_->cv.notify_one();
      return;
    }
  }
  job();
}

void RemoteCopier::Loop(std::shared_ptr<Queue> q) {
  std::unique_lock<std::mutex> lock(q->mu);
  for (;;) {
    q->cv.wait(lock, [&] { return q->stop || !q->jobs.empty(); });
    if (q->jobs.empty()) return;  // stopping, nothing left
    auto job = std::move(q->jobs.front());
    q->jobs.pop_front();
    lock.unlock();
    job();
    job = nullptr;
    lock.lock();
  }
}

namespace {

constexpr size_t kInlineCopyBytes = 2u << 20;

struct CopyJob {
  std::shared_ptr<RemoteCopier> copier;
  std::shared_ptr<RemoteTransfer> transfer;
  cl_event gate;  // owned: set (and released) once the copy is done
  void* mapped;
  size_t n;
  uint64_t remote;
  bool to_device;
};

void CL_CALLBACK Mapped(cl_event, cl_int status, void* user) {
  auto* job = static_cast<CopyJob*>(user);
  auto copier = job->copier;
  auto run = [job, status] {
    const cl_icd_dispatch& d = Dispatch(job->gate);
    cl_int gate = CL_COMPLETE;
    if (status < 0) {
      gate = status;  // no mapping: the unmap must not run either
      job->transfer->message = "the device could not map the buffer";
      job->transfer->status.store(status);
    } else {
      Status s = job->to_device ? job->copier->Read(job->remote, job->mapped, job->n)
                                : job->copier->Write(job->remote, job->mapped, job->n);
      if (!s.ok()) {
        // The unmap still runs (the mapping is given back); the command reports the failure:
        // CL_INVALID_OPERATION when the worker may not copy at all (the ICD then stops asking),
        // CL_INVALID_VALUE for memory it could not copy (the ICD copies itself if the
        // application maps it: device memory, for example, cannot be pinned by the kernel).
        job->transfer->message = s.message();
        job->transfer->status.store(s.code() == StatusCode::kPermissionDenied
                                        ? CL_INVALID_OPERATION
                                        : CL_INVALID_VALUE);
      }
    }
    d.clSetUserEventStatus(job->gate, gate);
    d.clReleaseEvent(job->gate);
    delete job;
  };
  // A copy that one thread does in a few hundred microseconds runs here, on the backend's
  // callback thread: handing it to the copier costs a thread wake-up, a large share of it.
  if (job->n < kInlineCopyBytes) {
    run();
  } else {
    copier->Post(std::move(run));
  }
}

}  // namespace

namespace {

// One piece of a transfer: map [offset, offset+n), copy once mapped, unmap behind a gate.
// `*out` receives the unmap's event; the map's is kept in `transfer`.
cl_int EnqueuePiece(const cl_icd_dispatch& d, cl_command_queue cq, cl_context ctx, cl_mem mem,
                    bool to_device, size_t offset, size_t n, uint64_t remote,
                    const std::shared_ptr<RemoteCopier>& copier,
                    const std::shared_ptr<RemoteTransfer>& transfer,
                    const std::vector<cl_event>& waits, cl_event* out) {
  cl_event map_ev = nullptr;
  cl_int err = CL_SUCCESS;
  const cl_map_flags flags = to_device ? CL_MAP_WRITE_INVALIDATE_REGION : CL_MAP_READ;
  void* p = d.clEnqueueMapBuffer(cq, mem, CL_FALSE, flags, offset, n,
                                 static_cast<cl_uint>(waits.size()),
                                 waits.empty() ? nullptr : waits.data(), &map_ev, &err);
  if (err != CL_SUCCESS) return err;
  Ref<cl_event> map = Adopt(map_ev);
  if (!transfer->map) transfer->map = map;
  transfer->pieces.push_back(map);
  cl_event gate = d.clCreateUserEvent(ctx, &err);
  if (err != CL_SUCCESS) {
    // Nothing can hold the unmap back: give the mapping back once it is made, and fail.
    d.clEnqueueUnmapMemObject(cq, mem, p, 1, &map_ev, nullptr);
    return err;
  }
  // The unmap follows the map (in-order or not) and the gate, so whatever waits for this
  // command waits for the copy too.
  cl_event unmap_waits[2] = {map_ev, gate};
  err = d.clEnqueueUnmapMemObject(cq, mem, p, 2, unmap_waits, out);
  if (err != CL_SUCCESS) {
    d.clSetUserEventStatus(gate, CL_COMPLETE);
    d.clReleaseEvent(gate);
    return err;
  }
  auto* job = new CopyJob{copier, transfer, gate, p, n, remote, to_device};
  err = d.clSetEventCallback(map_ev, CL_COMPLETE, Mapped, job);
  if (err != CL_SUCCESS) {
    job->transfer->message = "cannot watch the mapping";
    job->transfer->status.store(err);
    d.clSetUserEventStatus(gate, err);
    d.clReleaseEvent(gate);
    delete job;
  }
  return CL_SUCCESS;
}

}  // namespace

cl_int EnqueueRemoteCopy(cl_command_queue cq, cl_mem mem, bool to_device, size_t offset,
                         size_t n, uint64_t remote, std::shared_ptr<RemoteCopier> copier,
                         std::shared_ptr<RemoteTransfer> transfer,
                         const std::vector<cl_event>& waits, cl_event* out) {
  const cl_icd_dispatch& d = Dispatch(cq);
  cl_context ctx = nullptr;
  cl_int err = d.clGetCommandQueueInfo(cq, CL_QUEUE_CONTEXT, sizeof(ctx), &ctx, nullptr);
  if (err != CL_SUCCESS) return err;
  // Pieces of at most kMapPieceBytes, each mapped after the previous one's unmap: what a
  // transfer holds mapped at once (on a GPU, the driver's pinned staging memory) stays bounded
  // whatever its size.
  std::vector<cl_event> after = waits;
  for (size_t at = 0; at < n; at += kMapPieceBytes) {
    const size_t len = std::min(kMapPieceBytes, n - at);
    cl_event unmap = nullptr;
    err = EnqueuePiece(d, cq, ctx, mem, to_device, offset + at, len, remote + at, copier,
                       transfer, after, &unmap);
    if (err != CL_SUCCESS) return err;
    if (at + len == n) {
      *out = unmap;
    } else {
      transfer->pieces.push_back(Adopt(unmap));
      after.assign(1, unmap);
    }
  }
  return CL_SUCCESS;
}

}  // namespace gmux::daemon
