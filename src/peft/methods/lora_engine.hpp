// Shared machinery of lora_delta.cpp and lora_dora.cpp: validated, kernel-ready LoRA terms and
// a parallel walk over blocks of weight rows that hands each row its slice of the delta. Internal.
#pragma once

#include <cstdint>
#include <cstring>
#include <mutex>
#include <span>
#include <vector>

#include "core/error.hpp"
#include "peft/kernels/merge_kernels.hpp"
#include "peft/kernels/merge_parallel.hpp"
#include "peft/methods/lora_math.hpp"

namespace peft::merge::detail {

// The kernel storage type of a dtype; UNSUPPORTED for anything but F32, BF16, F16.
kernels::Storage storage_of(DType dtype, const char* what);

// Rows per block for a delta of `cols` columns and total rank `rank`: a multiple of 4.
int64_t block_rows_for(int64_t cols, int64_t rank);

// Terms in the orientation of storage: delta rows = sum_t coef_t * L_t @ R_t with L_t
// [rows x rank_t] and R_t [rank_t x cols], both row-major. For transposed layouts L = A^T and
// R = B^T are copies owned here; otherwise they point at the caller's B and A.
struct PreparedTerms {
  struct Term {
    const float* L;
    const float* R;
    int64_t rank;
    float coef;
  };
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<Term> terms;
  std::vector<std::vector<float>> owned;
  int64_t total_rank = 0;

  // Arithmetic::ggml (one term only): delta_rows gives float(float(sum_k double(L * R)) * coef).
  bool ggml = false;

  int64_t block_rows() const { return block_rows_for(cols, total_rank); }

  // Writes delta rows [row0, row0 + count) into out[count * cols].
  void delta_rows(const kernels::Table& k, int64_t row0, int64_t count, float* out) const {
    if (ggml) return ggml_delta_rows(row0, count, out);
    for (size_t t = 0; t < terms.size(); ++t) {
      const Term& term = terms[t];
      k.lowrank(term.L + row0 * term.rank, term.R, count, cols, term.rank, term.coef, t > 0, out);
    }
  }

  // The ggml order of terms[0] (lora_delta.cpp, compiled without floating-point contraction).
  void ggml_delta_rows(int64_t row0, int64_t count, float* out) const;
};

// Validates the terms against the layout (non-null factors, rank >= 1, at least one term, sizes
// that fit memory) and prepares them. `negate` flips every coefficient (exact).
PreparedTerms prepare(const DeltaLayout& layout, std::span<const LoraFactors> terms, bool negate);

// Checks that a buffer matches the layout's storage shape and has a supported dtype.
kernels::Storage check_view(const ConstWeightView& view, int64_t rows, int64_t cols, const char* what);


// Threads for a job over rows x cols elements (one for small jobs).
unsigned threads_for(const ExecOptions& exec, int64_t rows, int64_t cols, int64_t blocks);

// Calls op(row, w, from, delta_row) for every row of the weight, in parallel over blocks of rows;
// op writes the row w from the row `from`: w itself (in place), or with exec.source the row of the
// source buffer (no sink then: INTERNAL). When a row sink is set, or the buffer is not aligned to
// its element size, each row is staged through aligned scratch (copied from the source first), and
// the sink gets the original bytes of every row whose bytes changed.
template <class RowOp>
void for_each_row(const WeightView& weight, kernels::Storage storage, const PreparedTerms& prepared,
                  const ExecOptions& exec, RowOp&& op) {
  const kernels::Table& k = kernels::active();
  const int64_t rows = prepared.rows, cols = prepared.cols;
  const size_t esize = kernels::storage_bytes(storage);
  const size_t row_bytes = static_cast<size_t>(cols) * esize;
  const bool misaligned = reinterpret_cast<uintptr_t>(weight.data) % esize != 0;
  const bool staged = misaligned || exec.row_sink != nullptr;
  const int64_t block_rows = prepared.block_rows();
  const int64_t blocks = (rows + block_rows - 1) / block_rows;
  const unsigned threads = threads_for(exec, rows, cols, blocks);

  struct Scratch {
    std::vector<float> delta;
    std::vector<unsigned char> original, work;
  };
  std::vector<Scratch> scratch(threads);
  std::mutex sink_mutex;
  auto* base = static_cast<unsigned char*>(weight.data);
  const auto* source = static_cast<const unsigned char*>(exec.source);
  if (source != nullptr && exec.row_sink != nullptr)
    fail(PEFT_ERR_INTERNAL, "a merge from a source buffer cannot also save the rows it changes");

  parallel_tasks(blocks, threads, [&](int64_t block, unsigned worker) {
    Scratch& s = scratch[worker];
    const int64_t row0 = block * block_rows;
    const int64_t count = std::min(block_rows, rows - row0);
    s.delta.resize(static_cast<size_t>(count * cols));
    prepared.delta_rows(k, row0, count, s.delta.data());
    if (staged) {
      // std::vector storage comes from operator new, aligned for any element type.
      s.original.resize(row_bytes);
      s.work.resize(row_bytes);
    }
    for (int64_t r = 0; r < count; ++r) {
      unsigned char* row = base + static_cast<size_t>(row0 + r) * row_bytes;
      const float* d = s.delta.data() + r * cols;
      const unsigned char* from = source != nullptr ? source + static_cast<size_t>(row0 + r) * row_bytes : row;
      if (!staged) {
        op(row0 + r, static_cast<void*>(row), static_cast<const void*>(from), d);
        continue;
      }
      if (source != nullptr) std::memcpy(row, from, row_bytes);
      std::memcpy(s.original.data(), row, row_bytes);
      std::memcpy(s.work.data(), row, row_bytes);
      op(row0 + r, static_cast<void*>(s.work.data()), static_cast<const void*>(s.work.data()), d);
      if (std::memcmp(s.work.data(), s.original.data(), row_bytes) == 0) continue;
      if (exec.row_sink != nullptr) {
        std::lock_guard<std::mutex> lock(sink_mutex);
        (*exec.row_sink)(row0 + r, s.original.data(), row_bytes);
      }
      std::memcpy(row, s.work.data(), row_bytes);
    }
  });
}

// Read-only walk on the calling thread: op(row, row_bytes, delta_row) for rows [row_begin,
// row_end), block by block, with the caller's scratch; rows are staged when misaligned.
template <class RowOp>
void for_each_row_readonly(const ConstWeightView& weight, kernels::Storage storage, const PreparedTerms& prepared,
                           int64_t row_begin, int64_t row_end, std::vector<float>& delta,
                           std::vector<unsigned char>& stage, RowOp&& op) {
  const kernels::Table& k = kernels::active();
  const int64_t cols = prepared.cols;
  const size_t esize = kernels::storage_bytes(storage);
  const size_t row_bytes = static_cast<size_t>(cols) * esize;
  const bool misaligned = reinterpret_cast<uintptr_t>(weight.data) % esize != 0;
  const int64_t block_rows = prepared.block_rows();
  const auto* base = static_cast<const unsigned char*>(weight.data);
  for (int64_t row0 = row_begin; row0 < row_end; row0 += block_rows) {
    const int64_t count = std::min(block_rows, row_end - row0);
    delta.resize(static_cast<size_t>(count * cols));
    prepared.delta_rows(k, row0, count, delta.data());
    for (int64_t r = 0; r < count; ++r) {
      const unsigned char* row = base + static_cast<size_t>(row0 + r) * row_bytes;
      if (misaligned) {
        stage.resize(row_bytes);
        std::memcpy(stage.data(), row, row_bytes);
        row = stage.data();
      }
      op(row0 + r, static_cast<const void*>(row), delta.data() + r * cols);
    }
  }
}

}  // namespace peft::merge::detail
