// Truncated SVD of one f32 matrix into LoRA factors, the rule of PEFT's convert_to_lora
// (peft/tuners/lora/conversion.py): with M = U S V^T, B = U[:, :r] * S[:r] and A = V^T[:r], so that
// B @ A is the best rank-r approximation of M in the Frobenius norm.
//
// Numerics: the SVD runs in f32 through LAPACK's sgesdd (divide and conquer, jobz = 'S', from the
// BLAS/LAPACK library the build links, OpenBLAS on Debian), which is what torch.linalg.svd calls
// for an f32 CPU tensor; energies and errors are summed in f64. The randomized method (Halko,
// Martinsson and Tropp 2011, algorithm 4.4: a Gaussian sketch of r + 10 columns, two power
// iterations with re-orthonormalisation by QR, then sgesdd of the small projected matrix) costs
// O(m n (r + 10)) instead of O(m n min(m, n)); its random numbers come from a fixed seed, so results
// are reproducible for a given BLAS build and thread count.
//
// Rank choice, as PEFT's _find_cutoff_index: a fixed rank r, or an energy fraction f in (0, 1]: the
// smallest k with s_0^2 + ... + s_{k-1}^2 >= f * sum s_i^2 (at least 1). With the randomized
// method the total is ||M||_F^2 (exact) and the sketch's values must reach f of it; when they do
// not, the exact SVD is run instead.
//
// The relative error reported is ||M - B A||_F / ||M||_F of the f32 factors, computed from the
// singular values: sqrt(sum_{i >= r} s_i^2 / sum_i s_i^2) for the exact SVD, sqrt(1 - sum_{i < r}
// s_i^2 / ||M||_F^2) for the randomized one (both exact identities for orthonormal factors). It is
// 0 for a zero matrix.
//
// Memory: the matrix (overwritten), U and V^T of min(m, n) columns and LAPACK's workspace for the
// exact method; the sketch and its products for the randomized one.
//
// Thread safety: pure; calls may run concurrently. Callers that run several at once on threads of
// their own hold a BlasOnCallingThread (below) while they do.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace peft::merge {

enum class SvdMethod { exact, randomized };

struct RankChoice {
  int64_t rank = 0;     // > 0: this rank
  double energy = 0.0;  // used when rank is 0: the fraction of squared singular values kept, (0, 1]
};

struct LowRankFactors {
  std::vector<float> a;  // [rank, cols], row-major
  std::vector<float> b;  // [rows, rank], row-major
  int64_t rank = 0;
  double relative_error = 0.0;
};

// Factors the row-major f32 matrix `m` [rows, cols], which it overwrites. `who` names the matrix in
// errors: INVALID_ARGUMENT for a rank above min(rows, cols) (as PEFT refuses it) or an energy outside
// (0, 1]; NON_FINITE when the matrix holds an infinity or NaN; UNSUPPORTED for a matrix LAPACK's
// 32-bit sizes cannot hold; INTERNAL when LAPACK reports a failure (no convergence).
LowRankFactors truncated_svd(std::vector<float>& m, int64_t rows, int64_t cols, const RankChoice& choice,
                             SvdMethod method, const std::string& who);

// While one is held with `active` true (anywhere in the process), OpenBLAS, when it is the BLAS the
// library runs on (its pthreads build; its OpenMP build, which takes the count from OpenMP, was not
// measured), runs each call on the calling thread alone; the last one released gives OpenBLAS
// back its thread count. For SVDs run on several of the library's own workers at once: each of their
// OpenBLAS calls would otherwise also wake OpenBLAS's own pool, one thread per core (two workers on 2
// cores took 2.2x the time of two single-threaded ones, mostly in the scheduler). OpenBLAS 0.3.21 has
// only a process-wide setting, so a host's own OpenBLAS calls in the meantime run single-threaded too
// (documented at peft_lowrank_options_set_threads()). With another BLAS, or none found at run time,
// it does nothing.
class BlasOnCallingThread {
 public:
  explicit BlasOnCallingThread(bool active);
  ~BlasOnCallingThread();
  BlasOnCallingThread(const BlasOnCallingThread&) = delete;
  BlasOnCallingThread& operator=(const BlasOnCallingThread&) = delete;

 private:
  bool held_ = false;
};

}  // namespace peft::merge
