// dl_probe: checks that a preloaded libgmux-frame.so leaves the dynamic linker's behaviour as
// programs rely on it (the agent interposes dlsym). Used by frames_test.
//
//   dl_probe reload N   opens libGL privately N times: looks the swap up with dlsym, draws and
//                       swaps in a window, closes libGL (needs DISPLAY); the agent must keep
//                       nothing of a closed libGL
//   dl_probe next       a plugin opened with RTLD_LOCAL asks dlsym(RTLD_NEXT, "puts"), and the
//                       program asks for a missing symbol: libc's puts, and NULL with dlerror()
//
// Exit status 0 when every check passes; a message on stderr otherwise.
#include <X11/Xlib.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <string>

#include <GL/glx.h>

namespace {

int Reload(int rounds) {
  for (int round = 0; round < rounds; ++round) {
    void* h = dlopen("libGL.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      std::fprintf(stderr, "dl_probe: round %d: cannot open libGL.so.1\n", round);
      return 1;
    }
    auto swap = reinterpret_cast<void (*)(Display*, GLXDrawable)>(dlsym(h, "glXSwapBuffers"));
    auto choose = reinterpret_cast<XVisualInfo* (*)(Display*, int, int*)>(
        dlsym(h, "glXChooseVisual"));
    auto create = reinterpret_cast<GLXContext (*)(Display*, XVisualInfo*, GLXContext, Bool)>(
        dlsym(h, "glXCreateContext"));
    auto make_current = reinterpret_cast<Bool (*)(Display*, GLXDrawable, GLXContext)>(
        dlsym(h, "glXMakeCurrent"));
    auto destroy = reinterpret_cast<void (*)(Display*, GLXContext)>(dlsym(h, "glXDestroyContext"));
    Display* d = XOpenDisplay(nullptr);
    if (d == nullptr || !swap || !choose || !create || !make_current || !destroy) {
      std::fprintf(stderr, "dl_probe: round %d: no display or no GLX functions\n", round);
      return 1;
    }
    int attributes[] = {GLX_RGBA, GLX_DOUBLEBUFFER, None};
    XVisualInfo* vi = choose(d, DefaultScreen(d), attributes);
    if (vi == nullptr) {
      std::fprintf(stderr, "dl_probe: round %d: glXChooseVisual failed (libGL reopened "
                           "half-initialised?)\n", round);
      return 1;
    }
    XSetWindowAttributes swa{};
    swa.colormap = XCreateColormap(d, RootWindow(d, vi->screen), vi->visual, AllocNone);
    Window w = XCreateWindow(d, RootWindow(d, vi->screen), 0, 0, 64, 64, 0, vi->depth,
                             InputOutput, vi->visual, CWColormap, &swa);
    GLXContext c = create(d, vi, nullptr, True);
    make_current(d, w, c);
    for (int i = 0; i < 10; ++i) swap(d, w);
    make_current(d, None, nullptr);
    destroy(d, c);
    XFree(vi);
    XCloseDisplay(d);
    dlclose(h);
  }
  return 0;
}

int Next(const char* plugin) {
  void* p = dlopen(plugin, RTLD_NOW | RTLD_LOCAL);
  if (p == nullptr) {
    std::fprintf(stderr, "dl_probe: cannot open %s: %s\n", plugin, dlerror());
    return 1;
  }
  auto probe = reinterpret_cast<void* (*)()>(dlsym(p, "dl_probe_next_puts"));
  if (probe == nullptr || probe() != reinterpret_cast<void*>(&puts)) {
    std::fprintf(stderr, "dl_probe: a plugin's dlsym(RTLD_NEXT, \"puts\") is not libc's puts\n");
    return 1;
  }
  dlerror();
  void* missing = dlsym(RTLD_NEXT, "dl_probe_no_such_symbol");
  const char* error = dlerror();
  if (missing != nullptr || error == nullptr) {
    std::fprintf(stderr, "dl_probe: a missing symbol gave %p and no dlerror()\n", missing);
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 3 && std::strcmp(argv[1], "reload") == 0) return Reload(std::stoi(argv[2]));
  if (argc >= 3 && std::strcmp(argv[1], "next") == 0) return Next(argv[2]);
  std::fprintf(stderr, "usage: dl_probe reload N | dl_probe next PLUGIN\n");
  return 2;
}
