// Device (cpu, cuda:i) and DType (f32, bf16, f16, u8, i32, i64): small value types used everywhere.
// Tested in tests/test_core.cpp.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace actlab {

enum class DeviceType : uint8_t { CPU = 0, CUDA = 1 };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;

  static Device cpu() { return {DeviceType::CPU, 0}; }
  static Device cuda(int i = 0) { return {DeviceType::CUDA, i}; }
  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
  std::string str() const;            // "cpu" or "cuda:0"
  static Device parse(const std::string& s);  // "cpu", "cuda", "cuda:1"; throws Error otherwise
};

enum class DType : uint8_t { F32, BF16, F16, U8, I32, I64 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);  // "f32", "bf16", ...

template <typename T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::F32; }
template <> constexpr DType dtype_of<uint8_t>() { return DType::U8; }
template <> constexpr DType dtype_of<int32_t>() { return DType::I32; }
template <> constexpr DType dtype_of<int64_t>() { return DType::I64; }

}  // namespace actlab
