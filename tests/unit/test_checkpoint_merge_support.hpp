// Helpers of the merge pipeline tests: scratch folders, fixture paths, a plain double-precision
// reference of the LoRA merge (independent of lora_math's kernels), and tensor comparisons.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "core/convert.hpp"
#include "core/dtype.hpp"
#include "peft/adapter/adapter.hpp"
#include "peft/merge/checkpoint_merge.hpp"
#include "checkpoint/checkpoint.hpp"
#include "peft_test_paths.h"

namespace merge_pipeline_test {

namespace fs = std::filesystem;

class Scratch {
 public:
  Scratch() {
    std::string pattern = (fs::temp_directory_path() / "peft_merge_pipeline_XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) std::abort();
    path_ = pattern;
  }
  ~Scratch() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  std::string path(const std::string& name = {}) const { return name.empty() ? path_ : path_ + "/" + name; }

 private:
  std::string path_;
};

inline std::string model(const std::string& name) { return std::string(PEFT_TEST_DATA) + "/models/" + name; }
inline std::string adapter_dir(const std::string& name) { return std::string(PEFT_TEST_DATA) + "/adapters/" + name; }
inline bool fixtures_present() { return fs::exists(model("llama") + "/model.safetensors"); }

inline std::shared_ptr<const peft::Adapter> open_adapter(const std::string& dir, const std::string& base = {}) {
  peft::Adapter::Options options;
  options.base_dir = base;
  return peft::Adapter::open(dir, options);
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

inline peft::CheckpointMergeResult merge(const std::string& base, const std::string& out,
                                         const std::vector<std::pair<std::string, double>>& adapters,
                                         peft::CheckpointMergeOptions options = {}) {
  for (const auto& [dir, weight] : adapters) options.adapters.push_back({open_adapter(dir, base), weight});
  return peft::merge_checkpoint(base, out, options);
}

// A tensor of a checkpoint as doubles (by name).
inline std::vector<double> values(const peft::Checkpoint& ckpt, const std::string& name) {
  auto index = ckpt.find(name);
  if (!index) throw std::runtime_error("no tensor " + name);
  std::vector<float> f = ckpt.read_f32(*index);
  return std::vector<double>(f.begin(), f.end());
}

inline std::vector<uint8_t> raw(const peft::Checkpoint& ckpt, const std::string& name) {
  auto index = ckpt.find(name);
  if (!index) throw std::runtime_error("no tensor " + name);
  auto view = ckpt.view(*index);
  return std::vector<uint8_t>(view.begin(), view.end());
}

// W + c * (B @ A) in storage layout, in double: transposed for Conv1D and embeddings.
inline void add_reference_delta(std::vector<double>& w, const std::vector<double>& a, const std::vector<double>& b,
                                int64_t out, int64_t in, int64_t rank, double c, bool transposed) {
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; ++i) {
      double d = 0;
      for (int64_t k = 0; k < rank; ++k) d += b[o * rank + k] * a[k * in + i];
      const int64_t at = transposed ? i * out + o : o * in + i;
      w[at] += c * d;
    }
}

// Largest |x - y| / max|y|.
inline double max_relative(const std::vector<double>& x, const std::vector<double>& y) {
  double scale = 0, diff = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    scale = std::max(scale, std::abs(y[i]));
    diff = std::max(diff, std::abs(x[i] - y[i]));
  }
  return scale == 0 ? diff : diff / scale;
}

// The value rounded to `dtype` (F32, BF16, F16) and back, through the library's conversion.
inline double rounded(double v, peft::DType dtype) {
  float f = static_cast<float>(v);
  if (dtype == peft::DType::F32) return f;
  uint16_t h;
  peft::convert(peft::DType::F32, &f, dtype, &h, 1);
  float back;
  peft::convert(dtype, &h, peft::DType::F32, &back, 1);
  return back;
}

// The distance in units in the last place of `dtype` between two representable values.
inline double ulps(double x, double y, peft::DType dtype) {
  const int mantissa = dtype == peft::DType::BF16 ? 7 : dtype == peft::DType::F16 ? 10 : 23;
  const double m = std::max(std::abs(x), std::abs(y));
  if (m == 0) return 0;
  int e;
  std::frexp(m, &e);
  const double ulp = std::ldexp(1.0, std::max(e - 1 - mantissa, dtype == peft::DType::F16 ? -24 : -149));
  return std::abs(x - y) / ulp;
}

}  // namespace merge_pipeline_test
