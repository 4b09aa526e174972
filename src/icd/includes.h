// Include directories of a program build, resolved on the client.
//
// A program built with `-I DIR` (relative to the application's working directory, or absolute)
// includes headers the daemon's worker cannot see: over TCP it runs on another host, and locally
// in another working directory. So the ICD takes the `-I` options out of the build options,
// reads, from the application's own file system and with its own rights, every header that the
// source's `#include` lines name (transitively, searching as the compiler would: a quoted include
// first beside the file that includes it, then each directory in order), and sends them with the
// build. The worker writes them into a private directory per `-I` directory and builds with those
// in their place (docs/protocol.md).
//
// Every `#include` line counts, whatever `#if` surrounds it (a header that is not needed is sent
// for nothing); names built by macros cannot be resolved and are not sent. Files outside their
// directory's tree (`../x.h` above it) are not sent either: the worker never writes outside its
// private directory.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gmux::icd {

struct IncludeFile {
  uint32_t dir = 0;  // index of the -I directory it was found in
  std::string name;  // path below that directory, normalized, relative
  std::string data;
};

struct IncludeSet {
  std::string options;  // the build options without their -I options
  uint32_t dirs = 0;    // how many -I directories there were (in order)
  std::vector<IncludeFile> files;
};

// Bounds on what one build sends.
inline constexpr size_t kMaxIncludeFiles = 1024;
inline constexpr size_t kMaxIncludeBytes = 16u << 20;

// Splits `options` into its -I directories (`-I dir`, `-Idir`, quoted or not) and the rest, and
// collects the headers `sources` include from those directories.
IncludeSet CollectIncludes(const std::string& options, const std::vector<std::string>& sources);

// The names a source's #include lines give, in order ('"' or '<' kept as the first character).
std::vector<std::string> IncludeNames(const std::string& source);

// `name` lexically normalized ("a/./b/../c" -> "a/c"); empty when it is absolute, empty, or
// climbs above its root.
std::string NormalizeRelative(const std::string& name);

}  // namespace gmux::icd
