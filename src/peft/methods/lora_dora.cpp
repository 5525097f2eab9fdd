// DoRA merge and unmerge (peft/tuners/lora/variants.py Dora*Variant, dora.py get_weight_norm).
// The norm runs over the input axis of B @ A: within a storage row for Linear and Conv (so norm
// and merge are one pass), down a storage column for Conv1D and Embedding (a first pass sums the
// squares in 16 fixed slices of rows, whatever the thread count, then the merge pass).
#include "core/no_fp_contract.hpp"  // first: before any inline arithmetic of the headers below

#include <cmath>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "peft/methods/lora_engine.hpp"
#include "peft/methods/lora_math.hpp"

namespace peft::merge {

using detail::PreparedTerms;

namespace {

constexpr int64_t kNormSlices = 16;

std::vector<float> weight_norm(const ConstWeightView& base, kernels::Storage s, const PreparedTerms& p,
                               bool transposed, const ExecOptions& exec) {
  const kernels::Table& k = kernels::active();
  const int64_t rows = p.rows, cols = p.cols;
  struct Scratch {
    std::vector<float> delta;
    std::vector<unsigned char> stage;
  };
  if (!transposed) {
    std::vector<float> norms(static_cast<size_t>(rows));
    const int64_t block_rows = p.block_rows();
    const int64_t blocks = (rows + block_rows - 1) / block_rows;
    const unsigned threads = detail::threads_for(exec, rows, cols, blocks);
    std::vector<Scratch> scratch(threads);
    parallel_tasks(blocks, threads, [&](int64_t block, unsigned worker) {
      const int64_t row0 = block * block_rows;
      detail::for_each_row_readonly(base, s, p, row0, std::min(rows, row0 + block_rows), scratch[worker].delta,
                                    scratch[worker].stage, [&](int64_t row, const void* w, const float* d) {
                                      norms[static_cast<size_t>(row)] =
                                          static_cast<float>(std::sqrt(k.sum_squares(s, w, d, cols)));
                                    });
    });
    return norms;
  }
  const int64_t slices = std::min(kNormSlices, rows);
  std::vector<std::vector<double>> partial(static_cast<size_t>(slices));
  const unsigned threads = detail::threads_for(exec, rows, cols, slices);
  std::vector<Scratch> scratch(threads);
  parallel_tasks(slices, threads, [&](int64_t slice, unsigned worker) {
    std::vector<double>& acc = partial[static_cast<size_t>(slice)];
    acc.assign(static_cast<size_t>(cols), 0.0);
    const int64_t begin = rows * slice / slices, end = rows * (slice + 1) / slices;
    detail::for_each_row_readonly(base, s, p, begin, end, scratch[worker].delta, scratch[worker].stage,
                                  [&](int64_t, const void* w, const float* d) {
                                    k.accumulate_squares(s, w, d, acc.data(), cols);
                                  });
  });
  std::vector<float> norms(static_cast<size_t>(cols));
  for (int64_t j = 0; j < cols; ++j) {
    double sum = 0.0;
    for (const auto& acc : partial) sum += acc[static_cast<size_t>(j)];
    norms[static_cast<size_t>(j)] = static_cast<float>(std::sqrt(sum));
  }
  return norms;
}

// f = magnitude / norm in f32, as `lora_magnitude_vector.weight / weight_norm`.
std::vector<float> dora_factors(const float* magnitude, const std::vector<float>& norms) {
  std::vector<float> f(norms.size());
  for (size_t i = 0; i < norms.size(); ++i) f[i] = magnitude[i] / norms[i];
  return f;
}

void check_magnitude(const float* magnitude) {
  if (magnitude == nullptr) fail(PEFT_ERR_INVALID_ARGUMENT, "DoRA: lora_magnitude_vector is null");
}

// Applies (or removes) DoRA with known factors, one per output channel.
void apply_factors(const WeightView& weight, kernels::Storage s, const PreparedTerms& p, bool transposed,
                   const std::vector<float>& f, bool remove, const ExecOptions& exec) {
  const kernels::Table& k = kernels::active();
  const int64_t cols = p.cols;
  detail::for_each_row(weight, s, p, exec, [&](int64_t row, void* w, const void*, const float* d) {
    const float* factor = transposed ? f.data() : f.data() + row;
    const int64_t stride = transposed ? 1 : 0;
    if (remove)
      k.dora_remove(s, w, d, factor, stride, cols);
    else if (k.dora_apply(s, w, d, factor, stride, cols) && exec.non_finite != nullptr)
      *exec.non_finite = true;
  });
}

}  // namespace

std::vector<float> dora_weight_norm(const ConstWeightView& base, const DeltaLayout& layout,
                                    std::span<const LoraFactors> terms, const ExecOptions& exec) {
  const kernels::Storage s = detail::check_view(base, layout.rows(), layout.cols(), "DoRA norm base");
  const PreparedTerms p = detail::prepare(layout, terms, false);
  return weight_norm(base, s, p, layout.transposed, exec);
}

std::vector<float> dora_merge(const WeightView& weight, const DeltaLayout& layout, std::span<const LoraFactors> terms,
                              const float* magnitude, const float* norm, const ExecOptions& exec) {
  const kernels::Storage s = detail::check_view(weight, layout.rows(), layout.cols(), "DoRA merge target");
  check_magnitude(magnitude);
  if (exec.source != nullptr) fail(PEFT_ERR_INTERNAL, "a DoRA merge reads its weight's norms from the weight itself");
  const PreparedTerms p = detail::prepare(layout, terms, false);
  if (norm != nullptr) {
    std::vector<float> norms(norm, norm + layout.out);
    apply_factors(weight, s, p, layout.transposed, dora_factors(magnitude, norms), false, exec);
    return norms;
  }
  if (layout.transposed) {
    std::vector<float> norms = weight_norm(weight, s, p, true, exec);
    apply_factors(weight, s, p, true, dora_factors(magnitude, norms), false, exec);
    return norms;
  }
  // Row norms: one pass computes each row's norm from the row as it is, then rewrites it.
  std::vector<float> norms(static_cast<size_t>(layout.out));
  const kernels::Table& k = kernels::active();
  const int64_t cols = p.cols;
  detail::for_each_row(weight, s, p, exec, [&](int64_t row, void* w, const void*, const float* d) {
    const float n = static_cast<float>(std::sqrt(k.sum_squares(s, w, d, cols)));
    norms[static_cast<size_t>(row)] = n;
    const float f = magnitude[row] / n;
    if (k.dora_apply(s, w, d, &f, 0, cols) && exec.non_finite != nullptr) *exec.non_finite = true;
  });
  return norms;
}

void dora_unmerge(const WeightView& weight, const DeltaLayout& layout, std::span<const LoraFactors> terms,
                  const float* magnitude, const float* norm, const ExecOptions& exec) {
  const kernels::Storage s = detail::check_view(weight, layout.rows(), layout.cols(), "DoRA unmerge target");
  check_magnitude(magnitude);
  if (exec.source != nullptr) fail(PEFT_ERR_INTERNAL, "a DoRA unmerge takes its rows from the weight itself");
  if (norm == nullptr) fail(PEFT_ERR_INVALID_ARGUMENT, "DoRA unmerge needs the weight norm cached at merge time");
  const PreparedTerms p = detail::prepare(layout, terms, false);
  const std::vector<float> norms(norm, norm + layout.out);
  apply_factors(weight, s, p, layout.transposed, dora_factors(magnitude, norms), true, exec);
}

}  // namespace peft::merge
