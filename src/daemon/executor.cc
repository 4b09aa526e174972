#include "daemon/executor.h"

#include "common/stage_trace.h"
#include "daemon/remote_copy.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "daemon/session.h"

namespace gmux::daemon {

Executor::Executor(uint32_t device, Post post, OnComplete on_complete)
    : gate_(std::make_shared<Gate>()),
      device_(device),
      on_complete_(std::move(on_complete)),
      post_(std::move(post)) {
  gate_->self = this;
}

Executor::~Executor() { Close(); }

void Executor::Close() {
  gate_->open.store(false);
  while (gate_->passing.load() != 0) std::this_thread::sleep_for(std::chrono::microseconds(100));
}

void Executor::Run(std::vector<Job>& jobs) {
  GMUX_STAGE(3);
  {
    for (auto& j : jobs) Enqueue(std::move(j));
    jobs.clear();
    // Flush so the device starts (some backends only launch on flush), once per batch and queue.
    for (const auto& q : unflushed_) Dispatch(q->h).clFlush(q->h);
    GMUX_STAGE(4);
    unflushed_.clear();
    // One completion callback per batch, on its last command: when it fires, the earlier ones
    // have usually finished too and are collected without a wake-up each (see OnDone).
    for (auto it = inflight_.rbegin(); it != inflight_.rend(); ++it) {
      if (!(*it)->done) {
        if (!(*it)->watched) Watch(*it);
        break;
      }
    }
    Deliver();
  }
}

void Executor::Watch(const std::shared_ptr<Entry>& e) {
  e->watched = true;
  cl_event ev = e->ev->h;
  // The callback owns a reference to the entry: it may fire after the entry was collected.
  auto* ref = new std::shared_ptr<Entry>(e);
  callbacks_.fetch_add(1);
  if (Dispatch(ev).clSetEventCallback(ev, CL_COMPLETE, &Executor::OnEvent, ref) != CL_SUCCESS) {
    delete ref;
    callbacks_.fetch_sub(1);
    Dispatch(ev).clWaitForEvents(1, &ev);
    cl_int st = CL_COMPLETE;
    Dispatch(ev).clGetEventInfo(ev, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof(st), &st, nullptr);
    e->status = st;
    e->done = true;
  }
}

void Executor::OnDone(const std::shared_ptr<Entry>& e, cl_int status) {
  callbacks_.fetch_sub(1);
  if (e->done) return;  // already collected by polling (and perhaps delivered)
  e->status = status;
  e->done = true;
  // Collect the earlier commands that finished meanwhile; watch those still running.
  for (auto& x : inflight_) {
    if (x == e) break;
    if (x->done) continue;
    cl_int st = CL_QUEUED;
    Dispatch(x->ev->h).clGetEventInfo(x->ev->h, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof(st), &st,
                                      nullptr);
    if (st <= CL_COMPLETE) {
      x->status = st;
      x->done = true;
    } else if (!x->watched) {
      Watch(x);
    }
  }
  Deliver();
}

void CL_CALLBACK Executor::OnEvent(cl_event, cl_int status, void* user) {
  GMUX_STAGE(5);
  std::shared_ptr<Entry> e = std::move(*static_cast<std::shared_ptr<Entry>*>(user));
  delete static_cast<std::shared_ptr<Entry>*>(user);
  std::shared_ptr<Gate> gate = e->gate;
  gate->passing.fetch_add(1);
  if (gate->open.load()) {
    Executor* self = gate->self;
    self->post_([self, e = std::move(e), status] { self->OnDone(e, status); });
  }  // else closed: the owner stopped without waiting for this one
  gate->passing.fetch_sub(1);
}

void Executor::Enqueue(Job job) {
  auto entry = std::make_shared<Entry>();
  std::shared_ptr<Command> cmd = job.cmd;
  const bool first = job.whole || job.range.begin == 0;
  entry->job = std::move(job);
  entry->gate = gate_;
  inflight_.push_back(entry);
  const Job& j = entry->job;

  cl_int fail = CL_SUCCESS;
  std::vector<cl_event> waits;
  if (cmd->session && cmd->session->closed.load()) {
    fail = CL_INVALID_OPERATION;
  }
  if (!j.whole && cmd->chunk_status != CL_SUCCESS) fail = cmd->chunk_status;  // an earlier chunk failed
  // A finished command has dropped its closures (Deliver): nothing of it may run again.
  if (fail == CL_SUCCESS && !(j.whole ? static_cast<bool>(cmd->run)
                                      : static_cast<bool>(cmd->run_chunk))) {
    fail = CL_INVALID_OPERATION;
  }
  for (const auto& d : cmd->deps) {
    if (fail != CL_SUCCESS) break;
    cl_int st = d->StatusForWaiters();
    if (st < 0) {
      fail = CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST;
    } else if (!d->user() && first) {
      Ref<cl_event> b = d->backend();
      if (b) waits.push_back(b->h);
    }
  }
  if (fail == CL_SUCCESS && first) {
    for (const auto& d : cmd->after) {
      // A failed write's data never came: what follows runs regardless, as it would natively
      // after the blocking call that returned the error.
      if (d->StatusForWaiters() < 0) continue;
      if (Ref<cl_event> b = d->backend()) waits.push_back(b->h);
    }
  }
  if (!j.whole && !first && cmd->last_chunk) waits.push_back(cmd->last_chunk->h);
  if (fail == CL_SUCCESS) {
    cl_event ev = nullptr;
    cl_int err = j.whole ? cmd->run(cmd->queue->h, waits, &ev)
                         : cmd->run_chunk(cmd->queue->h, waits, j.range, &ev);
    if (err != CL_SUCCESS || ev == nullptr) {
      fail = err != CL_SUCCESS ? err : CL_OUT_OF_RESOURCES;
    } else {
      entry->ev = Adopt(ev);
      if (j.whole) {
        if (cmd->remote && cmd->remote->map) cmd->event->SetFirstBackend(cmd->remote->map);
        cmd->event->SetBackend(entry->ev);
      } else {
        if (first) cmd->event->SetFirstBackend(entry->ev);
        cmd->last_chunk = entry->ev;
        if (j.last) cmd->event->SetBackend(entry->ev);
      }
      // Watched later: by Run() for the last command of its batch, or by OnDone().
    }
  }
  if (fail != CL_SUCCESS) {
    entry->status = fail;
    entry->done = true;
    if (!j.whole && cmd->chunk_status == CL_SUCCESS) cmd->chunk_status = fail;
    cmd->event->failed_early.store(fail);
  }
  if (!entry->done &&
      std::find(unflushed_.begin(), unflushed_.end(), cmd->queue) == unflushed_.end()) {
    unflushed_.push_back(cmd->queue);
  }
}

void Executor::Deliver() {
  std::vector<core::Completion> batch;
  std::vector<std::shared_ptr<Entry>> finished;
  batch.swap(spare_done_);
  finished.swap(spare_finished_);
  while (!inflight_.empty() && inflight_.front()->done) {
    std::shared_ptr<Entry> e = std::move(inflight_.front());
    inflight_.pop_front();
    Command& c = *e->job.cmd;
    core::Completion done;
    done.tenant = c.tenant;
    done.block = c.block.id;
    done.range = e->job.range;
    done.last = e->job.last;
    if (e->ev && e->status >= 0) {
      cl_ulong start = 0, end = 0;
      const auto& d = Dispatch(e->ev->h);
      // A remote copy's time is the map's, the copy's and the unmap's together.
      cl_event first = c.remote && c.remote->map ? c.remote->map->h : e->ev->h;
      if (d.clGetEventProfilingInfo(first, CL_PROFILING_COMMAND_START, sizeof(start), &start,
                                    nullptr) == CL_SUCCESS &&
          d.clGetEventProfilingInfo(e->ev->h, CL_PROFILING_COMMAND_END, sizeof(end), &end,
                                    nullptr) == CL_SUCCESS &&
          end >= start) {
        done.device_time = Duration(static_cast<int64_t>(end - start));
      }
    }
    cl_int status = e->status >= 0 ? CL_COMPLETE : e->status;
    if (status == CL_COMPLETE && c.remote && c.remote->status.load() < 0) {
      status = c.remote->status.load();
    }
    if (!e->job.whole) {
      if (status < 0 && c.chunk_status == CL_SUCCESS) c.chunk_status = status;
      if (e->job.last) {
        status = c.chunk_status == CL_SUCCESS ? CL_COMPLETE : c.chunk_status;
        c.last_chunk.reset();
      }
    }
    e->status = status;
    batch.push_back(done);
    if (e->job.last && c.in_place_markers) {
      c.in_place_markers->fetch_sub(1);
      c.in_place_markers.reset();
    }
    if (e->job.last) finished.push_back(std::move(e));
  }
  // The scheduler first: delivering to the client may block on its socket, which must never
  // hold up the device for other tenants.
  if (!batch.empty()) on_complete_(device_, batch);
  for (auto& e : finished) {
    Command& c = *e->job.cmd;
    if (e->status == CL_COMPLETE) c.event->ran.store(true);
    if (c.finished) c.finished(e->status);
    c.event->Complete(e->status);
    // What the closures hold (a write's staging buffer, a launch's arguments) goes now, not when
    // the last reference to the command does: the client's event and its queue's records may
    // keep the command long after, and a series of large writes would keep every buffer.
    c.run = nullptr;
    c.run_chunk = nullptr;
    c.finished = nullptr;
  }
  batch.clear();
  finished.clear();
  if (batch.capacity() > spare_done_.capacity()) batch.swap(spare_done_);
  if (finished.capacity() > spare_finished_.capacity()) finished.swap(spare_finished_);
}

}  // namespace gmux::daemon
