#include "peft/kernels/truncated_svd.hpp"

#include <cblas.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <mutex>
#include <random>

#include "core/error.hpp"

// LAPACK's Fortran entry points, as the BLAS/LAPACK library exports them (OpenBLAS bundles LAPACK).
extern "C" {
void sgesdd_(const char* jobz, const int* m, const int* n, float* a, const int* lda, float* s, float* u,
             const int* ldu, float* vt, const int* ldvt, float* work, const int* lwork, int* iwork, int* info);
void sgeqrf_(const int* m, const int* n, float* a, const int* lda, float* tau, float* work, const int* lwork,
             int* info);
void sorgqr_(const int* m, const int* n, const int* k, float* a, const int* lda, const float* tau, float* work,
             const int* lwork, int* info);
#if defined(__ELF__)
// OpenBLAS's thread count, when the BLAS loaded is OpenBLAS (weak: null with another BLAS).
int openblas_get_num_threads(void) __attribute__((weak));
void openblas_set_num_threads(int threads) __attribute__((weak));
#endif
}

namespace peft::merge {
namespace {

int lapack_int(int64_t v, const std::string& who) {
  if (v > INT_MAX) fail(PEFT_ERR_UNSUPPORTED, who + ": a dimension of " + std::to_string(v) + " is too large for LAPACK");
  return static_cast<int>(v);
}

int workspace_size(float query, const std::string& who) {
  const double n = std::ceil(static_cast<double>(query));
  if (!(n < static_cast<double>(INT_MAX))) fail(PEFT_ERR_UNSUPPORTED, who + ": LAPACK's workspace is too large");
  return std::max(1, static_cast<int>(n));
}

// The SVD of the column-major matrix x [m, n] (overwritten): s (k = min(m, n) values, descending),
// u [m, k] and vt [k, n], column-major.
void gesdd(float* x, int m, int n, std::vector<float>& s, std::vector<float>& u, std::vector<float>& vt,
           const std::string& who) {
  const int k = std::min(m, n);
  s.assign(static_cast<size_t>(k), 0.0f);
  u.assign(static_cast<size_t>(m) * static_cast<size_t>(k), 0.0f);
  vt.assign(static_cast<size_t>(k) * static_cast<size_t>(n), 0.0f);
  std::vector<int> iwork(8 * static_cast<size_t>(k));
  const char jobz = 'S';
  int info = 0, lwork = -1;
  float query = 0;
  sgesdd_(&jobz, &m, &n, x, &m, s.data(), u.data(), &m, vt.data(), &k, &query, &lwork, iwork.data(), &info);
  if (info != 0) fail(PEFT_ERR_INTERNAL, who + ": LAPACK sgesdd workspace query failed (info " + std::to_string(info) + ")");
  lwork = workspace_size(query, who);
  std::vector<float> work(static_cast<size_t>(lwork));
  sgesdd_(&jobz, &m, &n, x, &m, s.data(), u.data(), &m, vt.data(), &k, work.data(), &lwork, iwork.data(), &info);
  if (info != 0)
    fail(PEFT_ERR_INTERNAL, who + ": LAPACK sgesdd failed (info " + std::to_string(info) + ", " +
                                (info > 0 ? "no convergence" : "bad argument") + ")");
}

// Replaces the column-major y [m, l] (m >= l) by an orthonormal basis of its columns.
void orthonormalise(std::vector<float>& y, int m, int l, const std::string& who) {
  std::vector<float> tau(static_cast<size_t>(l));
  int info = 0, lwork = -1;
  float query = 0;
  sgeqrf_(&m, &l, y.data(), &m, tau.data(), &query, &lwork, &info);
  lwork = workspace_size(query, who);
  std::vector<float> work(static_cast<size_t>(lwork));
  sgeqrf_(&m, &l, y.data(), &m, tau.data(), work.data(), &lwork, &info);
  if (info != 0) fail(PEFT_ERR_INTERNAL, who + ": LAPACK sgeqrf failed (info " + std::to_string(info) + ")");
  lwork = -1;
  sorgqr_(&m, &l, &l, y.data(), &m, tau.data(), &query, &lwork, &info);
  lwork = workspace_size(query, who);
  work.assign(static_cast<size_t>(lwork), 0.0f);
  sorgqr_(&m, &l, &l, y.data(), &m, tau.data(), work.data(), &lwork, &info);
  if (info != 0) fail(PEFT_ERR_INTERNAL, who + ": LAPACK sorgqr failed (info " + std::to_string(info) + ")");
}

// PEFT's _find_cutoff_index: the smallest k with cumsum(s^2)[k-1] >= energy * total, at least 1.
// nullopt-like -1 when the values given never reach it.
int64_t energy_rank(const std::vector<float>& s, double energy, double total) {
  const double cutoff = energy * total;
  double sum = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    sum += static_cast<double>(s[i]) * static_cast<double>(s[i]);
    if (sum >= cutoff) return static_cast<int64_t>(i) + 1;
  }
  return -1;
}

double squared_norm(const float* x, size_t n) {
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  return sum;
}

// From the SVD of X = M^T (column-major [cols, rows] = M row-major): u [cols, k] column-major is
// V, whose first r columns are A's rows; vt [k, rows] column-major is U^T, i.e. U row-major
// [rows, k] with leading dimension k.
LowRankFactors take_factors(const std::vector<float>& s, const std::vector<float>& v_cols,
                            const std::vector<float>& u_rows, int64_t rows, int64_t cols, int64_t k, int64_t r) {
  LowRankFactors f;
  f.rank = r;
  f.a.assign(v_cols.begin(), v_cols.begin() + static_cast<ptrdiff_t>(r * cols));
  f.b.resize(static_cast<size_t>(rows * r));
  for (int64_t j = 0; j < rows; ++j)
    for (int64_t i = 0; i < r; ++i)
      f.b[static_cast<size_t>(j * r + i)] = u_rows[static_cast<size_t>(j * k + i)] * s[static_cast<size_t>(i)];
  return f;
}

LowRankFactors exact(std::vector<float>& m, int64_t rows, int64_t cols, const RankChoice& choice,
                     const std::string& who) {
  const int n_rows = lapack_int(rows, who), n_cols = lapack_int(cols, who);
  std::vector<float> s, v_cols, u_rows;
  gesdd(m.data(), n_cols, n_rows, s, v_cols, u_rows, who);
  const int64_t k = static_cast<int64_t>(s.size());
  double total = 0;
  for (float x : s) total += static_cast<double>(x) * static_cast<double>(x);
  int64_t r = choice.rank;
  if (r == 0) {
    r = energy_rank(s, choice.energy, total);
    if (r < 0) r = k;  // rounding kept the cumulative sum below the cutoff: every value
  }
  LowRankFactors f = take_factors(s, v_cols, u_rows, rows, cols, k, r);
  double tail = 0;
  for (int64_t i = r; i < k; ++i) tail += static_cast<double>(s[static_cast<size_t>(i)]) * s[static_cast<size_t>(i)];
  f.relative_error = total > 0 ? std::sqrt(tail / total) : 0.0;
  return f;
}

}  // namespace

LowRankFactors truncated_svd(std::vector<float>& m, int64_t rows, int64_t cols, const RankChoice& choice,
                             SvdMethod method, const std::string& who) {
  if (rows < 1 || cols < 1 || m.size() != static_cast<size_t>(rows * cols))
    fail(PEFT_ERR_INTERNAL, who + ": matrix size does not match its shape");
  const int64_t k = std::min(rows, cols);
  if (choice.rank < 0 || choice.rank > k)
    fail(PEFT_ERR_INVALID_ARGUMENT, who + ": the chosen rank " + std::to_string(choice.rank) +
                                        " is larger than the weight shape allows (" + std::to_string(rows) + " x " +
                                        std::to_string(cols) + ", at most " + std::to_string(k) + ")");
  if (choice.rank == 0 && !(choice.energy > 0.0 && choice.energy <= 1.0))
    fail(PEFT_ERR_INVALID_ARGUMENT, who + ": the energy fraction must be in (0, 1]");
  for (float x : m)
    if (!std::isfinite(x)) fail(PEFT_ERR_NON_FINITE, who + ": the matrix holds an infinity or NaN");
  const int64_t sketch = (choice.rank > 0 ? choice.rank : k) + 10;
  if (method == SvdMethod::exact || 2 * sketch > k) return exact(m, rows, cols, choice, who);

  // Randomized, on X = M^T: column-major [cols, rows], the same bytes as M.
  const int n = lapack_int(cols, who), p = lapack_int(rows, who), l = static_cast<int>(sketch);
  const double total = squared_norm(m.data(), m.size());
  std::mt19937 gen(20250218u);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> omega(static_cast<size_t>(p) * static_cast<size_t>(l));
  for (float& x : omega) x = normal(gen);
  std::vector<float> y(static_cast<size_t>(n) * static_cast<size_t>(l));   // X omega: [n, l]
  std::vector<float> z(static_cast<size_t>(p) * static_cast<size_t>(l));   // X^T y: [p, l]
  cblas_sgemm(CblasColMajor, CblasNoTrans, CblasNoTrans, n, l, p, 1.0f, m.data(), n, omega.data(), p, 0.0f, y.data(), n);
  orthonormalise(y, n, l, who);
  for (int it = 0; it < 2; ++it) {
    cblas_sgemm(CblasColMajor, CblasTrans, CblasNoTrans, p, l, n, 1.0f, m.data(), n, y.data(), n, 0.0f, z.data(), p);
    orthonormalise(z, p, l, who);
    cblas_sgemm(CblasColMajor, CblasNoTrans, CblasNoTrans, n, l, p, 1.0f, m.data(), n, z.data(), p, 0.0f, y.data(), n);
    orthonormalise(y, n, l, who);
  }
  // Small = Q^T X: [l, p]; its SVD Ub S Vbt; X ~ (Q Ub) S Vbt.
  std::vector<float> small(static_cast<size_t>(l) * static_cast<size_t>(p));
  cblas_sgemm(CblasColMajor, CblasTrans, CblasNoTrans, l, p, n, 1.0f, y.data(), n, m.data(), n, 0.0f, small.data(), l);
  std::vector<float> s, ub, vbt;
  gesdd(small.data(), l, p, s, ub, vbt, who);  // ub [l, l], vbt [l, p]
  int64_t r = choice.rank;
  if (r == 0) {
    r = energy_rank(s, choice.energy, total);
    if (r < 0) return exact(m, rows, cols, choice, who);  // the sketch misses part of the energy
  }
  std::vector<float> qub(static_cast<size_t>(n) * static_cast<size_t>(l));  // Q Ub: [n, l] = V
  cblas_sgemm(CblasColMajor, CblasNoTrans, CblasNoTrans, n, l, l, 1.0f, y.data(), n, ub.data(), l, 0.0f, qub.data(), n);
  LowRankFactors f = take_factors(s, qub, vbt, rows, cols, l, r);
  double kept = 0;
  for (int64_t i = 0; i < r; ++i) kept += static_cast<double>(s[static_cast<size_t>(i)]) * s[static_cast<size_t>(i)];
  f.relative_error = total > 0 ? std::sqrt(std::max(0.0, 1.0 - kept / total)) : 0.0;
  return f;
}

namespace {
std::mutex blas_threads_mutex;
int blas_threads_holders = 0;  // BlasOnCallingThread objects held; guarded by the mutex
int blas_threads_saved = 0;    // OpenBLAS's thread count before the first of them
}  // namespace

BlasOnCallingThread::BlasOnCallingThread(bool active) {
#if defined(__ELF__)
  if (!active || openblas_get_num_threads == nullptr || openblas_set_num_threads == nullptr) return;
  const std::lock_guard<std::mutex> lock(blas_threads_mutex);
  if (blas_threads_holders++ == 0) {
    blas_threads_saved = openblas_get_num_threads();
    if (blas_threads_saved > 1) openblas_set_num_threads(1);
  }
  held_ = true;
#else
  (void)active;
#endif
}

BlasOnCallingThread::~BlasOnCallingThread() {
#if defined(__ELF__)
  if (!held_) return;
  const std::lock_guard<std::mutex> lock(blas_threads_mutex);
  if (--blas_threads_holders == 0 && blas_threads_saved > 1) openblas_set_num_threads(blas_threads_saved);
#endif
}

}  // namespace peft::merge
