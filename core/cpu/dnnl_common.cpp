// The oneDNN engine, the per-thread streams and the scratchpad binding of dnnl_common.h. Exercised by
// every oneDNN path's tests (tests/test_cpu_conv.cpp, tests/test_token_ops.cpp).
#include "actlab/core/cpu/dnnl_common.h"

#include <oneapi/dnnl/dnnl.hpp>

namespace actlab::cpu {

dnnl::engine& dnnl_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

dnnl::stream& dnnl_stream() {
  thread_local dnnl::stream stream(dnnl_engine());
  return stream;
}

dnnl::primitive_attr user_scratchpad_attr() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

void bind_scratchpad(std::unordered_map<int, dnnl::memory>& args, const dnnl::memory::desc& md,
                     std::vector<Buffer>& buffers) {
  if (md.get_size() == 0) return;
  const Buffer& buf = buffers.emplace_back(md.get_size(), MemTag::Workspace);
  args.emplace(DNNL_ARG_SCRATCHPAD, dnnl::memory(md, dnnl_engine(), buf.data()));
}

}  // namespace actlab::cpu
