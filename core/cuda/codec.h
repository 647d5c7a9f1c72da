// The GPU twin of the activation codec kernels (core/codec.h, cpu:: namespace): one fused pass per
// (n,c) plane for the division family (block means → bf16 LFC, residual, min/max, Philox stochastic
// rounding, bit packing) and one fused decompress; the same for ActNN-style groups. The per-element
// arithmetic is codec.h's ACTLAB_HD functions and the random numbers are the CPU's Philox stream, so for
// the same seed the packed bytes are identical on CPU and GPU. BLPA's codes too (blpa_pack: the channel
// statistics by a tree reduction, see there). CUDA-free header: implemented in core/cuda/codec.cu; in
// CPU-only builds nothing calls it (ACTLAB_DISPATCH compiles no CUDA branch, core/dispatch.h).
// Tested in tests/test_cuda_codec.cpp (byte-for-byte against the CPU); bench/bench_cuda.cpp times it.
#pragma once
#include <cstdint>

#include "actlab/core/codec.h"

namespace actlab::cuda {

// Same contracts, layouts and outputs as cpu::plane_pack / plane_unpack / group_pack / group_unpack, with
// every pointer in the memory of cuda:`device`. Queued on that device's actlab stream (asynchronous);
// scratch comes from the tracking allocator (MemTag::Workspace) and is freed in stream order.
void plane_pack(uint16_t* lfc, uint8_t* codes, uint16_t* mins, uint16_t* steps, float* residual, const float* x,
                const PlaneGeometry& g, bool with_lfc, uint64_t seed, uint64_t stream, int device);
void plane_unpack(float* out, const uint16_t* lfc, const uint8_t* codes, const uint16_t* mins,
                  const uint16_t* steps, const PlaneGeometry& g, int device);
void group_pack(uint8_t* codes, uint16_t* mins, uint16_t* steps, const float* x, const GroupGeometry& g,
                uint64_t seed, uint64_t stream, int device);
void group_unpack(float* out, const uint8_t* codes, const uint16_t* mins, const uint16_t* steps,
                  const GroupGeometry& g, int device);
// cpu::group_range_norms on the GPU (out: g.samples doubles in device memory), the same bits.
void group_range_norms(double* out, const float* x, const GroupGeometry& g, int device);
// cpu::blpa_pack / blpa_unpack on the GPU. The codes are codec.h's blpa_code / blpa_value of the same
// channel parameters; the parameters' mean and standard deviation are summed in double by a tree over each
// channel (one block per channel) instead of the CPU's eight ordered lanes, so they can differ from the
// CPU's in the last bits of a double, and a step or shift (rounded from them to f32) rarely by one ulp.
void blpa_pack(BlpaChannel* params, uint8_t* codes, const float* x, const BlpaGeometry& g, int device);
void blpa_unpack(float* out, const BlpaChannel* params, const uint8_t* codes, const BlpaGeometry& g, int device);

}  // namespace actlab::cuda
