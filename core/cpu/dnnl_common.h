// What the CPU kernels' oneDNN calls share: one engine, a stream per thread, and primitive scratchpads
// that go through actlab's allocator (user scratchpad mode, MemTag::Workspace Buffers) instead of
// oneDNN's own. Used by conv.cpp, gemm.cpp and kernels_token_dnnl.cpp; a minimal build (no oneDNN)
// compiles none of them.
#pragma once
#include <unordered_map>
#include <vector>

#include <oneapi/dnnl/dnnl.hpp>

#include "actlab/core/allocator.h"

namespace actlab::cpu {

dnnl::engine& dnnl_engine();
dnnl::stream& dnnl_stream();  // one per thread: oneDNN streams are not meant to be shared

// Attributes for a primitive whose scratchpad the caller binds with bind_scratchpad: oneDNN then
// allocates nothing itself, the bytes show up as Workspace in memory_stats(), and one primitive can
// run on several threads at once (each call brings its own scratchpad).
dnnl::primitive_attr user_scratchpad_attr();

// Adds DNNL_ARG_SCRATCHPAD to args when md (the primitive's scratchpad_desc()) has bytes: a fresh
// Workspace Buffer appended to buffers, which must outlive the execute and the stream wait.
void bind_scratchpad(std::unordered_map<int, dnnl::memory>& args, const dnnl::memory::desc& md,
                     std::vector<Buffer>& buffers);

}  // namespace actlab::cpu
