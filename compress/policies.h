// The lossy activation-cache policies: DIVISION (division:B,Q), its ablations (quant:Q, lfc:B, hfc:B[,Q])
// and the baselines (pergroup:G,Q and actnn:G,Q after ActNN, blpa:Q after BLPA, mesa:Q after Mesa), with
// the Packed forms they keep until backward.
// Each pack is ONE allocation under MemTag::ActivationPacked whose size is the closed form of
// expected_bytes() (docs/policies.md derives them). parse_policy (compress/registry.cpp) builds these.
// Tested in tests/test_policies.cpp; the codec arithmetic in tests/test_codec.cpp.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "actlab/core/codec.h"
#include "actlab/compress/policy.h"

namespace actlab {

// A tensor kept as an f32 copy (shapes a policy does not compress: a 1×1 plane, D == 1, rank 1, empty).
// nbytes() = 4·numel. The copy is owned: nothing references the packed input.
class PackedPassthrough final : public Packed {
 public:
  explicit PackedPassthrough(const Tensor& x);  // x: contiguous f32 on any device; the copy stays there
  size_t nbytes() const override { return copy_.nbytes(); }
  const Shape& shape() const override { return copy_.shape(); }
  const Tensor& tensor() const { return copy_; }
 private:
  Tensor copy_;
};

// What the plane policies keep. A tensor is seen as planes (core/codec.h PlaneGeometry):
// (N,C,H,W) → N·C planes of H×W; (B,T,D) token maps → B planes of T×D pooled along T only
// (make_token_geometry); (N,D) → N planes of 1×D.
enum class PlaneCodecKind {
  Division,  // bf16 LFC + Q-bit HFC; backward sees LFC↑ + HFC
  Quant,     // Q-bit x itself (DIVISION w/o LFC, Fixed Quant)
  LfcOnly,   // bf16 LFC; backward sees LFC↑ (DIVISION w/o HFC, LFC-ACT)
  HfcOnly,   // the HFC alone, Q-bit or (bits == 0) f32; backward sees HFC (HFC-ACT)
};

struct PlaneCodecConfig {
  PlaneCodecKind kind = PlaneCodecKind::Division;
  int64_t pool_block = 8;  // B: the LFC pool is min(B, H) × min(B, W)
  int bits = 2;       // Q ∈ {1,2,4,8}; 0 only for HfcOnly (f32 residual)
  // R (the policy string's R key): the codes take one min and step per min(R, H) consecutive rows of a plane
  // instead of one per plane — on a (B, T, D) token map R = 1 is one range per token. 0: one per plane.
  // Only with codes (division, quant, hfc with Q); it becomes the codec's PlaneGeometry::range_rows.
  int64_t range_rows = 0;
  bool stores_lfc() const { return kind == PlaneCodecKind::Division || kind == PlaneCodecKind::LfcOnly; }
  bool uses_lfc() const { return kind != PlaneCodecKind::Quant; }
  bool stores_codes() const { return kind != PlaneCodecKind::LfcOnly && bits > 0; }
  bool stores_residual() const { return kind == PlaneCodecKind::HfcOnly && bits == 0; }
};

// The sections of a plane pack, in buffer order (each section's offset keeps its element type aligned):
// residual f32 [planes·E] | lfc bf16 [planes·lfc_h·lfc_w] | mins bf16 [ranges] | steps bf16 [ranges] |
// codes u8 [ranges·code bytes per range]: the geometry's ranges (PlaneGeometry::ranges, one per plane
// without range_rows). Absent sections have size 0.
struct PlaneSections {
  size_t residual = 0, lfc = 0, mins = 0, steps = 0, codes = 0;  // byte offsets
  size_t total = 0;                                              // bytes
};
PlaneSections plane_sections(const PlaneCodecConfig& config, const PlaneGeometry& g);

class PackedPlanes final : public Packed {
 public:
  // The buffer is allocated on `device` (where the packed tensor lives).
  PackedPlanes(const Shape& shape, const PlaneCodecConfig& config, const PlaneGeometry& g,
               Device device = Device::cpu());
  size_t nbytes() const override { return buffer_.nbytes(); }
  const Shape& shape() const override { return shape_; }
  const PlaneCodecConfig& config() const { return config_; }
  const PlaneGeometry& geometry() const { return geometry_; }
  // Section pointers (nullptr when the section is absent). bf16 values are raw bits.
  uint16_t* lfc() const { return config_.stores_lfc() ? section<uint16_t>(sections_.lfc) : nullptr; }
  uint16_t* mins() const { return config_.stores_codes() ? section<uint16_t>(sections_.mins) : nullptr; }
  uint16_t* steps() const { return config_.stores_codes() ? section<uint16_t>(sections_.steps) : nullptr; }
  uint8_t* codes() const { return config_.stores_codes() ? section<uint8_t>(sections_.codes) : nullptr; }
  float* residual() const { return config_.stores_residual() ? section<float>(sections_.residual) : nullptr; }
  const Tensor& buffer() const { return buffer_; }  // every byte of the pack, u8
 private:
  template <typename T> T* section(size_t offset) const {
    return reinterpret_cast<T*>(static_cast<uint8_t*>(buffer_.raw_data()) + offset);
  }
  Shape shape_;
  PlaneCodecConfig config_;
  PlaneGeometry geometry_;
  PlaneSections sections_;
  Tensor buffer_;  // u8, MemTag::ActivationPacked
};

// division / quant / lfc / hfc. pack: x is f32 on the CPU or a GPU (made contiguous if it is not); the pack
// and the unpacked tensor live on x's device, and the bytes are the same on both (core/cuda/codec.h).
// With range_rows the codes take one min and step per R rows of a plane (PlaneGeometry::range_rows), packed
// and decoded by the same plane_pack and plane_unpack calls as one range per plane. No blocked or channel
// reads of such packs: those decoders take one range per plane, and the callers fall back to unpack.
class PlaneCodecPolicy final : public ActivationCachePolicy {
 public:
  explicit PlaneCodecPolicy(const PlaneCodecConfig& config);  // throws Error on a bad B/Q
  std::unique_ptr<Packed> pack(const Tensor& x, const SaveInfo& info, const PackContext& ctx) const override;
  // A channels-last x on the CPU is packed tile by tile (cpu::plane_pack_channels_last): the same bytes.
  bool takes_channels_last() const override { return true; }
  Tensor unpack(const Packed& p, const SaveInfo& info) const override;
  // CPU packs of (N, C, H, W) with C % 16 == 0 and block 16, codes or LFC (not a full-precision residual).
  Tensor unpack_blocked(const Packed& p, const SaveInfo& info, int channel_block) const override;
  // CPU packs of (N, C, H, W), codes or LFC (not a full-precision residual), that the lane kernels decode
  // (cpu::plane_channels_last_lanes: AVX-512, C a multiple of 16, one range per plane).
  Tensor unpack_channels_last(const Packed& p, const SaveInfo& info) const override;
  // CPU packs of (N, C, H, W), codes or LFC (not a full-precision residual).
  std::unique_ptr<ChannelReader> channel_reader(const Packed& p, const SaveInfo& info) const override;
  // Under --precision bf16, the packs channel_reader serves decoded and rounded to bf16 (what the bf16
  // convolution would round unpack()'s values to), without the f32 tensor in between: channel by channel into
  // (N, C, H, W), or for a consumer computing channels-last (SaveInfo::channels_last) with C % 16 == 0, sixteen
  // channels at a time into a channels-last tensor (cpu::plane_unpack_bf16_channels_last); undefined otherwise
  // (fp32, a GPU pack, not 4-D, several ranges per plane, an f32 residual).
  Tensor unpack_bf16(const Packed& p, const SaveInfo& info) const override;
  std::string name() const override;
  const PlaneCodecConfig& config() const { return config_; }
  // The plane view of a shape, or false when it is kept as an f32 copy (rank below 2, numel 0, H·W == 1).
  bool plane_view(const Shape& shape, PlaneGeometry& g) const;
 private:
  size_t closed_form_bytes(const Shape& shape) const override;
  size_t layer_closed_form_bytes(const Shape& shape, const SaveInfo& info) const override;  // at bits_for(info)
  int bits_for(const SaveInfo& info) const;  // the codes' width for this save: code_bits(Q, info)
  bool plane_view(const Shape& shape, PlaneGeometry& g, int bits) const;
  size_t bytes_at(const Shape& shape, int bits) const;
  PlaneCodecConfig config_;
};

// What a PackedGroups' rows are: the samples of shape() in its own order (pergroup, actnn, acgc), or the
// indices of dim 1 of a 4-D shape() across the batch (mesa's head-major copy). The two decode to other
// orders, so a policy refuses a pack of the other kind rather than read it as its own.
enum class GroupRows { Samples, Dim1 };

// ActNN-style per-group pack: (N, ...) → N samples of D = numel/N elements, zero-padded to groups of G.
// Buffer: mins bf16 [groups] | steps bf16 [groups] | codes u8 [Σ_n groups_per_sample·ceil(G·b_n/8)] |
// bits u8 [N] — the last section only when the samples have their own widths b_n (actnn); otherwise every
// sample has geometry().bits. Sample n's codes start at code_offset(n).
class PackedGroups final : public Packed {
 public:
  // sample_bits: empty (every sample g.bits) or one width in {1,2,4,8} per sample.
  PackedGroups(const Shape& shape, const GroupGeometry& g, Device device = Device::cpu(),
               std::vector<uint8_t> sample_bits = {}, GroupRows rows = GroupRows::Samples);
  GroupRows rows() const { return rows_; }
  size_t nbytes() const override { return buffer_.nbytes(); }
  const Shape& shape() const override { return shape_; }
  const GroupGeometry& geometry() const { return geometry_; }
  uint16_t* mins() const { return reinterpret_cast<uint16_t*>(buffer_.raw_data()); }
  uint16_t* steps() const { return mins() + geometry_.groups(); }
  uint8_t* codes() const { return reinterpret_cast<uint8_t*>(steps() + geometry_.groups()); }
  const Tensor& buffer() const { return buffer_; }  // every byte of the pack, u8
  // The width of sample n's codes, and a host copy of the per-sample widths (empty when uniform). The
  // buffer's bits section holds the same widths: the bytes a backward needs, counted in nbytes().
  int bits_of(int64_t n) const { return sample_bits_.empty() ? geometry_.bits : sample_bits_[static_cast<size_t>(n)]; }
  const std::vector<uint8_t>& sample_bits() const { return sample_bits_; }
  int64_t code_offset(int64_t n) const;
  // The maximal runs of consecutive samples with one width: each is one call of the group codec.
  struct Run {
    int64_t first, count;
    int bits;
  };
  std::vector<Run> runs() const;
 private:
  Shape shape_;
  GroupGeometry geometry_;
  std::vector<uint8_t> sample_bits_;
  std::vector<int64_t> code_offsets_;  // per sample, when sample_bits_ is not empty
  GroupRows rows_;
  Tensor buffer_;  // u8, MemTag::ActivationPacked
};
// `p` as the PackedGroups of a policy that keeps samples as rows (pergroup, actnn, acgc), or one Error naming
// `policy` (packed_as's, and for mesa's head-major groups).
const PackedGroups& sample_rows_pack(const Packed& p, const std::string& policy);

class PerGroupPolicy final : public ActivationCachePolicy {
 public:
  PerGroupPolicy(int64_t group_size, int bits);  // throws Error on a bad G/Q
  std::unique_ptr<Packed> pack(const Tensor& x, const SaveInfo& info, const PackContext& ctx) const override;
  Tensor unpack(const Packed& p, const SaveInfo& info) const override;
  std::string name() const override;
  // The group view of a shape, or false when it is kept as an f32 copy (rank 0, numel 0, D == 1).
  bool group_view(const Shape& shape, GroupGeometry& g) const;
 private:
  size_t closed_form_bytes(const Shape& shape) const override;
  size_t layer_closed_form_bytes(const Shape& shape, const SaveInfo& info) const override;  // at code_bits(Q, info)
  bool group_view(const Shape& shape, GroupGeometry& g, const SaveInfo& info) const;
  int64_t group_size_;
  int bits_;
};

// ActNN's per-sample mixed precision (its default optimization level L3) on top of the per-group codec:
// each sample n gets its own width b_n ∈ {1,2,4,8}, chosen by allocate_sample_bits from the sample's
// ‖range_n‖² (cpu::group_range_norms) under Σ b_n = N·Q, then the samples go through group_pack in runs
// of equal width. What it follows of ActNN and where it departs: docs/policies.md, "actnn".
// G % 8 == 0, so a group's codes take G·b/8 bytes and the size depends on the widths only through
// Σ b_n = N·Q: expected_bytes(shape) holds for every allocation (bytes_for_widths checks it per pack).
class AdaptiveGroupPolicy final : public ActivationCachePolicy {
 public:
  AdaptiveGroupPolicy(int64_t group_size, int average_bits);  // throws Error on a bad G/Q
  std::unique_ptr<Packed> pack(const Tensor& x, const SaveInfo& info, const PackContext& ctx) const override;
  Tensor unpack(const Packed& p, const SaveInfo& info) const override;
  std::string name() const override;
  // The closed form for one allocation: N·K·4 + Σ_n K·ceil(G·b_n/8) + N with K = ceil(D/G).
  size_t bytes_for_widths(const Shape& shape, const std::vector<uint8_t>& sample_bits) const;
  bool group_view(const Shape& shape, GroupGeometry& g) const;  // as PerGroupPolicy's
 private:
  size_t closed_form_bytes(const Shape& shape) const override;
  size_t layer_closed_form_bytes(const Shape& shape, const SaveInfo& info) const override;  // average code_bits(Q, info)
  int64_t group_size_;
  int average_bits_;
};

// The per-sample widths b_n ∈ {1,2,4,8} that a greedy picks to make Σ_n cost[n]/(2^b_n − 1)² small under
// Σ_n b_n = N·average_bits exactly (average_bits ∈ {1,2,4,8}): every sample starts at 1 bit and the
// upgrade (1→2, 2→4, 4→8) with the largest decrease of the sum per added bit that still fits the budget is
// taken until the budget is spent. Ties go to the lower n. Equal costs give every sample average_bits.
std::vector<uint8_t> allocate_sample_bits(const std::vector<double>& cost, int average_bits);

// ‖range_n‖² of each sample of x (contiguous f32, CPU or GPU) as the group codec sees g: the sum over the
// sample's groups of (max − min)², zero padding included (cpu::group_range_norms or its CUDA twin; the
// numbers come back to the host). actnn's per-sample costs and acgc's codec error estimate.
std::vector<double> sample_range_norms(const Tensor& x, const GroupGeometry& g);

// BLPA (Chakrabarti & Moseley, "Backprop with Approximate Activations", NeurIPS 2019) as a policy: Q-bit
// codes (Q ∈ {4, 8}) of each value on a fixed grid per channel — 2^Q cells of 6σ/2^Q over ±3σ around the
// channel mean, 0 a cell boundary, so each code keeps its value's sign — decoded to the cell midpoint
// (core/codec.h, blpa_code). Channels: dim 1 of a 4-D map; other ranks are one channel. CPU only (a GPU
// tensor is refused with one error line). What it follows of BLPA and where it departs: docs/policies.md,
// "blpa".
class PackedBlpa final : public Packed {
 public:
  PackedBlpa(const Shape& shape, const BlpaGeometry& g, Device device);  // the buffer on `device`
  size_t nbytes() const override { return buffer_.nbytes(); }
  const Shape& shape() const override { return shape_; }
  const BlpaGeometry& geometry() const { return geometry_; }
  // Buffer: params BlpaChannel [channels] | codes u8 [ceil(numel·Q/8)].
  BlpaChannel* params() const { return reinterpret_cast<BlpaChannel*>(buffer_.raw_data()); }
  uint8_t* codes() const { return reinterpret_cast<uint8_t*>(params() + geometry_.channels); }
  const Tensor& buffer() const { return buffer_; }
 private:
  Shape shape_;
  BlpaGeometry geometry_;
  Tensor buffer_;  // u8, MemTag::ActivationPacked
};

class BlpaPolicy final : public ActivationCachePolicy {
 public:
  explicit BlpaPolicy(int bits);  // throws Error unless Q is 4 or 8
  std::unique_ptr<Packed> pack(const Tensor& x, const SaveInfo& info, const PackContext& ctx) const override;
  Tensor unpack(const Packed& p, const SaveInfo& info) const override;
  std::string name() const override;
  bool blpa_view(const Shape& shape, BlpaGeometry& g) const;  // false: kept as an f32 copy (numel 0)
 private:
  // ceil(numel·Q/8) + 16·C (C = dim 1 of a 4-D shape, else 1); an empty tensor is a 0-byte copy.
  size_t closed_form_bytes(const Shape& shape) const override;
  size_t layer_closed_form_bytes(const Shape& shape, const SaveInfo& info) const override;  // at code_bits(Q, info)
  bool blpa_view(const Shape& shape, BlpaGeometry& g, const SaveInfo& info) const;
  int bits_;
};

// Mesa-style activation quantization for vision transformers: Q-bit codes (Q = 8 by default, as Mesa)
// with one range per head of a 4-D (B, heads, T, d) map — per channel of an (N, C, H, W) map — taken over
// the whole batch, and one range per tensor for every other rank. What it follows and where it departs
// (the batch's min/max in bf16 instead of f32 running averages, its own group choice): docs/policies.md, "mesa".
// Pack: a PackedGroups of the head-major copy (heads as the codec's rows), shape() the caller's.
class MesaPolicy final : public ActivationCachePolicy {
 public:
  explicit MesaPolicy(int bits);  // throws Error on a bad Q
  std::unique_ptr<Packed> pack(const Tensor& x, const SaveInfo& info, const PackContext& ctx) const override;
  Tensor unpack(const Packed& p, const SaveInfo& info) const override;
  std::string name() const override;
  // The ranges of a shape as the per-group codec sees them (one group per row), or false for a copy.
  bool range_view(const Shape& shape, GroupGeometry& g) const;
 private:
  size_t closed_form_bytes(const Shape& shape) const override;
  size_t layer_closed_form_bytes(const Shape& shape, const SaveInfo& info) const override;  // at code_bits(Q, info)
  bool range_view(const Shape& shape, GroupGeometry& g, const SaveInfo& info) const;
  int bits_;
};

}  // namespace actlab
