// openjet_probe: what the CUDA driver and runtime see, device by device, and whether our code runs there.
// Runtime API only, with cudart linked statically and libcuda loaded by cudart at run time: a machine
// without a driver or a GPU still gets a report (with the CUDA error), never a crash.
#include <cuda_runtime.h>

#include <cstdio>
#include <new>
#include <string>

#include "build_info.h"
#include "dense_gemm.cuh"
#include "json.h"
#include "openjet.h"

namespace {

using openjet::JsonWriter;

constexpr int kProbeMagic = 0x0DE7;  // a value device memory does not hold by chance (we zero it first)

// out[0] proves the launch ran; out[1] tells which code ran: __CUDA_ARCH__ of the SASS picked for the
// device, or of the PTX the driver JIT-compiled.
__global__ void probe_kernel(int* out) {
    out[0] = kProbeMagic;
#ifdef __CUDA_ARCH__
    out[1] = __CUDA_ARCH__;
#endif
}

// CUDA encodes versions as 1000*major + 10*minor (12090 -> "12.9").
std::string version_text(int v) {
    char b[32];
    std::snprintf(b, sizeof b, "%d.%d", v / 1000, (v % 1000) / 10);
    return b;
}

// What a user can do about the common failures; empty when we have nothing to add to CUDA's message.
std::string hint_for(cudaError_t e, int driver_version, int device_sm) {
    char b[512];
    switch (e) {
        case cudaErrorInsufficientDriver:
            if (driver_version == 0)
                std::snprintf(b, sizeof b,
                              "No NVIDIA driver was found (libcuda could not be loaded). Install the NVIDIA "
                              "driver; this engine's CUDA runtime %s needs a driver for CUDA %d.0 or newer.",
                              version_text(CUDART_VERSION).c_str(), CUDART_VERSION / 1000);
            else
                std::snprintf(b, sizeof b,
                              "The NVIDIA driver supports CUDA %s but this engine's runtime is CUDA %s: "
                              "update the driver.",
                              version_text(driver_version).c_str(), version_text(CUDART_VERSION).c_str());
            return b;
        case cudaErrorNoDevice:
            return "No CUDA GPU is visible to this process (check CUDA_VISIBLE_DEVICES, and that the "
                   "container was started with GPU access).";
        case cudaErrorNoKernelImageForDevice:
            std::snprintf(b, sizeof b,
                          "This library has no code that runs on sm_%d (compiled for %s): rebuild it with "
                          "OPENJET_CUDA_ARCHITECTURES including %d.",
                          device_sm, OPENJET_CUDA_ARCHITECTURES, device_sm);
            return b;
        case cudaErrorUnsupportedPtxVersion:
            std::snprintf(b, sizeof b,
                          "The driver cannot compile this library's PTX (CUDA %s): update the driver, or "
                          "rebuild with OPENJET_CUDA_ARCHITECTURES including %d-real.",
                          version_text(CUDART_VERSION).c_str(), device_sm);
            return b;
        default:
            return "";
    }
}

// {"code", "name", "message", "call", "hint"} for a failed CUDA call, or null on success.
void put_cuda_error(JsonWriter& w, cudaError_t e, const char* call, int driver_version, int device_sm = 0) {
    if (e == cudaSuccess) {
        w.null();
        return;
    }
    const std::string hint = hint_for(e, driver_version, device_sm);
    w.begin_object()
        .key("code").integer(static_cast<int>(e))
        .key("name").str(cudaGetErrorName(e))
        .key("message").str(cudaGetErrorString(e))
        .key("call").str(call)
        .key("hint");
    if (hint.empty()) w.null(); else w.str(hint);
    w.end_object();
}

// nvidia-smi's form, so the launcher can match CUDA devices with NVML's (their orders may differ).
std::string uuid_text(const cudaUUID_t& u) {
    const auto* b = reinterpret_cast<const unsigned char*>(u.bytes);
    char s[64];
    std::snprintf(s, sizeof s, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
                  b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
                  b[14], b[15]);
    return s;
}

// Launches probe_kernel on the current device and checks what it wrote. Writes the "kernel" object.
void put_kernel_check(JsonWriter& w, int driver_version, int device_sm) {
    int* d_out = nullptr;
    int h_out[2] = {0, 0};
    const char* call = "cudaMalloc";
    cudaError_t e = cudaMalloc(&d_out, sizeof h_out);
    if (e == cudaSuccess) {
        call = "cudaMemset";
        e = cudaMemset(d_out, 0, sizeof h_out);
    }
    if (e == cudaSuccess) {
        call = "probe_kernel<<<1, 1>>>";
        probe_kernel<<<1, 1>>>(d_out);
        e = cudaGetLastError();  // launch errors: no kernel image, unsupported PTX, ...
    }
    if (e == cudaSuccess) {
        call = "cudaMemcpy";
        e = cudaMemcpy(h_out, d_out, sizeof h_out, cudaMemcpyDeviceToHost);  // also reports execution errors
    }
    if (d_out) cudaFree(d_out);
    cudaGetLastError();  // clear a non-sticky error so it is not blamed on the next call

    cudaFuncAttributes attr{};
    const bool have_attr = cudaFuncGetAttributes(&attr, probe_kernel) == cudaSuccess;
    cudaGetLastError();

    const bool wrote = e == cudaSuccess && h_out[0] == kProbeMagic;
    w.key("kernel").begin_object().key("ok").boolean(wrote);
    w.key("arch");  // e.g. 90: the __CUDA_ARCH__ / 10 of the code that ran
    if (wrote) w.integer(h_out[1] / 10); else w.null();
    w.key("binary_version");  // cudaFuncAttributes: SASS arch picked for this device (PTX JIT: the device's)
    if (have_attr) w.integer(attr.binaryVersion); else w.null();
    w.key("ptx_version");
    if (have_attr) w.integer(attr.ptxVersion); else w.null();
    w.key("error");
    if (e != cudaSuccess) {
        put_cuda_error(w, e, call, driver_version, device_sm);
    } else if (!wrote) {
        char msg[128];
        std::snprintf(msg, sizeof msg, "the kernel ran but wrote %d instead of %d", h_out[0], kProbeMagic);
        w.begin_object().key("code").null().key("name").str("OpenJetProbeMismatch").key("message").str(msg)
            .key("call").str(call).key("hint").null().end_object();
    } else {
        w.null();
    }
    w.end_object();
}

void put_device(JsonWriter& w, int index, int driver_version) {
    w.begin_object().key("index").integer(index);
    cudaDeviceProp p{};
    cudaError_t e = cudaGetDeviceProperties(&p, index);
    if (e != cudaSuccess) {
        w.key("error");
        put_cuda_error(w, e, "cudaGetDeviceProperties", driver_version);
        w.end_object();
        return;
    }
    const int sm = p.major * 10 + p.minor;
    char pci[32] = "";
    if (cudaDeviceGetPCIBusId(pci, sizeof pci, index) != cudaSuccess) pci[0] = '\0';
    char cc[16];
    std::snprintf(cc, sizeof cc, "%d.%d", p.major, p.minor);
    w.key("name").str(p.name)
        .key("uuid").str(uuid_text(p.uuid))
        .key("pci_bus_id").str(pci)
        .key("compute_capability").str(cc)
        .key("sm").integer(sm)
        .key("sm_count").integer(p.multiProcessorCount)
        .key("total_memory_bytes").integer(static_cast<int64_t>(p.totalGlobalMem));

    // Free memory and the kernel check need a context on this device.
    const char* call = "cudaSetDevice";
    e = cudaSetDevice(index);
    size_t free_b = 0, total_b = 0;
    if (e == cudaSuccess) {
        call = "cudaMemGetInfo";
        e = cudaMemGetInfo(&free_b, &total_b);
    }
    w.key("free_memory_bytes");
    if (e == cudaSuccess) w.integer(static_cast<int64_t>(free_b)); else w.null();
    if (e == cudaSuccess) {
        put_kernel_check(w, driver_version, sm);
    } else {
        w.key("kernel").null();
    }
    w.key("error");
    put_cuda_error(w, e, call, driver_version, sm);
    w.end_object();
}

std::string probe_json() {
    int driver = 0, runtime = 0, count = 0;
    // cudaDriverGetVersion reports 0 (and success) when no driver can be loaded.
    const cudaError_t driver_err = cudaDriverGetVersion(&driver);
    const cudaError_t runtime_err = cudaRuntimeGetVersion(&runtime);
    const cudaError_t count_err = cudaGetDeviceCount(&count);
    if (count_err != cudaSuccess) count = 0;
    cudaGetLastError();

    JsonWriter w;
    w.begin_object()
        .key("api_version").integer(OPENJET_API_VERSION)
        .key("library_version").str(OPENJET_VERSION_STRING);
    w.key("driver_version");
    if (driver > 0) w.str(version_text(driver)); else w.null();
    w.key("driver_version_raw").integer(driver);
    w.key("runtime_version");
    if (runtime > 0) w.str(version_text(runtime)); else w.null();
    w.key("runtime_version_raw").integer(runtime);
    w.key("build").begin_object()
        .key("cuda_toolkit").str(version_text(CUDART_VERSION))
        .key("cuda_architectures").str(OPENJET_CUDA_ARCHITECTURES)
        .key("sass").raw(OPENJET_SASS_ARCHS_JSON)
        .key("ptx").raw(OPENJET_PTX_ARCHS_JSON)
        .key("dense_prefill_gemm").boolean(openjet::dense_gemm_compiled())  // sm_90a + CUTLASS (dense_gemm.cuh)
        .end_object();
    // The first failure that leaves us without devices; per-device failures sit in each device.
    w.key("error");
    if (driver_err != cudaSuccess) put_cuda_error(w, driver_err, "cudaDriverGetVersion", driver);
    else if (runtime_err != cudaSuccess) put_cuda_error(w, runtime_err, "cudaRuntimeGetVersion", driver);
    else put_cuda_error(w, count_err, "cudaGetDeviceCount", driver);
    w.key("device_count").integer(count);

    int previous = -1;  // the caller's current device, restored below (cudaSetDevice is per thread)
    if (count > 0 && cudaGetDevice(&previous) != cudaSuccess) previous = -1;
    w.key("devices").begin_array();
    for (int i = 0; i < count; ++i) put_device(w, i, driver);
    w.end_array();
    if (previous >= 0) cudaSetDevice(previous);
    cudaGetLastError();

    w.end_object();
    return w.text();
}

}  // namespace

extern "C" OPENJET_API int openjet_probe(char* buf, size_t buf_len) {
    if (buf == nullptr && buf_len > 0) return OPENJET_ERR_INVALID_ARGUMENT;
    try {
        const std::string json = probe_json();
        if (json.size() >= buf_len) {
            if (buf_len > 0) buf[0] = '\0';
        } else {
            json.copy(buf, json.size());
            buf[json.size()] = '\0';
        }
        return static_cast<int>(json.size());
    } catch (const std::bad_alloc&) {
        return OPENJET_ERR_OUT_OF_MEMORY;
    } catch (...) {
        return OPENJET_ERR_INTERNAL;
    }
}
