// pdl_enabled (pdl.cuh): OPENJET_PDL=0 read once, the compute capability once per device.
#include <cstdlib>
#include <cstring>

#include "pdl.cuh"

namespace openjet {

bool pdl_enabled() {
    static const bool asked = [] {
        const char* v = std::getenv("OPENJET_PDL");
        return !(v && std::strcmp(v, "0") == 0);
    }();
    if (!asked) return false;
    constexpr int kMaxDevices = 64;
    static int major[kMaxDevices] = {};  // 0: not asked yet (a benign race: every writer writes the same value)
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) return false;
    if (!major[dev] && cudaDeviceGetAttribute(&major[dev], cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
        major[dev] = 0;
        return false;
    }
    return major[dev] >= 9;
}

}  // namespace openjet
