#include "serve/lora_apply.hpp"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/convert.hpp"
#include "core/error.hpp"
#include "core/worker_pool.hpp"
#include "serve/apply_kernels.hpp"

namespace peft::serve {
namespace {

// Per-thread scratch, reused across calls so that a server's steady stream of calls does not
// allocate. Contents are not kept between calls.
class Scratch {
 public:
  float* floats(size_t count) { return reserve(floats_, float_capacity_, count); }
  size_t* indices(size_t count) { return reserve(indices_, index_capacity_, count); }
  // Returns what a call with unusually large shapes took, so that one such call does not pin
  // that much memory in every thread that ever made it.
  void trim() {
    if (float_capacity_ * sizeof(float) > kKeptScratchBytes) {
      floats_.reset();
      float_capacity_ = 0;
    }
    if (index_capacity_ * sizeof(size_t) > kKeptScratchBytes) {
      indices_.reset();
      index_capacity_ = 0;
    }
  }

 private:
  template <class T>
  static T* reserve(std::unique_ptr<T[]>& data, size_t& capacity, size_t count) {
    if (count > capacity) {
      data.reset();
      capacity = 0;
      data.reset(new T[count]);  // uninitialised: every element is written before it is read
      capacity = count;
    }
    return data.get();
  }
  std::unique_ptr<float[]> floats_;
  size_t float_capacity_ = 0;
  std::unique_ptr<size_t[]> indices_;
  size_t index_capacity_ = 0;
};

thread_local Scratch scratch;

struct TrimScratchOnExit {
  ~TrimScratchOnExit() { scratch.trim(); }
};

bool is_supported(DType dtype) { return dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F16; }

[[noreturn]] void fail_dtype(DType dtype, const std::string& what) {
  const std::string name = is_valid_dtype(static_cast<int32_t>(dtype)) ? std::string(dtype_name(dtype))
                                                                       : std::to_string(static_cast<int32_t>(dtype));
  fail(PEFT_ERR_UNSUPPORTED, what + " dtype " + name + " is not supported (F32, BF16 and F16 are)");
}

// Features and ranks are at most INT_MAX (the limit peft_lora_apply() documents).
template <class Int>
bool is_dimension(Int value) {
  return std::cmp_greater_equal(value, 1) && std::cmp_less_equal(value, INT_MAX);
}

template <class Int>
[[noreturn]] void fail_dimension(Int value, const std::string& what) {
  fail(PEFT_ERR_INVALID_ARGUMENT,
       what + " is " + std::to_string(value) + "; it must be from 1 to " + std::to_string(INT_MAX));
}

size_t dtype_size(DType dtype) { return dtype == DType::F32 ? 4 : 2; }

bool is_aligned(const void* data, DType dtype) { return reinterpret_cast<uintptr_t>(data) % dtype_size(dtype) == 0; }

// Whether f32 rows at `data` can be used in place, without a copy.
bool is_f32_in_place(const void* data, DType dtype) { return dtype == DType::F32 && is_aligned(data, DType::F32); }

// Bytes of rows x columns elements of dtype; INVALID_ARGUMENT when that does not fit in memory.
size_t byte_size(uint64_t rows, uint64_t columns, DType dtype, const char* what) {
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(rows, columns, &bytes) || __builtin_mul_overflow(bytes, dtype_size(dtype), &bytes) ||
      bytes > SIZE_MAX)
    fail(PEFT_ERR_INVALID_ARGUMENT, std::string(what) + " of " + std::to_string(rows) + " x " +
                                        std::to_string(columns) + " elements is too large");
  return static_cast<size_t>(bytes);
}

// Messages are built only on failure: this runs on every call.
void check_factors(const LoraFactors& f, size_t group) {
  const auto name = [group] { return "adapter " + std::to_string(group); };
  if (!is_supported(f.dtype)) fail_dtype(f.dtype, name() + " factor");
  if (f.a == nullptr || f.b == nullptr) fail(PEFT_ERR_INVALID_ARGUMENT, name() + ": lora_A and lora_B must not be NULL");
  if (!is_aligned(f.a, f.dtype) || !is_aligned(f.b, f.dtype) || !is_aligned(f.bias, f.dtype))
    fail(PEFT_ERR_INVALID_ARGUMENT, name() + ": factors must be aligned to their element size");
  if (!is_dimension(f.rank)) fail_dimension(f.rank, name() + "'s rank");
  if (f.dora_scale == nullptr && f.base_bias != nullptr)
    fail(PEFT_ERR_INVALID_ARGUMENT, name() + ": a base bias is for DoRA only");
  if (f.dora_scale != nullptr && f.bias != nullptr)
    fail(PEFT_ERR_INVALID_ARGUMENT, name() + ": a DoRA layer has no lora_B.bias");
}

// The rows of one group: [first, first + count) or, when list is set, list[0 .. count) (ascending).
struct RowSet {
  const size_t* list = nullptr;
  size_t first = 0;
  size_t count = 0;
  size_t row(size_t k) const { return list ? list[k] : first + k; }
  // Rows k0 .. k0 + length of this set.
  RowSet slice(size_t k0, size_t length) const {
    return list ? RowSet{list + k0, 0, length} : RowSet{nullptr, first + k0, length};
  }
};

// Calls fn(row, position, length) for each run of consecutive rows among rows.row(k0 .. k0 + n).
template <class Fn>
void for_each_run(const RowSet& rows, size_t k0, size_t n, Fn&& fn) {
  size_t start = 0;
  for (size_t k = 1; k <= n; ++k) {
    if (k == n || rows.row(k0 + k) != rows.row(k0 + k - 1) + 1) {
      fn(rows.row(k0 + start), start, k - start);
      start = k;
    }
  }
}

// C [n, out] += (s - 1) * (C - bias) + (s * L) * scaling, per output feature j (PEFT's DoRA forward).
void add_dora(size_t n, size_t out, float scaling, const float* s, const float* bias, const float* l, float* c) {
  for (size_t i = 0; i < n; ++i) {
    float* row = c + i * out;
    const float* lora = l + i * out;
    for (size_t j = 0; j < out; ++j) {
      const float base = bias ? row[j] - bias[j] : row[j];
      const float dora = (s[j] - 1.0f) * base + (s[j] * lora[j]) * scaling;
      row[j] = row[j] + dora;
    }
  }
}

// The f32 buffers of one thread of a call, carved from the calling thread's scratch before
// anything is written.
struct Buffers {
  float* bias = nullptr;     // the group's lora_B.bias widened, when it is not f32
  float* x = nullptr;        // a block of x's rows, when they must be gathered or widened
  float* t = nullptr;        // a block of X A^T
  float* y = nullptr;        // a block of y's rows, when they must be gathered or widened
  float* lora = nullptr;     // DoRA: a block of (X A^T) B^T
};

// One group's rows, or the share of them one thread takes.
struct Part {
  const LoraFactors* factors;
  RowSet rows;
};

// Reused across calls, like the scratch: a call's parts and its threads' buffers.
thread_local std::vector<Part> call_parts, call_slices;
thread_local std::vector<Buffers> call_buffers;

// The length of each of `threads` shares of [0, total): a multiple of `unit` (the last share shorter).
int64_t share_length(int64_t total, unsigned threads, int64_t unit) {
  return ((total + threads - 1) / threads + unit - 1) / unit * unit;
}

// T = X A^T for n rows: with threads > 1, its ranks split between them (each takes whole tiles of
// four ranks).
void shrink_on(unsigned threads, const LoraFactors& f, int64_t in, const float* x, int64_t n, float* t) {
  const kernels::Table& products = kernels::active();
  if (threads <= 1) return products.shrink(f.dtype, f.a, f.rank, in, x, n, t, f.rank);
  const int64_t step = share_length(f.rank, threads, 4);
  const size_t element = dtype_size(f.dtype);
  run_parallel((f.rank + step - 1) / step, threads, [&](int64_t part, unsigned) {
    const int64_t r0 = part * step;
    products.shrink(f.dtype, static_cast<const unsigned char*>(f.a) + size_t(r0 * in) * element,
                    std::min(step, f.rank - r0), in, x, n, t + r0, f.rank);
  });
}

// C += scale * T B^T for n rows: with threads > 1, the output columns split between them (in
// whole cache lines of C).
void expand_on(unsigned threads, const LoraFactors& f, int64_t out, const float* t, int64_t n, float scale,
               float* c) {
  const kernels::Table& products = kernels::active();
  if (threads <= 1) return products.expand(f.dtype, f.b, out, f.rank, t, n, scale, c, 0, out);
  const int64_t step = share_length(out, threads, 16);
  run_parallel((out + step - 1) / step, threads, [&](int64_t part, unsigned) {
    const int64_t j0 = part * step;
    products.expand(f.dtype, f.b, out, f.rank, t, n, scale, c, j0, std::min(out, j0 + step));
  });
}

// Adds one group's rows (or a thread's share of them). With product_threads > 1 (a call with few
// rows on one thread), each product is split between that many threads instead.
void apply_group(const LoraFactors& f, const RowSet& rows, const LoraBatch& batch, const Buffers& buffers,
                 unsigned product_threads) {
  const size_t in = batch.in_features, out = batch.out_features;
  const float scaling = static_cast<float>(f.scaling);

  const float* bias = static_cast<const float*>(f.bias);
  if (f.bias && f.dtype != DType::F32) {
    convert(f.dtype, f.bias, DType::F32, buffers.bias, out);
    bias = buffers.bias;
  }

  const size_t x_size = dtype_size(batch.x_dtype), y_size = dtype_size(batch.y_dtype);
  const auto* x_bytes = static_cast<const unsigned char*>(batch.x);
  auto* y_bytes = static_cast<unsigned char*>(batch.y);

  for (size_t k0 = 0; k0 < rows.count; k0 += kBlockRows) {
    const size_t n = std::min<size_t>(kBlockRows, rows.count - k0);
    const size_t first = rows.row(k0);
    const bool consecutive = rows.row(k0 + n - 1) - first == n - 1;

    const float* x = nullptr;
    if (consecutive && is_f32_in_place(batch.x, batch.x_dtype)) {
      x = reinterpret_cast<const float*>(x_bytes + first * in * x_size);
    } else {
      for_each_run(rows, k0, n, [&](size_t row, size_t position, size_t length) {
        convert(batch.x_dtype, x_bytes + row * in * x_size, DType::F32, buffers.x + position * in, length * in);
      });
      x = buffers.x;
    }

    const bool y_in_place = consecutive && is_f32_in_place(batch.y, batch.y_dtype);
    float* c = y_in_place ? reinterpret_cast<float*>(y_bytes + first * out * y_size) : buffers.y;
    if (!y_in_place) {
      for_each_run(rows, k0, n, [&](size_t row, size_t position, size_t length) {
        convert(batch.y_dtype, y_bytes + row * out * y_size, DType::F32, c + position * out, length * out);
      });
    }

    const auto n64 = static_cast<int64_t>(n), in64 = static_cast<int64_t>(in), out64 = static_cast<int64_t>(out);
    shrink_on(product_threads, f, in64, x, n64, buffers.t);
    if (f.dora_scale) {
      std::fill(buffers.lora, buffers.lora + n * out, 0.0f);
      expand_on(product_threads, f, out64, buffers.t, n64, 1.0f, buffers.lora);
      add_dora(n, out, scaling, f.dora_scale, f.base_bias, buffers.lora, c);
    } else {
      expand_on(product_threads, f, out64, buffers.t, n64, scaling, c);
    }
    if (bias) {
      for (size_t i = 0; i < n; ++i) {
        float* row = c + i * out;
        for (size_t j = 0; j < out; ++j) row[j] += scaling * bias[j];
      }
    }

    if (!y_in_place) {
      for_each_run(rows, k0, n, [&](size_t row, size_t position, size_t length) {
        convert(DType::F32, c + position * out, batch.y_dtype, y_bytes + row * out * y_size, length * out);
      });
    }
  }
}

}  // namespace

void apply_lora(std::span<const std::optional<LoraFactors>> groups, const LoraBatch& batch) {
  // ---- checks: nothing is written before all of them pass ----
  if (groups.empty()) fail(PEFT_ERR_INVALID_ARGUMENT, "no adapters given");
  if (!is_supported(batch.x_dtype)) fail_dtype(batch.x_dtype, "x");
  if (!is_supported(batch.y_dtype)) fail_dtype(batch.y_dtype, "y");
  if (!is_dimension(batch.in_features)) fail_dimension(batch.in_features, "in_features");
  if (!is_dimension(batch.out_features)) fail_dimension(batch.out_features, "out_features");
  const size_t x_bytes = byte_size(batch.rows, batch.in_features, batch.x_dtype, "x");
  const size_t y_bytes = byte_size(batch.rows, batch.out_features, batch.y_dtype, "y");
  if (batch.rows > 0 && batch.x == nullptr) fail(PEFT_ERR_INVALID_ARGUMENT, "x must not be NULL");
  if (batch.rows > 0 && batch.y == nullptr) fail(PEFT_ERR_INVALID_ARGUMENT, "y must not be NULL");
  const auto x_begin = reinterpret_cast<uintptr_t>(batch.x), y_begin = reinterpret_cast<uintptr_t>(batch.y);
  if (batch.rows > 0 && x_begin < y_begin + y_bytes && y_begin < x_begin + x_bytes)
    fail(PEFT_ERR_INVALID_ARGUMENT, "x and y must not overlap");

  size_t bias_floats = 0, max_rank = 0;
  bool dora = false;
  for (size_t g = 0; g < groups.size(); ++g) {
    if (!groups[g]) continue;
    const LoraFactors& f = *groups[g];
    check_factors(f, g);
    const size_t rank = static_cast<size_t>(f.rank);
    max_rank = std::max(max_rank, rank);
    dora = dora || f.dora_scale != nullptr;
    if (f.bias && f.dtype != DType::F32) bias_floats = batch.out_features;
  }
  if (batch.rows == 0) return;

  TrimScratchOnExit trim_scratch;
  const size_t rows = batch.rows, group_count = groups.size();

  // Group the rows (a stable counting sort, so every group's rows stay ascending); this also
  // checks every index before anything is written.
  std::span<const size_t> group_start;  // group g's rows are order[group_start[g] .. group_start[g + 1])
  const size_t* order = nullptr;
  if (batch.row_group) {
    size_t* start = scratch.indices(rows + group_count + 1);
    size_t* place = start + group_count + 1;
    std::fill(start, start + group_count + 1, size_t(0));
    for (size_t i = 0; i < rows; ++i) {
      const int32_t g = batch.row_group[i];
      if (g < -1 || (g >= 0 && static_cast<size_t>(g) >= group_count))
        fail(PEFT_ERR_INVALID_ARGUMENT, "the adapter index of row " + std::to_string(i) + " is " + std::to_string(g) +
                                            "; it must be -1 or from 0 to " + std::to_string(group_count - 1));
      if (g >= 0) ++start[g + 1];
    }
    for (size_t g = 0; g < group_count; ++g) start[g + 1] += start[g];
    // Place row i at the next free slot of its group; start[g] then ends at group g's end, which
    // is group g + 1's start: shift back by one group afterwards.
    for (size_t i = 0; i < rows; ++i) {
      const int32_t g = batch.row_group[i];
      if (g >= 0) place[start[g]++] = i;
    }
    std::copy_backward(start, start + group_count, start + group_count + 1);
    start[0] = 0;
    group_start = {start, group_count + 1};
    order = place;
  }
  if (max_rank == 0) return;  // no adapter has this layer

  // The rows of each group with factors, and the work (multiply-adds) of the call.
  const bool gathered = batch.row_group != nullptr;
  std::vector<Part>& parts = call_parts;
  parts.clear();
  uint64_t work = 0;
  for (size_t g = 0; g < group_count; ++g) {
    const size_t count = gathered ? group_start[g + 1] - group_start[g] : (g == 0 ? rows : 0);
    if (!groups[g] || count == 0) continue;
    parts.push_back({&*groups[g], gathered ? RowSet{order + group_start[g], 0, count} : RowSet{nullptr, 0, rows}});
    work += uint64_t(count) * uint64_t(groups[g]->rank) * (batch.in_features + batch.out_features);
  }
  // From kParallelWork on, each group's rows are split between the cores (each thread reads the
  // factors once for its rows): as many threads as the cores, with at least kParallelWork / 2
  // multiply-adds and kMinRowsPerThread rows of the largest group each.
  const uint64_t cores = core_count();
  unsigned threads = 1;
  if (work >= kParallelWork) {
    size_t most_rows = 0;
    for (const Part& part : parts) most_rows = std::max(most_rows, part.rows.count);
    threads = static_cast<unsigned>(std::max<uint64_t>(
        1, std::min({cores, uint64_t(most_rows / kMinRowsPerThread), work / (kParallelWork / 2)})));
  }
  if (threads > 1) {
    std::vector<Part>& slices = call_slices;
    slices.clear();
    for (const Part& part : parts) {
      const size_t length = (part.rows.count + threads - 1) / threads;
      for (size_t k0 = 0; k0 < part.rows.count; k0 += length)
        slices.push_back({part.factors, part.rows.slice(k0, std::min(length, part.rows.count - k0))});
    }
    parts.swap(slices);
  }

  size_t block = 0;
  for (const Part& part : parts) block = std::max(block, std::min<size_t>(part.rows.count, kBlockRows));
  const size_t x_floats = gathered || !is_f32_in_place(batch.x, batch.x_dtype) ? block * batch.in_features : 0;
  const size_t y_floats = gathered || !is_f32_in_place(batch.y, batch.y_dtype) ? block * batch.out_features : 0;
  const size_t lora_floats = dora ? block * batch.out_features : 0;
  const size_t thread_floats = bias_floats + x_floats + block * max_rank + y_floats + lora_floats;
  float* floats = scratch.floats(thread_floats * threads);
  std::vector<Buffers>& buffers = call_buffers;
  buffers.resize(threads);
  for (unsigned w = 0; w < threads; ++w) {
    Buffers& b = buffers[w];
    b.bias = floats + w * thread_floats;
    b.x = b.bias + bias_floats;
    b.t = b.x + x_floats;
    b.y = b.t + block * max_rank;
    b.lora = b.y + y_floats;
  }

  // A call that does not split its rows, for a group of kSplitWork multiply-adds or more,
  // splits that group's products between the cores instead, with at least kSplitWork / 2 each.
  const auto product_threads = [&](const Part& part) -> unsigned {
    if (threads > 1) return 1;
    const uint64_t group_work =
        uint64_t(part.rows.count) * uint64_t(part.factors->rank) * (batch.in_features + batch.out_features);
    if (group_work < kSplitWork) return 1;
    return static_cast<unsigned>(std::min(cores, group_work / (kSplitWork / 2)));
  };

  // ---- the products ----
  run_parallel(static_cast<int64_t>(parts.size()), threads, [&](int64_t i, unsigned worker) {
    const Part& part = parts[size_t(i)];
    apply_group(*part.factors, part.rows, batch, buffers[worker], product_threads(part));
  });
}

}  // namespace peft::serve
