#include "daemon/executor.h"

#include <algorithm>

#include "daemon/session.h"

namespace gmux::daemon {

Executor::Executor(uint32_t device, OnComplete on_complete)
    : device_(device), on_complete_(std::move(on_complete)) {}

Executor::~Executor() { Stop(); }

void Executor::Start() { thread_ = std::thread([this] { Loop(); }); }

void Executor::Stop() {
  if (!thread_.joinable()) return;
  stopping_ = true;
  mailbox_.Post([] {});
  thread_.join();
}

void Executor::Run(std::shared_ptr<Command> cmd) {
  mailbox_.Post([this, c = std::move(cmd)]() mutable { Enqueue(std::move(c)); });
}

void Executor::Loop() {
  for (;;) {
    if (stopping_ && inflight_.empty()) {
      // Drain anything still posted (commands run normally so their sessions get answers).
      auto t = mailbox_.Take(std::chrono::steady_clock::now());
      if (!t) return;
      (*t)();
      continue;
    }
    auto t = mailbox_.Take(std::nullopt);
    if (t) (*t)();
  }
}

void CL_CALLBACK Executor::OnEvent(cl_event, cl_int status, void* user) {
  auto* e = static_cast<Entry*>(user);
  e->self->mailbox_.Post([e, status] {
    e->status = status;
    e->done = true;
    e->self->Deliver();
  });
}

void Executor::Enqueue(std::shared_ptr<Command> cmd) {
  auto entry = std::make_shared<Entry>();
  entry->cmd = cmd;
  entry->self = this;
  inflight_.push_back(entry);

  cl_int fail = CL_SUCCESS;
  std::vector<cl_event> waits;
  if (cmd->session && cmd->session->closed.load()) {
    fail = CL_INVALID_OPERATION;
  }
  for (const auto& d : cmd->deps) {
    if (fail != CL_SUCCESS) break;
    cl_int st = d->status();
    if (st < 0) {
      fail = CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST;
    } else if (!d->user()) {
      Ref<cl_event> b = d->backend();
      if (b) waits.push_back(b->h);
    }
  }
  if (fail == CL_SUCCESS) {
    cl_event ev = nullptr;
    cl_int err = cmd->run(cmd->queue->h, waits, &ev);
    if (err != CL_SUCCESS || ev == nullptr) {
      fail = err != CL_SUCCESS ? err : CL_OUT_OF_RESOURCES;
    } else {
      entry->ev = Adopt(ev);
      cmd->event->SetBackend(entry->ev);
      err = Dispatch(ev).clSetEventCallback(ev, CL_COMPLETE, &Executor::OnEvent, entry.get());
      if (err != CL_SUCCESS) {
        Dispatch(ev).clWaitForEvents(1, &ev);
        cl_int st = CL_COMPLETE;
        Dispatch(ev).clGetEventInfo(ev, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof(st), &st,
                                    nullptr);
        entry->status = st;
        entry->done = true;
      }
    }
  }
  if (fail != CL_SUCCESS) {
    entry->status = fail;
    entry->done = true;
  }
  // Flush so the device starts (some backends only launch on flush), once per batch: when more
  // commands are already waiting, the last of them flushes every queue the batch used.
  if (!entry->done &&
      std::find(unflushed_.begin(), unflushed_.end(), cmd->queue) == unflushed_.end()) {
    unflushed_.push_back(cmd->queue);
  }
  if (mailbox_.Empty()) {
    for (const auto& q : unflushed_) Dispatch(q->h).clFlush(q->h);
    unflushed_.clear();
  }
  Deliver();
}

void Executor::Deliver() {
  while (!inflight_.empty() && inflight_.front()->done) {
    std::shared_ptr<Entry> e = std::move(inflight_.front());
    inflight_.pop_front();
    Command& c = *e->cmd;
    core::Completion done;
    done.tenant = c.tenant;
    done.block = c.block.id;
    done.range = {0, c.block.work_items};
    done.last = true;
    if (e->ev && e->status >= 0) {
      cl_ulong start = 0, end = 0;
      const auto& d = Dispatch(e->ev->h);
      if (d.clGetEventProfilingInfo(e->ev->h, CL_PROFILING_COMMAND_START, sizeof(start), &start,
                                    nullptr) == CL_SUCCESS &&
          d.clGetEventProfilingInfo(e->ev->h, CL_PROFILING_COMMAND_END, sizeof(end), &end,
                                    nullptr) == CL_SUCCESS &&
          end >= start) {
        done.device_time = Duration(static_cast<int64_t>(end - start));
      }
    }
    cl_int status = e->status >= 0 ? CL_COMPLETE : e->status;
    if (c.finished) c.finished(status);
    c.event->Complete(status);
    on_complete_(device_, done);
  }
}

}  // namespace gmux::daemon
