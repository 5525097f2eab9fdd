// Plain LoRA: the delta itself, merging it into a weight and taking it out again, and lora_bias.
// No floating-point contraction here: PEFT rounds lora_B.bias * scaling to f32 before the add.
#include "core/no_fp_contract.hpp"  // first: before any inline arithmetic of the headers below

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "core/bf16.hpp"
#include "core/error.hpp"
#include "core/f16.hpp"
#include "peft/methods/lora_engine.hpp"
#include "peft/methods/lora_math.hpp"

namespace peft::merge {

using detail::PreparedTerms;

void compute_delta(const DeltaLayout& layout, std::span<const LoraFactors> terms, float* out,
                   const ExecOptions& exec) {
  const PreparedTerms p = detail::prepare(layout, terms, false);
  if (out == nullptr) fail(PEFT_ERR_INVALID_ARGUMENT, "compute_delta: output buffer is null");
  const kernels::Table& k = kernels::active();
  const int64_t block_rows = p.block_rows();
  const int64_t blocks = (p.rows + block_rows - 1) / block_rows;
  parallel_tasks(blocks, detail::threads_for(exec, p.rows, p.cols, blocks), [&](int64_t block, unsigned) {
    const int64_t row0 = block * block_rows;
    p.delta_rows(k, row0, std::min(block_rows, p.rows - row0), out + row0 * p.cols);
  });
}

void compute_delta_rows(const DeltaLayout& layout, std::span<const LoraFactors> terms, int64_t row0, int64_t rows,
                        float* out) {
  const PreparedTerms p = detail::prepare(layout, terms, false);
  if (out == nullptr) fail(PEFT_ERR_INVALID_ARGUMENT, "compute_delta_rows: output buffer is null");
  if (row0 < 0 || rows < 0 || row0 + rows > p.rows)
    fail(PEFT_ERR_INTERNAL, "compute_delta_rows: rows " + std::to_string(row0) + " + " + std::to_string(rows) +
                                " outside the delta's " + std::to_string(p.rows));
  const kernels::Table& k = kernels::active();
  const int64_t block_rows = p.block_rows();
  for (int64_t r = 0; r < rows; r += block_rows)
    p.delta_rows(k, row0 + r, std::min(block_rows, rows - r), out + r * p.cols);
}

std::vector<float> compute_delta(const DeltaLayout& layout, std::span<const LoraFactors> terms,
                                 const ExecOptions& exec) {
  detail::prepare(layout, terms, false);  // validate before allocating rows x cols
  std::vector<float> out(static_cast<size_t>(layout.rows() * layout.cols()));
  compute_delta(layout, terms, out.data(), exec);
  return out;
}

void detail::PreparedTerms::ggml_delta_rows(int64_t row0, int64_t count, float* out) const {
  // ggml_vec_dot_f32 without GGML_SIMD: `sumf += (ggml_float)(x[i]*y[i])`, then `*s = sumf`; then
  // ggml_vec_scale_f32 `y[i] *= v`. Each column keeps its own double sum in rank order; the loop over
  // columns is innermost only for speed (the order of each sum does not change).
  const Term& term = terms.at(0);
  std::vector<double> sum(static_cast<size_t>(cols));
  for (int64_t r = 0; r < count; ++r) {
    const float* l = term.L + (row0 + r) * term.rank;
    std::fill(sum.begin(), sum.end(), 0.0);
    for (int64_t k = 0; k < term.rank; ++k) {
      const float lk = l[k];
      const float* rk = term.R + k * cols;
      for (int64_t c = 0; c < cols; ++c) {
        const float product = lk * rk[c];
        sum[static_cast<size_t>(c)] += static_cast<double>(product);
      }
    }
    float* o = out + r * cols;
    for (int64_t c = 0; c < cols; ++c) o[c] = static_cast<float>(sum[static_cast<size_t>(c)]) * term.coef;
  }
}

namespace {

void apply_plain(const WeightView& weight, const DeltaLayout& layout, std::span<const LoraFactors> terms,
                 const ExecOptions& exec, bool negate) {
  const kernels::Storage s = detail::check_view(weight, layout.rows(), layout.cols(), "LoRA merge target");
  if (negate && exec.source != nullptr) fail(PEFT_ERR_INTERNAL, "an unmerge takes its rows from the weight itself");
  const kernels::Table& k = kernels::active();
  if (exec.arithmetic == Arithmetic::ggml && !negate) {
    // llama-export-lora adds each adapter's scaled delta in turn: cur = delta_i + cur. Every term is
    // checked before the first row changes.
    if (terms.empty()) detail::prepare(layout, terms, false);  // the error for no terms
    std::vector<PreparedTerms> each;
    for (const LoraFactors& term : terms) {
      each.push_back(detail::prepare(layout, {&term, 1}, false));
      each.back().ggml = true;
    }
    ExecOptions pass = exec;  // the first term's pass reads the rows from the source, the next ones from the weight
    for (const PreparedTerms& p : each) {
      detail::for_each_row(weight, s, p, pass, [&](int64_t, void* row, const void* from, const float* d) {
        if (k.add_rounded(s, row, from, d, p.cols) && exec.non_finite != nullptr) *exec.non_finite = true;
      });
      pass.source = nullptr;
    }
    return;
  }
  const PreparedTerms p = detail::prepare(layout, terms, negate);
  const int64_t cols = p.cols;
  detail::for_each_row(weight, s, p, exec, [&](int64_t, void* row, const void* from, const float* d) {
    if (k.add_rounded(s, row, from, d, cols) && exec.non_finite != nullptr) *exec.non_finite = true;
  });
}

float load_value(DType dtype, const unsigned char* p) {
  uint16_t h = 0;
  switch (dtype) {
    case DType::F32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case DType::BF16: std::memcpy(&h, p, 2); return bf16_to_f32(h);
    default: std::memcpy(&h, p, 2); return f16_to_f32(h);
  }
}

void store_value(DType dtype, unsigned char* p, float v) {
  uint16_t h = 0;
  switch (dtype) {
    case DType::F32: std::memcpy(p, &v, 4); return;
    case DType::BF16: h = f32_to_bf16(v); break;
    default: h = f32_to_f16(v); break;
  }
  std::memcpy(p, &h, 2);
}

}  // namespace

void add_delta(const WeightView& weight, const DeltaLayout& layout, std::span<const LoraFactors> terms,
               const ExecOptions& exec) {
  apply_plain(weight, layout, terms, exec, false);
}

void subtract_delta(const WeightView& weight, const DeltaLayout& layout, std::span<const LoraFactors> terms,
                    const ExecOptions& exec) {
  apply_plain(weight, layout, terms, exec, true);
}

void add_lora_bias(const WeightView& bias, const float* lora_b_bias, double coefficient, bool subtract,
                   const RowSink* row_sink) {
  const kernels::Storage s = detail::storage_of(bias.dtype, "LoRA bias target");
  if (bias.rows != 1 || bias.cols < 1)
    fail(PEFT_ERR_SHAPE_MISMATCH, "LoRA bias target must be 1 x out, got " + std::to_string(bias.rows) + " x " +
                                      std::to_string(bias.cols));
  if (bias.data == nullptr || lora_b_bias == nullptr)
    fail(PEFT_ERR_INVALID_ARGUMENT, "LoRA bias: bias or lora_B.bias is null");
  const size_t esize = kernels::storage_bytes(s);
  const size_t bytes = static_cast<size_t>(bias.cols) * esize;
  std::vector<unsigned char> work(bytes);
  auto* data = static_cast<unsigned char*>(bias.data);
  std::memcpy(work.data(), data, bytes);
  const float c = static_cast<float>(coefficient);
  for (int64_t j = 0; j < bias.cols; ++j) {
    unsigned char* p = work.data() + static_cast<size_t>(j) * esize;
    const float product = lora_b_bias[j] * c;  // lora_B.bias * scaling, an f32 tensor
    const float b = load_value(bias.dtype, p);
    store_value(bias.dtype, p, subtract ? b - product : b + product);
  }
  if (std::memcmp(work.data(), data, bytes) == 0) return;
  if (row_sink != nullptr) (*row_sink)(0, data, bytes);
  std::memcpy(data, work.data(), bytes);
}

const char* kernel_name() { return kernels::active().name; }

}  // namespace peft::merge
