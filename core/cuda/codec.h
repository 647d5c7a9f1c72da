// The GPU twin of the activation codec kernels (core/codec.h, cpu:: namespace): one fused pass per
// (n,c) plane for the division family (block means → bf16 LFC, residual, min/max, Philox stochastic
// rounding, bit packing) and one fused decompress; the same for ActNN-style groups. The per-element
// arithmetic is codec.h's ACTLAB_HD functions and the random numbers are the CPU's Philox stream, so for
// the same seed the packed bytes are identical on CPU and GPU. CUDA-free header: implemented in
// core/cuda/codec.cu, and by compress/codec_cuda.cpp (throws: no CUDA) in CPU-only builds.
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

}  // namespace actlab::cuda
