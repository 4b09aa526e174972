// A plugin for dl_probe (opened with RTLD_LOCAL): what dlsym(RTLD_NEXT, "puts") gives it.
#include <dlfcn.h>

extern "C" __attribute__((visibility("default"))) void* dl_probe_next_puts() {
  return dlsym(RTLD_NEXT, "puts");
}
