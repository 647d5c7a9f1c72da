// The lossy policies of compress/policies.h: plane views of shapes, the one-buffer pack layouts, the
// closed-form sizes, and the calls into the codec kernels of the tensor's device (core/cpu/codec.cpp,
// core/cuda/codec.cu). Tested in tests/test_policies.cpp and tests/test_cuda_codec.cpp.
#include "actlab/compress/policies.h"

#include <algorithm>
#include <cstring>
#include <queue>
#include <tuple>

#include "actlab/core/dispatch.h"
#include "actlab/core/ops.h"
#include "actlab/core/precision.h"
#if defined(ACTLAB_WITH_CUDA)
#include "actlab/core/cuda/codec.h"
#endif

namespace actlab {
namespace {

bool valid_bits(int bits) { return bits == 1 || bits == 2 || bits == 4 || bits == 8; }

size_t to_size(int64_t v) { return static_cast<size_t>(v); }

// x as a contiguous f32 tensor (a copy only when x is strided).
Tensor checked_input(const Tensor& x, const std::string& policy) {
  check_defined_input(x, policy);
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
  const int64_t ranges = g.ranges(), code_bytes = g.code_bytes_per_range();
  PlaneSections s;
  size_t at = 0;
  s.residual = at;
  if (config.stores_residual()) at += to_size(g.planes * g.plane_elems()) * 4;
  s.lfc = at;
  if (config.stores_lfc()) at += to_size(g.planes * g.lfc_elems()) * 2;
  s.mins = at;
  if (config.stores_codes()) at += to_size(ranges) * 2;
  s.steps = at;
  if (config.stores_codes()) at += to_size(ranges) * 2;
  s.codes = at;
  if (config.stores_codes()) at += to_size(ranges * code_bytes);
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
  ACTLAB_CHECK(config_.range_rows >= 0, "policy range rows R must be >= 1, got ", config_.range_rows);
  ACTLAB_CHECK(config_.range_rows == 0 || config_.stores_codes(), "policy range rows R apply to the codes, and ",
               name(), " keeps none");
}

bool PlaneCodecPolicy::plane_view(const Shape& shape, PlaneGeometry& g) const {
  return plane_view(shape, g, config_.bits);
}

int PlaneCodecPolicy::bits_for(const SaveInfo& info) const {
  return config_.stores_codes() ? code_bits(config_.bits, info) : config_.bits;
}

bool PlaneCodecPolicy::plane_view(const Shape& shape, PlaneGeometry& g, int bits) const {
  int64_t planes = 0, height = 1, width = 1;
  if (shape.size() == 4) {
    planes = shape[0] * shape[1], height = shape[2], width = shape[3];
  } else if (shape.size() == 3) {
    // (batch, tokens, features): one plane per sample, pooled along the tokens (make_token_geometry).
    if (shape_numel(shape) == 0 || shape[1] * shape[2] == 1) return false;
    g = make_token_geometry(shape[0], shape[1], shape[2], config_.pool_block, bits);
    g.range_rows = config_.range_rows;
    return true;
  } else if (shape.size() == 2) {
    planes = shape[0], width = shape[1];
  } else if (shape.size() >= 5) {
    // (N, C, D, H, W) volumes (a 3-D convolution's saves) and higher ranks: planes of the last two axes, as
    // a 4-D map's, one per index of the leading ones, so the bytes are those of the (N, C·D, H, W) view.
    planes = 1;
    for (size_t d = 0; d + 2 < shape.size(); ++d) planes *= shape[d];
    height = shape[shape.size() - 2], width = shape.back();
  } else {
    return false;
  }
  if (shape_numel(shape) == 0 || height * width == 1) return false;
  g = make_plane_geometry(planes, height, width, config_.pool_block, bits);
  g.range_rows = config_.range_rows;
  return true;
}

std::unique_ptr<Packed> PlaneCodecPolicy::pack(const Tensor& x_in, const SaveInfo& info, const PackContext& ctx) const {
  PlaneGeometry g;
  const bool channels_last = x_in.is_channels_last() && x_in.device().is_cpu() && x_in.dtype() == DType::F32 &&
                             plane_view(x_in.shape(), g, bits_for(info));
  if (channels_last) {
    auto packed = std::make_unique<PackedPlanes>(x_in.shape(), config_, g, x_in.device());
    cpu::plane_pack_channels_last(packed->lfc(), packed->codes(), packed->mins(), packed->steps(), packed->residual(),
                                  x_in.data<float>(), g, x_in.size(1), config_.uses_lfc(), ctx.seed, ctx.stream);
    return packed;
  }
  const Tensor x = checked_input(x_in, name());
  if (!plane_view(x.shape(), g, bits_for(info))) return std::make_unique<PackedPassthrough>(x);
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
  ACTLAB_CHECK(planes != nullptr && planes->config().kind == config_.kind &&
                   planes->config().range_rows == config_.range_rows,
               "policy ", name(), " cannot unpack a pack it did not make (shape ", shape_str(p.shape()), ")");
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
      planes->geometry().ranges_per_plane() > 1 || !planes->buffer().device().is_cpu() ||
      channel_block != cpu::kChannelBlock)
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

namespace {
// p as this kind's pack of a 4-D tensor on the CPU with one range per plane and no f32 residual, the packs the
// channel reader and the channels-last decode serve; else nullptr.
const PackedPlanes* cpu_planes_4d(const Packed& p, PlaneCodecKind kind) {
  const auto* planes = dynamic_cast<const PackedPlanes*>(&p);
  if (planes == nullptr || planes->config().kind != kind || planes->residual() != nullptr ||
      planes->geometry().ranges_per_plane() > 1 || !planes->buffer().device().is_cpu() || planes->shape().size() != 4)
    return nullptr;
  return planes;
}
}  // namespace

std::unique_ptr<ChannelReader> PlaneCodecPolicy::channel_reader(const Packed& p, const SaveInfo&) const {
  const PackedPlanes* planes = cpu_planes_4d(p, config_.kind);
  return planes ? std::make_unique<PlaneChannelReader>(*planes) : nullptr;
}

Tensor PlaneCodecPolicy::unpack_channels_last(const Packed& p, const SaveInfo&) const {
  const PackedPlanes* planes = cpu_planes_4d(p, config_.kind);
  if (!planes || !cpu::plane_channels_last_lanes(planes->geometry(), planes->shape()[1])) return {};
  const Shape& s = planes->shape();
  Tensor out = Tensor::empty_channels_last(s, DType::F32, Device::cpu());
  cpu::plane_unpack_channels_last(out.data<float>(), planes->lfc(), planes->codes(), planes->mins(), planes->steps(),
                                  planes->geometry(), s[1]);
  return out;
}

Tensor PlaneCodecPolicy::unpack_bf16(const Packed& p, const SaveInfo& info) const {
  if (compute_precision() != Precision::BF16) return {};
  const std::unique_ptr<ChannelReader> reader = channel_reader(p, info);
  if (!reader) return {};
  const Shape& s = reader->shape();
  // A consumer computing channels-last gets that layout, decoded sixteen channels at a time (whole blocks only).
  if (info.channels_last && s[1] % cpu::kChannelBlock == 0) {
    const auto& planes = static_cast<const PackedPlanes&>(p);  // channel_reader checked the type
    Tensor h = Tensor::empty_channels_last(s, DType::BF16, Device::cpu());
    cpu::plane_unpack_bf16_channels_last(static_cast<uint16_t*>(h.raw_data()), planes.lfc(), planes.codes(),
                                         planes.mins(), planes.steps(), planes.geometry(), s[1]);
    return h;
  }
  return ops::to_bf16_channels(s, [&](int64_t c, float* out) { reader->read(c, out); });
}

std::string PlaneCodecPolicy::name() const {
  const std::string b = std::to_string(config_.pool_block), q = std::to_string(config_.bits);
  const std::string r = config_.range_rows > 0 ? ",R=" + std::to_string(config_.range_rows) : "";
  switch (config_.kind) {
    case PlaneCodecKind::Division: return "division:B=" + b + ",Q=" + q + r;
    case PlaneCodecKind::Quant: return "quant:Q=" + q + r;
    case PlaneCodecKind::LfcOnly: return "lfc:B=" + b + r;
    case PlaneCodecKind::HfcOnly: return config_.bits ? "hfc:B=" + b + ",Q=" + q + r : "hfc:B=" + b + r;
  }
  return "?";
}

// Closed forms per docs/policies.md, with P planes of E elements, an h'×w' LFC and Q-bit codes:
//   division P·(2h'w' + ceil(QE/8) + 4); quant and hfc:Q P·(ceil(QE/8) + 4); lfc P·2h'w';
//   hfc (f32) and every passthrough 4·numel. With R rows per range on H×W planes (R' = min(R, H)), the
//   codes' term ceil(QE/8) + 4 becomes ceil(H/R')·(ceil(Q·R'·W/8) + 4).
size_t PlaneCodecPolicy::closed_form_bytes(const Shape& shape) const { return bytes_at(shape, config_.bits); }

size_t PlaneCodecPolicy::layer_closed_form_bytes(const Shape& shape, const SaveInfo& info) const {
  return bytes_at(shape, bits_for(info));
}

size_t PlaneCodecPolicy::bytes_at(const Shape& shape, int bits) const {
  PlaneGeometry g;
  if (!plane_view(shape, g, bits)) return to_size(shape_numel(shape)) * 4;
  const int64_t P = g.planes, E = g.plane_elems(), Q = bits;
  const int64_t R = std::min(config_.range_rows, g.height), H = g.height, W = g.width;
  const int64_t lfc = 2 * g.lfc_h * g.lfc_w;
  const int64_t hfc = R > 0 ? (H + R - 1) / R * ((Q * R * W + 7) / 8 + 2 + 2) : (Q * E + 7) / 8 + 2 + 2;
  switch (config_.kind) {
    case PlaneCodecKind::Division: return to_size(P * (lfc + hfc));
    case PlaneCodecKind::Quant: return to_size(P * hfc);
    case PlaneCodecKind::LfcOnly: return to_size(P * lfc);
    case PlaneCodecKind::HfcOnly: return to_size(Q ? P * hfc : P * E * 4);
  }
  return 0;
}

// ---------------------------------------------------------------- per-group policy
namespace {
// Where each sample's codes start (N + 1 offsets: the last is the code section's size); empty when uniform.
std::vector<int64_t> sample_code_offsets(const GroupGeometry& g, const std::vector<uint8_t>& sample_bits) {
  if (sample_bits.empty()) return {};
  ACTLAB_CHECK(static_cast<int64_t>(sample_bits.size()) == g.samples, "per-group pack: ", sample_bits.size(),
               " sample widths for ", g.samples, " samples");
  std::vector<int64_t> offsets(sample_bits.size() + 1, 0);
  for (size_t n = 0; n < sample_bits.size(); ++n) {
    ACTLAB_CHECK(valid_bits(sample_bits[n]), "per-group pack: sample ", n, " has width ", int{sample_bits[n]},
                 ", not 1, 2, 4 or 8");
    offsets[n + 1] = offsets[n] + g.groups_per_sample() * ((g.group_size * sample_bits[n] + 7) / 8);
  }
  return offsets;
}

int64_t group_pack_bytes(const GroupGeometry& g, const std::vector<int64_t>& offsets) {
  if (offsets.empty()) return g.groups() * (4 + g.code_bytes_per_group());
  return g.groups() * 4 + offsets.back() + g.samples;  // + the width of each sample
}
}  // namespace

PackedGroups::PackedGroups(const Shape& shape, const GroupGeometry& g, Device device, std::vector<uint8_t> sample_bits,
                           GroupRows rows)
    : shape_(shape), geometry_(g), sample_bits_(std::move(sample_bits)),
      code_offsets_(sample_code_offsets(g, sample_bits_)), rows_(rows),
      buffer_(Tensor::empty_tagged({group_pack_bytes(g, code_offsets_)}, MemTag::ActivationPacked, DType::U8,
                                   device)) {
  if (!sample_bits_.empty())
    copy_bytes(codes() + code_offsets_.back(), device, sample_bits_.data(), Device::cpu(), sample_bits_.size());
}

int64_t PackedGroups::code_offset(int64_t n) const {
  if (code_offsets_.empty()) return n * geometry_.groups_per_sample() * geometry_.code_bytes_per_group();
  return code_offsets_[static_cast<size_t>(n)];
}

std::vector<PackedGroups::Run> PackedGroups::runs() const {
  std::vector<Run> out;
  for (int64_t n = 0; n < geometry_.samples; ++n) {
    const int bits = bits_of(n);
    if (!out.empty() && out.back().bits == bits) {
      ++out.back().count;
    } else {
      out.push_back({n, 1, bits});
    }
  }
  return out;
}

PerGroupPolicy::PerGroupPolicy(int64_t group_size, int bits) : group_size_(group_size), bits_(bits) {
  ACTLAB_CHECK(group_size >= 1, "policy group size G must be >= 1, got ", group_size);
  ACTLAB_CHECK(valid_bits(bits), "policy bit width Q must be 1, 2, 4 or 8, got ", bits);
}

namespace {
// (N, ...) as N samples of numel/N values; false (an f32 copy) for rank 0, numel 0 and D == 1.
bool sample_rows(const Shape& shape, int64_t group_size, int bits, GroupGeometry& g) {
  const int64_t numel = shape_numel(shape);
  if (shape.empty() || numel == 0 || numel == shape[0]) return false;
  g.samples = shape[0];
  g.sample_elems = numel / shape[0];
  g.group_size = group_size;
  g.bits = bits;
  // Each row is padded to whole groups, and the closed forms count the padded values: a large G on short
  // rows passes their 64 bits long before the element count does (ActivationCachePolicy's own check).
  const int64_t limit = ActivationCachePolicy::kMaxClosedFormElements;
  ACTLAB_CHECK(g.groups_per_sample() <= limit / group_size / g.samples, "shape ", shape_str(shape),
               " padded to whole groups of G=", group_size, " has more values than the closed forms count (2^57)");
  return true;
}
}  // namespace

bool PerGroupPolicy::group_view(const Shape& shape, GroupGeometry& g) const { return group_view(shape, g, SaveInfo{}); }

bool PerGroupPolicy::group_view(const Shape& shape, GroupGeometry& g, const SaveInfo& info) const {
  return sample_rows(shape, group_size_, code_bits(bits_, info), g);
}

namespace {
// The geometry of one run of samples for the codec: its rows, its width, and where its draws start.
GroupGeometry run_geometry(const GroupGeometry& g, const PackedGroups::Run& run) {
  GroupGeometry r = g;
  r.samples = run.count;
  r.bits = run.bits;
  r.first_sample = run.first;
  return r;
}

// The per-group codec on x's device: x (contiguous f32) as g.samples rows of g.sample_elems values, kept as
// `shape` (which may differ from x's: a policy that reorders first records the caller's shape), one codec
// call per run of samples of one width (a single call unless sample_bits gives each sample its own).
std::unique_ptr<PackedGroups> pack_groups(const Tensor& x, const Shape& shape, const GroupGeometry& g,
                                          const PackContext& ctx, std::vector<uint8_t> sample_bits = {},
                                          GroupRows rows = GroupRows::Samples) {
  auto packed = std::make_unique<PackedGroups>(shape, g, x.device(), std::move(sample_bits), rows);
  const int64_t K = g.groups_per_sample();
  for (const PackedGroups::Run& run : packed->runs()) {
    const GroupGeometry r = run_geometry(g, run);
    uint8_t* codes = packed->codes() + packed->code_offset(run.first);
    uint16_t *mins = packed->mins() + run.first * K, *steps = packed->steps() + run.first * K;
    const float* rows = x.data<float>() + run.first * g.sample_elems;
    ACTLAB_DISPATCH(x.device(), cuda::group_pack(codes, mins, steps, rows, r, ctx.seed, ctx.stream, gpu.device()),
                    cpu::group_pack(codes, mins, steps, rows, r, ctx.seed, ctx.stream));
  }
  return packed;
}

// The dequantized values in the codec's row order, shaped `shape` (a fresh f32 tensor).
Tensor unpack_groups(const PackedGroups& groups, const Shape& shape) {
  const Device device = groups.buffer().device();
  Tensor out = Tensor::empty(shape, DType::F32, device);
  const GroupGeometry& g = groups.geometry();
  const int64_t K = g.groups_per_sample();
  for (const PackedGroups::Run& run : groups.runs()) {
    const GroupGeometry r = run_geometry(g, run);
    const uint8_t* codes = groups.codes() + groups.code_offset(run.first);
    const uint16_t *mins = groups.mins() + run.first * K, *steps = groups.steps() + run.first * K;
    float* rows = out.data<float>() + run.first * g.sample_elems;
    ACTLAB_DISPATCH(device, cuda::group_unpack(rows, codes, mins, steps, r, gpu.device()),
                    cpu::group_unpack(rows, codes, mins, steps, r));
  }
  return out;
}

// The unpack of the policies that keep samples as rows (pergroup, actnn): an f32 copy, or the groups.
Tensor unpack_sample_rows(const Packed& p, const std::string& policy) {
  if (const auto* pass = dynamic_cast<const PackedPassthrough*>(&p)) return unpack_passthrough(*pass);
  const PackedGroups& groups = sample_rows_pack(p, policy);
  return unpack_groups(groups, groups.shape());
}
}  // namespace

const PackedGroups& sample_rows_pack(const Packed& p, const std::string& policy) {
  const PackedGroups& groups = packed_as<PackedGroups>(p, policy);
  ACTLAB_CHECK(groups.rows() == GroupRows::Samples, "policy ", policy, " cannot unpack a pack it did not make (",
               "its rows are dim 1 of ", shape_str(groups.shape()), ", as mesa keeps them)");
  return groups;
}

std::unique_ptr<Packed> PerGroupPolicy::pack(const Tensor& x_in, const SaveInfo& info, const PackContext& ctx) const {
  const Tensor x = checked_input(x_in, name());
  GroupGeometry g;
  if (!group_view(x.shape(), g, info)) return std::make_unique<PackedPassthrough>(x);
  return pack_groups(x, x.shape(), g, ctx);
}

Tensor PerGroupPolicy::unpack(const Packed& p, const SaveInfo&) const { return unpack_sample_rows(p, name()); }

std::string PerGroupPolicy::name() const {
  return "pergroup:G=" + std::to_string(group_size_) + ",Q=" + std::to_string(bits_);
}

// N samples of D elements: N·ceil(D/G)·(ceil(G·Q/8) + 4); D == 1 (and numel 0) is an f32 copy.
size_t PerGroupPolicy::closed_form_bytes(const Shape& shape) const {
  return layer_closed_form_bytes(shape, SaveInfo{});
}

size_t PerGroupPolicy::layer_closed_form_bytes(const Shape& shape, const SaveInfo& info) const {
  GroupGeometry g;
  if (!group_view(shape, g, info)) return to_size(shape_numel(shape)) * 4;
  const int64_t groups = g.samples * ((g.sample_elems + group_size_ - 1) / group_size_);
  return to_size(groups * ((group_size_ * g.bits + 7) / 8 + 4));
}

// ---------------------------------------------------------------- ActNN's per-sample widths
std::vector<double> sample_range_norms(const Tensor& x, const GroupGeometry& g) {
  std::vector<double> norms(static_cast<size_t>(g.samples));
  if (x.device().is_cpu()) {
    cpu::group_range_norms(norms.data(), x.data<float>(), g);
  } else {
    MemTagScope tag(MemTag::Workspace);
    const Tensor on_device = Tensor::empty({g.samples * 8}, DType::U8, x.device());
    ACTLAB_CUDA_ONLY(
        cuda::group_range_norms(static_cast<double*>(on_device.raw_data()), x.data<float>(), g, x.device().index));
    copy_bytes(norms.data(), Device::cpu(), on_device.raw_data(), x.device(), norms.size() * sizeof(double));
  }
  return norms;
}

std::vector<uint8_t> allocate_sample_bits(const std::vector<double>& cost, int average_bits) {
  ACTLAB_CHECK(valid_bits(average_bits), "bit allocation: the average width must be 1, 2, 4 or 8, got ", average_bits);
  std::vector<uint8_t> bits(cost.size(), 1);
  // Upgrading b → 2b adds b bits. Why upward from 1 bit and not down from 8 as ActNN's unit steps: with
  // steps of 1, 2 and 4 bits a budget left over can always be spent exactly (a sample at 1 bit takes 1;
  // with none, every width is even and so is the budget left, and likewise for 2 and 4), whereas going
  // down one can be left with 1 bit to remove and no 2-bit sample. So the loop ends at Σ b = N·Q.
  const auto gain = [&](size_t n) {  // decrease of cost/(2^b − 1)² per added bit
    const double c = cost[n] == cost[n] ? cost[n] : INFINITY;  // a NaN range: treat as the costliest
    const double now = (1 << bits[n]) - 1, next = (1 << (2 * bits[n])) - 1;
    return c * (1.0 / (now * now) - 1.0 / (next * next)) / bits[n];
  };
  // (gain, −width, −n): the largest gain first, then the narrower sample, then the lower n, so equal costs
  // (zero ones too) raise every sample one level before any sample goes further.
  using Upgrade = std::tuple<double, int, int64_t>;
  std::priority_queue<Upgrade> upgrades;
  for (size_t n = 0; n < cost.size(); ++n) upgrades.emplace(gain(n), -1, -static_cast<int64_t>(n));
  int64_t budget = static_cast<int64_t>(cost.size()) * (average_bits - 1);
  while (budget > 0) {
    ACTLAB_CHECK(!upgrades.empty(), "bit allocation: ", budget, " bits left and no upgrade fits");
    const size_t n = static_cast<size_t>(-std::get<2>(upgrades.top()));
    upgrades.pop();
    if (bits[n] > budget) continue;  // it never fits again: the budget only shrinks
    budget -= bits[n];
    bits[n] = static_cast<uint8_t>(bits[n] * 2);
    if (bits[n] < 8) upgrades.emplace(gain(n), -bits[n], -static_cast<int64_t>(n));
  }
  return bits;
}

AdaptiveGroupPolicy::AdaptiveGroupPolicy(int64_t group_size, int average_bits)
    : group_size_(group_size), average_bits_(average_bits) {
  ACTLAB_CHECK(group_size >= 8 && group_size % 8 == 0,
               "policy actnn: group size G must be a positive multiple of 8 (a group's codes then fill whole "
               "bytes at every width), got ", group_size);
  ACTLAB_CHECK(valid_bits(average_bits), "policy actnn: average width Q must be 1, 2, 4 or 8, got ", average_bits);
}

bool AdaptiveGroupPolicy::group_view(const Shape& shape, GroupGeometry& g) const {
  return sample_rows(shape, group_size_, average_bits_, g);
}

std::unique_ptr<Packed> AdaptiveGroupPolicy::pack(const Tensor& x_in, const SaveInfo& info, const PackContext& ctx) const {
  const Tensor x = checked_input(x_in, name());
  GroupGeometry g;
  if (!group_view(x.shape(), g)) return std::make_unique<PackedPassthrough>(x);
  // ActNN's cost of sample n is (kernel area, G/pixels, the gradient EMA: factors shared by the samples of
  // one layer) × ‖range_n‖²; only the last decides how one layer's budget is shared among its samples.
  return pack_groups(x, x.shape(), g, ctx, allocate_sample_bits(sample_range_norms(x, g), code_bits(average_bits_, info)));
}

Tensor AdaptiveGroupPolicy::unpack(const Packed& p, const SaveInfo&) const { return unpack_sample_rows(p, name()); }

std::string AdaptiveGroupPolicy::name() const {
  return "actnn:G=" + std::to_string(group_size_) + ",Q=" + std::to_string(average_bits_);
}

size_t AdaptiveGroupPolicy::bytes_for_widths(const Shape& shape, const std::vector<uint8_t>& sample_bits) const {
  GroupGeometry g;
  if (!group_view(shape, g)) return to_size(shape_numel(shape)) * 4;
  const int64_t K = g.groups_per_sample();
  int64_t codes = 0;
  for (const uint8_t b : sample_bits) codes += K * ((group_size_ * b + 7) / 8);
  return to_size(g.samples * K * 4 + codes + g.samples);
}

// N samples of D elements, K = ceil(D/G) groups each: N·K·4 + N·K·G·Q/8 + N (G % 8 == 0 and Σ b_n = N·Q).
size_t AdaptiveGroupPolicy::closed_form_bytes(const Shape& shape) const {
  return layer_closed_form_bytes(shape, SaveInfo{});
}

size_t AdaptiveGroupPolicy::layer_closed_form_bytes(const Shape& shape, const SaveInfo& info) const {
  GroupGeometry g;
  if (!group_view(shape, g)) return to_size(shape_numel(shape)) * 4;
  const int64_t K = g.groups_per_sample();
  return to_size(g.samples * K * 4 + g.samples * K * group_size_ * code_bits(average_bits_, info) / 8 + g.samples);
}

// ---------------------------------------------------------------- BLPA
PackedBlpa::PackedBlpa(const Shape& shape, const BlpaGeometry& g, Device device)
    : shape_(shape), geometry_(g),
      buffer_(Tensor::empty_tagged({g.channels * static_cast<int64_t>(sizeof(BlpaChannel)) + g.code_bytes()},
                                   MemTag::ActivationPacked, DType::U8, device)) {}

BlpaPolicy::BlpaPolicy(int bits) : bits_(bits) {
  ACTLAB_CHECK(bits == 4 || bits == 8, "policy blpa: Q must be 4 or 8 (BLPA's widths), got ", bits);
}

bool BlpaPolicy::blpa_view(const Shape& shape, BlpaGeometry& g) const { return blpa_view(shape, g, SaveInfo{}); }

bool BlpaPolicy::blpa_view(const Shape& shape, BlpaGeometry& g, const SaveInfo& info) const {
  const int64_t numel = shape_numel(shape);
  if (numel == 0) return false;
  // Channels as batch norm normalizes them (dim 1 of a map), which is where BLPA's ±3σ grid comes from.
  const bool map = shape.size() == 4;
  g.outer = map ? shape[0] : 1;
  g.channels = map ? shape[1] : 1;
  g.inner = numel / (g.outer * g.channels);
  g.bits = code_bits(bits_, info);
  return true;
}

std::unique_ptr<Packed> BlpaPolicy::pack(const Tensor& x_in, const SaveInfo& info, const PackContext&) const {
  const Tensor x = checked_input(x_in, name());
  BlpaGeometry g;
  if (!blpa_view(x.shape(), g, info)) return std::make_unique<PackedPassthrough>(x);
  auto packed = std::make_unique<PackedBlpa>(x.shape(), g, x.device());
  ACTLAB_DISPATCH(x.device(), cuda::blpa_pack(packed->params(), packed->codes(), x.data<float>(), g, gpu.device()),
                  cpu::blpa_pack(packed->params(), packed->codes(), x.data<float>(), g));
  return packed;
}

Tensor BlpaPolicy::unpack(const Packed& p, const SaveInfo&) const {
  if (const auto* pass = dynamic_cast<const PackedPassthrough*>(&p)) return unpack_passthrough(*pass);
  const auto* blpa = dynamic_cast<const PackedBlpa*>(&p);
  ACTLAB_CHECK(blpa != nullptr, "policy ", name(), " cannot unpack a pack it did not make (shape ",
               shape_str(p.shape()), ")");
  const Device device = blpa->buffer().device();
  Tensor out = Tensor::empty(blpa->shape(), DType::F32, device);
  float* values = out.data<float>();
  ACTLAB_DISPATCH(device, cuda::blpa_unpack(values, blpa->params(), blpa->codes(), blpa->geometry(), gpu.device()),
                  cpu::blpa_unpack(values, blpa->params(), blpa->codes(), blpa->geometry()));
  return out;
}

std::string BlpaPolicy::name() const { return "blpa:Q=" + std::to_string(bits_); }

size_t BlpaPolicy::closed_form_bytes(const Shape& shape) const {
  return layer_closed_form_bytes(shape, SaveInfo{});
}

size_t BlpaPolicy::layer_closed_form_bytes(const Shape& shape, const SaveInfo& info) const {
  BlpaGeometry g;
  if (!blpa_view(shape, g, info)) return 0;  // an empty f32 copy
  return to_size(g.code_bytes() + g.channels * 16);
}

// ---------------------------------------------------------------- Mesa-style policy
MesaPolicy::MesaPolicy(int bits) : bits_(bits) {
  ACTLAB_CHECK(valid_bits(bits), "policy bit width Q must be 1, 2, 4 or 8, got ", bits);
}

bool MesaPolicy::range_view(const Shape& shape, GroupGeometry& g) const { return range_view(shape, g, SaveInfo{}); }

bool MesaPolicy::range_view(const Shape& shape, GroupGeometry& g, const SaveInfo& info) const {
  const int64_t numel = shape_numel(shape);
  if (numel <= 1) return false;
  // 4-D: one range per index of dim 1 (a head of (B, heads, T, d), a channel of (N, C, H, W)) over the batch.
  g.samples = shape.size() == 4 ? shape[1] : 1;
  g.sample_elems = numel / g.samples;
  g.group_size = g.sample_elems;
  g.bits = code_bits(bits_, info);
  return true;
}

std::unique_ptr<Packed> MesaPolicy::pack(const Tensor& x_in, const SaveInfo& info, const PackContext& ctx) const {
  const Tensor x = checked_input(x_in, name());
  GroupGeometry g;
  if (!range_view(x.shape(), g, info)) return std::make_unique<PackedPassthrough>(x);
  if (x.dim() != 4) return pack_groups(x, x.shape(), g, ctx);
  // Each head's values across the batch made contiguous (a scratch copy, freed before returning).
  MemTagScope tag(MemTag::Workspace);
  const Tensor by_head = x.permute({1, 0, 2, 3}).contiguous();
  return pack_groups(by_head, x.shape(), g, ctx, {}, GroupRows::Dim1);
}

Tensor MesaPolicy::unpack(const Packed& p, const SaveInfo&) const {
  if (const auto* pass = dynamic_cast<const PackedPassthrough*>(&p)) return unpack_passthrough(*pass);
  const PackedGroups& groups = packed_as<PackedGroups>(p, name());
  const Shape& s = groups.shape();
  ACTLAB_CHECK((s.size() == 4) == (groups.rows() == GroupRows::Dim1), "policy ", name(),
               " cannot unpack a pack it did not make (its rows are the samples of ", shape_str(s), ")");
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
size_t MesaPolicy::closed_form_bytes(const Shape& shape) const {
  return layer_closed_form_bytes(shape, SaveInfo{});
}

size_t MesaPolicy::layer_closed_form_bytes(const Shape& shape, const SaveInfo& info) const {
  GroupGeometry g;
  if (!range_view(shape, g, info)) return to_size(shape_numel(shape)) * 4;
  return to_size(g.samples * ((g.sample_elems * g.bits + 7) / 8 + 4));
}

}  // namespace actlab
