// Server::Pending: a connection before its worker has it (server.cc, server_admin.cc).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

#include "daemon/server.h"
#include "proto/frame.h"

namespace gmux::daemon {

struct Server::Pending {
  int fd = -1;
  bool tcp = false;
  uid_t uid = 0;
  gid_t gid = 0;
  pid_t pid = 0;           // a Unix peer's pid (SO_PEERCRED)
  uint64_t probe = 0;      // the hello's remote-copy probe (wire::Hello), handed to the worker
  uint64_t probe_cookie = 0;
  bool data_frames = false;  // the hello's dataFrames: the client reads data frames
  uint64_t slurm_job = 0;  // the Slurm job of a Unix peer (slurm.h), 0 when none
  std::string identity;  // "uid:N" or "token:T"; counted in identity_conns_ when non-empty
  std::string origin;    // who it is before hello: "uid:N", or the TCP peer's address
  std::string tls_subject;  // the client certificate's subject (TLS with tls_client_ca)
  std::chrono::steady_clock::time_point since;  // accepted (the waiting room's order)
  std::chrono::steady_clock::time_point deadline;
  std::vector<uint8_t> buf;
  size_t need = proto::kHeaderBytes;
  bool have_header = false;
  bool said_hello = false;  // a control connection: the next frame is its request
  bool control = false;
  bool admin = false;
  bool waiting = false;  // identified; waits for a worker of `key`
  WorkerKey key;
  TenantConfig tenant;
  TenantId tenant_id = 0;
};

}  // namespace gmux::daemon
