// Internal entry points of libgmux-icd (hidden; reached only through the dispatch table and the
// three exported ICD functions in entry.cc).
#pragma once

#include "icd/objects.h"

namespace gmux::icd {

cl_int CL_API_CALL GetPlatformIDs(cl_uint, cl_platform_id*, cl_uint*);
cl_int CL_API_CALL GetPlatformInfo(cl_platform_id, cl_platform_info, size_t, void*, size_t*);
void* CL_API_CALL GetExtensionFunctionAddress(const char* name);
void* CL_API_CALL GetExtensionFunctionAddressForPlatform(cl_platform_id, const char* name);

}  // namespace gmux::icd
