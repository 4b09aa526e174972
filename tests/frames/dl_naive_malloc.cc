// An LD_PRELOAD malloc wrapper written the common, naive way: it finds the real malloc with
// dlsym(RTLD_NEXT) on first use, with no guard against dlsym allocating. Works alone; must keep
// working beside libgmux-frame.so in either order (the agent's dlsym may not allocate).
#include <dlfcn.h>

#include <cstddef>

extern "C" __attribute__((visibility("default"))) void* malloc(size_t size) {
  using Fn = void* (*)(size_t);
  static Fn real = nullptr;
  if (real == nullptr) real = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "malloc"));
  return real(size);
}
