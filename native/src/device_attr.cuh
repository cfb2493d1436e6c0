// Attributes of the current CUDA device, asked once per (device, attribute): launchers read them on every
// launch (compute capability for PDL, shared memory for the attention rows and the prefill kernel, SM count).
#pragma once

#include <cuda_runtime.h>

namespace openjet {

// cudaDeviceGetAttribute(value, attr, current device), cached after its first success.
cudaError_t device_attribute(cudaDeviceAttr attr, int* value);

}  // namespace openjet
