// Kernel scan: decides from a program's OpenCL C source whether splitting its launches into
// chunks (ranges of work-groups run as separate launches with global work offsets) is invisible
// to its kernels.
//
// Under splitting, get_global_id, get_local_id, get_local_size, get_enqueued_local_size,
// get_local_linear_id, get_work_dim and sub-group queries keep their whole-launch values (each
// chunk passes the whole launch's global offset plus its start, and the same local size). These
// change and make a program unsplittable:
//   get_group_id, get_num_groups, get_global_size, get_global_offset, get_global_linear_id.
// The scan is conservative: it looks at whole identifier tokens anywhere in the source, outside
// comments and string literals, so a helper function or macro that uses one also counts. Source
// it cannot see through makes the program unsplittable too: `#include` (headers are not ours to
// scan), the token-pasting operator `##` (it can build a forbidden name), and build options that
// include files or define macros naming a forbidden builtin. Programs built from binaries, or
// compiled and linked from several pieces, are never split (decided by the caller).
//
// Restoring. A program whose only obstacle is the five builtins is `restorable`: a variant of it
// built from RestoringSource() with RestoringOptions() of one launch shape computes, in chunks of
// that launch, exactly what the program computes whole. The prelude redefines the five as
// functions of get_global_id, get_local_id, get_local_size and the launch's whole global sizes
// and offsets, passed as -D constants (so one variant serves every launch of that shape, and its
// chunks). Line numbers of the program's own source are kept (#line 1).
// Pure functions; any thread.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace gmux::daemon {

struct SplitVerdict {
  bool splittable = false;
  bool restorable = false;   // not splittable only for the builtins the prelude restores
  bool uses_groups = false;  // restorable, and uses get_group_id or get_num_groups
  std::string reason;        // why not (the first offending token or construct)
};

SplitVerdict ScanForSplit(std::string_view source, std::string_view build_options);

// The source of the restoring variant of `source` (see above).
std::string RestoringSource(std::string_view source);
// The build options (appended to the program's own) of the variant for launches of `dim`
// dimensions with these whole-launch global sizes and offsets.
std::string RestoringOptions(uint32_t dim, const std::array<size_t, 3>& global,
                             const std::array<size_t, 3>& offset);

}  // namespace gmux::daemon
