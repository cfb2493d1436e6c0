// Host-side counts of the launches of paths whose output may equal another path's bit for bit (the dense prefill
// GEMM gives the fast kernel's bits, the two-phase chunked GDN the one-kernel form's, a checkpoint taken inside a
// prefill call that of two calls around it, the prefill attention on fp16 rows of a Q8_0 cache the Q8_0 kernel's,
// a prefill's FFN gate and up in one GEMM those of two GEMMs and the swiglu pack, the persistent FFN those of the
// default launches, a GEMV or GEMM reading the tile layout (weight_layout.cuh) that of the GGUF's row layout, a
// decode row's pack on a cluster of blocks that of one block, a prefill's swiglu pack in two passes that of one, the
// dense GEMM's swiglu epilogue that of its plain output and the swiglu pass, the prefill attention on warpgroup MMA
// the mma.sync kernel's, a prefill GEMM on kept fp16 weights that of the weights dequantised at the call, the GDN's
// gated norm and pack in one pass those of the two kernels, the GDN's tf32 state phase on operands rounded once that
// of the phase rounding each fragment), so that a test can see the path it checks really ran instead of a silent fallback. One
// relaxed atomic add per launch, on the host.
#pragma once

namespace openjet {

// this order: openjet_test_launch_count's
enum class Counted {
    kDenseGemm = 0,
    kGdnTwoPhase = 1,
    kGdnSnapshot = 2,
    kGdnStateTensorCores = 3,
    kAttnPrefillF16Rows = 4,
    kPrefillGateUp = 5,
    kFfnPersistent = 6,
    kTiledWeights = 7,
    kPackCluster = 8,
    kGemvInt = 9,
    kSwigluSplit = 10,
    kDenseGemmSwiglu = 11,
    kAttnPrefillWgmma = 12,
    kPrefillF16Kept = 13,  // a prefill GEMM on the engine's kept fp16 weights (no dequantisation; the same bits)
    kGdnNormPack = 14,     // a prefill's GDN gated RMSNorm and the out projection's pack in one pass (the same bits)
    kPrefillResidual = 15,  // a prefill projection added to the residual stream in the dense GEMM's epilogue
    kAttnPrepRows = 16,     // an attention call's prep a row a block (attn_prep_rows; the same bits)
    kGdnStateRounded = 17,  // the chunked GDN's tf32 state phase on operands rounded once (tf32-cvt's bits)
    kGdnLocalTensorCores = 18,  // the chunked GDN's local phase with A and Aq on tensor cores (numerics of its own)
    kDenseGemmSwigluHalf = 19,  // the FFN's gate and up writing fp16 silu(g) u under a bound's scale (its own numerics)
    kGdnPackBounded = 20,       // a prefill's GDN gated norm packed under a bound's row scales (its own numerics)
    kGemvTma = 21,              // a decode GEMV on the producer-warp kernel (gemv_tma.cu; the same bits)
    // 22: unused (OPENJET_NORM_FOLD's counter, then OPENJET_NORM_TAIL's, both removed; the numbers after it kept:
    // kernels_test.COUNTED)
    kAttnPlanned = 23,          // attention chunk blocks in the planned tile pipeline (OPENJET_ATTN_PIPE; the same bits)
    kTrunkGraphCapture = 24,    // a decode trunk captured as a CUDA graph (OPENJET_BENCH_GRAPH), then launched
    kTrunkGraphReplay = 25,     // a captured trunk graph launched again (the same launches, the same bits)
    kCycleGraphCapture = 26,    // a greedy cycle captured as a CUDA graph (OPENJET_BENCH_GRAPH), then launched
    kCycleGraphReplay = 27,     // a captured cycle graph launched again (the same launches, the same bits)
    kMtpInputPack = 28,         // the MTP head's embedding, input norms and pack in one launch (the same bits)
    kFfnPersistentTma = 29,     // a persistent FFN launch in its producer-warp form (OPENJET_FFN_TMA; the same bits)
    kGdnStepPack = 30,          // a GDN step that packs its own output for the out projection (OPENJET_GDN_STEP_PACK)
    kGemvFold = 31,             // a GEMV of the fold (gemv_fold.cuh: A's epilogue or B's own pack; OPENJET_FOLD)
    kFoldAddNorm = 32,          // a prefill's add-norm on the fold's numerics (launch_fold_add_norm_pack; its bits)
    kSwigluSelf = 33,           // gate / up packing their own swiglu (launch_gemv_swiglu; OPENJET_SWIGLU_SELF)
    kGdnStaged = 34,            // a GDN step in its staged form (GdnStepArgs::staged; OPENJET_GDN_STAGED)
    kGdnLateLaunch = 35,        // a GDN step letting the kernels after it in late (GdnStepArgs::late_launch)
    kGemvGroup = 36,            // a producer-warp GEMV launch of several matrices' types (OPENJET_GEMV_GROUP)
    kAttnOwnPack = 37,          // an attention combine packing its own output (OPENJET_ATTN_OWN_PACK; the same bits)
    kGemvTmaFormForced = 38,    // a producer-warp GEMV on the form OPENJET_GEMV_TMA names, not t's (the same bits)
    kFoldRows = 39,             // the fold's B at t > 1 making its rows' pack itself (OPENJET_FOLD_ROWS; the same bits)
    kSwigluRows = 40,           // a down projection at t > 1 making its swiglu pack itself (OPENJET_SWIGLU_ROWS; its bits)
    kCount
};

void count_launch(Counted what);
long long launch_count(Counted what);

}  // namespace openjet
