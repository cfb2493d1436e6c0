/* OpenJet engine: the C API that Python reaches through ctypes (openjet_launcher/engine/native.py).
 *
 * Plain C on purpose: one library serves every Python version. Conventions for every function here:
 *   - errors are values: an int status (OPENJET_OK, or a negative OPENJET_ERR_*), nothing aborts;
 *   - reports are JSON written into a caller's buffer, snprintf-style (see openjet_probe);
 *   - const char* results are static strings owned by the library.
 * Only the functions declared here are exported from the shared library. */
#ifndef OPENJET_H
#define OPENJET_H

#include <stddef.h>

/* Bumps when a signature or a report's JSON schema changes incompatibly; the binding checks it. */
#define OPENJET_API_VERSION 1

#if defined(_WIN32)
#  if defined(OPENJET_BUILDING_LIBRARY)
#    define OPENJET_API __declspec(dllexport)
#  else
#    define OPENJET_API __declspec(dllimport)
#  endif
#else
#  define OPENJET_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

enum openjet_status {
    OPENJET_OK = 0,
    OPENJET_ERR_INVALID_ARGUMENT = -1, /* e.g. buf == NULL with buf_len > 0 */
    OPENJET_ERR_OUT_OF_MEMORY = -2,    /* host allocation failed while building a report */
    OPENJET_ERR_INTERNAL = -3          /* a bug: please report it */
};

/* OPENJET_API_VERSION of the library (compare with the header the caller was written against). */
OPENJET_API int openjet_api_version(void);

/* Package version the library was built from, e.g. "0.1.0". */
OPENJET_API const char* openjet_version(void);

/* Writes a JSON report of the CUDA driver, runtime, every visible device and the architectures
 * compiled into this library (schema: openjet_launcher/engine/device_probe.py). Launches a tiny
 * kernel on every device to prove that our code runs there.
 *
 * Returns n >= 0, the report's length in bytes without the terminating NUL:
 *   n <  buf_len: buf holds the report and its NUL;
 *   n >= buf_len: buf is too small and holds "" (when buf_len > 0); call again with at least
 *                 n + 1 bytes, plus slack, since free memory may change between calls.
 * buf may be NULL when buf_len == 0 (size query; the probe still runs).
 * Returns a negative OPENJET_ERR_* on bad arguments or host out-of-memory.
 * CUDA failures (no driver, no device, no kernel image for a device) are not errors of this call:
 * the report says what failed, with the CUDA error code, name and message. */
OPENJET_API int openjet_probe(char* buf, size_t buf_len);

#ifdef __cplusplus
}
#endif

/* The decode engine (openjet_engine_*). */
#include "openjet_engine.h"

#endif /* OPENJET_H */
