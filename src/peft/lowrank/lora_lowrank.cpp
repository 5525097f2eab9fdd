#include "peft/lowrank/lora_lowrank.hpp"

#include <algorithm>
#include <set>

#include "core/error.hpp"
#include "core/shape.hpp"
#include "core/text.hpp"
#include "peft/arch/key_grammar.hpp"
#include "peft/export/adapter_export.hpp"
#include "peft/kernels/merge_parallel.hpp"
#include "safetensors/writer.hpp"

namespace peft {
namespace {

using Json = nlohmann::ordered_json;

struct Result {
  bool present = false;
  LowRankModule report;
  int64_t rows = 0, cols = 0;  // of the stored dW
  std::vector<float> a, b;     // PEFT's lora_A [rank, in] and lora_B [out, rank]
  std::vector<float> bias;     // lora_B.bias [out], when the adapter has lora_bias
};

void factor(const DeltaSource& source, const LowRankOptions& options, Result& out) {
  if (source.bias) out.bias = source.bias();
  if (source.exact) {
    const int64_t rank = source.exact(out.a, out.b);
    out.present = true;
    out.report = {source.name, rank, 0.0};
    out.rows = static_cast<int64_t>(out.b.size()) / rank;
    out.cols = static_cast<int64_t>(out.a.size()) / rank;
    return;
  }
  int64_t rows = 0, cols = 0;
  std::optional<std::vector<float>> delta = source.make(rows, cols);
  if (!delta) return;
  merge::LowRankFactors f =
      merge::truncated_svd(*delta, rows, cols, options.choice, options.method, "module " + peft::quoted(source.name));
  delta.reset();
  out.present = true;
  out.report = {source.name, f.rank, f.relative_error};
  out.rows = rows;
  out.cols = cols;
  if (source.conv1d) {  // stored [in, out]: B' = U S [in, r], A' = V^T [r, out]; A = B'^T, B = A'^T
    out.a = transposed(f.b, static_cast<uint64_t>(rows), static_cast<uint64_t>(f.rank));
    out.b = transposed(f.a, static_cast<uint64_t>(f.rank), static_cast<uint64_t>(cols));
  } else {
    out.a = std::move(f.a);
    out.b = std::move(f.b);
  }
}

}  // namespace

void check_lowrank_options(const LowRankOptions& options) {
  const bool rank = options.choice.rank > 0, energy = options.choice.energy != 0.0;
  if (options.choice.rank < 0) fail(PEFT_ERR_INVALID_ARGUMENT, "the rank must be at least 1");
  if (rank == energy)
    fail(PEFT_ERR_INVALID_ARGUMENT, "choose either a rank or an energy fraction for the truncated SVD");
  if (energy && !(options.choice.energy > 0.0 && options.choice.energy <= 1.0))
    fail(PEFT_ERR_INVALID_ARGUMENT, "the energy fraction must be in (0, 1]");
  if (options.dtype && *options.dtype != DType::F32 && *options.dtype != DType::BF16 && *options.dtype != DType::F16)
    fail(PEFT_ERR_INVALID_ARGUMENT, "factors are written as F32, BF16 or F16");
}

std::vector<LowRankModule> write_lowrank_adapter(const std::vector<DeltaSource>& sources, Json config,
                                                 const std::string& out_dir, const LowRankOptions& options) {
  check_lowrank_options(options);
  std::vector<Result> results(sources.size());
  const auto count = static_cast<int64_t>(sources.size());
  const unsigned workers = merge::worker_count(options.threads, count);
  const merge::BlasOnCallingThread blas_on_workers(workers > 1);
  merge::parallel_tasks(count, workers, [&](int64_t i, unsigned) {
    factor(sources[static_cast<size_t>(i)], options, results[static_cast<size_t>(i)]);
  });

  std::vector<LowRankModule> report;
  bool conv1d = false;
  for (size_t i = 0; i < results.size(); ++i)
    if (results[i].present) {
      report.push_back(results[i].report);
      conv1d = conv1d || sources[i].conv1d;
    }
  if (report.empty()) fail(PEFT_ERR_INVALID_ARGUMENT, "no module has a weight change to convert");

  // convert_to_lora's config: fixed rank -> names in target_modules; energy (or a regex
  // target_modules) -> every module in rank_pattern and alpha_pattern, r = lora_alpha = 1.
  const bool fixed = options.choice.rank > 0;
  const int64_t r = fixed ? options.choice.rank : 1;
  Json targets = config.contains("target_modules") ? config["target_modules"] : Json::array();
  const bool regex = targets.is_string();
  Json rank_pattern = Json::object(), alpha_pattern = Json::object();
  std::set<std::string> names;
  if (targets.is_array())
    for (const auto& t : targets)
      if (t.is_string()) names.insert(t.get<std::string>());
  // Unlike convert_to_lora, the names also go into a list target_modules with an energy choice:
  // PEFT's own output without a source config has an empty list there, which PEFT cannot load.
  for (const LowRankModule& m : report) {
    if (!regex) names.insert(m.name);
    if (!fixed || regex || m.rank != r) {
      rank_pattern[m.name] = m.rank;
      alpha_pattern[m.name] = m.rank;
    }
  }
  if (!regex) {
    targets = Json::array();
    for (const std::string& n : names) targets.push_back(n);
  }
  config["alpha_pattern"] = alpha_pattern;
  config["fan_in_fan_out"] = conv1d;
  config["lora_alpha"] = r;
  config["r"] = r;
  config["rank_pattern"] = rank_pattern;
  config["target_modules"] = targets;

  const bool lora_bias = config.contains("lora_bias") && config["lora_bias"] == true;
  std::vector<OutputTensor> tensors;
  for (Result& res : results) {
    if (!res.present) continue;
    const Result* p = &res;
    if (lora_bias) {
      const uint64_t out = res.b.size() / static_cast<uint64_t>(res.report.rank);
      if (res.bias.empty()) res.bias.assign(out, 0.0f);
      if (res.bias.size() != out)
        fail(PEFT_ERR_SHAPE_MISMATCH, "module " + peft::quoted(res.report.name) + ": a lora_B.bias of " +
                                          std::to_string(res.bias.size()) + " values for " + std::to_string(out) +
                                          " output features");
      OutputTensor t;
      t.key = peft_saved_key(res.report.name, "lora_B.bias");
      t.dtype = DType::F32;
      t.shape = {out};
      require_finite_output(t.key, p->bias, options.dtype.value_or(DType::F32), true);
      t.write = [p](TensorWriter& writer, const std::string& key) {
        writer.write_tensor(key, DType::F32, p->bias.data(), p->bias.size() * sizeof(float));
      };
      tensors.push_back(std::move(t));
    }
    for (const bool is_a : {true, false}) {
      OutputTensor t;
      t.key = peft_saved_key(res.report.name, is_a ? "lora_A.weight" : "lora_B.weight");
      t.dtype = DType::F32;
      const auto rank = static_cast<uint64_t>(res.report.rank);
      const uint64_t in = res.a.size() / rank, out = res.b.size() / rank;
      t.shape = is_a ? std::vector<uint64_t>{rank, in} : std::vector<uint64_t>{out, rank};
      require_finite_output(t.key, is_a ? p->a : p->b, options.dtype.value_or(DType::F32), true);
      t.write = [p, is_a](TensorWriter& writer, const std::string& key) {
        const std::vector<float>& v = is_a ? p->a : p->b;
        writer.write_tensor(key, DType::F32, v.data(), v.size() * sizeof(float));
      };
      tensors.push_back(std::move(t));
    }
  }
  // json.dumps(sort_keys=True) order, nested objects included.
  const Json sorted = Json::parse(nlohmann::json::parse(config.dump()).dump());
  write_adapter_folder(out_dir, sorted, tensors, options.dtype.value_or(DType::F32));
  return report;
}

}  // namespace peft
