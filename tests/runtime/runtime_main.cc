// main() of one runtime test executable. This file is compiled once per executable, with the
// executable's GMUX_TEST_* definitions (tests/runtime/CMakeLists.txt); the environment itself is
// in the shared runtime_env.cc.
#include "runtime/runtime_env.h"

int main(int argc, char** argv) {
  gmux::testing::Variant v;
#ifdef GMUX_TEST_NO_SHM
  v.no_shm = true;
#endif
#ifdef GMUX_TEST_NO_DATA_FRAMES
  v.no_data_frames = true;
#endif
#ifdef GMUX_TEST_NO_REMOTE
  v.no_remote = true;
#endif
#ifdef GMUX_TEST_NO_STORAGE
  v.no_storage = true;
#endif
#ifdef GMUX_TEST_NO_DAEMON
  v.no_daemon = true;
#endif
#ifdef GMUX_TEST_TCP
  v.tcp = true;
#endif
#ifdef GMUX_TEST_TLS
  v.tls = true;
#endif
  return gmux::testing::RunRuntimeTests(argc, argv, v);
}
