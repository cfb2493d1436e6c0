// device_attribute (device_attr.cuh): a table per device and attribute, filled on first use.
#include <atomic>

#include "device_attr.cuh"

namespace openjet {
namespace {

constexpr int kMaxDevices = 64, kMaxAttributes = 256;
std::atomic<int> cache[kMaxDevices][kMaxAttributes];  // value + 1 (attributes are >= 0); 0: not asked yet

}  // namespace

cudaError_t device_attribute(cudaDeviceAttr attr, int* value) {
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess) return e;
    const int a = static_cast<int>(attr);
    if (dev < 0 || dev >= kMaxDevices || a < 0 || a >= kMaxAttributes) return cudaDeviceGetAttribute(value, attr, dev);
    if (const int cached = cache[dev][a].load(std::memory_order_relaxed)) {
        *value = cached - 1;
        return cudaSuccess;
    }
    e = cudaDeviceGetAttribute(value, attr, dev);
    if (e == cudaSuccess && *value >= 0) cache[dev][a].store(*value + 1, std::memory_order_relaxed);
    return e;
}

}  // namespace openjet
