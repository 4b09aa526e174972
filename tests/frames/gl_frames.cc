// gl_frames: a small, self-contained OpenGL frame loop used by the vGASA frame-rate tests and
// the demo. It stands in for an unmodified game: it opens an X11 window (no window manager
// needed, so it runs under Xvfb), and each frame it spins the CPU for --cpu-ms (the "game
// logic"), draws --draw full-window blended, textured quads (rasterizer load; on Mesa's
// llvmpipe that is CPU work in the same process) and presents the frame with glXSwapBuffers or
// eglSwapBuffers, called by their normal names so that an LD_PRELOAD agent interposes them.
// With --lookup the swap is called through a pointer from glXGetProcAddressARB /
// eglGetProcAddress instead, to test that the agent interposes the lookup too.
//
//   gl_frames [--frames N] [--seconds S] [--size WxH] [--cpu-ms X] [--draw N] [--api glx|egl]
//             [--lookup] [--report S] [--json]
//
//   --frames N   stop after N frames (0, the default: no frame limit)
//   --seconds S  stop after S seconds (0: no time limit). Default: 5 without --frames, no time
//                limit with --frames N; with both it stops at whichever comes first. With both
//                limits at 0 it runs until SIGINT or SIGTERM, then reports as usual.
//   --size WxH   window size (default 256x256)
//   --cpu-ms X   busy-spin X ms of this thread's CPU time per frame before drawing (default 0)
//   --draw N     full-window quads drawn per frame (default 1; 0 only clears)
//   --api A      glx (default; desktop GL 1.x through GLX) or egl (GLES 2 through EGL on the X
//                display, eglGetDisplay + eglCreateWindowSurface)
//   --lookup     call the swap through glXGetProcAddressARB / eglGetProcAddress
//   --report S   also print the rate of the last S seconds every S seconds (default 0: off)
//   --json       print {"frames":N,"seconds":S,"fps":F,"api":"glx","renderer":"..."} at the
//                end (and each --report line as {"t":T,"frames":N,"fps":F}); else human lines
//
// Exit status: 0 on success, 1 on a bad command line, 2 when the display, the window or the GL
// context cannot be had (with a message on stderr).
//
// Build: g++ -std=c++20 -O2 -Wall -Wextra -o gl_frames gl_frames.cc -lGL -lEGL -lGLESv2 -lX11
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <string_view>

#include <X11/Xlib.h>
#include <X11/Xutil.h>

#include <GL/gl.h>
#include <GL/glx.h>

#include <EGL/egl.h>
#include <GLES2/gl2.h>

namespace {

struct Options {
  long frames = 0;
  double seconds = 5;
  bool seconds_given = false;
  int width = 256;
  int height = 256;
  double cpu_ms = 0;
  long draw = 1;
  bool egl = false;
  bool lookup = false;
  double report = 0;
  bool json = false;
};

volatile std::sig_atomic_t g_stop = 0;

void OnSignal(int) { g_stop = 1; }

void Usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s [--frames N] [--seconds S] [--size WxH] [--cpu-ms X] [--draw N]\n"
               "          [--api glx|egl] [--lookup] [--report S] [--json]\n",
               argv0);
}

bool ParseLong(const char* s, long* out) {
  char* end = nullptr;
  long v = std::strtol(s, &end, 10);
  if (end == s || *end != '\0' || v < 0) return false;
  *out = v;
  return true;
}

bool ParseDouble(const char* s, double* out) {
  char* end = nullptr;
  double v = std::strtod(s, &end);
  if (end == s || *end != '\0' || !(v >= 0) || v > 1e9) return false;
  *out = v;
  return true;
}

bool ParseSize(const char* s, int* w, int* h) {
  char* end = nullptr;
  long a = std::strtol(s, &end, 10);
  if (end == s || (*end != 'x' && *end != 'X')) return false;
  const char* rest = end + 1;
  long b = std::strtol(rest, &end, 10);
  if (end == rest || *end != '\0' || a < 1 || b < 1 || a > 16384 || b > 16384) return false;
  *w = static_cast<int>(a);
  *h = static_cast<int>(b);
  return true;
}

// Returns false (after a message) on a bad command line.
bool ParseArgs(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "gl_frames: %s needs a value\n", argv[i]);
        return nullptr;
      }
      return argv[++i];
    };
    const char* v = nullptr;
    bool ok = true;
    if (a == "--lookup") {
      o->lookup = true;
    } else if (a == "--json") {
      o->json = true;
    } else if (a == "-h" || a == "--help") {
      Usage(argv[0]);
      std::exit(0);
    } else if (a == "--frames") {
      ok = (v = value()) && ParseLong(v, &o->frames);
    } else if (a == "--seconds") {
      ok = (v = value()) && ParseDouble(v, &o->seconds);
      o->seconds_given = true;
    } else if (a == "--size") {
      ok = (v = value()) && ParseSize(v, &o->width, &o->height);
    } else if (a == "--cpu-ms") {
      ok = (v = value()) && ParseDouble(v, &o->cpu_ms);
    } else if (a == "--draw") {
      ok = (v = value()) && ParseLong(v, &o->draw);
    } else if (a == "--report") {
      ok = (v = value()) && ParseDouble(v, &o->report);
    } else if (a == "--api") {
      ok = (v = value()) != nullptr;
      if (ok && std::string_view(v) == "glx") {
        o->egl = false;
      } else if (ok && std::string_view(v) == "egl") {
        o->egl = true;
      } else {
        ok = false;
      }
    } else {
      std::fprintf(stderr, "gl_frames: unknown option %s\n", argv[i]);
      Usage(argv[0]);
      return false;
    }
    if (!ok) {
      if (v != nullptr) std::fprintf(stderr, "gl_frames: bad value for %s: %s\n", argv[i - 1], v);
      Usage(argv[0]);
      return false;
    }
  }
  if (o->frames > 0 && !o->seconds_given) o->seconds = 0;
  return true;
}

double Now(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// Burns `ms` milliseconds of this thread's CPU time (not wall time: under contention the frame
// takes longer, as a game's logic would).
void SpinCpu(double ms) {
  if (ms <= 0) return;
  static volatile unsigned sink = 0;
  const double end = Now(CLOCK_THREAD_CPUTIME_ID) + ms * 1e-3;
  unsigned x = sink + 1;
  do {
    for (int i = 0; i < 2000; ++i) x = x * 1664525u + 1013904223u;
    sink = x;
  } while (Now(CLOCK_THREAD_CPUTIME_ID) < end);
}

std::string JsonEscape(const char* s) {
  std::string out;
  for (; s != nullptr && *s != '\0'; ++s) {
    unsigned char c = static_cast<unsigned char>(*s);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

// Creates and maps a plain window (no window manager needed) and waits until it is mapped.
Window MakeWindow(Display* dpy, Visual* visual, int depth, const Options& o) {
  Window root = DefaultRootWindow(dpy);
  XSetWindowAttributes attrs{};
  attrs.colormap = XCreateColormap(dpy, root, visual, AllocNone);
  attrs.background_pixel = 0;
  attrs.border_pixel = 0;
  attrs.event_mask = StructureNotifyMask;
  Window win = XCreateWindow(dpy, root, 0, 0, static_cast<unsigned>(o.width),
                             static_cast<unsigned>(o.height), 0, depth, InputOutput, visual,
                             CWColormap | CWBackPixel | CWBorderPixel | CWEventMask, &attrs);
  XStoreName(dpy, win, o.egl ? "gl_frames (egl)" : "gl_frames (glx)");
  XMapWindow(dpy, win);
  XEvent ev;
  do {
    XWindowEvent(dpy, win, StructureNotifyMask, &ev);
  } while (ev.type != MapNotify);
  return win;
}

constexpr int kTex = 64;

// A kTex x kTex RGBA checkerboard with varying alpha.
void FillTexture(unsigned char* px) {
  for (int y = 0; y < kTex; ++y) {
    for (int x = 0; x < kTex; ++x) {
      unsigned char* p = px + 4 * (y * kTex + x);
      bool on = ((x / 8) + (y / 8)) % 2 == 0;
      p[0] = static_cast<unsigned char>(on ? 255 : 4 * x);
      p[1] = static_cast<unsigned char>(on ? 255 : 4 * y);
      p[2] = static_cast<unsigned char>(on ? 64 : 192);
      p[3] = static_cast<unsigned char>(on ? 200 : 120);
    }
  }
}

// ---- GLX: desktop GL 1.x, fixed function ----

struct GlxState {
  Display* dpy = nullptr;
  Window win = 0;
  GLXContext ctx = nullptr;
  void (*swap)(Display*, GLXDrawable) = nullptr;
};

bool GlxInit(Display* dpy, const Options& o, GlxState* s) {
  s->dpy = dpy;
  int attrs[] = {GLX_RGBA, GLX_DOUBLEBUFFER, GLX_RED_SIZE, 8, GLX_GREEN_SIZE, 8,
                 GLX_BLUE_SIZE, 8, None};
  XVisualInfo* vi = glXChooseVisual(dpy, DefaultScreen(dpy), attrs);
  if (vi == nullptr) {
    std::fprintf(stderr, "gl_frames: no double-buffered RGB GLX visual on this display\n");
    return false;
  }
  s->win = MakeWindow(dpy, vi->visual, vi->depth, o);
  s->ctx = glXCreateContext(dpy, vi, nullptr, True);
  XFree(vi);
  if (s->ctx == nullptr) {
    std::fprintf(stderr, "gl_frames: glXCreateContext failed\n");
    return false;
  }
  if (!glXMakeCurrent(dpy, s->win, s->ctx)) {
    std::fprintf(stderr, "gl_frames: glXMakeCurrent failed\n");
    return false;
  }
  if (o.lookup) {
    s->swap = reinterpret_cast<void (*)(Display*, GLXDrawable)>(
        glXGetProcAddressARB(reinterpret_cast<const GLubyte*>("glXSwapBuffers")));
    if (s->swap == nullptr) {
      std::fprintf(stderr, "gl_frames: glXGetProcAddressARB(\"glXSwapBuffers\") gave null\n");
      return false;
    }
  }
  glViewport(0, 0, o.width, o.height);
  static unsigned char px[kTex * kTex * 4];
  FillTexture(px);
  GLuint tex = 0;
  glGenTextures(1, &tex);
  glBindTexture(GL_TEXTURE_2D, tex);
  glTexParameteri(GL_TEXTURE_2D, GL_TEXTURE_MIN_FILTER, GL_LINEAR);
  glTexParameteri(GL_TEXTURE_2D, GL_TEXTURE_MAG_FILTER, GL_LINEAR);
  glTexImage2D(GL_TEXTURE_2D, 0, GL_RGBA, kTex, kTex, 0, GL_RGBA, GL_UNSIGNED_BYTE, px);
  glTexEnvi(GL_TEXTURE_ENV, GL_TEXTURE_ENV_MODE, GL_MODULATE);
  glEnable(GL_TEXTURE_2D);
  glBlendFunc(GL_SRC_ALPHA, GL_ONE_MINUS_SRC_ALPHA);
  glEnable(GL_BLEND);
  return true;
}

void GlxDraw(const Options& o, long frame) {
  float phase = static_cast<float>(frame % 360) / 360.0f;
  glClearColor(0.1f, 0.1f, 0.2f + 0.3f * phase, 1.0f);
  glClear(GL_COLOR_BUFFER_BIT);
  for (long i = 0; i < o.draw; ++i) {
    float k = static_cast<float>(i % 7) / 7.0f;
    float off = phase + 0.13f * static_cast<float>(i);
    glColor4f(0.5f + 0.5f * k, 1.0f - k, 0.5f, 0.5f);
    glBegin(GL_QUADS);
    glTexCoord2f(off, 0);
    glVertex2f(-1, -1);
    glTexCoord2f(off + 3, 0);
    glVertex2f(1, -1);
    glTexCoord2f(off + 3, 3);
    glVertex2f(1, 1);
    glTexCoord2f(off, 3);
    glVertex2f(-1, 1);
    glEnd();
  }
}

void GlxSwap(const Options& o, const GlxState& s) {
  if (o.lookup) {
    s.swap(s.dpy, s.win);
  } else {
    glXSwapBuffers(s.dpy, s.win);
  }
}

void GlxFini(GlxState* s) {
  if (s->ctx != nullptr) {
    glXMakeCurrent(s->dpy, None, nullptr);
    glXDestroyContext(s->dpy, s->ctx);
  }
  if (s->win != 0) XDestroyWindow(s->dpy, s->win);
}

// ---- EGL: GLES 2 with a trivial shader ----

struct EglState {
  EGLDisplay dpy = EGL_NO_DISPLAY;
  EGLSurface surf = EGL_NO_SURFACE;
  EGLContext ctx = EGL_NO_CONTEXT;
  Window win = 0;
  Display* xdpy = nullptr;
  EGLBoolean (*swap)(EGLDisplay, EGLSurface) = nullptr;
  GLint u_color = -1;
  GLint u_off = -1;
};

const char* kVertexShader = R"(
attribute vec2 pos;
uniform float off;
varying vec2 uv;
void main() {
  uv = (pos * 0.5 + 0.5) * 3.0 + vec2(off, 0.0);
  gl_Position = vec4(pos, 0.0, 1.0);
}
)";

const char* kFragmentShader = R"(
precision mediump float;
uniform sampler2D tex;
uniform vec4 color;
varying vec2 uv;
void main() { gl_FragColor = texture2D(tex, uv) * color; }
)";

GLuint Compile(GLenum type, const char* src) {
  GLuint sh = glCreateShader(type);
  glShaderSource(sh, 1, &src, nullptr);
  glCompileShader(sh);
  GLint ok = 0;
  glGetShaderiv(sh, GL_COMPILE_STATUS, &ok);
  if (!ok) {
    char log[512] = {};
    glGetShaderInfoLog(sh, sizeof log, nullptr, log);
    std::fprintf(stderr, "gl_frames: shader compile failed: %s\n", log);
    return 0;
  }
  return sh;
}

bool EglInit(Display* xdpy, const Options& o, EglState* s) {
  s->xdpy = xdpy;
  s->dpy = eglGetDisplay(reinterpret_cast<EGLNativeDisplayType>(xdpy));
  EGLint major = 0;
  EGLint minor = 0;
  if (s->dpy == EGL_NO_DISPLAY || !eglInitialize(s->dpy, &major, &minor)) {
    std::fprintf(stderr, "gl_frames: eglGetDisplay/eglInitialize failed (0x%x)\n",
                 eglGetError());
    return false;
  }
  if (!eglBindAPI(EGL_OPENGL_ES_API)) {
    std::fprintf(stderr, "gl_frames: eglBindAPI(EGL_OPENGL_ES_API) failed\n");
    return false;
  }
  const EGLint cfg_attrs[] = {EGL_SURFACE_TYPE, EGL_WINDOW_BIT, EGL_RENDERABLE_TYPE,
                              EGL_OPENGL_ES2_BIT, EGL_RED_SIZE, 8, EGL_GREEN_SIZE, 8,
                              EGL_BLUE_SIZE, 8, EGL_NONE};
  EGLConfig cfg = nullptr;
  EGLint n = 0;
  if (!eglChooseConfig(s->dpy, cfg_attrs, &cfg, 1, &n) || n < 1) {
    std::fprintf(stderr, "gl_frames: no EGL config with a GLES2 window surface\n");
    return false;
  }
  EGLint visual_id = 0;
  eglGetConfigAttrib(s->dpy, cfg, EGL_NATIVE_VISUAL_ID, &visual_id);
  XVisualInfo tmpl{};
  tmpl.visualid = static_cast<VisualID>(visual_id);
  int nvis = 0;
  XVisualInfo* vi = XGetVisualInfo(xdpy, VisualIDMask, &tmpl, &nvis);
  if (vi == nullptr) {
    std::fprintf(stderr, "gl_frames: no X visual 0x%x for the EGL config\n", visual_id);
    return false;
  }
  s->win = MakeWindow(xdpy, vi->visual, vi->depth, o);
  XFree(vi);
  s->surf = eglCreateWindowSurface(s->dpy, cfg, static_cast<EGLNativeWindowType>(s->win),
                                   nullptr);
  if (s->surf == EGL_NO_SURFACE) {
    std::fprintf(stderr, "gl_frames: eglCreateWindowSurface failed (0x%x)\n", eglGetError());
    return false;
  }
  const EGLint ctx_attrs[] = {EGL_CONTEXT_CLIENT_VERSION, 2, EGL_NONE};
  s->ctx = eglCreateContext(s->dpy, cfg, EGL_NO_CONTEXT, ctx_attrs);
  if (s->ctx == EGL_NO_CONTEXT) {
    std::fprintf(stderr, "gl_frames: eglCreateContext (GLES2) failed (0x%x)\n", eglGetError());
    return false;
  }
  if (!eglMakeCurrent(s->dpy, s->surf, s->surf, s->ctx)) {
    std::fprintf(stderr, "gl_frames: eglMakeCurrent failed (0x%x)\n", eglGetError());
    return false;
  }
  if (o.lookup) {
    s->swap = reinterpret_cast<EGLBoolean (*)(EGLDisplay, EGLSurface)>(
        eglGetProcAddress("eglSwapBuffers"));
    if (s->swap == nullptr) {
      std::fprintf(stderr, "gl_frames: eglGetProcAddress(\"eglSwapBuffers\") gave null\n");
      return false;
    }
  }
  GLuint vs = Compile(GL_VERTEX_SHADER, kVertexShader);
  GLuint fs = Compile(GL_FRAGMENT_SHADER, kFragmentShader);
  if (vs == 0 || fs == 0) return false;
  GLuint prog = glCreateProgram();
  glAttachShader(prog, vs);
  glAttachShader(prog, fs);
  glBindAttribLocation(prog, 0, "pos");
  glLinkProgram(prog);
  GLint linked = 0;
  glGetProgramiv(prog, GL_LINK_STATUS, &linked);
  if (!linked) {
    std::fprintf(stderr, "gl_frames: shader link failed\n");
    return false;
  }
  glUseProgram(prog);
  s->u_color = glGetUniformLocation(prog, "color");
  s->u_off = glGetUniformLocation(prog, "off");
  glUniform1i(glGetUniformLocation(prog, "tex"), 0);
  static const GLfloat quad[] = {-1, -1, 1, -1, -1, 1, 1, 1};
  GLuint vbo = 0;
  glGenBuffers(1, &vbo);
  glBindBuffer(GL_ARRAY_BUFFER, vbo);
  glBufferData(GL_ARRAY_BUFFER, sizeof quad, quad, GL_STATIC_DRAW);
  glVertexAttribPointer(0, 2, GL_FLOAT, GL_FALSE, 0, nullptr);
  glEnableVertexAttribArray(0);
  static unsigned char px[kTex * kTex * 4];
  FillTexture(px);
  GLuint tex = 0;
  glGenTextures(1, &tex);
  glActiveTexture(GL_TEXTURE0);
  glBindTexture(GL_TEXTURE_2D, tex);
  glTexParameteri(GL_TEXTURE_2D, GL_TEXTURE_MIN_FILTER, GL_LINEAR);
  glTexParameteri(GL_TEXTURE_2D, GL_TEXTURE_MAG_FILTER, GL_LINEAR);
  glTexParameteri(GL_TEXTURE_2D, GL_TEXTURE_WRAP_S, GL_REPEAT);
  glTexParameteri(GL_TEXTURE_2D, GL_TEXTURE_WRAP_T, GL_REPEAT);
  glTexImage2D(GL_TEXTURE_2D, 0, GL_RGBA, kTex, kTex, 0, GL_RGBA, GL_UNSIGNED_BYTE, px);
  glBlendFunc(GL_SRC_ALPHA, GL_ONE_MINUS_SRC_ALPHA);
  glEnable(GL_BLEND);
  glViewport(0, 0, o.width, o.height);
  return true;
}

void EglDraw(const Options& o, const EglState& s, long frame) {
  float phase = static_cast<float>(frame % 360) / 360.0f;
  glClearColor(0.1f, 0.1f, 0.2f + 0.3f * phase, 1.0f);
  glClear(GL_COLOR_BUFFER_BIT);
  for (long i = 0; i < o.draw; ++i) {
    float k = static_cast<float>(i % 7) / 7.0f;
    glUniform4f(s.u_color, 0.5f + 0.5f * k, 1.0f - k, 0.5f, 0.5f);
    glUniform1f(s.u_off, phase + 0.13f * static_cast<float>(i));
    glDrawArrays(GL_TRIANGLE_STRIP, 0, 4);
  }
}

void EglSwap(const Options& o, const EglState& s) {
  if (o.lookup) {
    s.swap(s.dpy, s.surf);
  } else {
    eglSwapBuffers(s.dpy, s.surf);
  }
}

void EglFini(EglState* s) {
  if (s->dpy != EGL_NO_DISPLAY) {
    eglMakeCurrent(s->dpy, EGL_NO_SURFACE, EGL_NO_SURFACE, EGL_NO_CONTEXT);
    if (s->ctx != EGL_NO_CONTEXT) eglDestroyContext(s->dpy, s->ctx);
    if (s->surf != EGL_NO_SURFACE) eglDestroySurface(s->dpy, s->surf);
    eglTerminate(s->dpy);
  }
  if (s->win != 0) XDestroyWindow(s->xdpy, s->win);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!ParseArgs(argc, argv, &o)) return 1;
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);

  Display* dpy = XOpenDisplay(nullptr);
  if (dpy == nullptr) {
    const char* name = std::getenv("DISPLAY");
    std::fprintf(stderr, "gl_frames: cannot open X display '%s'\n", name ? name : "(unset)");
    return 2;
  }
  GlxState glx;
  EglState egl;
  bool ok = o.egl ? EglInit(dpy, o, &egl) : GlxInit(dpy, o, &glx);
  if (!ok) {
    XCloseDisplay(dpy);
    return 2;
  }
  const char* api = o.egl ? "egl" : "glx";
  const char* renderer_str = reinterpret_cast<const char*>(glGetString(GL_RENDERER));
  std::string renderer = renderer_str ? renderer_str : "unknown";

  const double start = Now(CLOCK_MONOTONIC);
  double last_report = start;
  long last_frames = 0;
  long frames = 0;
  double now = start;
  while (g_stop == 0) {
    if (o.frames > 0 && frames >= o.frames) break;
    if (o.seconds > 0 && now - start >= o.seconds) break;
    SpinCpu(o.cpu_ms);
    if (o.egl) {
      EglDraw(o, egl, frames);
      EglSwap(o, egl);
    } else {
      GlxDraw(o, frames);
      GlxSwap(o, glx);
    }
    ++frames;
    now = Now(CLOCK_MONOTONIC);
    if (o.report > 0 && now - last_report >= o.report) {
      double fps = static_cast<double>(frames - last_frames) / (now - last_report);
      if (o.json) {
        std::printf("{\"t\":%.3f,\"frames\":%ld,\"fps\":%.2f}\n", now - start, frames, fps);
      } else {
        std::printf("gl_frames: t=%.1f s: %.2f fps\n", now - start, fps);
      }
      std::fflush(stdout);
      last_report = now;
      last_frames = frames;
    }
  }
  const double secs = now - start;
  const double fps = secs > 0 ? static_cast<double>(frames) / secs : 0;
  if (o.json) {
    std::printf("{\"frames\":%ld,\"seconds\":%.3f,\"fps\":%.2f,\"api\":\"%s\","
                "\"renderer\":\"%s\"}\n",
                frames, secs, fps, api, JsonEscape(renderer.c_str()).c_str());
  } else {
    std::printf("gl_frames: %ld frames in %.3f s = %.2f fps (api %s, lookup %s, renderer %s)\n",
                frames, secs, fps, api, o.lookup ? "yes" : "no", renderer.c_str());
  }
  std::fflush(stdout);
  if (o.egl) {
    EglFini(&egl);
  } else {
    GlxFini(&glx);
  }
  XCloseDisplay(dpy);
  return 0;
}
