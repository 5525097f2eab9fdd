#include "peft/combine/delta_combine.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>

#include "core/error.hpp"
#include "core/file_identity.hpp"
#include "core/text.hpp"
#include "peft/adapter/expert_modules.hpp"
#include "peft/base/base_model.hpp"
#include "peft/lowrank/adapter_delta.hpp"
#include "peft/methods/lora_math.hpp"
#include "peft/methods/method_table.hpp"

namespace peft {
namespace {

using Json = nlohmann::ordered_json;


struct Module {
  std::string name;
  bool conv1d = false;
  std::vector<CombinePart> parts;
};

class DeltaCombiner {
 public:
  DeltaCombiner(std::span<const std::shared_ptr<const Adapter>> adapters, std::span<const double> weights,
                merge::TaskSettings task, const LowRankOptions& options)
      : adapters_(adapters), weights_(weights), task_(task), options_(options) {}

  std::vector<LowRankModule> run(const std::string& out_dir) {
    const std::string base_dir = !options_.base_dir.empty() ? options_.base_dir : adapters_[0]->base_dir();
    if (!base_dir.empty()) base_ = BaseModel::open(base_dir, {});
    collect();
    const bool exact = options_.choice.rank == 0 && options_.choice.energy == 0.0;
    std::vector<DeltaSource> sources;
    int64_t largest = 0;
    for (const Module& m : modules_) {
      DeltaSource s{m.name, m.conv1d, nullptr, nullptr, nullptr};
      if (lora_bias_) s.bias = [this, &m] { return bias(m); };
      if (exact) {
        const int64_t rank = exact_rank(m);
        largest = std::max(largest, rank);
        s.exact = [this, &m](std::vector<float>& a, std::vector<float>& b) { return cat(m, a, b); };
      } else {
        s.make = [this, &m](int64_t& rows, int64_t& cols) -> std::optional<std::vector<float>> {
          return sum(m, rows, cols);
        };
      }
      sources.push_back(std::move(s));
    }
    LowRankOptions written = options_;
    if (exact) written.choice.rank = largest;  // the config's r; modules of other ranks go into the patterns
    return write_lowrank_adapter(sources, config(), out_dir, written);
  }

 private:
  const Adapter& adapter(size_t i) const { return *adapters_[i]; }
  const BaseModel* base() const { return base_ ? &*base_ : nullptr; }

  void collect() {
    std::map<std::string, size_t, std::less<>> index;
    for (size_t i = 0; i < adapters_.size(); ++i) {
      const Adapter& a = adapter(i);
      const std::string who = combine_input_name(a, i);
      if (a.config().use_dora)
        fail(PEFT_ERR_UNSUPPORTED, who + " uses DoRA: its change rescales W + dW by a magnitude per output row, "
                                         "so it is not a delta that adds to others; merge it into the base instead");
      lora_bias_ = lora_bias_ || a.config().lora_bias;
      if (!std::isfinite(weights_[i]))
        fail(PEFT_ERR_INVALID_ARGUMENT, "the weight of " + who + " is not a finite number");
      for (const AdapterModule& m : a.modules()) {
        std::string why;
        if (!has_module_delta(a, m, base() != nullptr, why, true))
          fail(PEFT_ERR_UNSUPPORTED, who + ": module " + peft::quoted(m.name) + " is " + why);
        auto [it, added] = index.emplace(m.name, modules_.size());
        if (added) modules_.push_back({m.name, m.kind == LayerKind::conv1d, {}});
        modules_[it->second].parts.push_back({i, &m});
      }
    }
    if (modules_.empty()) fail(PEFT_ERR_INVALID_ARGUMENT, "combining deltas: the adapters have no modules");
  }

  // The exact form's rank, or INVALID_ARGUMENT naming why there is none.
  int64_t exact_rank(const Module& m) const {
    if (task_.how != merge::TaskArithmetic::linear)
      fail(PEFT_ERR_INVALID_ARGUMENT, "combining deltas exactly needs \"linear\": pruned deltas have no low-rank "
                                      "factors; choose a rank or an energy fraction");
    int64_t rank = 0;
    for (const CombinePart& p : m.parts) {
      if (method_row(p.module->method).effect != MethodEffect::lora)
        fail(PEFT_ERR_INVALID_ARGUMENT, "module " + peft::quoted(m.name) + " of " +
                                            combine_input_name(adapter(p.adapter), p.adapter) + " is " +
                                            peft_method_name(p.module->method) +
                                            ", whose delta has no exact LoRA factors; choose a rank or an energy fraction");
      if (__builtin_add_overflow(rank, p.module->rank, &rank)) fail(PEFT_ERR_VALIDATION_OVERFLOW, "rank overflows");
    }
    return rank;
  }

  // lora_A rows w_i * s_i * A_i and lora_B columns B_i (merge::combine_cat), Linear order.
  int64_t cat(const Module& m, std::vector<float>& a, std::vector<float>& b) const {
    std::vector<std::vector<float>> storage;
    std::vector<merge::WeightedFactors> factors;
    storage.reserve(2 * m.parts.size());
    int64_t out = 0, in = 0;
    for (const CombinePart& p : m.parts) {
      const Adapter& ad = adapter(p.adapter);
      const AdapterTensor* ta = p.module->find(TensorRole::lora_a);
      const AdapterTensor* tb = p.module->find(TensorRole::lora_b);
      if (ta == nullptr || tb == nullptr)
        fail(PEFT_ERR_INVALID_CHECKPOINT, "module " + peft::quoted(m.name) + " lacks lora_A or lora_B");
      const auto& as = ad.checkpoint().tensor(ta->index).shape;
      const auto& bs = ad.checkpoint().tensor(tb->index).shape;
      if (as.size() != 2 || bs.size() != 2 || as[0] != bs[1] || static_cast<int64_t>(as[0]) != p.module->rank)
        fail(PEFT_ERR_SHAPE_MISMATCH, "module " + peft::quoted(m.name) + ": lora_A " + shape_text(as) + " and lora_B " +
                                          shape_text(bs) + " do not form a product");
      const auto pin = static_cast<int64_t>(as[1]), pout = static_cast<int64_t>(bs[0]);
      if (factors.empty()) {
        out = pout;
        in = pin;
      } else if (pout != out || pin != in) {
        fail(PEFT_ERR_SHAPE_MISMATCH, "module " + peft::quoted(m.name) + " of " +
                                          combine_input_name(ad, p.adapter) + " adapts a " + std::to_string(pout) + " x " +
                                          std::to_string(pin) + " layer, the earlier adapters a " +
                                          std::to_string(out) + " x " + std::to_string(in) + " one");
      }
      storage.push_back(ad.checkpoint().read_f32(ta->index));
      storage.push_back(ad.checkpoint().read_f32(tb->index));
      factors.push_back({storage[storage.size() - 2].data(), storage.back().data(), p.module->rank,
                         p.module->scaling, weights_[p.adapter]});
    }
    merge::CombinedFactors c = merge::combine_cat(factors, out, in);
    a = std::move(c.a);
    b = std::move(c.b);
    return c.rank;
  }

  // The combined delta in storage layout.
  std::vector<float> sum(const Module& m, int64_t& rows, int64_t& cols) const {
    std::vector<std::vector<float>> deltas;
    std::vector<const float*> tensors;
    std::vector<float> weights;
    deltas.reserve(m.parts.size());
    for (const CombinePart& p : m.parts) {
      ModuleDelta d = module_delta(adapter(p.adapter), *p.module, base(), true);
      if (deltas.empty()) {
        rows = d.rows;
        cols = d.cols;
      } else if (d.rows != rows || d.cols != cols) {
        fail(PEFT_ERR_SHAPE_MISMATCH, "module " + peft::quoted(m.name) + " of " +
                                          combine_input_name(adapter(p.adapter), p.adapter) + " changes a " +
                                          std::to_string(d.rows) + " x " + std::to_string(d.cols) +
                                          " weight, the earlier adapters a " + std::to_string(rows) + " x " +
                                          std::to_string(cols) + " one");
      }
      deltas.push_back(std::move(d.values));
      tensors.push_back(deltas.back().data());
      weights.push_back(static_cast<float>(weights_[p.adapter]));
    }
    merge::TaskSettings task = task_;
    task.stream = m.name;
    return merge::combine_task_tensors(tensors, weights, static_cast<size_t>(rows * cols), task, 2);
  }

  // sum_i w_i s_i lora_B.bias_i over the parts that have one (f32 products summed in order, as a
  // merge adds them); empty when none has one (the writer puts zeros).
  std::vector<float> bias(const Module& m) const {
    std::vector<float> sum;
    for (const CombinePart& p : m.parts) {
      const AdapterTensor* t = p.module->find(TensorRole::lora_b_bias);
      if (t == nullptr) continue;
      const std::vector<float> b = adapter(p.adapter).checkpoint().read_f32(t->index);
      if (sum.empty()) sum.assign(b.size(), 0.0f);
      if (b.size() != sum.size())
        fail(PEFT_ERR_SHAPE_MISMATCH, "module " + peft::quoted(m.name) + ": lora_B.bias " + peft::quoted(t->key) +
                                          " has " + std::to_string(b.size()) + " values, another adapter's " +
                                          std::to_string(sum.size()));
      const float c = static_cast<float>(weights_[p.adapter] * p.module->scaling);
      for (size_t j = 0; j < b.size(); ++j) sum[j] += b[j] * c;
    }
    return sum;
  }

  Json config() const {
    const Json& doc = adapter(0).config().document;
    Json c = Json::object();
    c["base_model_name_or_path"] = doc.contains("base_model_name_or_path") ? doc["base_model_name_or_path"] : Json();
    c["bias"] = "none";
    c["inference_mode"] = true;
    c["init_lora_weights"] = true;
    if (lora_bias_) c["lora_bias"] = true;
    c["lora_dropout"] = 0.0;
    c["peft_type"] = "LORA";
    c["target_modules"] = Json::array();  // filled with the modules' names
    c["task_type"] = doc.contains("task_type") ? doc["task_type"] : Json();
    c["use_dora"] = false;
    c["use_rslora"] = false;
    return c;
  }

  std::span<const std::shared_ptr<const Adapter>> adapters_;
  std::span<const double> weights_;
  merge::TaskSettings task_;
  LowRankOptions options_;
  std::optional<BaseModel> base_;
  std::vector<Module> modules_;
  bool lora_bias_ = false;  // some input has lora_bias: so does the output
};

}  // namespace

std::vector<LowRankModule> combine_deltas(std::span<const std::shared_ptr<const Adapter>> adapters,
                                          std::span<const double> weights, CombineMethod method,
                                          const CombineSettings& settings, const LowRankOptions& options,
                                          const std::string& out_dir) {
  if (adapters.empty()) fail(PEFT_ERR_INVALID_ARGUMENT, "combining deltas: no adapters given");
  if (weights.size() != adapters.size())
    fail(PEFT_ERR_INVALID_ARGUMENT, "combining deltas: " + std::to_string(adapters.size()) + " adapters but " +
                                        std::to_string(weights.size()) + " weights");
  for (size_t i = 0; i < adapters.size(); ++i)
    if (!adapters[i]) fail(PEFT_ERR_INVALID_ARGUMENT, "combining deltas: adapter #" + std::to_string(i) + " is NULL");
  if (!is_task_arithmetic(method))
    fail(PEFT_ERR_INVALID_ARGUMENT, "combining deltas takes linear, ties, dare_linear, dare_ties or magnitude_prune; "
                                    "the other combination types are PEFT's factor and SVD forms");
  const merge::TaskSettings task = task_settings_of(method, settings, "combining deltas");
  if (options.choice.rank != 0 || options.choice.energy != 0.0) check_lowrank_options(options);
  for (const auto& adapter : adapters) {
    refuse_expert_modules(adapter->modules(), "combining deltas");
    refuse_activated_lora(*adapter, "a combination of deltas");
  }
  std::vector<JobInput> inputs;
  for (const auto& adapter : adapters)
    inputs.insert(inputs.end(), {{"an input adapter's folder", adapter->dir()}, {"the base model folder", adapter->base_dir()}});
  if (!options.base_dir.empty()) inputs.push_back({"the base model folder", options.base_dir});
  refuse_output_over_inputs(out_dir, inputs);
  return DeltaCombiner(adapters, weights, task, options).run(out_dir);
}

}  // namespace peft
