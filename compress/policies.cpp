// The lossy policies of compress/policies.h: plane views of shapes, the one-buffer pack layouts, the
// closed-form sizes, and the calls into the codec kernels of the tensor's device (core/cpu/codec.cpp,
// core/cuda/codec.cu). Tested in tests/test_policies.cpp and tests/test_cuda_codec.cpp.
#include "actlab/compress/policies.h"

#include <cstring>

#include "actlab/core/dispatch.h"
#if defined(ACTLAB_WITH_CUDA)
#include "actlab/core/cuda/codec.h"
#endif

namespace actlab {
namespace {

bool valid_bits(int bits) { return bits == 1 || bits == 2 || bits == 4 || bits == 8; }

size_t to_size(int64_t v) { return static_cast<size_t>(v); }

// x as a contiguous f32 tensor (a copy only when x is strided).
Tensor checked_input(const Tensor& x, const std::string& policy) {
  ACTLAB_CHECK(x.defined(), "policy ", policy, ": cannot pack an undefined tensor");
  ACTLAB_CHECK(x.dtype() == DType::F32, "policy ", policy, " packs f32 tensors, got ", x.str());
  return x.contiguous();
}

// dst <- src, `bytes` bytes, both on `device`: a memcpy on the CPU, a stream-ordered copy on a GPU.
void copy_on_device(void* dst, const void* src, size_t bytes, Device device) {
  if (bytes == 0) return;
  if (device.is_cpu()) {
    std::memcpy(dst, src, bytes);
  } else {
    copy_bytes(dst, device, src, device, bytes);
  }
}

// A fresh f32 copy of a passthrough pack, allocated under the caller's MemTagScope.
Tensor unpack_passthrough(const PackedPassthrough& p) {
  const Device device = p.tensor().device();
  Tensor out = Tensor::empty(p.shape(), DType::F32, device);
  copy_on_device(out.raw_data(), p.tensor().raw_data(), out.nbytes(), device);
  return out;
}

}  // namespace

PackedPassthrough::PackedPassthrough(const Tensor& x)
    : copy_(Tensor::empty_tagged(x.shape(), MemTag::ActivationPacked, DType::F32, x.device())) {
  copy_on_device(copy_.raw_data(), x.raw_data(), copy_.nbytes(), x.device());
}

// ---------------------------------------------------------------- plane policies
PlaneSections plane_sections(const PlaneCodecConfig& config, const PlaneGeometry& g) {
  PlaneSections s;
  size_t at = 0;
  s.residual = at;
  if (config.stores_residual()) at += to_size(g.planes * g.plane_elems()) * 4;
  s.lfc = at;
  if (config.stores_lfc()) at += to_size(g.planes * g.lfc_elems()) * 2;
  s.mins = at;
  if (config.stores_codes()) at += to_size(g.planes) * 2;
  s.steps = at;
  if (config.stores_codes()) at += to_size(g.planes) * 2;
  s.codes = at;
  if (config.stores_codes()) at += to_size(g.planes * g.code_bytes_per_plane());
  s.total = at;
  return s;
}

PackedPlanes::PackedPlanes(const Shape& shape, const PlaneCodecConfig& config, const PlaneGeometry& g, Device device)
    : shape_(shape), config_(config), geometry_(g), sections_(plane_sections(config, g)),
      buffer_(Tensor::empty_tagged({static_cast<int64_t>(sections_.total)}, MemTag::ActivationPacked, DType::U8,
                                   device)) {}

PlaneCodecPolicy::PlaneCodecPolicy(const PlaneCodecConfig& config) : config_(config) {
  ACTLAB_CHECK(config.pool_block >= 1, "policy block size B must be >= 1, got ", config.pool_block);
  const bool f32_hfc = config.kind == PlaneCodecKind::HfcOnly && config.bits == 0;
  ACTLAB_CHECK(f32_hfc || config.kind == PlaneCodecKind::LfcOnly || valid_bits(config.bits),
               "policy bit width Q must be 1, 2, 4 or 8, got ", config.bits);
  if (config_.kind == PlaneCodecKind::LfcOnly) config_.bits = 0;
}

bool PlaneCodecPolicy::plane_view(const Shape& shape, PlaneGeometry& g) const {
  int64_t planes = 0, height = 1, width = 1;
  if (shape.size() == 4) {
    planes = shape[0] * shape[1], height = shape[2], width = shape[3];
  } else if (shape.size() == 3) {
    // (batch, tokens, features): one plane per sample, pooled along the tokens (make_token_geometry).
    if (shape_numel(shape) == 0 || shape[1] * shape[2] == 1) return false;
    g = make_token_geometry(shape[0], shape[1], shape[2], config_.pool_block, config_.bits);
    return true;
  } else if (shape.size() == 2) {
    planes = shape[0], width = shape[1];
  } else {
    return false;
  }
  if (shape_numel(shape) == 0 || height * width == 1) return false;
  g = make_plane_geometry(planes, height, width, config_.pool_block, config_.bits);
  return true;
}

std::unique_ptr<Packed> PlaneCodecPolicy::pack(const Tensor& x_in, const SaveInfo&, const PackContext& ctx) const {
  const Tensor x = checked_input(x_in, name());
  PlaneGeometry g;
  if (!plane_view(x.shape(), g)) return std::make_unique<PackedPassthrough>(x);
  auto packed = std::make_unique<PackedPlanes>(x.shape(), config_, g, x.device());
  ACTLAB_DISPATCH(x.device(),
                  cuda::plane_pack(packed->lfc(), packed->codes(), packed->mins(), packed->steps(), packed->residual(),
                                   x.data<float>(), g, config_.uses_lfc(), ctx.seed, ctx.stream, gpu.device()),
                  cpu::plane_pack(packed->lfc(), packed->codes(), packed->mins(), packed->steps(), packed->residual(),
                                  x.data<float>(), g, config_.uses_lfc(), ctx.seed, ctx.stream));
  return packed;
}

Tensor PlaneCodecPolicy::unpack(const Packed& p, const SaveInfo&) const {
  if (const auto* pass = dynamic_cast<const PackedPassthrough*>(&p)) return unpack_passthrough(*pass);
  const auto* planes = dynamic_cast<const PackedPlanes*>(&p);
  ACTLAB_CHECK(planes != nullptr && planes->config().kind == config_.kind, "policy ", name(),
               " cannot unpack a pack it did not make (shape ", shape_str(p.shape()), ")");
  const Device device = planes->buffer().device();
  Tensor out = Tensor::empty(planes->shape(), DType::F32, device);
  const PlaneGeometry& g = planes->geometry();
  if (planes->residual()) {
    copy_on_device(out.raw_data(), planes->residual(), out.nbytes(), device);
  } else {
    ACTLAB_DISPATCH(device,
                    cuda::plane_unpack(out.data<float>(), planes->lfc(), planes->codes(), planes->mins(),
                                       planes->steps(), g, gpu.device()),
                    cpu::plane_unpack(out.data<float>(), planes->lfc(), planes->codes(), planes->mins(),
                                      planes->steps(), g));
  }
  return out;
}

Tensor PlaneCodecPolicy::unpack_blocked(const Packed& p, const SaveInfo&, int channel_block) const {
  const auto* planes = dynamic_cast<const PackedPlanes*>(&p);
  if (planes == nullptr || planes->config().kind != config_.kind || planes->residual() != nullptr ||
      !planes->buffer().device().is_cpu() || channel_block != cpu::kChannelBlock)
    return {};
  const Shape& s = planes->shape();
  if (s.size() != 4 || s[1] % channel_block != 0) return {};
  Tensor out = Tensor::empty({s[0], s[1] / channel_block, s[2], s[3], channel_block}, DType::F32, Device::cpu());
  cpu::plane_unpack_blocked(out.data<float>(), planes->lfc(), planes->codes(), planes->mins(), planes->steps(),
                            planes->geometry(), s[1]);
  return out;
}

namespace {
// Channel c of a CPU plane pack: the codec's plane_unpack_channel over the N planes (n, c).
class PlaneChannelReader final : public ChannelReader {
 public:
  explicit PlaneChannelReader(const PackedPlanes& p) : p_(p) {}
  void read(int64_t c, float* out) const override {
    cpu::plane_unpack_channel(out, p_.lfc(), p_.codes(), p_.mins(), p_.steps(), p_.geometry(), p_.shape()[1], c);
  }
  const Shape& shape() const override { return p_.shape(); }
 private:
  const PackedPlanes& p_;
};
}  // namespace

std::unique_ptr<ChannelReader> PlaneCodecPolicy::channel_reader(const Packed& p, const SaveInfo&) const {
  const auto* planes = dynamic_cast<const PackedPlanes*>(&p);
  if (planes == nullptr || planes->config().kind != config_.kind || planes->residual() != nullptr ||
      !planes->buffer().device().is_cpu() || planes->shape().size() != 4)
    return nullptr;
  return std::make_unique<PlaneChannelReader>(*planes);
}

std::string PlaneCodecPolicy::name() const {
  const std::string b = std::to_string(config_.pool_block), q = std::to_string(config_.bits);
  switch (config_.kind) {
    case PlaneCodecKind::Division: return "division:B=" + b + ",Q=" + q;
    case PlaneCodecKind::Quant: return "quant:Q=" + q;
    case PlaneCodecKind::LfcOnly: return "lfc:B=" + b;
    case PlaneCodecKind::HfcOnly: return config_.bits ? "hfc:B=" + b + ",Q=" + q : "hfc:B=" + b;
  }
  return "?";
}

// Closed forms per docs/policies.md, with P planes of E elements, an h'×w' LFC and Q-bit codes:
//   division P·(2h'w' + ceil(QE/8) + 4); quant and hfc:Q P·(ceil(QE/8) + 4); lfc P·2h'w';
//   hfc (f32) and every passthrough 4·numel.
size_t PlaneCodecPolicy::expected_bytes(const Shape& shape) const {
  PlaneGeometry g;
  if (!plane_view(shape, g)) return to_size(shape_numel(shape)) * 4;
  const int64_t P = g.planes, E = g.plane_elems(), Q = config_.bits;
  const int64_t lfc = 2 * g.lfc_h * g.lfc_w, hfc = (Q * E + 7) / 8 + 2 + 2;
  switch (config_.kind) {
    case PlaneCodecKind::Division: return to_size(P * (lfc + hfc));
    case PlaneCodecKind::Quant: return to_size(P * hfc);
    case PlaneCodecKind::LfcOnly: return to_size(P * lfc);
    case PlaneCodecKind::HfcOnly: return to_size(Q ? P * hfc : P * E * 4);
  }
  return 0;
}

// ---------------------------------------------------------------- per-group policy
PackedGroups::PackedGroups(const Shape& shape, const GroupGeometry& g, Device device)
    : shape_(shape), geometry_(g),
      buffer_(Tensor::empty_tagged({g.groups() * (4 + g.code_bytes_per_group())}, MemTag::ActivationPacked,
                                   DType::U8, device)) {}

PerGroupPolicy::PerGroupPolicy(int64_t group_size, int bits) : group_size_(group_size), bits_(bits) {
  ACTLAB_CHECK(group_size >= 1, "policy group size G must be >= 1, got ", group_size);
  ACTLAB_CHECK(valid_bits(bits), "policy bit width Q must be 1, 2, 4 or 8, got ", bits);
}

bool PerGroupPolicy::group_view(const Shape& shape, GroupGeometry& g) const {
  const int64_t numel = shape_numel(shape);
  if (shape.empty() || numel == 0 || numel == shape[0]) return false;
  g.samples = shape[0];
  g.sample_elems = numel / shape[0];
  g.group_size = group_size_;
  g.bits = bits_;
  return true;
}

namespace {
// The per-group codec on x's device: x (contiguous f32) as g.samples rows of g.sample_elems values, kept as
// `shape` (which may differ from x's: a policy that reorders first records the caller's shape).
std::unique_ptr<PackedGroups> pack_groups(const Tensor& x, const Shape& shape, const GroupGeometry& g,
                                          const PackContext& ctx) {
  auto packed = std::make_unique<PackedGroups>(shape, g, x.device());
  ACTLAB_DISPATCH(x.device(),
                  cuda::group_pack(packed->codes(), packed->mins(), packed->steps(), x.data<float>(), g, ctx.seed,
                                   ctx.stream, gpu.device()),
                  cpu::group_pack(packed->codes(), packed->mins(), packed->steps(), x.data<float>(), g, ctx.seed,
                                  ctx.stream));
  return packed;
}

// The dequantized values in the codec's row order, shaped `shape` (a fresh f32 tensor).
Tensor unpack_groups(const PackedGroups& groups, const Shape& shape) {
  const Device device = groups.buffer().device();
  Tensor out = Tensor::empty(shape, DType::F32, device);
  ACTLAB_DISPATCH(device,
                  cuda::group_unpack(out.data<float>(), groups.codes(), groups.mins(), groups.steps(),
                                     groups.geometry(), gpu.device()),
                  cpu::group_unpack(out.data<float>(), groups.codes(), groups.mins(), groups.steps(),
                                    groups.geometry()));
  return out;
}

const PackedGroups& checked_groups(const Packed& p, const std::string& policy) {
  const auto* groups = dynamic_cast<const PackedGroups*>(&p);
  ACTLAB_CHECK(groups != nullptr, "policy ", policy, " cannot unpack a pack it did not make (shape ",
               shape_str(p.shape()), ")");
  return *groups;
}
}  // namespace

std::unique_ptr<Packed> PerGroupPolicy::pack(const Tensor& x_in, const SaveInfo&, const PackContext& ctx) const {
  const Tensor x = checked_input(x_in, name());
  GroupGeometry g;
  if (!group_view(x.shape(), g)) return std::make_unique<PackedPassthrough>(x);
  return pack_groups(x, x.shape(), g, ctx);
}

Tensor PerGroupPolicy::unpack(const Packed& p, const SaveInfo&) const {
  if (const auto* pass = dynamic_cast<const PackedPassthrough*>(&p)) return unpack_passthrough(*pass);
  const PackedGroups& groups = checked_groups(p, name());
  return unpack_groups(groups, groups.shape());
}

std::string PerGroupPolicy::name() const {
  return "pergroup:G=" + std::to_string(group_size_) + ",Q=" + std::to_string(bits_);
}

// N samples of D elements: N·ceil(D/G)·(ceil(G·Q/8) + 4); D == 1 (and numel 0) is an f32 copy.
size_t PerGroupPolicy::expected_bytes(const Shape& shape) const {
  GroupGeometry g;
  if (!group_view(shape, g)) return to_size(shape_numel(shape)) * 4;
  const int64_t groups = g.samples * ((g.sample_elems + group_size_ - 1) / group_size_);
  return to_size(groups * ((group_size_ * bits_ + 7) / 8 + 4));
}

// ---------------------------------------------------------------- Mesa-style policy
MesaPolicy::MesaPolicy(int bits) : bits_(bits) {
  ACTLAB_CHECK(valid_bits(bits), "policy bit width Q must be 1, 2, 4 or 8, got ", bits);
}

bool MesaPolicy::range_view(const Shape& shape, GroupGeometry& g) const {
  const int64_t numel = shape_numel(shape);
  if (numel <= 1) return false;
  // 4-D: one range per index of dim 1 (a head of (B, heads, T, d), a channel of (N, C, H, W)) over the batch.
  g.samples = shape.size() == 4 ? shape[1] : 1;
  g.sample_elems = numel / g.samples;
  g.group_size = g.sample_elems;
  g.bits = bits_;
  return true;
}

std::unique_ptr<Packed> MesaPolicy::pack(const Tensor& x_in, const SaveInfo&, const PackContext& ctx) const {
  const Tensor x = checked_input(x_in, name());
  GroupGeometry g;
  if (!range_view(x.shape(), g)) return std::make_unique<PackedPassthrough>(x);
  if (x.dim() != 4) return pack_groups(x, x.shape(), g, ctx);
  // Each head's values across the batch made contiguous (a scratch copy, freed before returning).
  MemTagScope tag(MemTag::Workspace);
  const Tensor by_head = x.permute({1, 0, 2, 3}).contiguous();
  return pack_groups(by_head, x.shape(), g, ctx);
}

Tensor MesaPolicy::unpack(const Packed& p, const SaveInfo&) const {
  if (const auto* pass = dynamic_cast<const PackedPassthrough*>(&p)) return unpack_passthrough(*pass);
  const PackedGroups& groups = checked_groups(p, name());
  const Shape& s = groups.shape();
  if (s.size() != 4) return unpack_groups(groups, s);
  Tensor by_head;
  {
    MemTagScope tag(MemTag::Workspace);
    by_head = unpack_groups(groups, {s[1], s[0], s[2], s[3]});
  }
  return by_head.permute({1, 0, 2, 3}).contiguous();
}

std::string MesaPolicy::name() const { return "mesa:Q=" + std::to_string(bits_); }

// R ranges (dim 1's size for 4-D, else 1) of E = numel/R elements: R·(ceil(E·Q/8) + 4); numel <= 1 is a copy.
size_t MesaPolicy::expected_bytes(const Shape& shape) const {
  GroupGeometry g;
  if (!range_view(shape, g)) return to_size(shape_numel(shape)) * 4;
  return to_size(g.samples * ((g.sample_elems * bits_ + 7) / 8 + 4));
}

}  // namespace actlab
