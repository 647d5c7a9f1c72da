// Device and DType helpers.
#include "actlab/core/device.h"

#include "actlab/core/error.h"

namespace actlab {

std::string Device::str() const {
  return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index);
}

Device Device::parse(const std::string& s) {
  if (s == "cpu") return cpu();
  if (s == "cuda") return cuda(0);
  if (s.rfind("cuda:", 0) == 0) {
    const std::string idx = s.substr(5);
    ACTLAB_CHECK(!idx.empty() && idx.size() <= 4 && idx.find_first_not_of("0123456789") == std::string::npos,
                 "bad device '", s, "': expected cpu, cuda or cuda:N");
    return cuda(std::stoi(idx));
  }
  ACTLAB_FAIL("bad device '", s, "': expected cpu, cuda or cuda:N");
}

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::F16: return 2;
    case DType::U8: return 1;
    case DType::I32: return 4;
    case DType::I64: return 8;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::BF16: return "bf16";
    case DType::F16: return "f16";
    case DType::U8: return "u8";
    case DType::I32: return "i32";
    case DType::I64: return "i64";
  }
  return "?";
}

}  // namespace actlab
