// pdl_enabled (pdl.cuh): OPENJET_PDL=0 read once; the compute capability from device_attribute.
#include <cstdlib>
#include <cstring>

#include "device_attr.cuh"
#include "pdl.cuh"

namespace openjet {

bool pdl_enabled() {
    static const bool asked = [] {
        const char* v = std::getenv("OPENJET_PDL");
        return !(v && std::strcmp(v, "0") == 0);
    }();
    int major = 0;
    return asked && device_attribute(cudaDevAttrComputeCapabilityMajor, &major) == cudaSuccess && major >= 9;
}

}  // namespace openjet
