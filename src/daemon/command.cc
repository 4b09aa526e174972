#include "daemon/command.h"

namespace gmux::daemon {

void EventRecord::Complete(cl_int status) {
  std::vector<Waiter> waiters;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (status_ <= CL_COMPLETE) return;
    status_ = status > CL_COMPLETE ? CL_COMPLETE : status;
    waiters.swap(waiters_);
  }
  for (auto& w : waiters) w(status);
}

void EventRecord::AddWaiter(Waiter w) {
  cl_int now;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (status_ > CL_COMPLETE) {
      waiters_.push_back(std::move(w));
      return;
    }
    now = status_;
  }
  w(now);
}

}  // namespace gmux::daemon
