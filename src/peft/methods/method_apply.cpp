// The two ways the non-LoRA methods change a weight (peft_methods.hpp): a dense delta added with one
// rounding, and IA3's per-feature scale; plus the matrix product their deltas share. No
// floating-point contraction: every product rounds as torch's does, fused only where written.
#include "core/no_fp_contract.hpp"  // first: before any inline arithmetic of the headers below

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string_view>
#include <utility>
#include <string>
#include <vector>

#include "core/bf16.hpp"
#include "core/error.hpp"
#include "core/f16.hpp"
#include "core/text.hpp"
#include "peft/kernels/merge_parallel.hpp"
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

// Whether the value stored at p is finite (its exponent bits are not all ones).
bool finite_stored(DType dtype, const unsigned char* p) {
  if (dtype == DType::F32) {
    uint32_t u;
    std::memcpy(&u, p, 4);
    return (u & 0x7F800000u) != 0x7F800000u;
  }
  uint16_t h;
  std::memcpy(&h, p, 2);
  const uint16_t exponent = dtype == DType::BF16 ? 0x7F80 : 0x7C00;
  return (h & exponent) != exponent;
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
    bool bad = false;
    for (int64_t j = 0; j < weight.cols; ++j) {
      unsigned char* p = work.data() + j * esize;
      store(weight.dtype, p, values[static_cast<size_t>(j)]);
      bad |= !finite_stored(weight.dtype, p);
    }
    if (bad && exec.non_finite != nullptr) *exec.non_finite = true;
    if (std::memcmp(work.data(), row, row_bytes) == 0) continue;
    if (exec.row_sink != nullptr) (*exec.row_sink)(r, row, row_bytes);
    std::memcpy(row, work.data(), row_bytes);
  }
}

}  // namespace

namespace {

// The largest magnitude bits of count values from p, as largest_magnitude describes.
template <class Bits, Bits kMagnitude>
Bits largest_bits(const Bits* p, size_t count) {
  Bits most = 0;
  for (size_t i = 0; i < count; ++i) most = std::max<Bits>(most, p[i] & kMagnitude);
  return most;
}

}  // namespace

double largest_magnitude(const ConstWeightView& view, unsigned threads) {
  const auto count = static_cast<size_t>(view.rows * view.cols);
  const size_t esize = view.dtype == DType::F32 ? 4 : 2;
  // 4 MiB pieces over the threads (one thread does not reach the memory's bandwidth); the largest
  // of the pieces' results is the same whichever thread took which piece.
  const size_t piece = (size_t{4} << 20) / esize;
  const auto pieces = static_cast<int64_t>((count + piece - 1) / piece);
  std::vector<uint32_t> most(static_cast<size_t>(std::max<int64_t>(pieces, 1)), 0);
  parallel_tasks(pieces, worker_count(threads, pieces), [&](int64_t i, unsigned) {
    const size_t begin = static_cast<size_t>(i) * piece, n = std::min(piece, count - begin);
    most[static_cast<size_t>(i)] =
        esize == 4 ? largest_bits<uint32_t, 0x7FFFFFFFu>(static_cast<const uint32_t*>(view.data) + begin, n)
                   : largest_bits<uint16_t, 0x7FFFu>(static_cast<const uint16_t*>(view.data) + begin, n);
  });
  const uint32_t bits = *std::max_element(most.begin(), most.end());
  if (esize == 4) {
    float value;
    std::memcpy(&value, &bits, sizeof value);
    return value;
  }
  const auto half = static_cast<uint16_t>(bits);
  return view.dtype == DType::BF16 ? bf16_to_f32(half) : f16_to_f32(half);
}

bool holds_non_finite(const ConstWeightView& view) { return !std::isfinite(largest_magnitude(view)); }

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


// ---- The multiplicative methods' shared parts (OFT, BOFT, HRA; peft_methods.hpp) -----------------

namespace {

// Solves A X = B for n x n row-major A and B (m columns) in place, partial pivoting, in f64.
void solve_f64(std::vector<double>& a, std::vector<double>& b, int64_t n, int64_t m, std::string_view name) {
  for (int64_t c = 0; c < n; ++c) {
    int64_t pivot = c;
    for (int64_t r = c + 1; r < n; ++r)
      if (std::fabs(a[r * n + c]) > std::fabs(a[pivot * n + c])) pivot = r;
    if (!(std::fabs(a[pivot * n + c]) > 0.0))
      fail(PEFT_ERR_INVALID_CHECKPOINT, "module " + peft::quoted(std::string(name)) +
                                            ": the rotation's matrix is singular (non-finite or degenerate parameters)");
    if (pivot != c) {
      for (int64_t j = 0; j < n; ++j) std::swap(a[c * n + j], a[pivot * n + j]);
      for (int64_t j = 0; j < m; ++j) std::swap(b[c * m + j], b[pivot * m + j]);
    }
    for (int64_t r = 0; r < n; ++r) {
      if (r == c) continue;
      const double f = a[r * n + c] / a[c * n + c];
      if (f == 0.0) continue;
      for (int64_t j = c; j < n; ++j) a[r * n + j] -= f * a[c * n + j];
      for (int64_t j = 0; j < m; ++j) b[r * m + j] -= f * b[c * m + j];
    }
  }
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < m; ++j) b[r * m + j] /= a[r * n + r];
}

}  // namespace

std::vector<double> cayley_f64(const std::vector<double>& s, int64_t n, std::string_view name) {
  // X (I + S) = I - S; transposed, with S^T = -S: (I - S) X^T = I + S.
  std::vector<double> a(static_cast<size_t>(n * n)), b(static_cast<size_t>(n * n));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) {
      const double eye = i == j ? 1.0 : 0.0;
      a[i * n + j] = eye - s[i * n + j];
      b[i * n + j] = eye + s[i * n + j];
    }
  solve_f64(a, b, n, n, name);
  std::vector<double> x(static_cast<size_t>(n * n));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) x[i * n + j] = b[j * n + i];
  return x;
}

std::vector<double> inverse_f64(const std::vector<double>& a, int64_t n, std::string_view name) {
  std::vector<double> work = a, b(static_cast<size_t>(n * n), 0.0);
  for (int64_t i = 0; i < n; ++i) b[i * n + i] = 1.0;
  solve_f64(work, b, n, n, name);
  return b;
}

void transform_input(const WeightView& weight, const DeltaLayout& layout, const InputTransform& t,
                     const ExecOptions& exec) {
  check_weight(weight, layout, "merge target");
  if (layout.transposed)
    fail(PEFT_ERR_UNSUPPORTED, "OFT, BOFT and HRA merge into Linear weights [out, in] only (PEFT has no Conv1D form)");
  if (t.in != layout.in)
    fail(PEFT_ERR_SHAPE_MISMATCH, "merge: the rotation is " + std::to_string(t.in) + " x " + std::to_string(t.in) +
                                      " but the layer has " + std::to_string(layout.in) + " input features");
  if (!t.out_scale.empty() && static_cast<int64_t>(t.out_scale.size()) != layout.out)
    fail(PEFT_ERR_SHAPE_MISMATCH, "merge: the output scale has " + std::to_string(t.out_scale.size()) +
                                      " values, the layer " + std::to_string(layout.out) + " output features");
  const size_t in = static_cast<size_t>(layout.in);
  std::vector<double> x(in), y(in);
  rewrite_rows(weight, exec, [&](int64_t r, float* v) {
    for (size_t j = 0; j < in; ++j) x[j] = v[j];
    for (const TransformStep& s : t.steps) {
      switch (s.kind) {
        case TransformStep::Kind::blocks: {
          const size_t b = static_cast<size_t>(s.size);
          for (size_t blk = 0; blk * b < in; ++blk) {
            const double* m = s.values.data() + (s.count == 1 ? 0 : blk) * b * b;
            const double* xs = x.data() + blk * b;
            for (size_t i = 0; i < b; ++i) {
              double acc = 0.0;
              for (size_t j = 0; j < b; ++j) acc += xs[j] * m[i * b + j];
              y[blk * b + i] = acc;
            }
          }
          x.swap(y);
          break;
        }
        case TransformStep::Kind::permute:
          for (size_t i = 0; i < in; ++i) y[i] = x[static_cast<size_t>(s.index[i])];
          x.swap(y);
          break;
        case TransformStep::Kind::reflections:
        case TransformStep::Kind::projector: {
          const bool each = s.kind == TransformStep::Kind::reflections;
          std::vector<double> dots(static_cast<size_t>(s.count));
          for (int64_t k = 0; k < s.count; ++k) {
            const double* u = s.values.data() + static_cast<size_t>(k) * in;
            double d = 0.0;
            for (size_t j = 0; j < in; ++j) d += x[j] * u[j];
            if (each) {
              for (size_t j = 0; j < in; ++j) x[j] -= 2.0 * d * u[j];
            } else {
              dots[static_cast<size_t>(k)] = d;
            }
          }
          if (!each)
            for (int64_t k = 0; k < s.count; ++k) {
              const double* u = s.values.data() + static_cast<size_t>(k) * in;
              for (size_t j = 0; j < in; ++j) x[j] -= 2.0 * dots[static_cast<size_t>(k)] * u[j];
            }
          break;
        }
      }
    }
    for (size_t j = 0; j < in; ++j) v[j] = static_cast<float>(x[j]);
    if (!t.out_scale.empty()) {
      const float s = t.out_scale[static_cast<size_t>(r)];
      for (size_t j = 0; j < in; ++j) v[j] = v[j] * s;
    }
  });
}

}  // namespace peft::merge

namespace peft::merge {

std::vector<float> weight_f32(const WeightView& weight, const DeltaLayout& layout) {
  check_weight(weight, layout, "merge target");
  const size_t esize = element_bytes(weight.dtype);
  const auto* base = static_cast<const unsigned char*>(weight.data);
  std::vector<float> w(static_cast<size_t>(layout.out * layout.in));
  for (int64_t r = 0; r < weight.rows; ++r)
    for (int64_t j = 0; j < weight.cols; ++j) {
      const float v = load(weight.dtype, base + (static_cast<size_t>(r * weight.cols + j)) * esize);
      w[static_cast<size_t>(layout.transposed ? j * layout.in + r : r * layout.in + j)] = v;
    }
  return w;
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
