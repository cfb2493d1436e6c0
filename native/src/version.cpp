// The library's identity: C API version (checked by the ctypes binding) and the package version.
#include "build_info.h"
#include "openjet.h"

extern "C" OPENJET_API int openjet_api_version(void) { return OPENJET_API_VERSION; }

extern "C" OPENJET_API const char* openjet_version(void) { return OPENJET_VERSION_STRING; }
