// FNV-1a 64: the checksum of a checkpoint's data section (io/safetensors.h) and of the ablation
// grid's cell keys. Not cryptographic: it catches truncation and bit rot, not tampering.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace actlab {

uint64_t fnv1a64(const void* data, size_t n, uint64_t h = 0xcbf29ce484222325ull);
// v as 16 lower-case hex digits (how checksums are stored).
std::string hex64(uint64_t v);

}  // namespace actlab
