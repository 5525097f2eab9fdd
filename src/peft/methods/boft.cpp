// BOFT (peft/tuners/boft/layer.py, Linear.get_delta_weight and merge): W' = (W @ M^T) * boft_s with
// M = B_(N-1) ... B_0, B_i = P_i D_i P_i^T, D_i block diagonal of Cayley transforms of
// 0.5 (R - R^T) and P_i the butterfly permutation rebuilt as BOFTLayer.block_butterfly_perm does.
// N, the block count D and the block size H are boft_R's shape [N, D, H, H]: PEFT without its CUDA
// extension trains N = 1 whatever boft_n_butterfly_factor says, so the tensor, not the config, decides.
#include "core/no_fp_contract.hpp"  // first: before any inline arithmetic of the headers below

#include "peft/methods/method_shapes.hpp"
#include "peft/methods/peft_methods.hpp"

namespace peft::merge {

namespace {

// block_butterfly_perm(n, b, r, n_butterfly_factor): identity for factor 0; otherwise within each
// of the b blocks of n / b indices, the r-sized groups reordered evens first, then odds.
std::vector<int64_t> butterfly_perm(int64_t n, int64_t b, int64_t r, int64_t factor, std::string_view name) {
  std::vector<int64_t> indices(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) indices[static_cast<size_t>(i)] = i;
  if (factor == 0) return indices;
  if (b < 1 || r < 1 || b * r * 2 > n || n % b != 0)
    fail(PEFT_ERR_SHAPE_MISMATCH, "module " + peft::quoted(std::string(name)) +
                                      ": boft_R's butterfly factors do not fit the layer (invalid number of blocks)");
  const int64_t block = n / b;
  // sort_block(block, r): step = block / r groups; sorted_seq = evens then odds of arange(step).
  std::vector<int64_t> order(static_cast<size_t>(block));
  for (int64_t i = 0; i < block; ++i) order[static_cast<size_t>(i)] = i;
  const double step = static_cast<double>(block) / static_cast<double>(r);
  std::vector<int64_t> seq;
  for (int64_t p = 0; static_cast<double>(p) < step; p += 2) seq.push_back(p);
  for (int64_t p = 1; static_cast<double>(p) < step; p += 2) seq.push_back(p);
  std::vector<int64_t> sorted = order;
  for (size_t i = 0; i < seq.size(); ++i)
    for (int64_t k = 0; k < r; ++k) {
      const int64_t dst = static_cast<int64_t>(i) * r + k, src = seq[i] * r + k;
      if (dst < block && src < block) sorted[static_cast<size_t>(dst)] = order[static_cast<size_t>(src)];
    }
  for (int64_t start = 0; start < n; start += block) {
    std::vector<int64_t> tmp(indices.begin() + start, indices.begin() + start + block);
    for (int64_t i = 0; i < block; ++i)
      indices[static_cast<size_t>(start + i)] = tmp[static_cast<size_t>(sorted[static_cast<size_t>(i)])];
  }
  return indices;
}

}  // namespace

InputTransform boft_transform(const MethodTensor& boft_r, const MethodTensor& boft_s, int64_t out, int64_t in,
                              bool inverse, std::string_view name) {
  const std::string who = "module " + peft::quoted(std::string(name));
  const auto& sh = boft_r.shape;
  if (sh.size() != 4 || sh[0] < 1 || sh[1] < 1 || sh[2] < 1 || sh[2] != sh[3] || sh[1] * sh[2] != in ||
      static_cast<int64_t>(boft_r.values.size()) != sh[0] * sh[1] * sh[2] * sh[3])
    fail(PEFT_ERR_SHAPE_MISMATCH, who + ": boft_R is " + shape_text(sh) + ", the layer needs [N, D, H, H] with D * H = " +
                                      std::to_string(in) + " input features");
  detail::expect_shape(boft_s, out, 1, name, "boft_s");
  const int64_t n = sh[0], d = sh[1], h = sh[2];
  InputTransform t;
  t.in = in;
  std::vector<std::vector<int64_t>> perms, inverses;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t blocks = d >> i;
    if (blocks << i != d)
      fail(PEFT_ERR_SHAPE_MISMATCH, who + ": boft_R " + shape_text(sh) + ": " + std::to_string(d) +
                                        " blocks cannot be halved for " + std::to_string(n) + " butterfly factors");
    perms.push_back(butterfly_perm(in, blocks, h / 2, n - 1, name));
    std::vector<int64_t> inv(static_cast<size_t>(in));
    for (int64_t k = 0; k < in; ++k) inv[static_cast<size_t>(perms.back()[static_cast<size_t>(k)])] = k;
    inverses.push_back(std::move(inv));
  }
  auto factor_steps = [&](int64_t i) {
    // x @ B_i^T = x @ P D^T P^T (merge) or x @ B_i = x @ P D P^T (PEFT's unmerge, M^T).
    TransformStep to, blocks, back;
    to.kind = back.kind = TransformStep::Kind::permute;
    to.index = inverses[static_cast<size_t>(i)];  // (x P)[perm[k]] = x[k]
    back.index = perms[static_cast<size_t>(i)];   // (y P^T)[k] = y[perm[k]]
    blocks.kind = TransformStep::Kind::blocks;
    blocks.size = h;
    blocks.count = d;
    for (int64_t k = 0; k < d; ++k) {
      const float* raw = boft_r.values.data() + (i * d + k) * h * h;
      std::vector<double> s(static_cast<size_t>(h * h));
      for (int64_t r = 0; r < h; ++r)
        for (int64_t c = 0; c < h; ++c)
          s[r * h + c] = 0.5 * (static_cast<double>(raw[r * h + c]) - static_cast<double>(raw[c * h + r]));
      const std::vector<double> q = cayley_f64(s, h, name);
      // The blocks step computes x @ block^T: pass Q for x @ Q^T, Q^T for x @ Q.
      for (int64_t r = 0; r < h; ++r)
        for (int64_t c = 0; c < h; ++c) blocks.values.push_back(inverse ? q[c * h + r] : q[r * h + c]);
    }
    t.steps.push_back(std::move(to));
    t.steps.push_back(std::move(blocks));
    t.steps.push_back(std::move(back));
  };
  if (inverse) {
    for (int64_t i = n; i-- > 0;) factor_steps(i);
  } else {
    for (int64_t i = 0; i < n; ++i) factor_steps(i);
  }
  t.out_scale = boft_s.values;
  if (inverse)
    for (float& s : t.out_scale) s = 1.0f / s;  // orig_weight * (1 / boft_s)
  return t;
}

}  // namespace peft::merge
