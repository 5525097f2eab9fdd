// Validation and preparation shared by every merge entry point (see lora_engine.hpp).
#include "peft/methods/lora_engine.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "core/error.hpp"

namespace peft::merge::detail {

namespace {

// Largest element count a buffer may describe: its bytes must fit in size_t and int64_t.
constexpr int64_t kMaxElements = std::numeric_limits<int64_t>::max() / 8;

int64_t checked_product(int64_t a, int64_t b, const char* what) {
  int64_t result = 0;
  if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &result) || result > kMaxElements)
    fail(PEFT_ERR_VALIDATION_OVERFLOW, std::string(what) + ": size " + std::to_string(a) + " x " +
                                           std::to_string(b) + " is too large");
  return result;
}

}  // namespace

kernels::Storage storage_of(DType dtype, const char* what) {
  switch (dtype) {
    case DType::F32: return kernels::Storage::f32;
    case DType::BF16: return kernels::Storage::bf16;
    case DType::F16: return kernels::Storage::f16;
    default:
      fail(PEFT_ERR_UNSUPPORTED, std::string(what) + ": merging into " + std::string(dtype_name(dtype)) +
                                     " is not supported (F32, BF16 and F16 are)");
  }
}

PreparedTerms prepare(const DeltaLayout& layout, std::span<const LoraFactors> terms, bool negate) {
  if (layout.out < 1 || layout.in < 1)
    fail(PEFT_ERR_INVALID_ARGUMENT, "LoRA layout has an empty dimension (out " + std::to_string(layout.out) +
                                        ", in " + std::to_string(layout.in) + ")");
  if (terms.empty()) fail(PEFT_ERR_INVALID_ARGUMENT, "no LoRA factors to merge");
  checked_product(layout.out, layout.in, "LoRA delta");
  PreparedTerms p;
  p.rows = layout.rows();
  p.cols = layout.cols();
  p.terms.reserve(terms.size());
  for (size_t t = 0; t < terms.size(); ++t) {
    const LoraFactors& f = terms[t];
    const std::string which = "LoRA factors #" + std::to_string(t);
    if (f.a == nullptr || f.b == nullptr) fail(PEFT_ERR_INVALID_ARGUMENT, which + ": lora_A or lora_B is null");
    if (f.rank < 1) fail(PEFT_ERR_INVALID_ARGUMENT, which + ": rank " + std::to_string(f.rank) + " is not positive");
    checked_product(f.rank, layout.in, which.c_str());
    checked_product(f.rank, layout.out, which.c_str());
    // torch multiplies an f32 tensor by a Python float as float.
    float coef = static_cast<float>(f.coefficient);
    if (negate) coef = -coef;
    if (!layout.transposed) {
      p.terms.push_back({f.b, f.a, f.rank, coef});
      continue;
    }
    // Storage is (B @ A)^T = A^T @ B^T: rows index A's columns. Transposed copies keep the
    // kernel on unit-stride rows.
    const int64_t r = f.rank, in = layout.in, out = layout.out;
    std::vector<float> lt(static_cast<size_t>(in * r)), rt(static_cast<size_t>(r * out));
    for (int64_t k = 0; k < r; ++k)
      for (int64_t i = 0; i < in; ++i) lt[static_cast<size_t>(i * r + k)] = f.a[k * in + i];
    for (int64_t j = 0; j < out; ++j)
      for (int64_t k = 0; k < r; ++k) rt[static_cast<size_t>(k * out + j)] = f.b[j * r + k];
    p.owned.push_back(std::move(lt));
    const float* L = p.owned.back().data();
    p.owned.push_back(std::move(rt));
    p.terms.push_back({L, p.owned.back().data(), r, coef});
  }
  for (const auto& t : p.terms) p.total_rank += t.rank;
  return p;
}

kernels::Storage check_view(const ConstWeightView& view, int64_t rows, int64_t cols, const char* what) {
  const kernels::Storage s = storage_of(view.dtype, what);
  if (view.rows != rows || view.cols != cols)
    fail(PEFT_ERR_SHAPE_MISMATCH, std::string(what) + ": buffer is " + std::to_string(view.rows) + " x " +
                                      std::to_string(view.cols) + " but the LoRA delta is " + std::to_string(rows) +
                                      " x " + std::to_string(cols));
  if (view.data == nullptr) fail(PEFT_ERR_INVALID_ARGUMENT, std::string(what) + ": buffer is null");
  return s;
}

int64_t block_rows_for(int64_t cols, int64_t rank) {
  // About 64 Ki floats of delta per block (256 KiB, within L2), but for large ranks at least
  // rank / 4 rows, so that each panel of the factor R is reused by enough rows (+15% at r = 256).
  const int64_t target = (int64_t(1) << 16) / std::max<int64_t>(cols, 1);
  const int64_t at_least = std::clamp<int64_t>((rank / 4 + 3) / 4 * 4, 4, 64);
  return std::clamp<int64_t>(target / 4 * 4, at_least, 1024);
}

unsigned threads_for(const ExecOptions& exec, int64_t rows, int64_t cols, int64_t blocks) {
  if (rows * cols < (int64_t(1) << 16)) return 1;  // thread start-up would cost more than the work
  return worker_count(exec.threads, blocks);
}

}  // namespace peft::merge::detail
