// BufferMerge: lora_math applied to a host's buffers, with an exact or arithmetic way back.
#include "peft/buffer_merge/buffer_merge.hpp"

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <new>
#include <string>

#include "core/error.hpp"
#include "core/text.hpp"
#include "peft/adapter/adapter_config.hpp"
#include "peft/methods/peft_methods.hpp"

namespace peft {

namespace {

size_t element_bytes(DType dtype) { return dtype == DType::F32 ? 4 : 2; }

void check_dtype(DType dtype, const char* what) {
  if (dtype != DType::F32 && dtype != DType::BF16 && dtype != DType::F16)
    fail(PEFT_ERR_UNSUPPORTED, std::string(what) + ": buffer merge into " + std::string(dtype_name(dtype)) +
                                   " is not supported (F32, BF16 and F16 are)");
}

void check_view(const merge::WeightView& view, int64_t rows, int64_t cols, const char* what) {
  check_dtype(view.dtype, what);
  if (view.rows != rows || view.cols != cols)
    fail(PEFT_ERR_SHAPE_MISMATCH, std::string(what) + " is " + std::to_string(view.rows) + " x " +
                                      std::to_string(view.cols) + ", expected " + std::to_string(rows) + " x " +
                                      std::to_string(cols));
  if (view.data == nullptr) fail(PEFT_ERR_INVALID_ARGUMENT, std::string(what) + " is null");
}

// A fast 64-bit hash of a row's bytes; it only has to notice accidental changes. Four independent
// lanes over 32-byte steps keep the multiplier busy: 4.0 GB/s on 8 KiB rows here, against 2.6 GB/s
// for one chained lane, whose hashing was a large part of an exact hot-swap.
uint64_t hash_bytes(const unsigned char* p, size_t n) {
  constexpr uint64_t kMul = 0x9E3779B97F4A7C15ull;
  uint64_t lane[4] = {0x243F6A8885A308D3ull ^ n, 0x13198A2E03707344ull, 0xA4093822299F31D0ull, 0x082EFA98EC4E6C89ull};
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (int k = 0; k < 4; ++k) {
      uint64_t w;
      std::memcpy(&w, p + i + 8 * k, 8);
      lane[k] = (lane[k] ^ w) * kMul;
      lane[k] ^= lane[k] >> 29;
    }
  }
  uint64_t h = lane[0];
  for (int k = 1; k < 4; ++k) h = ((h ^ lane[k]) * kMul) ^ (h >> 31);
  for (; i < n; ++i) {
    h = (h ^ p[i]) * 0x100000001B3ull;
    h ^= h >> 29;
  }
  return h;
}

template <class T>
void reserve_or_fail(std::vector<T>& v, size_t count, const char* what) {
  try {
    v.reserve(count);
  } catch (const std::bad_alloc&) {
    fail(PEFT_ERR_OUT_OF_MEMORY, std::string("buffer merge: cannot allocate ") + std::to_string(count * sizeof(T)) +
                                     " bytes to keep " + what);
  } catch (const std::length_error&) {
    fail(PEFT_ERR_OUT_OF_MEMORY, std::string("buffer merge: too many bytes to keep ") + what);
  }
}

merge::LoraFactors factors_of(const BufferMergeModule& m, double coefficient) {
  return merge::LoraFactors{m.lora_a, m.lora_b, m.rank, coefficient};
}

double largest_finite(DType dtype) {
  switch (dtype) {
    case DType::BF16: return 0x1.FEp127;
    case DType::F16: return 65504.0;
    default: return FLT_MAX;
  }
}

}  // namespace

namespace {

// 2 |coefficient| x max_i sum_k |B_ik| x max |A|: a bound on every |delta| of the merge, as computed
// in f32 (the factor 2 covers the rounding of the product and the sum). Infinity when a factor is
// not finite or missing, NaN for a NaN coefficient.
double lora_delta_bound(const BufferMergeModule& module, double coefficient) {
  if (module.lora_a == nullptr || module.lora_b == nullptr || module.rank < 1)
    return std::numeric_limits<double>::infinity();
  const merge::DeltaLayout& layout = module.layout;
  double a_most = 0.0, b_row_most = 0.0;  // max |A|, max over B's rows of sum |B_ik|
  bool factors_finite = true;
  for (int64_t i = 0; i < module.rank * layout.in; ++i) {
    factors_finite = factors_finite && std::isfinite(module.lora_a[i]);
    a_most = std::max(a_most, std::fabs(double{module.lora_a[i]}));
  }
  for (int64_t row = 0; row < layout.out; ++row) {
    double sum = 0.0;
    for (int64_t k = 0; k < module.rank; ++k) {
      factors_finite = factors_finite && std::isfinite(module.lora_b[row * module.rank + k]);
      sum += std::fabs(double{module.lora_b[row * module.rank + k]});
    }
    b_row_most = std::max(b_row_most, sum);
  }
  if (!factors_finite) return std::numeric_limits<double>::infinity();
  return 2 * std::fabs(coefficient) * b_row_most * a_most;
}

// Whether a weight whose |w| are at most `largest` stays finite with deltas of at most `delta`:
// every |w| under half the dtype's largest finite value less the delta bound. False for NaNs.
bool stays_finite(DType dtype, double largest, double delta) {
  const double room = largest_finite(dtype) / 2 - delta;
  return room > 0.0 && largest <= room;
}

// A bound of |w| once deltas of at most `delta` are added to (or taken from) values of at most
// `largest`, in f32 and then rounded to the weight's dtype: the relative factor covers the rounding
// of the f32 sum (2^-24) and then to bf16 (2^-8) or f16 (2^-11), twice over; 2^-24 the absolute
// rounding of a subnormal. (The bound grows with each merge and removal: a host model's bound on a
// bf16 weight of magnitude 1 takes thousands of swaps to leave no room, and then apply reads the
// weight again.)
double grown_magnitude(DType dtype, double largest, double delta) {
  const double rounding = dtype == DType::BF16 ? 0x1p-7 : dtype == DType::F16 ? 0x1p-10 : 0x1p-22;
  return (largest + delta) * (1.0 + rounding) + 0x1p-24;
}

// A bound of |w| over `weight` that shows deltas of at most `delta` keep it finite: `known` when it
// shows it (a caller's bound), else the weight's largest magnitude, read; NaN when neither does (a
// NaN delta bound, from a NaN coefficient, and an infinite one leave no room).
double finite_proof(const merge::WeightView& weight, double delta, double known, unsigned threads) {
  if (!stays_finite(weight.dtype, 0.0, delta)) return std::numeric_limits<double>::quiet_NaN();
  if (stays_finite(weight.dtype, known, delta)) return known;
  const double largest = merge::largest_magnitude(weight, threads);
  return stays_finite(weight.dtype, largest, delta) ? largest : std::numeric_limits<double>::quiet_NaN();
}

}  // namespace

bool lora_merge_stays_finite(const merge::WeightView& weight, const BufferMergeModule& module, double coefficient,
                             unsigned threads) {
  return !std::isnan(finite_proof(weight, lora_delta_bound(module, coefficient),
                                  std::numeric_limits<double>::quiet_NaN(), threads));
}

double BufferMerge::largest_magnitude_after_remove(double before) const {
  return std::isnan(largest_after_) ? std::numeric_limits<double>::quiet_NaN()
                                    : grown_magnitude(dtype_, before, delta_bound_);
}

size_t BufferMerge::row_bytes() const {
  return static_cast<size_t>(module_.layout.cols()) * element_bytes(dtype_);
}

BufferMerge::Saving::Saving(BufferMerge& record, const BufferMergeOptions& options, bool changes_bias,
                            bool cannot_fail) {
  exec.threads = options.threads;
  if (options.refuse_non_finite) exec.non_finite = &non_finite;
  if (!record.keep_rows_ && (!options.refuse_non_finite || options.caller_restores || cannot_fail)) return;
  // Everything the sinks may need is allocated now, so the merge itself cannot fail halfway.
  const size_t rows = static_cast<size_t>(record.module_.layout.rows());
  reserve_or_fail(record.saved_row_index_, rows, "row indices");
  reserve_or_fail(record.saved_bytes_, rows * record.row_bytes(), "the original rows");
  reserve_or_fail(record.merged_row_hash_, rows, "row hashes");
  if (changes_bias)
    reserve_or_fail(record.saved_bias_, static_cast<size_t>(record.module_.layout.out) * 4, "the original bias");
  rows_sink = [&record](int64_t row, const void* bytes, size_t count) {
    record.saved_row_index_.push_back(row);
    const auto* p = static_cast<const unsigned char*>(bytes);
    record.saved_bytes_.insert(record.saved_bytes_.end(), p, p + count);
  };
  bias_sink = [&record](int64_t, const void* bytes, size_t count) {
    const auto* p = static_cast<const unsigned char*>(bytes);
    record.saved_bias_.assign(p, p + count);
  };
  exec.row_sink = &rows_sink;
}

bool merges_from_source(const BufferMergeModule& module) {
  return !module.method_params && module.slices.empty() && module.magnitude == nullptr && module.lora_bias == nullptr;
}

BufferMerge BufferMerge::apply(const merge::WeightView& weight, const merge::WeightView* bias,
                               const BufferMergeModule& module, const BufferMergeOptions& options) {
  const merge::DeltaLayout& layout = module.layout;
  if (options.source != nullptr && (!merges_from_source(module) || !options.caller_restores || options.keep_original_rows))
    fail(PEFT_ERR_INVALID_ARGUMENT, "buffer merge: only a plain LoRA module without a lora_B.bias, whose caller "
                                    "restores the weight, merges from a source buffer");
  if (layout.out < 1 || layout.in < 1) fail(PEFT_ERR_INVALID_ARGUMENT, "buffer merge: module layout is empty");
  check_view(weight, layout.rows(), layout.cols(), "buffer merge: weight");
  if (options.arithmetic == merge::Arithmetic::ggml && (module.method_params || module.magnitude != nullptr))
    fail(PEFT_ERR_UNSUPPORTED, std::string("buffer merge: the ggml arithmetic is defined for plain LoRA only, not ") +
                                   (module.magnitude != nullptr ? "DoRA"
                                    : module.method_module ? peft_method_name(module.method_module->method)
                                                           : "another PEFT method"));
  if (module.method_params) return apply_method(weight, bias, module, options);
  if (!module.slices.empty()) return apply_slices(weight, module, options);
  if (module.lora_a == nullptr || module.lora_b == nullptr || module.rank < 1)
    fail(PEFT_ERR_INVALID_ARGUMENT, "buffer merge: module has no lora_A/lora_B factors");
  const bool with_bias = module.lora_bias != nullptr;
  if (with_bias) {
    if (bias == nullptr)
      fail(PEFT_ERR_INVALID_ARGUMENT, "buffer merge: the module has a lora_B bias but no bias buffer was given");
    check_view(*bias, 1, layout.out, "buffer merge: bias");
  }

  BufferMerge record;
  record.module_ = module;
  record.coefficient_ = merge::lora_coefficient(options.weight, module.scaling, "buffer merge");
  record.threads_ = options.threads;
  record.keep_rows_ = options.keep_original_rows;
  record.dtype_ = weight.dtype;
  record.bias_dtype_ = with_bias ? bias->dtype : DType::F32;

  // A plain LoRA merge in PEFT's arithmetic that cannot overflow saves no rows for its refusal. (Not
  // DoRA, which rescales rows, nor ggml's arithmetic, which rounds through F16.)
  // The weight's largest magnitude is read only when the caller knows no bound of it that shows the
  // merge cannot fail.
  bool cannot_fail = false;
  if (options.refuse_non_finite && !options.caller_restores && !record.keep_rows_ && module.magnitude == nullptr &&
      !with_bias && options.arithmetic == merge::Arithmetic::peft) {
    const double delta = lora_delta_bound(module, record.coefficient_);
    const double largest = finite_proof(weight, delta, options.largest_magnitude, options.threads);
    cannot_fail = !std::isnan(largest);
    if (cannot_fail) {
      record.delta_bound_ = delta;
      record.largest_after_ = grown_magnitude(weight.dtype, largest, delta);
    }
  }
  Saving saving(record, options, with_bias, cannot_fail);
  saving.exec.arithmetic = options.arithmetic;
  saving.exec.source = options.source;
  const merge::LoraFactors term = factors_of(module, record.coefficient_);
  if (module.magnitude != nullptr)
    record.dora_norm_ = merge::dora_merge(weight, layout, {&term, 1}, module.magnitude, nullptr, saving.exec);
  else
    merge::add_delta(weight, layout, {&term, 1}, saving.exec);
  if (cannot_fail && saving.non_finite)
    fail(PEFT_ERR_INTERNAL, "buffer merge: layer " + peft::quoted(options.layer) +
                                " holds an infinity or a NaN although its bound ruled them out; it stays merged");
  if (with_bias)
    merge::add_lora_bias(*bias, module.lora_bias, record.coefficient_, false, saving.bias_sink_or_null());
  record.finish(saving.non_finite, weight, with_bias ? bias : nullptr, options);
  return record;
}

namespace {

// Rows first_row .. of `weight` as a weight of their own.
merge::WeightView sub_view(const merge::WeightView& weight, int64_t first_row, int64_t rows) {
  auto* base = static_cast<unsigned char*>(weight.data);
  const size_t offset = static_cast<size_t>(first_row) * static_cast<size_t>(weight.cols) * element_bytes(weight.dtype);
  return {base + offset, weight.dtype, rows, weight.cols};
}

}  // namespace

// Each slice merged by its own BufferMerge. Checked before any byte changes; when a slice refuses
// non-finite values the slices merged before it are taken out again, exactly (they keep their rows
// then).
BufferMerge BufferMerge::apply_slices(const merge::WeightView& weight, const BufferMergeModule& module,
                                      const BufferMergeOptions& options) {
  for (const BufferMergeSlice& slice : module.slices) {
    if (!slice.module || !slice.module->slices.empty())
      fail(PEFT_ERR_INTERNAL, "buffer merge: a slice without its own module");
    const merge::DeltaLayout& layout = slice.module->layout;
    if (slice.first_row < 0 || layout.cols() != weight.cols || slice.first_row + layout.rows() > weight.rows)
      fail(PEFT_ERR_SHAPE_MISMATCH, "buffer merge: a slice of " + std::to_string(layout.rows()) + " x " +
                                        std::to_string(layout.cols()) + " at row " + std::to_string(slice.first_row) +
                                        " does not fit the weight of " + std::to_string(weight.rows) + " x " +
                                        std::to_string(weight.cols));
  }
  BufferMerge record;
  record.module_ = module;
  record.threads_ = options.threads;
  record.keep_rows_ = options.keep_original_rows;
  record.dtype_ = weight.dtype;
  BufferMergeOptions each = options;
  each.keep_original_rows = options.keep_original_rows || (options.refuse_non_finite && !options.caller_restores);
  for (const BufferMergeSlice& slice : module.slices) {
    const merge::WeightView view = sub_view(weight, slice.first_row, slice.module->layout.rows());
    try {
      record.slice_merges_.push_back(apply(view, nullptr, *slice.module, each));
    } catch (...) {
      for (size_t k = record.slice_merges_.size(); k-- > 0;) {
        const BufferMergeSlice& done = module.slices[k];
        record.slice_merges_[k].remove(sub_view(weight, done.first_row, done.module->layout.rows()), nullptr);
      }
      throw;
    }
  }
  record.active_ = true;
  return record;
}

int64_t BufferMerge::saved_rows() const {
  int64_t rows = static_cast<int64_t>(saved_row_index_.size());
  for (const BufferMerge& slice : slice_merges_) rows += slice.keeps_original_rows() ? slice.saved_rows() : 0;
  return rows;
}

size_t BufferMerge::saved_bytes() const {
  size_t bytes = saved_bytes_.size() + saved_bias_.size();
  for (const BufferMerge& slice : slice_merges_) bytes += slice.saved_bytes();
  return bytes;
}

void BufferMerge::finish(bool non_finite, const merge::WeightView& weight, const merge::WeightView* bias,
                         const BufferMergeOptions& options) {
  const size_t row_bytes = this->row_bytes();
  auto* base = static_cast<unsigned char*>(weight.data);
  if (options.refuse_non_finite && (non_finite || (bias != nullptr && merge::holds_non_finite(*bias)))) {
    for (size_t i = 0; i < saved_row_index_.size(); ++i)
      std::memcpy(base + static_cast<size_t>(saved_row_index_[i]) * row_bytes, saved_bytes_.data() + i * row_bytes,
                  row_bytes);
    if (!saved_bias_.empty()) std::memcpy(bias->data, saved_bias_.data(), saved_bias_.size());
    // (With caller_restores nothing was saved: the caller puts the buffers back.)
    fail(PEFT_ERR_NON_FINITE, "buffer merge: layer " + peft::quoted(options.layer) +
                                  " would hold an infinity or a NaN after the merge; its buffers are unchanged");
  }
  if (!keep_rows_) {
    saved_row_index_ = {};
    saved_bytes_ = {};
    merged_row_hash_ = {};
    saved_bias_ = {};
    active_ = true;
    return;
  }
  if (!saved_bias_.empty())
    merged_bias_hash_ = hash_bytes(static_cast<const unsigned char*>(bias->data), saved_bias_.size());
  for (int64_t row : saved_row_index_)
    merged_row_hash_.push_back(hash_bytes(base + static_cast<size_t>(row) * row_bytes, row_bytes));
  // Give back the reservation when few rows changed.
  if (saved_bytes_.size() < saved_bytes_.capacity() / 2) {
    try {
      saved_bytes_.shrink_to_fit();
      saved_row_index_.shrink_to_fit();
      merged_row_hash_.shrink_to_fit();
    } catch (const std::bad_alloc&) {
      // keeping the larger buffers is fine
    }
  }
  active_ = true;
}

// The record's changes for another method, computed from its parameters and the merge weight.
struct BufferMerge::MethodChange {
  std::vector<float> delta;  // additive methods: dW [out, in], PyTorch order
  std::vector<float> scale;  // IA3: ia3_l x weight
  merge::InputTransform transform;  // OFT, BOFT, HRA: the rotation (and BOFT's boft_s)
  bool scales_bias = false;  // IA3 on a layer that is not feed-forward, with a bias buffer
  // Replacements (full and trainable_tokens modules, layer_module.cpp's replacement_module: their
  // values under "weight" and "bias"): rows of the weight, and the bias, overwritten.
  bool replaces = false;
  std::vector<int64_t> rows;  // the rows replaced (trainable tokens); empty: the whole weight
  std::vector<float> bias;    // the bias replacement [layout.out], or empty
};


BufferMerge BufferMerge::apply_method(const merge::WeightView& weight, const merge::WeightView* bias,
                                      const BufferMergeModule& module, const BufferMergeOptions& options) {
  const AdapterModule& m = *module.method_module;
  const merge::DeltaLayout& layout = module.layout;
  auto change = std::make_shared<MethodChange>();
  const bool ia3 = effect_of(m.method) == MethodEffect::scale;
  const merge::MethodTensor* replacement = nullptr;
  if (!m.is_lora()) {
    // A replacement: PEFT defines no weight for it, and removal always restores the saved rows
    // (PEFT's unmerge restores its saved originals too).
    if (options.weight != 1.0)
      fail(PEFT_ERR_UNSUPPORTED, "buffer merge: module " + peft::quoted(m.name) + " replaces tensors (" +
                                     layer_kind_name(m.kind) + "); PEFT defines no merge weight for it, only 1 is "
                                     "supported");
    change->replaces = true;
    replacement = module.method_params->get("weight");
    if (replacement == nullptr) fail(PEFT_ERR_INTERNAL, "module " + peft::quoted(m.name) + " lost its replacement");
    change->rows = m.kind == LayerKind::trainable_tokens ? m.token_indices : std::vector<int64_t>{};
    if (const merge::MethodTensor* b = module.method_params->get("bias")) {
      if (bias == nullptr)
        fail(PEFT_ERR_INVALID_ARGUMENT, "buffer merge: module " + peft::quoted(m.name) +
                                            " replaces the bias too: pass the bias buffer");
      check_view(*bias, 1, layout.out, "buffer merge: bias");
      change->bias = b->values;
      change->scales_bias = true;  // the bias buffer is changed (kept and checked like IA3's)
    }
  } else if (ia3) {
    change->scale = ia3_vector(*module.method_params, options.weight);
    const int64_t want = m.settings.ia3_feedforward ? layout.in : layout.out;
    if (static_cast<int64_t>(change->scale.size()) != want)
      fail(PEFT_ERR_SHAPE_MISMATCH, "buffer merge: module " + peft::quoted(m.name) + ": ia3_l has " +
                                        std::to_string(change->scale.size()) + " values, the layer " +
                                        std::to_string(want) + " features");
    change->scales_bias = !m.settings.ia3_feedforward && bias != nullptr;
    if (change->scales_bias) check_view(*bias, 1, layout.out, "buffer merge: bias");
  } else if (is_rotation(m.method)) {
    change->transform = method_transform(m, *module.method_params, options.weight, layout, false);
  } else {
    const double coefficient = merge::lora_coefficient(options.weight, module.scaling, "buffer merge");
    const std::vector<float> current = method_reads_weight(m) ? merge::weight_f32(weight, layout) : std::vector<float>{};
    change->delta = method_delta(m, *module.method_params, coefficient, layout, current.empty() ? nullptr : current.data());
  }
  BufferMerge record;
  record.module_ = module;
  record.method_ = change;
  record.threads_ = options.threads;
  record.keep_rows_ = options.keep_original_rows || change->replaces;
  record.dtype_ = weight.dtype;
  record.bias_dtype_ = change->scales_bias ? bias->dtype : DType::F32;
  Saving saving(record, options, change->scales_bias);
  const merge::ExecOptions& exec = saving.exec;
  if (change->replaces)
    merge::replace_rows(weight, replacement->values.data(), change->rows, exec);
  else if (ia3)
    merge::ia3_scale(weight, layout, change->scale.data(), m.settings.ia3_feedforward, false, exec);
  else if (is_rotation(m.method))
    merge::transform_input(weight, layout, change->transform, exec);
  else
    merge::add_dense_delta(weight, layout, change->delta.data(), false, exec);
  if (change->scales_bias) {
    if (change->replaces) {
      merge::ExecOptions bias_exec;
      bias_exec.row_sink = &saving.bias_sink;
      merge::replace_rows(*bias, change->bias.data(), {}, bias_exec);
    } else {
      merge::ia3_scale_bias(*bias, change->scale.data(), false, saving.bias_sink_or_null());
    }
  }
  record.finish(saving.non_finite, weight, change->scales_bias ? bias : nullptr, options);
  return record;
}

void BufferMerge::check_same_buffers(const merge::WeightView& weight, const merge::WeightView* bias) const {
  if (!active_) fail(PEFT_ERR_INVALID_ARGUMENT, "buffer unmerge: the record holds no merge (already removed?)");
  if (weight.dtype != dtype_)
    fail(PEFT_ERR_SHAPE_MISMATCH, "buffer unmerge: weight is " + std::string(dtype_name(weight.dtype)) +
                                      " but was merged as " + std::string(dtype_name(dtype_)));
  check_view(weight, module_.layout.rows(), module_.layout.cols(), "buffer unmerge: weight");
  if (module_.lora_bias != nullptr || (method_ && method_->scales_bias)) {
    if (bias == nullptr) fail(PEFT_ERR_INVALID_ARGUMENT, "buffer unmerge: the merge changed a bias; pass it");
    if (bias->dtype != bias_dtype_)
      fail(PEFT_ERR_SHAPE_MISMATCH, "buffer unmerge: bias is " + std::string(dtype_name(bias->dtype)) +
                                        " but was merged as " + std::string(dtype_name(bias_dtype_)));
    check_view(*bias, 1, module_.layout.out, "buffer unmerge: bias");
  }
}

void BufferMerge::check_unchanged_rows(const merge::WeightView& weight, const merge::WeightView* bias) const {
  const size_t row_bytes = this->row_bytes();
  const auto* base = static_cast<const unsigned char*>(weight.data);
  for (size_t i = 0; i < saved_row_index_.size(); ++i) {
    const unsigned char* row = base + static_cast<size_t>(saved_row_index_[i]) * row_bytes;
    if (hash_bytes(row, row_bytes) != merged_row_hash_[i])
      fail(PEFT_ERR_INVALID_ARGUMENT, "buffer unmerge: row " + std::to_string(saved_row_index_[i]) +
                                          " of the weight changed after this merge (remove later merges first)");
  }
  if (!saved_bias_.empty() &&
      hash_bytes(static_cast<const unsigned char*>(bias->data), saved_bias_.size()) != merged_bias_hash_)
    fail(PEFT_ERR_INVALID_ARGUMENT, "buffer unmerge: the bias changed after this merge (remove later merges first)");
}

void BufferMerge::remove(const merge::WeightView& weight, const merge::WeightView* bias) {
  check_same_buffers(weight, bias);
  const merge::DeltaLayout& layout = module_.layout;
  if (!slice_merges_.empty()) {  // the slices in reverse order; all checked first when rows were kept
    std::vector<merge::WeightView> views;
    for (const BufferMergeSlice& slice : module_.slices)
      views.push_back(sub_view(weight, slice.first_row, slice.module->layout.rows()));
    for (size_t k = 0; k < slice_merges_.size(); ++k)
      if (slice_merges_[k].keeps_original_rows()) slice_merges_[k].check_unchanged_rows(views[k], nullptr);
    for (size_t k = slice_merges_.size(); k-- > 0;) slice_merges_[k].remove(views[k], nullptr);
  } else if (keep_rows_) {
    check_unchanged_rows(weight, bias);
    const size_t row_bytes = this->row_bytes();
    auto* base = static_cast<unsigned char*>(weight.data);
    for (size_t i = 0; i < saved_row_index_.size(); ++i)
      std::memcpy(base + static_cast<size_t>(saved_row_index_[i]) * row_bytes, saved_bytes_.data() + i * row_bytes,
                  row_bytes);
    if (!saved_bias_.empty()) std::memcpy(bias->data, saved_bias_.data(), saved_bias_.size());
  } else if (method_) {
    // PEFT's arithmetic unmerge: subtract the delta, or divide by (ia3_l + 1e-8), or apply the
    // inverse rotation (OFT inverts R, BOFT transposes and divides, HRA reflects in reverse): none
    // of the multiplicative ones is exact.
    merge::ExecOptions exec;
    exec.threads = threads_;
    const AdapterModule& m = *module_.method_module;
    if (effect_of(m.method) == MethodEffect::scale) {
      merge::ia3_scale(weight, layout, method_->scale.data(), m.settings.ia3_feedforward, true, exec);
      if (method_->scales_bias) merge::ia3_scale_bias(*bias, method_->scale.data(), true);
    } else if (is_rotation(m.method)) {
      merge::transform_input(weight, layout, method_transform(m, *module_.method_params, 1.0, layout, true), exec);
    } else {
      merge::add_dense_delta(weight, layout, method_->delta.data(), true, exec);
    }
  } else {
    merge::ExecOptions exec;
    exec.threads = threads_;
    const merge::LoraFactors term = factors_of(module_, coefficient_);
    if (module_.magnitude != nullptr)
      merge::dora_unmerge(weight, layout, {&term, 1}, module_.magnitude, dora_norm_.data(), exec);
    else
      merge::subtract_delta(weight, layout, {&term, 1}, exec);
    if (module_.lora_bias != nullptr) merge::add_lora_bias(*bias, module_.lora_bias, coefficient_, true);
  }
  *this = BufferMerge();
}

}  // namespace peft
