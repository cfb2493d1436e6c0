// Programmatic dependent launch (sm_90 and later): the next kernel in the stream may be launched while this
// one ends, so its blocks take the SMs this one's tail leaves idle and a GEMV streams its first weights in
// while the kernel before it (a one-block pack, say) still runs. ~850 kernels make a decode step.
//
// The rule every kernel launched through launch_kernel follows: pdl_wait() before it reads or writes any
// memory another kernel of the stream writes or reads (only immutable weights may be read before it), and
// pdl_launch_dependents() (lets the next kernel launch; the launch happens once every block of the grid has called
// it or exited, so a grid of several waves lets it in during its last) as early as it likes: correctness rests on
// the waits alone. Both are no-ops where the launch did not ask for it and on GPUs before sm_90.
//
// Reading weights before the wait pays only as copies or hints: ptxas moves the wait (ACQBULK in the SASS) above plain
// loads, so `x = w[i]; pdl_wait();` loads after the wait all the same, while cp.async copies (LDGSTS) and L2 prefetches
// (CCTL.E.PF2) keep their place before it (the SASS of the decode GEMV, the add-norm cluster pack and the GDN step,
// 2026-12-06; the producer-warp GEMV's bulk copies are in a warp that never waits).
//
// On by default on sm_90+ (the same bits, scripts/gpu_same_bits.sh; the 27B's decode step at T=1 12.38 ->
// 11.46 ms on the H200); OPENJET_PDL=0, set before the first launch, turns the launch attribute off.
#pragma once

#include <cuda_runtime.h>

#include <utility>

namespace openjet {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// The start of a kernel that touches the stream's memory from its first instruction: wait for the kernel before,
// then let the next one launch (letting it launch before the wait measured slower: the 27B's step on the H200 at
// T=1 9.51 against 9.28 ms, T=4 11.04 against 10.84).
__device__ __forceinline__ void pdl_start() {
    pdl_wait();
    pdl_launch_dependents();
}

// The start of a kernel whose first loads lie on its critical path, kLate: wait for the kernel before, but let the
// next one launch only at pdl_let_in<kLate>(), once those loads are in; else pdl_start. Why: a next GEMV let in at once
// fills its weight rings (MBs) beside those loads, which then wait behind its stream (the GDN step, OPENJET_GDN_LATE:
// its state loads ~6 us against ~2.5, a layer 2.0 us shorter at T=5 on the H100 when let in late; NOTES_gemv.md,
// fifty-third session; the decode packs, whose loads are few, gained nothing from it). Every thread of the block calls
// both.
template <bool kLate> __device__ __forceinline__ void pdl_start_late() {
    if constexpr (kLate) pdl_wait();
    else pdl_start();
}
template <bool kLate> __device__ __forceinline__ void pdl_let_in() {
    if constexpr (kLate) pdl_launch_dependents();
}

// Whether launches on the current device ask for programmatic serialization (sm_90+, unless OPENJET_PDL=0).
bool pdl_enabled();

// kernel<<<grid, block, smem, stream>>>(args...) with the first n of attrs.
template <class... Params, class... Args>
cudaError_t launch_kernel_with(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                               cudaLaunchAttribute* attrs, unsigned n, Args&&... args) {
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = attrs;
    cfg.numAttrs = n;
    return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

inline cudaLaunchAttribute pdl_attribute() {
    cudaLaunchAttribute a{};
    a.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    a.val.programmaticStreamSerializationAllowed = 1;
    return a;
}

// kernel<<<grid, block, smem, stream>>>(args...), with the PDL attribute where pdl_enabled(); the kernel must
// follow the rule above. Returns the launch's error.
template <class... Params, class... Args>
cudaError_t launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                          Args&&... args) {
    cudaLaunchAttribute attr[1] = {pdl_attribute()};
    return launch_kernel_with(kernel, grid, block, smem, stream, attr, pdl_enabled() ? 1 : 0,
                              std::forward<Args>(args)...);
}

// kKernel allowed kBytes of dynamic shared memory a block (past the default 48 KiB), asked once, at the first call:
// every later call returns the first one's result without a driver call (a launch's path pays one static's check).
template <auto kKernel, size_t kBytes> cudaError_t smem_opted_in() {
    static const cudaError_t e =
        cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kBytes));
    return e;
}

// Blocks of kKernel (kThreads a block, kBytes of dynamic shared memory) resident per SM, asked once, after the opt-in
// above (without it a block of over 48 KiB counts as not fitting) and, with max_carveout (the first call's), after
// asking for the largest shared-memory carveout; 0 where a call failed. Resident grids size themselves by it.
template <auto kKernel, int kThreads, size_t kBytes> int resident_per_sm(bool max_carveout = false) {
    static const int n = [max_carveout] {
        int per_sm = 0;
        if (smem_opted_in<kKernel, kBytes>() != cudaSuccess ||
            (max_carveout && cudaFuncSetAttribute(kKernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                                  cudaSharedmemCarveoutMaxShared) != cudaSuccess) ||
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kKernel, kThreads, kBytes) != cudaSuccess) {
            cudaGetLastError();
            return 0;
        }
        return per_sm;
    }();
    return n;
}

// The SMs a resident grid is sized for: the GPU's `sms`, or grid_sms where that is smaller and positive (a smaller
// GPU emulated: the engine's OPENJET_PERSISTENT_SMS).
inline int grid_sm_count(int sms, int grid_sms) { return grid_sms > 0 && grid_sms < sms ? grid_sms : sms; }

// The same in thread-block clusters of cluster_x blocks along x (sm_90+; the kernel may use cluster APIs).
template <class... Params, class... Args>
cudaError_t launch_kernel_cluster(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                                  unsigned cluster_x, Args&&... args) {
    cudaLaunchAttribute attr[2] = {{}, pdl_attribute()};
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = cluster_x;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    return launch_kernel_with(kernel, grid, block, smem, stream, attr, pdl_enabled() ? 2 : 1,
                              std::forward<Args>(args)...);
}

}  // namespace openjet
