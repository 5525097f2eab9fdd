#include "peft/merge/merge_compute.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>
#include <vector>

#include "core/bf16.hpp"
#include "core/convert.hpp"
#include "core/error.hpp"
#include "core/shape.hpp"
#include "core/f16.hpp"
#include "core/quant/fp8_block.hpp"
#include "core/text.hpp"
#include "peft/kernels/merge_parallel.hpp"
#include "peft/methods/lora_math.hpp"
#include "peft/adapter/method_params.hpp"
#include "peft/lowrank/adapter_delta.hpp"
#include "peft/methods/peft_methods.hpp"

namespace peft {
namespace {

std::vector<int64_t> signed_shape(const std::vector<uint64_t>& shape) {
  std::vector<int64_t> out;
  for (uint64_t d : shape) {
    if (d > static_cast<uint64_t>(INT64_MAX)) fail(PEFT_ERR_VALIDATION_OVERFLOW, "tensor dimension is too large");
    out.push_back(static_cast<int64_t>(d));
  }
  return out;
}

merge::ModuleKind merge_kind(LayerKind kind) {
  switch (kind) {
    case LayerKind::linear: return merge::ModuleKind::linear;
    case LayerKind::conv1d: return merge::ModuleKind::conv1d_gpt2;
    case LayerKind::embedding: return merge::ModuleKind::embedding;
    case LayerKind::conv2d: return merge::ModuleKind::conv;
    default: fail(PEFT_ERR_INTERNAL, "not a LoRA layer kind");
  }
}

// One LoRA term's factors as f32, and the layout of its product in the weight.
struct LoadedTerm {
  merge::DeltaLayout layout;
  std::vector<float> a, b, magnitude;
  int64_t rank = 0;
  double coefficient = 0;
  bool dora = false;
};

LoadedTerm load_term(const LoraTerm& term, const std::vector<int64_t>& weight_shape, merge::Arithmetic arithmetic) {
  const AdapterModule& m = *term.module;
  const Checkpoint& ckpt = term.adapter->adapter->checkpoint();
  const bool emb = m.kind == LayerKind::embedding;
  const AdapterTensor* a = m.find(emb ? TensorRole::lora_embedding_a : TensorRole::lora_a);
  const AdapterTensor* b = m.find(emb ? TensorRole::lora_embedding_b : TensorRole::lora_b);
  if (!a || !b) fail(PEFT_ERR_INTERNAL, "LoRA module " + peft::quoted(m.name) + " lost its factors");
  LoadedTerm t;
  const auto a_shape = signed_shape(ckpt.tensor(a->index).shape);
  const auto b_shape = signed_shape(ckpt.tensor(b->index).shape);
  t.layout = merge::layout_for(merge_kind(m.kind), weight_shape, a_shape, b_shape, 1, m.name);
  t.rank = a_shape.at(0);
  t.a = ckpt.read_f32(a->index);
  t.b = ckpt.read_f32(b->index);
  t.coefficient = term.coefficient;
  if (arithmetic == merge::Arithmetic::ggml)  // llama-export-lora's scale: weight * alpha / rank in float
    t.coefficient = merge::ggml_lora_coefficient(term.adapter->weight, m.alpha, m.rank, m.scaling,
                                                 "module " + peft::quoted(m.name));
  t.dora = term.dora;
  if (t.dora) {
    t.magnitude = ckpt.read_f32(m.find(TensorRole::lora_magnitude)->index);
    if (static_cast<int64_t>(t.magnitude.size()) != t.layout.out)
      fail(PEFT_ERR_SHAPE_MISMATCH, "module " + peft::quoted(m.name) + ": lora_magnitude_vector has " +
                                        std::to_string(t.magnitude.size()) + " values, the layer " +
                                        std::to_string(t.layout.out) + " output channels");
  }
  return t;
}

// A LoRA term on a stacked expert parameter (PEFT's ParamWrapper): expert e's factors are lora_A's
// rows e*r .. e*r+r-1 and lora_B's columns k*E + e (k < r), its delta s * B_e @ A_e the parameter's
// [out, in] slice e (transposed: [in, out]). Added expert by expert to the fused tensor, or to the
// rows of one expert's saved tensor that the slot names.
void apply_expert_term(const LoraTerm& term, DType dtype, uint8_t* data, const merge::ExecOptions& exec) {
  const AdapterModule& m = *term.module;
  const ExpertFactors factors(m, term.adapter->adapter->checkpoint());
  const ExpertFactorShape& f = factors.shape();
  auto add = [&](int64_t e, int64_t row_begin, int64_t rows, int64_t row_stride, const merge::DeltaLayout& layout,
                 uint8_t* at) {
    const std::vector<float> b = factors.b(e, row_begin, rows, row_stride);
    const merge::LoraFactors pair{factors.a(e), b.data(), f.rank, term.coefficient};
    merge::add_delta(merge::WeightView{at, dtype, layout.rows(), layout.cols()}, layout, {&pair, 1}, exec);
  };
  const ExpertSlot& slot = *term.expert;
  if (slot.expert >= 0) {
    add(slot.expert, slot.row_begin, slot.rows, slot.row_stride, merge::DeltaLayout{slot.rows, f.in, false}, data);
    return;
  }
  const merge::DeltaLayout layout{f.out, f.in, m.expert->transposed};
  const uint64_t stride = converted_byte_size(dtype, static_cast<uint64_t>(f.out * f.in));
  for (int64_t e = 0; e < f.experts; ++e) add(e, 0, f.out, 1, layout, data + static_cast<uint64_t>(e) * stride);
}

bool same_layout(const merge::DeltaLayout& x, const merge::DeltaLayout& y) {
  return x.out == y.out && x.in == y.in && x.transposed == y.transposed;
}

// Applies one term of a non-LoRA method to the weight: its dense delta, or IA3's scale.
void apply_method(const LoraTerm& term, const std::vector<int64_t>& shape, DType dtype, uint8_t* data,
                  const merge::ExecOptions& exec) {
  const AdapterModule& m = *term.module;
  const merge::DeltaLayout layout = method_layer_layout(m, m.kind, shape);
  const merge::WeightView view{data, dtype, layout.rows(), layout.cols()};
  const MethodParams params = load_method_params(*term.adapter->adapter, m);
  check_conv_kernel(m, params, shape);
  if (effect_of(m.method) == MethodEffect::scale) {
    const std::vector<float> l = ia3_vector(params, term.coefficient);
    const int64_t want = m.settings.ia3_feedforward ? layout.in : layout.out;
    if (static_cast<int64_t>(l.size()) != want)
      fail(PEFT_ERR_SHAPE_MISMATCH, "module " + peft::quoted(m.name) + ": ia3_l has " + std::to_string(l.size()) +
                                        " values, the layer " + std::to_string(want) + " features");
    merge::ia3_scale(view, layout, l.data(), m.settings.ia3_feedforward, false, exec);
    return;
  }
  if (is_rotation(m.method)) {  // OFT, BOFT, HRA: W' = (W @ M) * s
    merge::transform_input(view, layout, method_transform(m, params, term.coefficient, layout, false), exec);
    return;
  }
  const std::vector<float> current = method_reads_weight(m) ? merge::weight_f32(view, layout) : std::vector<float>{};
  const std::vector<float> delta =
      method_delta(m, params, term.coefficient, layout, current.empty() ? nullptr : current.data());
  merge::add_dense_delta(view, layout, delta.data(), false, exec);
}

// The LoRA terms of `p` added to `data`, which holds the weight of `weight_shape` in `dtype`
// (p.shape and p.work_dtype, but the FP8 weight's shape and F32 for an FP8 weight or its scales).
void apply_lora(const PlannedTensor& p, const std::vector<uint64_t>& weight_shape, DType dtype, uint8_t* data,
                unsigned threads, merge::Arithmetic arithmetic) {
  const auto shape = signed_shape(weight_shape);
  merge::ExecOptions exec;
  exec.threads = threads;
  exec.arithmetic = arithmetic;
  std::vector<LoadedTerm> loaded;
  loaded.reserve(p.lora.size());
  for (const LoraTerm& term : p.lora)
    if (effect_of(term.module->method) == MethodEffect::lora && !term.expert)
      loaded.push_back(load_term(term, shape, arithmetic));

  std::vector<merge::LoraFactors> pending;
  merge::DeltaLayout pending_layout;
  auto view_for = [&](const merge::DeltaLayout& layout) {
    return merge::WeightView{data, dtype, layout.rows(), layout.cols()};
  };
  auto flush = [&] {
    if (pending.empty()) return;
    merge::add_delta(view_for(pending_layout), pending_layout, pending, exec);
    pending.clear();
  };
  size_t next = 0;
  for (const LoraTerm& term : p.lora) {
    if (term.expert) {
      flush();
      apply_expert_term(term, dtype, data, exec);
      continue;
    }
    if (effect_of(term.module->method) != MethodEffect::lora) {
      flush();  // another method's change applies to the weight as the earlier adapters left it
      apply_method(term, shape, dtype, data, exec);
      continue;
    }
    const LoadedTerm& t = loaded[next++];
    const merge::LoraFactors factors{t.a.data(), t.b.data(), t.rank, t.coefficient};
    if (t.dora) {
      flush();  // DoRA's norm is taken from the weight as the earlier adapters left it
      merge::dora_merge(view_for(t.layout), t.layout, {&factors, 1}, t.magnitude.data(), nullptr, exec);
      continue;
    }
    if (!pending.empty() && !same_layout(pending_layout, t.layout)) flush();
    pending_layout = t.layout;
    pending.push_back(factors);
  }
  flush();
}

// Values per slice of a combined delta, in whole rows (as model_combine slices its tensors).
constexpr int64_t kCombineSliceValues = int64_t{1} << 20;

// apply_combined for plain LoRA terms, in slices of whole rows: each dW_i = s_i B_i @ A_i computed a
// slice at a time (compute_delta_rows, module_delta's arithmetic), so that memory does not grow with
// the weight; the same values as the whole-delta path.
void apply_combined_lora(const MergePlan& plan, const PlannedTensor& p, const std::vector<uint64_t>& weight_shape,
                         DType dtype, uint8_t* data) {
  // Each term's factors at the module's own scaling: the adapter weight goes into the combination.
  std::vector<LoadedTerm> factors;
  std::vector<merge::LoraFactors> terms;
  std::vector<float> weights;
  const auto shape = signed_shape(weight_shape);
  for (const LoraTerm& term : p.lora) {
    LoadedTerm t = load_term(term, shape, merge::Arithmetic::peft);
    t.coefficient = term.module->scaling;
    factors.push_back(std::move(t));
    weights.push_back(static_cast<float>(term.adapter->weight));
  }
  for (const LoadedTerm& t : factors) terms.push_back({t.a.data(), t.b.data(), t.rank, t.coefficient});
  const int64_t rows = factors[0].layout.rows(), cols = factors[0].layout.cols();
  const int64_t slice_rows = std::max<int64_t>(1, kCombineSliceValues / cols);
  const uint64_t width = converted_byte_size(dtype, 1);
  merge::TaskSettings task = *plan.combine;
  task.stream = p.lora.front().module->name;
  merge::combine_task_slices(
      factors.size(), weights, static_cast<uint64_t>(rows * cols), task, 2, static_cast<size_t>(slice_rows * cols),
      [&](size_t i, uint64_t offset, size_t count, float* out) {
        merge::compute_delta_rows(factors[i].layout, std::span<const merge::LoraFactors>(&terms[i], 1),
                                  static_cast<int64_t>(offset) / cols, static_cast<int64_t>(count) / cols, out);
      },
      [&](uint64_t offset, const float* values, size_t count) {
        const int64_t slice = static_cast<int64_t>(count) / cols;
        const merge::DeltaLayout rows_layout{slice, cols, false};  // storage order, element by element
        merge::add_dense_delta(merge::WeightView{data + offset * width, dtype, slice, cols}, rows_layout, values, false,
                               merge::ExecOptions{1});
      });
}

// The adapters' changes of `p` combined on their deltas (MergePlan::combine), then added at once:
// W' = round(W + combine(w_i dW_i)), each dW_i module_delta's (PEFT's get_delta_weight layout, the
// layout DARE's masks are drawn in, as the delta-space combination draws them). Plain LoRA terms go
// slice by slice (apply_combined_lora); other methods' deltas are built whole.
void apply_combined(const MergePlan& plan, const PlannedTensor& p, const std::vector<uint64_t>& weight_shape,
                    DType dtype, uint8_t* data, unsigned threads) {
  const bool all_lora = std::all_of(p.lora.begin(), p.lora.end(), [](const LoraTerm& term) {
    return effect_of(term.module->method) == MethodEffect::lora && !term.dora && !term.expert &&
           (term.module->kind == LayerKind::linear || term.module->kind == LayerKind::conv1d);
  });
  if (all_lora) return apply_combined_lora(plan, p, weight_shape, dtype, data);
  std::vector<std::vector<float>> deltas;
  std::vector<const float*> tensors;
  std::vector<float> weights;
  merge::DeltaLayout layout;
  for (const LoraTerm& term : p.lora) {
    ModuleDelta d = module_delta(*term.adapter->adapter, *term.module, &plan.base, true);
    const merge::DeltaLayout mine{d.transposed ? d.cols : d.rows, d.transposed ? d.rows : d.cols, d.transposed};
    if (deltas.empty()) {
      layout = mine;
      if (static_cast<uint64_t>(mine.out * mine.in) != shape_elements(weight_shape, p.name))
        fail(PEFT_ERR_SHAPE_MISMATCH, "module " + peft::quoted(term.module->name) + " changes " +
                                          std::to_string(mine.out) + " x " + std::to_string(mine.in) +
                                          " values, tensor " + peft::quoted(p.name) + " has shape " + shape_text(weight_shape));
    } else if (mine.out != layout.out || mine.in != layout.in || mine.transposed != layout.transposed) {
      fail(PEFT_ERR_SHAPE_MISMATCH, "module " + peft::quoted(term.module->name) + " of an adapter changes a " +
                                        std::to_string(mine.out) + " x " + std::to_string(mine.in) +
                                        " weight, the earlier adapters a " + std::to_string(layout.out) + " x " +
                                        std::to_string(layout.in) + " one");
    }
    deltas.push_back(std::move(d.values));
    tensors.push_back(deltas.back().data());
    weights.push_back(static_cast<float>(term.adapter->weight));
  }
  merge::TaskSettings task = *plan.combine;
  task.stream = p.lora.front().module->name;
  std::vector<float> combined =
      merge::combine_task_tensors(tensors, weights, static_cast<size_t>(layout.out * layout.in), task, 2);
  if (layout.transposed) combined = transposed(combined, layout.in, layout.out);  // to [out, in]
  merge::ExecOptions exec;
  exec.threads = threads;
  merge::add_dense_delta(merge::WeightView{data, dtype, layout.rows(), layout.cols()}, layout, combined.data(), false, exec);
}

// The adapters' changes of `p` added to `data` (the weight of `weight_shape` in `dtype`): combined
// on their deltas when the plan says so, else one after the other.
void apply_adapters(const MergePlan& plan, const PlannedTensor& p, const std::vector<uint64_t>& weight_shape,
                    DType dtype, uint8_t* data, unsigned threads) {
  if (plan.combine) {
    apply_combined(plan, p, weight_shape, dtype, data, threads);
  } else {
    apply_lora(p, weight_shape, dtype, data, threads, plan.arithmetic);
  }
}

void apply_lora_bias(const PlannedTensor& p, uint8_t* data, uint64_t elements) {
  const merge::WeightView view{data, p.work_dtype, 1, static_cast<int64_t>(elements)};
  size_t ia3_terms = 0;
  for (const LoraTerm& term : p.lora_bias) ia3_terms += effect_of(term.module->method) == MethodEffect::scale ? 1 : 0;
  if (ia3_terms != 0 && ia3_terms != p.lora_bias.size())
    fail(PEFT_ERR_UNSUPPORTED, "bias " + peft::quoted(p.name) + ": an IA3 scale and a LoRA lora_B.bias on the same "
                                                                "bias in one merge are not supported");
  if (ia3_terms != 0) {
    for (const LoraTerm& term : p.lora_bias) {  // each IA3 adapter scales the bias in turn, as PEFT merges
      const std::vector<float> l = ia3_vector(load_method_params(*term.adapter->adapter, *term.module), term.coefficient);
      if (l.size() != elements)
        fail(PEFT_ERR_SHAPE_MISMATCH, "module " + peft::quoted(term.module->name) + ": ia3_l has " +
                                          std::to_string(l.size()) + " values, the bias " + peft::quoted(p.name) + " " +
                                          std::to_string(elements));
      merge::ia3_scale_bias(view, l.data(), false);
    }
    return;
  }
  std::vector<std::vector<float>> values;
  for (const LoraTerm& term : p.lora_bias) {
    const AdapterTensor* t = term.module->find(TensorRole::lora_b_bias);
    values.push_back(term.adapter->adapter->checkpoint().read_f32(t->index));
    if (values.back().size() != elements)
      fail(PEFT_ERR_SHAPE_MISMATCH, "tensor " + peft::quoted(t->key) + " has " + std::to_string(values.back().size()) +
                                        " values, the base bias " + peft::quoted(p.name) + " " + std::to_string(elements));
  }
  if (values.size() == 1) {
    merge::add_lora_bias(view, values[0].data(), p.lora_bias[0].coefficient);
    return;
  }
  // Several adapters: their f32 products summed first, so the bias is rounded once.
  std::vector<float> sum(elements, 0.0f);
  for (size_t i = 0; i < values.size(); ++i) {
    const float c = static_cast<float>(p.lora_bias[i].coefficient);
    for (uint64_t j = 0; j < elements; ++j) sum[j] += values[i][j] * c;
  }
  merge::add_lora_bias(view, sum.data(), 1.0);
}

void apply_token_rows(const PlannedTensor& p, uint8_t* data, uint64_t nbytes) {
  if (p.shape.size() != 2) fail(PEFT_ERR_SHAPE_MISMATCH, "trainable tokens need a 2-D embedding, " + peft::quoted(p.name));
  const uint64_t row_bytes = converted_byte_size(p.work_dtype, p.shape[1]);
  for (const TokenRows& rows : p.tokens) {
    const AdapterTensor* t = rows.module->find(TensorRole::trainable_tokens_delta);
    const Checkpoint& ckpt = rows.adapter->adapter->checkpoint();
    const TensorInfo& info = ckpt.tensor(t->index);
    if (info.shape.size() != 2 || info.shape[1] != p.shape[1] || info.shape[0] != rows.module->token_indices.size())
      fail(PEFT_ERR_SHAPE_MISMATCH, "tensor " + peft::quoted(t->key) + " does not fit the embedding " + peft::quoted(p.name));
    std::vector<uint8_t> values(converted_byte_size(p.work_dtype, info.shape[0] * info.shape[1]));
    ckpt.read(t->index, p.work_dtype, values.data(), values.size());
    for (size_t r = 0; r < rows.module->token_indices.size(); ++r) {
      const int64_t row = rows.module->token_indices[r];
      if (row < 0 || static_cast<uint64_t>(row) >= p.shape[0] || (static_cast<uint64_t>(row) + 1) * row_bytes > nbytes)
        fail(PEFT_ERR_SHAPE_MISMATCH, "trainable token " + std::to_string(row) + " is outside " + peft::quoted(p.name));
      std::memcpy(data + static_cast<uint64_t>(row) * row_bytes, values.data() + r * row_bytes, row_bytes);
    }
  }
}

// An FP8 block weight (or its scales): the weight in f32 (dequantized, or its replacement), its
// LoRA terms added, then either kept in f32 (an output dtype was asked for) or quantized again,
// giving the weight's bytes or its scales.
void compute_fp8(const MergePlan& plan, const PlannedTensor& p, unsigned threads, TensorBuffer& out) {
  const Fp8BlockSource& f = *p.fp8;
  const Checkpoint& base = *plan.base.weights;
  const uint64_t n = f.layout.elements();
  const bool requantize = p.work_dtype != DType::F32 || f.scale_output;
  std::vector<float> values;
  float* w = nullptr;
  if (requantize) {
    values.resize(n);
    w = values.data();
  } else {
    out.reserve(n * sizeof(float), "merging tensor " + peft::quoted(p.name));
    w = reinterpret_cast<float*>(out.data());
  }
  if (p.replacement) {
    p.replacement->adapter->adapter->checkpoint().read(p.replacement->tensor->index, DType::F32, w, n * sizeof(float));
  } else {
    std::vector<uint8_t> q(n);
    std::vector<float> scales(f.layout.scales());
    base.read_bytes(f.weight_index, 0, q.data(), n);
    base.read(f.scale_index, DType::F32, scales.data(), scales.size() * sizeof(float));
    fp8_block_dequantize(f.layout, q.data(), scales.data(), w);
  }
  if (!p.lora.empty())
    apply_adapters(plan, p, base.tensor(f.weight_index).shape, DType::F32, reinterpret_cast<uint8_t*>(w), threads);
  if (!requantize) return;
  const std::string& weight_name = base.tensor(f.weight_index).name;
  std::vector<uint8_t> q(n);
  std::vector<float> scales(f.layout.scales());
  fp8_block_quantize(f.layout, w, q.data(), scales.data(), "merged FP8 weight " + peft::quoted(weight_name));
  if (f.scale_output) {
    out.reserve(scales.size() * sizeof(float), "merging tensor " + peft::quoted(p.name));
    std::memcpy(out.data(), scales.data(), scales.size() * sizeof(float));
  } else {
    out.reserve(n, "merging tensor " + peft::quoted(p.name));
    std::memcpy(out.data(), q.data(), n);
  }
}

}  // namespace

void TensorBuffer::reserve(uint64_t nbytes, const std::string& what) {
  if (nbytes > capacity_ || !data_) {
    data_.reset();
    capacity_ = 0;
    uint8_t* fresh = nbytes <= SIZE_MAX ? new (std::nothrow) uint8_t[std::max<uint64_t>(nbytes, 1)] : nullptr;
    if (fresh == nullptr)
      fail(PEFT_ERR_OUT_OF_MEMORY, "cannot allocate " + std::to_string(nbytes) + " bytes for " + what);
    data_.reset(fresh);
    capacity_ = std::max<uint64_t>(nbytes, 1);
  }
  size_ = nbytes;
}

namespace {

// The first index i < elements for which element_is_bad(i) holds; `elements` when there is none.
// Scanned in blocks without a branch per element (an OR over the block, which the compiler
// vectorizes); only a block that holds a bad element is looked at again one element at a time.
template <class ElementIsBad>
uint64_t first_bad(uint64_t elements, ElementIsBad element_is_bad) {
  constexpr uint64_t kBlock = 4096;
  for (uint64_t start = 0; start < elements; start += kBlock) {
    const uint64_t end = std::min(elements, start + kBlock);
    unsigned any = 0;
    for (uint64_t i = start; i < end; ++i) any |= element_is_bad(i) ? 1u : 0u;
    if (any == 0) continue;
    for (uint64_t i = start; i < end; ++i)
      if (element_is_bad(i)) return i;
  }
  return elements;
}

}  // namespace

uint64_t first_nonfinite(DType work, DType stored, const uint8_t* data, uint64_t elements) {
  const auto all_exponent_bits = [&](auto bits_type, auto mask) {
    return first_bad(elements, [&](uint64_t i) {
      decltype(bits_type) v;
      std::memcpy(&v, data + sizeof v * i, sizeof v);
      return (v & mask) == mask;
    });
  };
  if (work == DType::BF16) return all_exponent_bits(uint16_t{}, uint16_t{0x7F80});
  if (work == DType::F16) return all_exponent_bits(uint16_t{}, uint16_t{0x7C00});
  if (work == DType::F64) return all_exponent_bits(uint64_t{}, uint64_t{0x7FF0000000000000});
  if (work != DType::F32) return elements;
  if (stored == DType::BF16 || stored == DType::F16) {  // finite in f32 may round to an infinity
    const auto value = [&](uint64_t i) {
      float v;
      std::memcpy(&v, data + 4 * i, 4);
      return v;
    };
    if (stored == DType::BF16) return first_bad(elements, [&](uint64_t i) { return (f32_to_bf16(value(i)) & 0x7F80u) == 0x7F80u; });
    return first_bad(elements, [&](uint64_t i) { return (f32_to_f16(value(i)) & 0x7C00u) == 0x7C00u; });
  }
  return all_exponent_bits(uint32_t{}, uint32_t{0x7F800000});
}

void require_finite_values(const std::string& name, const float* values, size_t count, unsigned threads) {
  // Pieces of 1 Mi values; the first bad value is the first of the first piece that has one.
  constexpr uint64_t kPiece = uint64_t{1} << 20;
  const auto pieces = static_cast<int64_t>((count + kPiece - 1) / kPiece);
  std::vector<uint64_t> first_bad_in(static_cast<size_t>(pieces), count);
  merge::parallel_tasks(pieces, merge::worker_count(threads, pieces), [&](int64_t piece, unsigned) {
    const uint64_t start = static_cast<uint64_t>(piece) * kPiece, n = std::min<uint64_t>(kPiece, count - start);
    const uint64_t at = first_nonfinite(DType::F32, DType::F32, reinterpret_cast<const uint8_t*>(values + start), n);
    if (at != n) first_bad_in[static_cast<size_t>(piece)] = start + at;
  });
  const uint64_t at = pieces == 0 ? count : *std::min_element(first_bad_in.begin(), first_bad_in.end());
  if (at == count) return;
  fail(PEFT_ERR_NON_FINITE, "merged tensor " + peft::quoted(name) + " holds an infinity or a NaN (element " +
                                std::to_string(at) + ") before it is quantized; nothing was written "
                                "(allow_nonfinite / --allow-nonfinite writes it anyway)");
}

void check_finite(const PlannedTensor& p, const TensorBuffer& buffer) {
  const uint64_t elements = buffer.size() / std::max<uint64_t>(1, dtype_bits(p.work_dtype) / 8);
  const uint64_t at = first_nonfinite(p.work_dtype, p.out_dtype, buffer.data(), elements);
  if (at == elements) return;
  fail(PEFT_ERR_NON_FINITE, "merged tensor " + peft::quoted(p.name) + " holds an infinity or a NaN in " +
                                std::string(dtype_name(p.out_dtype)) + " (element " + std::to_string(at) +
                                "): the adapter's scale or factors are too large for it; nothing was written "
                                "(allow_nonfinite / --allow-nonfinite writes it anyway)");
}

namespace {

// A bitsandbytes weight or state tensor: the weight dequantized and merged in f32, then written as
// it is (with an output dtype) or quantized again, this tensor taking its part.
void compute_bnb(const MergePlan& plan, const PlannedTensor& p, unsigned threads, TensorBuffer& out) {
  const BnbWeight& w = *p.bnb;
  const Checkpoint& base = *plan.base.weights;
  MergePlan::BnbParts& cache = plan.bnb_parts;
  if (!p.bnb_requantize || cache.weight != &w) {
    cache = {};
    std::vector<float> values = bnb_dequantize(base, w);
    if (!p.lora.empty()) apply_adapters(plan, p, w.shape, DType::F32, reinterpret_cast<uint8_t*>(values.data()), threads);
    if (!plan.allow_nonfinite) require_finite_values(p.name, values.data(), values.size(), threads);
    if (!p.bnb_requantize) {
      out.reserve(values.size() * 4, "merging tensor " + peft::quoted(p.name));
      std::memcpy(out.data(), values.data(), values.size() * 4);
      return;
    }
    cache.parts = bnb_quantize(base, w, values);
    cache.weight = &w;
  }
  const std::vector<uint8_t>& bytes = cache.parts.at(p.bnb_part);
  out.reserve(bytes.size(), "merging tensor " + peft::quoted(p.name));
  std::memcpy(out.data(), bytes.data(), bytes.size());
}

}  // namespace

void settle_bnb_sizes(MergePlan& plan, unsigned threads) {
  for (PlannedTensor& p : plan.tensors) {
    if (!p.bnb || !p.bnb_requantize || !p.bnb->nested || p.bnb_part != p.bnb->quant_state) continue;
    TensorBuffer buffer;
    compute_bnb(plan, p, threads, buffer);
    p.shape = {buffer.size()};
    p.out_nbytes = buffer.size();
  }
}

void compute_tensor(const MergePlan& plan, const PlannedTensor& p, unsigned threads, TensorBuffer& out) {
  if (p.bnb) {
    compute_bnb(plan, p, threads, out);
    return;
  }
  if (p.fp8) return compute_fp8(plan, p, threads, out);
  const uint64_t elements = shape_elements(p.shape, "tensor " + peft::quoted(p.name));  // checked when planned
  const uint64_t nbytes = converted_byte_size(p.work_dtype, elements);
  out.reserve(nbytes, "merging tensor " + peft::quoted(p.name));
  if (p.replacement) {
    p.replacement->adapter->adapter->checkpoint().read(p.replacement->tensor->index, p.work_dtype, out.data(), nbytes);
  } else {
    const Checkpoint& base = *plan.base.weights;
    base.read(p.base_index, p.work_dtype, out.data(), nbytes);
  }
  if (p.tokens_before_lora && !p.tokens.empty()) apply_token_rows(p, out.data(), nbytes);
  if (!p.lora.empty()) apply_adapters(plan, p, p.shape, p.work_dtype, out.data(), threads);
  if (!p.lora_bias.empty()) apply_lora_bias(p, out.data(), elements);
  if (!p.tokens_before_lora && !p.tokens.empty()) apply_token_rows(p, out.data(), nbytes);
}

}  // namespace peft
