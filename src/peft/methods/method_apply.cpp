// The two ways the non-LoRA methods change a weight (peft_methods.hpp): a dense delta added with one
// rounding, and IA3's per-feature scale; plus the matrix product their deltas share. No
// floating-point contraction: every product rounds as torch's does, fused only where written.
#include "core/no_fp_contract.hpp"  // first: before any inline arithmetic of the headers below

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/bf16.hpp"
#include "core/error.hpp"
#include "core/f16.hpp"
#include "peft/methods/peft_methods.hpp"

namespace peft::merge {

namespace {

size_t element_bytes(DType dtype) {
  if (dtype != DType::F32 && dtype != DType::BF16 && dtype != DType::F16)
    fail(PEFT_ERR_UNSUPPORTED, "merging into " + std::string(dtype_name(dtype)) +
                                   " is not supported (F32, BF16 and F16 are)");
  return dtype == DType::F32 ? 4 : 2;
}

float load(DType dtype, const unsigned char* p) {
  uint16_t h = 0;
  if (dtype == DType::F32) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  std::memcpy(&h, p, 2);
  return dtype == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
}

void store(DType dtype, unsigned char* p, float v) {
  if (dtype == DType::F32) {
    std::memcpy(p, &v, 4);
    return;
  }
  const uint16_t h = dtype == DType::BF16 ? f32_to_bf16(v) : f32_to_f16(v);
  std::memcpy(p, &h, 2);
}

void check_weight(const WeightView& weight, const DeltaLayout& layout, const char* what) {
  element_bytes(weight.dtype);
  if (weight.data == nullptr) fail(PEFT_ERR_INVALID_ARGUMENT, std::string(what) + ": weight buffer is null");
  if (weight.rows != layout.rows() || weight.cols != layout.cols())
    fail(PEFT_ERR_SHAPE_MISMATCH, std::string(what) + ": buffer is " + std::to_string(weight.rows) + " x " +
                                      std::to_string(weight.cols) + " but the layer is " +
                                      std::to_string(layout.rows()) + " x " + std::to_string(layout.cols()));
}

// Rewrites each row of the weight through op(row_index, values) on f32 values, one rounding per
// element, reporting the original bytes of changed rows to the sink.
template <class Op>
void rewrite_rows(const WeightView& weight, const ExecOptions& exec, Op&& op) {
  const size_t esize = element_bytes(weight.dtype);
  const size_t row_bytes = static_cast<size_t>(weight.cols) * esize;
  std::vector<unsigned char> work(row_bytes);
  std::vector<float> values(static_cast<size_t>(weight.cols));
  auto* base = static_cast<unsigned char*>(weight.data);
  for (int64_t r = 0; r < weight.rows; ++r) {
    unsigned char* row = base + static_cast<size_t>(r) * row_bytes;
    for (int64_t j = 0; j < weight.cols; ++j) values[static_cast<size_t>(j)] = load(weight.dtype, row + j * esize);
    op(r, values.data());
    for (int64_t j = 0; j < weight.cols; ++j) store(weight.dtype, work.data() + j * esize, values[static_cast<size_t>(j)]);
    if (std::memcmp(work.data(), row, row_bytes) == 0) continue;
    if (exec.row_sink != nullptr) (*exec.row_sink)(r, row, row_bytes);
    std::memcpy(row, work.data(), row_bytes);
  }
}

}  // namespace

std::vector<float> matmul_f32(const float* x, const float* y, int64_t m, int64_t k, int64_t n) {
  std::vector<float> out(static_cast<size_t>(m * n), 0.0f);
  for (int64_t i = 0; i < m; ++i) {
    float* o = out.data() + i * n;
    for (int64_t p = 0; p < k; ++p) {
      const float xv = x[i * k + p];
      const float* yr = y + p * n;
      if (p == 0) {
        for (int64_t j = 0; j < n; ++j) o[j] = xv * yr[j];
      } else {
        for (int64_t j = 0; j < n; ++j) o[j] = std::fma(xv, yr[j], o[j]);
      }
    }
  }
  return out;
}

void add_dense_delta(const WeightView& weight, const DeltaLayout& layout, const float* delta, bool subtract,
                     const ExecOptions& exec) {
  check_weight(weight, layout, "merge target");
  if (delta == nullptr) fail(PEFT_ERR_INVALID_ARGUMENT, "merge: the delta is null");
  const int64_t in = layout.in;
  const int64_t out = layout.out;
  rewrite_rows(weight, exec, [&](int64_t r, float* v) {
    for (int64_t j = 0; j < weight.cols; ++j) {
      // storage [out, in] or, transposed, [in, out]: element (r, j) is dW[j, r].
      const float d = layout.transposed ? delta[j * in + r] : delta[r * in + j];
      v[j] = subtract ? v[j] - d : v[j] + d;
    }
  });
  (void)out;
}

void ia3_scale(const WeightView& weight, const DeltaLayout& layout, const float* l, bool input_features, bool divide,
               const ExecOptions& exec) {
  check_weight(weight, layout, "IA3 merge target");
  if (l == nullptr) fail(PEFT_ERR_INVALID_ARGUMENT, "IA3 merge: ia3_l is null");
  // In storage, output features are rows ([out, in]) or columns (transposed, [in, out]).
  const bool per_row = input_features == layout.transposed;
  rewrite_rows(weight, exec, [&](int64_t r, float* v) {
    for (int64_t j = 0; j < weight.cols; ++j) {
      float s = l[per_row ? r : j];
      if (divide) s = s + 1e-8f;
      v[j] = divide ? v[j] / s : v[j] * s;
    }
  });
}

void ia3_scale_bias(const WeightView& bias, const float* l, bool divide, const RowSink* row_sink) {
  if (bias.rows != 1 || bias.cols < 1 || bias.data == nullptr || l == nullptr)
    fail(PEFT_ERR_INVALID_ARGUMENT, "IA3 bias merge: the bias must be a non-null 1 x out buffer");
  ExecOptions exec;
  exec.row_sink = row_sink;
  rewrite_rows(bias, exec, [&](int64_t, float* v) {
    for (int64_t j = 0; j < bias.cols; ++j) {
      float s = l[j];
      if (divide) s = s + 1e-8f;
      v[j] = divide ? v[j] / s : v[j] * s;
    }
  });
}

void replace_rows(const WeightView& weight, const float* values, std::span<const int64_t> rows,
                  const ExecOptions& exec) {
  element_bytes(weight.dtype);
  if (weight.data == nullptr || values == nullptr) fail(PEFT_ERR_INVALID_ARGUMENT, "replacement: a buffer is null");
  std::vector<int64_t> source(static_cast<size_t>(weight.rows), -1);  // weight row -> row of `values`
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] < 0 || rows[i] >= weight.rows)
      fail(PEFT_ERR_INVALID_ARGUMENT, "replacement: row " + std::to_string(rows[i]) + " is outside the weight's " +
                                          std::to_string(weight.rows) + " rows");
    source[static_cast<size_t>(rows[i])] = static_cast<int64_t>(i);  // index_copy_: the last one wins
  }
  if (rows.empty())
    for (int64_t r = 0; r < weight.rows; ++r) source[static_cast<size_t>(r)] = r;
  rewrite_rows(weight, exec, [&](int64_t r, float* v) {
    const int64_t from = source[static_cast<size_t>(r)];
    if (from < 0) return;
    std::memcpy(v, values + from * weight.cols, static_cast<size_t>(weight.cols) * sizeof(float));
  });
}

}  // namespace peft::merge
