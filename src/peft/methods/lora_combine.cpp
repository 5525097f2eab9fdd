// add_weighted_adapter's combinations (peft/tuners/lora/model.py, peft/utils/merge_utils.py), on
// f32 factors, in torch's order of f32 operations. No contraction: the weighted sums round each
// product before adding it, as torch's `(task_tensors * weights).sum(dim=0)` does.
#include "core/no_fp_contract.hpp"  // first: before any inline arithmetic of the headers below

#include <algorithm>
#include <bit>
#include <cmath>
#include <functional>
#include <string>

#include "core/error.hpp"
#include "core/shape.hpp"
#include "peft/kernels/truncated_svd.hpp"
#include "peft/methods/lora_math.hpp"

namespace peft::merge {

namespace {

void check_adapters(std::span<const WeightedFactors> adapters, int64_t out, int64_t in, const char* how) {
  const std::string what = std::string("combining adapters (") + how + ")";
  if (adapters.empty()) fail(PEFT_ERR_INVALID_ARGUMENT, what + ": no adapters given");
  if (out < 1 || in < 1) fail(PEFT_ERR_INVALID_ARGUMENT, what + ": empty factor dimension");
  int64_t total = 0;
  for (size_t i = 0; i < adapters.size(); ++i) {
    const WeightedFactors& f = adapters[i];
    if (f.a == nullptr || f.b == nullptr)
      fail(PEFT_ERR_INVALID_ARGUMENT, what + ": adapter #" + std::to_string(i) + " has a null factor");
    if (f.rank < 1)
      fail(PEFT_ERR_INVALID_ARGUMENT, what + ": adapter #" + std::to_string(i) + " has rank " + std::to_string(f.rank));
    lora_coefficient(f.weight, f.scaling, what + ": adapter #" + std::to_string(i));
    int64_t a_size = 0, b_size = 0;
    if (__builtin_add_overflow(total, f.rank, &total) || __builtin_mul_overflow(total, in, &a_size) ||
        __builtin_mul_overflow(total, out, &b_size) || a_size > (int64_t(1) << 60) || b_size > (int64_t(1) << 60))
      fail(PEFT_ERR_VALIDATION_OVERFLOW, what + ": combined factors are too large");
  }
}

}  // namespace

CombinedFactors combine_cat(std::span<const WeightedFactors> adapters, int64_t out, int64_t in) {
  check_adapters(adapters, out, in, "cat");
  CombinedFactors c;
  c.in = in;
  c.out = out;
  for (const auto& f : adapters) c.rank += f.rank;
  c.a.resize(static_cast<size_t>(c.rank * in));
  c.b.resize(static_cast<size_t>(out * c.rank));
  int64_t offset = 0;
  for (const auto& f : adapters) {
    // lora_A * weight * scaling: two f32 products, left to right.
    const float w = static_cast<float>(f.weight), s = static_cast<float>(f.scaling);
    float* a = c.a.data() + offset * in;
    for (int64_t i = 0; i < f.rank * in; ++i) {
      const float weighted = f.a[i] * w;
      a[i] = weighted * s;
    }
    for (int64_t o = 0; o < out; ++o)
      for (int64_t k = 0; k < f.rank; ++k) c.b[static_cast<size_t>(o * c.rank + offset + k)] = f.b[o * f.rank + k];
    offset += f.rank;
  }
  return c;
}

CombinedFactors combine_linear(std::span<const WeightedFactors> adapters, int64_t out, int64_t in) {
  return combine_task_arithmetic(adapters, out, in, TaskSettings{});
}

namespace {

uint64_t mix(uint64_t x) {
  uint64_t z = x + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t fnv1a64(std::string_view text) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const char c : text) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  return h;
}

const char* task_name(TaskArithmetic how) {
  switch (how) {
    case TaskArithmetic::linear: return "linear";
    case TaskArithmetic::ties: return "ties";
    case TaskArithmetic::dare_linear: return "dare_linear";
    case TaskArithmetic::dare_ties: return "dare_ties";
    case TaskArithmetic::magnitude_prune: return "magnitude_prune";
  }
  return "?";
}

void check_density(double density, const char* how) {
  if (!(density >= 0.0))
    fail(PEFT_ERR_INVALID_ARGUMENT, std::string("combining adapters (") + how + "): the density " +
                                        std::to_string(density) + " is not a number from 0 to 1");
}

float sign_of(float x) { return x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : 0.0f); }

// The order of magnitudes magnitude pruning keeps by: |x|'s bits as an integer (monotonic in |x|
// for every float, NaN above infinity, so the order is total).
uint32_t magnitude_key(float x) { return std::bit_cast<uint32_t>(x) & 0x7FFFFFFFu; }

// One slice of the combination: the tensors' elements [offset, offset + count), pruned and combined
// (combine_factor's arithmetic), written to `out`. `cuts` (magnitude pruning) and `equal_seen` (the
// elements equal to each cut met in earlier slices) carry what pruning needs across slices.
void combine_slice(const std::vector<const float*>& t, const std::vector<float>& w, size_t count, uint64_t offset,
                   const TaskSettings& s, int factor, const std::vector<MagnitudeCut>& cuts,
                   std::vector<uint64_t>& equal_seen, std::vector<std::vector<float>>& scratch, float* out) {
  const bool ties = s.how == TaskArithmetic::ties || s.how == TaskArithmetic::dare_ties;
  const bool random = s.how == TaskArithmetic::dare_linear || s.how == TaskArithmetic::dare_ties;
  std::vector<const float*> use = t;
  if (s.how != TaskArithmetic::linear && s.density < 1.0) {
    scratch.resize(t.size());
    const auto density = static_cast<float>(s.density);
    for (size_t i = 0; i < t.size(); ++i) {
      std::vector<float>& pruned = scratch[i];
      pruned.resize(count);
      for (size_t j = 0; j < count; ++j) {
        if (random) {  // random_pruning with rescale: (t * mask) / density
          const float masked =
              dare_keep(s.seed, s.stream, i, factor, offset + j, s.density) ? t[i][j] * 1.0f : t[i][j] * 0.0f;
          pruned[j] = masked / density;
        } else {  // magnitude_based_pruning: torch.topk's int(density * n) largest |t|, lower index first
          const uint32_t key = magnitude_key(t[i][j]);
          bool keep = key > cuts[i].threshold;
          if (!keep && key == cuts[i].threshold && equal_seen[i] < cuts[i].equal_kept) {
            keep = true;
            ++equal_seen[i];
          }
          pruned[j] = keep ? t[i][j] : 0.0f;
        }
      }
      use[i] = pruned.data();
    }
  }
  if (!ties) {
    for (size_t j = 0; j < count; ++j) out[j] = 0.0f;
    for (size_t i = 0; i < use.size(); ++i)
      for (size_t j = 0; j < count; ++j) {
        const float term = use[i][j] * w[i];
        out[j] = out[j] + term;
      }
    return;
  }
  // calculate_majority_sign_mask and disjoint_merge, element by element.
  for (size_t j = 0; j < count; ++j) {
    float magnitude = 0.0f;
    for (size_t i = 0; i < use.size(); ++i)
      magnitude = magnitude + (s.sign == MajoritySign::total ? use[i][j] : sign_of(use[i][j]));
    const float majority = magnitude >= 0.0f ? 1.0f : -1.0f;
    float mixed = 0.0f;
    int64_t agreeing = 0;
    for (size_t i = 0; i < use.size(); ++i) {
      const bool agrees = sign_of(use[i][j]) == majority;
      const float weighted = use[i][j] * w[i];
      const float term = weighted * (agrees ? 1.0f : 0.0f);
      mixed = mixed + term;
      agreeing += agrees ? 1 : 0;
    }
    out[j] = mixed / static_cast<float>(std::max<int64_t>(agreeing, 1));
  }
}

bool prunes_by_magnitude(const TaskSettings& s) {
  return (s.how == TaskArithmetic::ties || s.how == TaskArithmetic::magnitude_prune) && s.density < 1.0;
}

// One factor (A or B) of every adapter, combined: the tensors t_i of n elements with weights w_i.
std::vector<float> combine_factor(const std::vector<const float*>& t, const std::vector<float>& w, size_t n,
                                  const TaskSettings& s, int factor) {
  std::vector<MagnitudeCut> cuts;
  if (prunes_by_magnitude(s))
    for (const float* tensor : t)
      cuts.push_back(magnitude_cut(n, s.density, [&](const SliceVisitor& visit) { visit(tensor, n); }));
  std::vector<uint64_t> equal_seen(t.size(), 0);
  std::vector<std::vector<float>> scratch;
  std::vector<float> sum(n);
  combine_slice(t, w, n, 0, s, factor, cuts, equal_seen, scratch, sum.data());
  return sum;
}

}  // namespace

bool dare_keep(uint64_t seed, std::string_view stream, size_t adapter, int factor, uint64_t element, double density) {
  const uint64_t s = mix(mix(seed ^ fnv1a64(stream)) ^ (2 * static_cast<uint64_t>(adapter) + static_cast<uint64_t>(factor)));
  const double u = static_cast<double>(mix(s ^ element) >> 11) * 0x1.0p-53;
  return u < density;
}

MagnitudeCut magnitude_cut(uint64_t n, double density, const std::function<void(const SliceVisitor&)>& for_each_slice) {
  MagnitudeCut cut;
  const auto keep = static_cast<uint64_t>(density * static_cast<double>(n));
  if (keep == 0) return cut;
  if (keep >= n) return MagnitudeCut{0, n};  // every key is >= 0: all kept
  // The bin (key >> 16) that holds the keep-th largest key, then its low 16 bits.
  std::vector<uint64_t> high(1u << 15, 0), low(1u << 16, 0);
  for_each_slice([&](const float* values, size_t count) {
    for (size_t j = 0; j < count; ++j) ++high[magnitude_key(values[j]) >> 16];
  });
  uint64_t above = 0;  // keys in bins above the chosen one
  size_t bin = high.size();
  while (bin > 0 && above + high[bin - 1] < keep) above += high[--bin];
  const uint32_t chosen = static_cast<uint32_t>(bin - 1);
  for_each_slice([&](const float* values, size_t count) {
    for (size_t j = 0; j < count; ++j)
      if (const uint32_t key = magnitude_key(values[j]); key >> 16 == chosen) ++low[key & 0xFFFFu];
  });
  size_t lower = low.size();
  while (lower > 0 && above + low[lower - 1] < keep) above += low[--lower];
  cut.threshold = (chosen << 16) | static_cast<uint32_t>(lower - 1);
  cut.equal_kept = keep - above;  // `above` now counts the keys greater than the threshold
  return cut;
}

void combine_task_slices(size_t m, std::span<const float> weights, uint64_t n, const TaskSettings& settings, int factor,
                         size_t slice, const SliceReader& read, const SliceWriter& write) {
  check_density(settings.density, task_name(settings.how));
  if (m != weights.size() || m == 0 || slice == 0)
    fail(PEFT_ERR_INTERNAL, "combine_task_slices: one weight per tensor, at least one tensor, a slice");
  std::vector<std::vector<float>> inputs(m, std::vector<float>(static_cast<size_t>(std::min<uint64_t>(slice, n))));
  std::vector<MagnitudeCut> cuts;
  if (prunes_by_magnitude(settings))
    for (size_t i = 0; i < m; ++i)
      cuts.push_back(magnitude_cut(n, settings.density, [&](const SliceVisitor& visit) {
        for (uint64_t offset = 0; offset < n; offset += slice) {
          const auto count = static_cast<size_t>(std::min<uint64_t>(slice, n - offset));
          read(i, offset, count, inputs[i].data());
          visit(inputs[i].data(), count);
        }
      }));
  std::vector<uint64_t> equal_seen(m, 0);
  std::vector<std::vector<float>> scratch;
  std::vector<const float*> tensors(m);
  const std::vector<float> w(weights.begin(), weights.end());
  std::vector<float> out(inputs[0].size());
  for (uint64_t offset = 0; offset < n; offset += slice) {
    const auto count = static_cast<size_t>(std::min<uint64_t>(slice, n - offset));
    for (size_t i = 0; i < m; ++i) {
      read(i, offset, count, inputs[i].data());
      tensors[i] = inputs[i].data();
    }
    combine_slice(tensors, w, count, offset, settings, factor, cuts, equal_seen, scratch, out.data());
    write(offset, out.data(), count);
  }
}

CombinedFactors combine_task_arithmetic(std::span<const WeightedFactors> adapters, int64_t out, int64_t in,
                                        const TaskSettings& settings) {
  const char* how = task_name(settings.how);
  check_adapters(adapters, out, in, how);
  check_density(settings.density, how);
  const int64_t rank = adapters[0].rank;
  for (const auto& f : adapters)
    if (f.rank != rank)
      fail(PEFT_ERR_INVALID_ARGUMENT, std::string("combining adapters (") + how + "): all ranks must be equal, got " +
                                          std::to_string(rank) + " and " + std::to_string(f.rank));
  // Python floats, then torch.tensor(list) makes them f32; the sign goes on A only.
  std::vector<float> wa, wb;
  std::vector<const float*> as, bs;
  for (const auto& f : adapters) {
    const double weighted = f.weight * f.scaling;
    const double root = std::sqrt(std::fabs(weighted));
    wa.push_back(static_cast<float>(weighted >= 0 ? root : -root));
    wb.push_back(static_cast<float>(root));
    as.push_back(f.a);
    bs.push_back(f.b);
  }
  CombinedFactors c;
  c.in = in;
  c.out = out;
  c.rank = rank;
  c.a = combine_factor(as, wa, static_cast<size_t>(rank * in), settings, 0);
  c.b = combine_factor(bs, wb, static_cast<size_t>(out * rank), settings, 1);
  return c;
}

std::vector<float> combine_task_tensors(std::span<const float* const> tensors, std::span<const float> weights,
                                        size_t n, const TaskSettings& settings, int factor) {
  check_density(settings.density, task_name(settings.how));
  if (tensors.size() != weights.size() || tensors.empty())
    fail(PEFT_ERR_INTERNAL, "combine_task_tensors: one weight per tensor, at least one tensor");
  return combine_factor(std::vector<const float*>(tensors.begin(), tensors.end()),
                        std::vector<float>(weights.begin(), weights.end()), n, settings, factor);
}

namespace {

// torch.quantile(values, q) with linear interpolation, in f32 as torch computes it for f32 values:
// rank = q * (n - 1), weight = rank - floor(rank), then torch's lerp of the two neighbours.
float quantile(std::vector<float> values, float q) {
  std::sort(values.begin(), values.end());
  const float rank = q * static_cast<float>(values.size() - 1);
  const auto below = static_cast<size_t>(rank);
  const size_t above = std::min(values.size() - 1, static_cast<size_t>(std::ceil(rank)));
  const float weight = rank - static_cast<float>(below);
  const float lo = values[below], hi = values[above];
  return std::fabs(weight) < 0.5f ? lo + weight * (hi - lo) : hi - (hi - lo) * (1.0f - weight);
}

}  // namespace

CombinedFactors combine_svd(std::span<const WeightedFactors> adapters, const DeltaLayout& layout,
                            const TaskSettings& settings, int64_t rank, std::optional<double> clamp) {
  const std::string how = std::string(task_name(settings.how)) == "linear"
                              ? std::string("svd")
                              : std::string(task_name(settings.how)) + "_svd";
  const int64_t out = layout.out, in = layout.in;
  check_adapters(adapters, out, in, how.c_str());
  check_density(settings.density, how.c_str());
  const std::string who = "combining adapters (" + how + ") in module " + std::string(settings.stream);
  if (rank < 1) fail(PEFT_ERR_INVALID_ARGUMENT, who + ": the new rank " + std::to_string(rank) + " is below 1");
  if (clamp && !(*clamp >= 0.0 && *clamp <= 1.0))
    fail(PEFT_ERR_INVALID_ARGUMENT, who + ": the clamp quantile " + std::to_string(*clamp) + " is not from 0 to 1");
  const auto n = static_cast<size_t>(out * in);
  std::vector<float> sum;
  {
    std::vector<std::vector<float>> deltas;
    std::vector<const float*> tensors;
    std::vector<float> weights;
    deltas.reserve(adapters.size());
    for (const WeightedFactors& f : adapters) {
      const LoraFactors term{f.a, f.b, f.rank, f.scaling};
      deltas.push_back(compute_delta(layout, std::span<const LoraFactors>(&term, 1)));
      tensors.push_back(deltas.back().data());
      weights.push_back(static_cast<float>(f.weight));  // torch.tensor(weights): f32
    }
    sum = combine_factor(tensors, weights, n, settings, 2);
  }
  if (layout.transposed) sum = transposed(sum, static_cast<uint64_t>(in), static_cast<uint64_t>(out));
  const int64_t k = std::min({rank, out, in});
  LowRankFactors f = truncated_svd(sum, out, in, RankChoice{k, 0.0}, SvdMethod::exact, who);
  // One sign per component, the same whichever LAPACK computed it.
  for (int64_t c = 0; c < k; ++c) {
    int64_t at = 0;
    for (int64_t o = 1; o < out; ++o)
      if (std::fabs(f.b[static_cast<size_t>(o * k + c)]) > std::fabs(f.b[static_cast<size_t>(at * k + c)])) at = o;
    if (f.b[static_cast<size_t>(at * k + c)] >= 0.0f) continue;
    for (int64_t o = 0; o < out; ++o) f.b[static_cast<size_t>(o * k + c)] = -f.b[static_cast<size_t>(o * k + c)];
    for (int64_t i = 0; i < in; ++i) f.a[static_cast<size_t>(c * in + i)] = -f.a[static_cast<size_t>(c * in + i)];
  }
  if (clamp) {
    std::vector<float> all(f.b);
    all.insert(all.end(), f.a.begin(), f.a.end());
    const float hi = quantile(std::move(all), static_cast<float>(*clamp)), lo = -hi;
    for (std::vector<float>* v : {&f.b, &f.a})
      for (float& x : *v) x = std::min(std::max(x, lo), hi);  // torch.clamp(x, lo, hi)
  }
  CombinedFactors c;
  c.in = in;
  c.out = out;
  c.rank = rank;
  c.a.assign(static_cast<size_t>(rank * in), 0.0f);
  c.b.assign(static_cast<size_t>(out * rank), 0.0f);
  std::copy(f.a.begin(), f.a.end(), c.a.begin());
  for (int64_t o = 0; o < out; ++o)
    std::copy_n(f.b.begin() + o * k, k, c.b.begin() + o * rank);
  return c;
}

}  // namespace peft::merge
