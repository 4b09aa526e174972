// gmux-worker: serves one client session of gmuxd in a process of its own, so that whatever the
// backend does on the tenant's behalf (compile its source, run its kernels, assert on its bad
// arguments) can hurt only this session. gmuxd starts it (under the tenant's uid when gmuxd runs
// as root, with no capabilities and no new privileges) with its control channel on a descriptor;
// it opens the backend, says it is up, receives its session (the client's socket comes with
// it), answers the client's hello, and then serves the client until the client leaves. It runs
// only what gmuxd's scheduler releases (daemon/worker_queue.h). Not meant to be run by hand.
#include <grp.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <spdlog/spdlog.h>

#include "common/stage_trace.h"
#include "daemon/backend.h"
#include "daemon/control.h"
#include "daemon/log.h"
#include "daemon/remote_copy.h"
#include "daemon/session.h"
#include "daemon/worker_queue.h"

#ifdef GMUX_JEMALLOC
// The worker's allocator is jemalloc (docs/performance.md, "The worker's allocator"). Its options,
// read when it starts: freed address space is unmapped, not kept for reuse ("retain", on by
// default on 64-bit Linux), because the tenant's worker_memory_bytes (RLIMIT_DATA) and the
// worker's books of shared-memory storage count the process's data mappings (VmData): kept,
// memory freed after a peak (a kernel's compilation) would still count against the tenant.
extern "C" {
const char* malloc_conf = "retain:false";
int mallctl(const char* name, void* oldp, size_t* oldlenp, void* newp, size_t newlen);
}
#endif

namespace {

int Usage() {
  std::fprintf(stderr, "gmux-worker: started by gmuxd, not by hand.\n"
               "usage: gmux-worker --control-fd N [--backend-library PATH] [--vendors-dir DIR] "
               "[--platform NAME] [--backend-threads batch|normal] [--uid U --gid G]\n");
  return 2;
}

// Lowers `resource` to `value` (hard and soft); 0 leaves it. A limit already below stays.
bool SetLimit(int resource, uint64_t value) {
  if (value == 0) return true;
  rlimit cur{};
  if (::getrlimit(resource, &cur) != 0) return false;
  rlim_t v = static_cast<rlim_t>(value);
  if (cur.rlim_max != RLIM_INFINITY && cur.rlim_max < v) v = cur.rlim_max;
  rlimit want{v, v};
  return ::setrlimit(resource, &want) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace gmux::daemon;
  InitLog("gmux-worker", "info");
#ifdef GMUX_JEMALLOC
  {
    // A direct reference: the link cannot drop jemalloc (--as-needed) and leave glibc's malloc.
    const char* version = nullptr;
    size_t len = sizeof(version);
    if (mallctl("version", &version, &len, nullptr, 0) == 0 && version != nullptr) {
      spdlog::debug("allocator: jemalloc {}", version);
    }
  }
#endif
  int ctl_fd = -1;
  long uid = -1, gid = -1;  // the tenant's, when gmuxd (root) starts this worker for it
  BackendOptions backend_options;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (i + 1 >= argc) return Usage();
    std::string v = argv[++i];
    if (a == "--control-fd") {
      ctl_fd = std::atoi(v.c_str());
    } else if (a == "--backend-library") {
      backend_options.library = v;
    } else if (a == "--vendors-dir") {
      backend_options.vendors_dir = v;
    } else if (a == "--platform") {
      backend_options.platform = v;
    } else if (a == "--backend-threads" && (v == "batch" || v == "normal")) {
      backend_options.batch_threads = v == "batch";
    } else if (a == "--uid") {
      uid = std::strtol(v.c_str(), nullptr, 10);
    } else if (a == "--gid") {
      gid = std::strtol(v.c_str(), nullptr, 10);
    } else {
      return Usage();
    }
  }
  if (ctl_fd < 0 || (uid < 0) != (gid < 0)) return Usage();
  // Not dumpable: the tenant this worker serves runs as the same uid, and must not ptrace it or
  // write its memory through /proc (it would forge what the worker reports to gmuxd, or run
  // commands the scheduler did not release). The worker may still read its client's memory
  // (remote_copy.h): that needs the *client* to be dumpable, not the worker. Set before the
  // tenant's uid is taken, so the process is never the tenant's and dumpable at once.
  ::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
  if (uid >= 0) {
    if (::setgroups(0, nullptr) != 0 || ::setresgid(static_cast<gid_t>(gid),
                                                     static_cast<gid_t>(gid),
                                                     static_cast<gid_t>(gid)) != 0 ||
        ::setresuid(static_cast<uid_t>(uid), static_cast<uid_t>(uid),
                    static_cast<uid_t>(uid)) != 0) {
      std::fprintf(stderr, "gmux-worker: cannot take uid %ld: %s\n", uid, std::strerror(errno));
      return 125;
    }
    ::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    // A uid change clears the parent-death signal gmuxd set: set again.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  }
  // Without root every worker runs as gmuxd's own uid, which no other tenant has: the moment
  // between exec and the line above is then open only to processes of gmuxd's uid.
  ::signal(SIGPIPE, SIG_IGN);

  // The threads the backend starts now (PoCL's compute threads, a driver's helpers) inherit
  // SCHED_BATCH from this one: woken by the session thread's enqueue, they wait for it to
  // reach its next wait instead of preempting it in the middle of its dispatch, which on a
  // host with fewer CPUs than busy threads turned one launch into a chain of context switches
  // (docs/policies.md, "The backend's threads run as batch"). This thread goes back to the
  // default policy after, and so do the threads it starts later. Unprivileged: a thread may
  // move itself between the two.
  sched_param no_priority{};
  const bool batch = backend_options.batch_threads &&
                     ::sched_setscheduler(0, SCHED_BATCH, &no_priority) == 0;
  auto backend = Backend::Open(backend_options);
  if (batch) ::sched_setscheduler(0, SCHED_OTHER, &no_priority);
  if (!backend.ok()) {
    spdlog::error("{}", backend.status().ToString());
    return 3;
  }
  ctl::WorkerUp up{static_cast<uint32_t>(::getpid()),
                   static_cast<uint32_t>((*backend)->devices().size())};
  if (!ctl::Send(ctl_fd, ctl::Type::kWorkerUp, &up, sizeof(up), 1).ok()) return 0;

  // Waits (as a spare, perhaps for long) for its session.
  auto m = ctl::Receive(ctl_fd);
  if (!m.ok()) return 0;  // gmuxd retired this spare or stopped
  auto assign = m->As<ctl::Assign>();
  if (m->type != ctl::Type::kAssign || assign.size() != 1 || m->fd < 0) {
    spdlog::error("expected a session from gmuxd");
    return 4;
  }
  const ctl::Assign& a = assign[0];
  // The tenant's resource limits, hard and soft, before any of its requests is read: from here
  // on this process runs tenant code, which cannot raise them again (no CAP_SYS_RESOURCE).
  if (!SetLimit(RLIMIT_DATA, a.rlimit_data) || !SetLimit(RLIMIT_NOFILE, a.rlimit_nofile)) {
    spdlog::warn("cannot set the tenant's resource limits: {}",
                 std::strerror(errno));
    return 5;
  }
  auto core = std::make_shared<SessionCore>();
  core->fd = m->fd;
  core->id = a.session;
  core->tenant = a.tenant;
  core->tenant_name = std::string(a.tenant_name, strnlen(a.tenant_name, sizeof(a.tenant_name)));
  core->tcp = a.tcp != 0;
  core->limits.max_payload_bytes = a.max_payload_bytes;
  core->pool_mask = a.pool_mask;
  core->data_frames = a.data_frames != 0;
  core->spin_us = a.spin_us;
  if (!core->tcp && a.probe != 0) {
    std::string why;
    core->remote = RemoteCopier::Open(static_cast<pid_t>(a.peer_pid), a.probe, a.probe_cookie,
                                      &why);
    if (!core->remote) {
      spdlog::info("session {}: transfers through shared memory, not copied straight from the "
                   "application ({})", core->id, why);
    }
  }
  {
    capnp::MallocMessageBuilder b;
    BuildHelloReply(b, **backend, core->tenant_name, core->id, a.pool_mask,
                    core->remote != nullptr);
    core->Send(b);
  }
  auto to_session = [](const ctl::Limits& l) {
    SessionLimits s;
    s.max_bulk_bytes = l.max_bulk_bytes == 0 ? UINT64_MAX : l.max_bulk_bytes;
    s.max_queued_commands = l.max_queued_commands;
    s.max_events = l.max_events;
    s.max_objects = l.max_objects;
    s.memory_quota = l.memory_quota;
    s.memory_capacity = l.memory_capacity;
    return s;
  };
  const SessionLimits limits = to_session(a.limits);
  core->SetSessionLimits(limits);

  // gmuxd gone: nothing can be scheduled any more; the client sees its socket close.
  WorkerQueue queue(ctl_fd, (*backend)->devices().size(), [] { ::_exit(0); });
  // The tenant's limits are shared by its sessions: gmuxd sends a new share as they come and go.
  queue.OnLimits([core, to_session](const ctl::Limits& l) { core->SetSessionLimits(to_session(l)); });
  queue.SetPool(a.pool_mask, &(*backend)->cl(), (*backend)->devices());
  queue.SetReleaseSpin(std::chrono::microseconds(a.spin_us));
  queue.Start();
  Session session(core, **backend, queue, limits);
  // A client that leaves ends the stream (kUnavailable); anything else ended the session on
  // its account (a malformed frame, a broken ring): said in gmuxd's log.
  if (gmux::Status st = session.Serve();
      !st.ok() && st.code() != gmux::StatusCode::kUnavailable) {
    spdlog::warn("session {} of tenant '{}' ended: {}", core->id, core->tenant_name,
                 st.message());
  }
  GMUX_STAGE_WRITE();  // before _exit (a stage-trace build only)
  // The client left (or broke the protocol): the process ends, and with it every backend
  // object of the session, whatever is still running. What finished is reported first: a
  // client that exits right after its last blocking call is charged for it.
  queue.ReportBeforeExit();
  std::fflush(stderr);
  ::_exit(0);
}
