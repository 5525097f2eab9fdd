#include "peft/combine/adapter_combine.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "core/error.hpp"
#include "core/file_identity.hpp"
#include "core/python_json.hpp"
#include "core/text.hpp"
#include "peft/adapter/adapter.hpp"
#include "peft/adapter/expert_modules.hpp"
#include "peft/adapter/module_matcher.hpp"
#include "peft/methods/lora_math.hpp"
#include "safetensors/writer.hpp"

namespace peft {
namespace {

using Json = nlohmann::ordered_json;

const char* method_name(CombineMethod method) {
  switch (method) {
    case CombineMethod::cat: return "cat";
    case CombineMethod::linear: return "linear";
    case CombineMethod::ties: return "ties";
    case CombineMethod::dare_linear: return "dare_linear";
    case CombineMethod::dare_ties: return "dare_ties";
    case CombineMethod::magnitude_prune: return "magnitude_prune";
    case CombineMethod::svd: return "svd";
    case CombineMethod::ties_svd: return "ties_svd";
    case CombineMethod::dare_linear_svd: return "dare_linear_svd";
    case CombineMethod::dare_ties_svd: return "dare_ties_svd";
    case CombineMethod::magnitude_prune_svd: return "magnitude_prune_svd";
  }
  return "?";
}

bool is_svd(CombineMethod method) {
  return method == CombineMethod::svd || method == CombineMethod::ties_svd || method == CombineMethod::dare_linear_svd ||
         method == CombineMethod::dare_ties_svd || method == CombineMethod::magnitude_prune_svd;
}

// The methods whose modules must all have the new rank: "linear" and its pruning types.
bool needs_equal_ranks(CombineMethod method) { return method != CombineMethod::cat && !is_svd(method); }


// A module of the combined adapter and the adapters that contribute to it.
struct CombinedModule {
  std::string name;
  LayerKind kind = LayerKind::linear;
  std::vector<CombinePart> parts;
  std::vector<uint64_t> a_shape;  // of the first part; dim 0 is the rank
  std::vector<uint64_t> b_shape;  // dim 1 is the rank
};

const AdapterTensor& factor(const AdapterModule& m, bool a) {
  const bool emb = m.kind == LayerKind::embedding;
  const TensorRole role = a ? (emb ? TensorRole::lora_embedding_a : TensorRole::lora_a)
                            : (emb ? TensorRole::lora_embedding_b : TensorRole::lora_b);
  const AdapterTensor* t = m.find(role);
  if (t == nullptr) fail(PEFT_ERR_INTERNAL, "module " + peft::quoted(m.name) + " has no " + role_suffix(role));
  return *t;
}

uint64_t product(const std::vector<uint64_t>& shape, size_t from) {
  uint64_t n = 1;
  for (size_t i = from; i < shape.size(); ++i)
    if (__builtin_mul_overflow(n, shape[i], &n)) fail(PEFT_ERR_VALIDATION_OVERFLOW, "factor shape overflows");
  return n;
}

class Combiner {
 public:
  Combiner(std::span<const std::shared_ptr<const Adapter>> adapters, std::span<const double> weights,
           CombineMethod method, const CombineSettings& settings)
      : adapters_(adapters),
        weights_(weights),
        method_(adapters.size() == 1 ? CombineMethod::linear : method),
        settings_(settings),
        task_(task_settings_of(method_, settings, "combining adapters")) {
    if (settings_.svd_rank < 0)
      fail(PEFT_ERR_INVALID_ARGUMENT, "the combination's svd rank " + std::to_string(settings_.svd_rank) + " is negative");
    if (settings_.svd_clamp && !(*settings_.svd_clamp >= 0.0 && *settings_.svd_clamp <= 1.0))
      fail(PEFT_ERR_INVALID_ARGUMENT, "the combination's svd clamp " + std::to_string(*settings_.svd_clamp) +
                                          " is not a quantile from 0 to 1");
  }

  void run(const std::string& out_dir, const ExportOptions& options) {
    check_adapters();
    compute_new_rank();
    collect_modules();
    Json config = new_config();
    check_targets(config);
    std::vector<ExportedModule> expected;
    for (const CombinedModule& m : modules_)
      expected.push_back({m.name, new_rank_, static_cast<double>(new_rank_)});
    const Json final_config = export_config(config, expected, options.peft_version, "combined adapter");
    write_adapter_folder(out_dir, final_config, output_tensors(), options.dtype);
  }

 private:
  const Adapter& adapter(size_t i) const { return *adapters_[i]; }

  void check_adapters() const {
    for (size_t i = 0; i < adapters_.size(); ++i) {
      const Adapter& a = adapter(i);
      const std::string who = combine_input_name(a, i);
      if (a.config().use_dora)
        fail(PEFT_ERR_UNSUPPORTED, who + ": DoRA adapters cannot be combined (PEFT's add_weighted_adapter leaves the "
                                         "new magnitude at the base weight's norm and ignores the adapters')");
      if (a.config().lora_bias)
        fail(PEFT_ERR_UNSUPPORTED, who + ": adapters with lora_bias cannot be combined (PEFT's add_weighted_adapter "
                                         "drops the lora_B biases)");
      for (const AdapterModule& m : a.modules())
        for (const AdapterTensor& t : m.tensors)
          if (!is_lora_role(t.role))
            fail(PEFT_ERR_UNSUPPORTED,
                 who + ": tensor " + peft::quoted(t.key) + " is " +
                     (t.role == TensorRole::trainable_tokens_delta ? "a trainable-token delta" : "a full replacement tensor") +
                     " (modules_to_save, bias=\"all\", saved embedding layers, trainable tokens), which PEFT's "
                     "add_weighted_adapter does not combine (the result gets the base model's values there)");
      if (!std::isfinite(weights_[i]))
        fail(PEFT_ERR_INVALID_ARGUMENT, "the weight of " + who + " is not a finite number");
    }
  }

  // PEFT allocates max(r, rank_pattern values) per adapter (_check_add_weighted_adapter).
  static int64_t allocated_rank(const LoraConfig& c) {
    int64_t r = c.r;
    for (const auto& [key, rank] : c.rank_pattern) r = std::max(r, rank);
    return r;
  }

  void compute_new_rank() {
    new_rank_ = 0;
    for (size_t i = 0; i < adapters_.size(); ++i) {
      const int64_t r = allocated_rank(adapter(i).config());
      if (is_svd(method_)) {
        new_rank_ = std::max(new_rank_, r);
      } else if (method_ == CombineMethod::cat) {
        if (__builtin_add_overflow(new_rank_, r, &new_rank_))
          fail(PEFT_ERR_VALIDATION_OVERFLOW, "the combined rank overflows");
      } else if (i == 0) {
        new_rank_ = r;
      } else if (r != new_rank_) {
        fail(PEFT_ERR_INVALID_ARGUMENT, std::string("combining with \"") + method_name(method_) +
                                            "\" needs adapters of equal rank, but " +
                                            combine_input_name(adapter(0), 0) + " has " + std::to_string(new_rank_) +
                                            " and " + combine_input_name(adapter(i), i) + " has " + std::to_string(r) +
                                            " (use \"cat\")");
      }
    }
    if (is_svd(method_) && settings_.svd_rank > 0) new_rank_ = settings_.svd_rank;
  }

  void collect_modules() {
    std::map<std::string, size_t, std::less<>> index;
    for (size_t i = 0; i < adapters_.size(); ++i) {
      for (const AdapterModule& m : adapter(i).modules()) {
        const auto& a_shape = adapter(i).checkpoint().tensor(factor(m, true).index).shape;
        const auto& b_shape = adapter(i).checkpoint().tensor(factor(m, false).index).shape;
        auto [it, added] = index.emplace(m.name, modules_.size());
        if (added) modules_.push_back({m.name, m.kind, {}, a_shape, b_shape});
        CombinedModule& c = modules_[it->second];
        check_compatible(c, m, a_shape, b_shape, i);
        if (needs_equal_ranks(method_) && m.rank != new_rank_)
          fail(PEFT_ERR_INVALID_ARGUMENT, std::string("combining with \"") + method_name(method_) + "\": module " +
                                              peft::quoted(m.name) + " of " +
                                              combine_input_name(adapter(i), i) + " has rank " + std::to_string(m.rank) +
                                              " but the combined rank is " + std::to_string(new_rank_) +
                                              " (rank_pattern); use \"cat\"");
        c.parts.push_back({i, &m});
      }
    }
  }

  void check_compatible(const CombinedModule& c, const AdapterModule& m, const std::vector<uint64_t>& a_shape,
                        const std::vector<uint64_t>& b_shape, size_t i) const {
    const std::string who = "module " + peft::quoted(m.name) + " of " + combine_input_name(adapter(i), i);
    const bool same_kind = (c.kind == LayerKind::embedding) == (m.kind == LayerKind::embedding) &&
                           (c.kind == LayerKind::conv2d) == (m.kind == LayerKind::conv2d);
    bool same = same_kind && a_shape.size() == c.a_shape.size() && b_shape.size() == c.b_shape.size() &&
                b_shape.size() >= 2 && a_shape.size() >= 2 && b_shape[0] == c.b_shape[0];
    for (size_t d = 1; same && d < a_shape.size(); ++d) same = a_shape[d] == c.a_shape[d];
    for (size_t d = 2; same && d < b_shape.size(); ++d) same = b_shape[d] == c.b_shape[d];
    if (!same)
      fail(PEFT_ERR_SHAPE_MISMATCH, who + " has lora factors " + shape_text(a_shape) + " and " + shape_text(b_shape) +
                                        " (" + layer_kind_name(m.kind) + "), which do not fit the earlier adapters' " +
                                        shape_text(c.a_shape) + " and " + shape_text(c.b_shape) + " (" +
                                        layer_kind_name(c.kind) + ")");
    if (product(b_shape, 2) != 1)
      fail(PEFT_ERR_UNSUPPORTED, who + ": lora_B " + shape_text(b_shape) + " has a kernel larger than 1x1");
  }

  // The target_modules PEFT's _check_add_weighted_adapter computes.
  Json union_of_targets() const {
    bool regex = false, list = false;
    for (size_t i = 0; i < adapters_.size(); ++i)
      (adapter(i).config().target_modules.kind == ModuleSelector::Kind::regex ? regex : list) = true;
    if (regex && list)
      fail(PEFT_ERR_UNSUPPORTED, "cannot combine adapters whose target_modules mix regular expressions and lists "
                                 "(PEFT's add_weighted_adapter refuses it too)");
    if (regex) {
      std::string pattern;
      for (size_t i = 0; i < adapters_.size(); ++i)
        pattern += (i ? "|(" : "(") + adapter(i).config().target_modules.pattern + ")";
      return pattern;
    }
    std::set<std::string> names;
    for (size_t i = 0; i < adapters_.size(); ++i) {
      const ModuleSelector& t = adapter(i).config().target_modules;
      if (t.kind == ModuleSelector::Kind::list) {
        names.insert(t.names.begin(), t.names.end());
      } else {  // "all-linear" or absent: what PEFT expands it to on the base, as far as the adapter shows
        for (const AdapterModule& m : adapter(i).modules()) names.insert(m.name);
      }
    }
    Json out = Json::array();
    for (const std::string& n : names) out.push_back(n);
    return out;
  }

  Json new_config() const {
    Json doc = adapter(0).config().document;
    doc["r"] = new_rank_;
    doc["lora_alpha"] = new_rank_;
    doc["target_modules"] = union_of_targets();
    doc["rank_pattern"] = Json::object();
    doc["alpha_pattern"] = Json::object();
    return doc;
  }

  // Every module must still be adapted under the inherited config, or PEFT would drop it.
  void check_targets(const Json& config) const {
    const LoraConfig parsed = LoraConfig::parse(python_json_dumps(config), "combined adapter config");
    const ModuleMatcher matcher(parsed);
    for (const CombinedModule& m : modules_) {
      const ModuleMatcher::Verdict v = matcher.check(m.name);
      if (v == ModuleMatcher::Verdict::targeted || v == ModuleMatcher::Verdict::unknown) continue;
      fail(PEFT_ERR_UNSUPPORTED,
           "module " + peft::quoted(m.name) + " is " + verdict_name(v) + " under the combined config, which inherits " +
               "exclude_modules, layers_to_transform, layers_pattern and modules_to_save from " +
               combine_input_name(adapter(0), 0) + ": PEFT's add_weighted_adapter would silently drop its contributions");
    }
  }

  // Computes a module's new factors: a [new_rank, in], b [out, new_rank], row-major f32.
  std::pair<std::vector<float>, std::vector<float>> compute(const CombinedModule& m) const {
    const uint64_t in = product(m.a_shape, 1);
    const uint64_t out = m.b_shape[0];
    std::vector<std::vector<float>> storage;
    std::vector<merge::WeightedFactors> factors;
    storage.reserve(m.parts.size() * 2);
    for (const CombinePart& p : m.parts) {
      const Adapter& a = adapter(p.adapter);
      storage.push_back(a.checkpoint().read_f32(factor(*p.module, true).index));
      storage.push_back(a.checkpoint().read_f32(factor(*p.module, false).index));
      factors.push_back({storage[storage.size() - 2].data(), storage.back().data(), p.module->rank,
                         p.module->scaling, weights_[p.adapter]});
    }
    const auto in_i = static_cast<int64_t>(in), out_i = static_cast<int64_t>(out);
    if (is_svd(method_)) {
      // PEFT's get_delta_weight layout: [in, out] for an embedding (and a GPT-2 Conv1D), as merged.
      const bool transposed = m.kind == LayerKind::embedding || m.kind == LayerKind::conv1d;
      const merge::DeltaLayout layout =
          merge::layout_for(transposed ? merge::ModuleKind::conv1d_gpt2 : merge::ModuleKind::linear, out_i, in_i);
      merge::CombinedFactors c = merge::combine_svd(factors, layout, task_settings(m.name), new_rank_, settings_.svd_clamp);
      return {std::move(c.a), std::move(c.b)};
    }
    merge::CombinedFactors c = method_ == CombineMethod::cat
                                   ? merge::combine_cat(factors, out_i, in_i)
                                   : merge::combine_task_arithmetic(factors, out_i, in_i, task_settings(m.name));
    if (c.rank > new_rank_) fail(PEFT_ERR_INTERNAL, "combined rank of " + peft::quoted(m.name) + " exceeds r");
    if (c.rank == new_rank_) return {std::move(c.a), std::move(c.b)};
    // PEFT writes the factors into the top-left corner of zeroed [new_rank, ...] tensors.
    const auto r = static_cast<size_t>(new_rank_), cr = static_cast<size_t>(c.rank);
    std::vector<float> a(r * in, 0.0f), b(out * r, 0.0f);
    std::copy(c.a.begin(), c.a.end(), a.begin());
    for (size_t o = 0; o < out; ++o)
      std::copy(c.b.begin() + static_cast<ptrdiff_t>(o * cr), c.b.begin() + static_cast<ptrdiff_t>((o + 1) * cr),
                b.begin() + static_cast<ptrdiff_t>(o * r));
    return {std::move(a), std::move(b)};
  }

  std::vector<OutputTensor> output_tensors() {
    std::vector<OutputTensor> tensors;
    for (size_t k = 0; k < modules_.size(); ++k) {
      const CombinedModule& m = modules_[k];
      const bool emb = m.kind == LayerKind::embedding;
      for (bool is_a : {true, false}) {
        OutputTensor t;
        t.key = peft_saved_key(m.name, role_suffix(is_a ? (emb ? TensorRole::lora_embedding_a : TensorRole::lora_a)
                                                         : (emb ? TensorRole::lora_embedding_b : TensorRole::lora_b)));
        t.dtype = DType::F32;
        t.shape = is_a ? m.a_shape : m.b_shape;
        t.shape[is_a ? 0 : 1] = static_cast<uint64_t>(new_rank_);
        t.write = [this, k, is_a](TensorWriter& writer, const std::string& key) { write_factor(writer, key, k, is_a); };
        tensors.push_back(std::move(t));
      }
    }
    return tensors;
  }

  // Computes a module when the writer first asks for one of its factors; keeps the other until
  // it is written too.
  void write_factor(TensorWriter& writer, const std::string& key, size_t module, bool is_a) {
    auto it = pending_.find(module);
    if (it == pending_.end()) it = pending_.emplace(module, Pending{compute(modules_[module]), 2}).first;
    const std::vector<float>& data = is_a ? it->second.factors.first : it->second.factors.second;
    writer.write_tensor(key, DType::F32, data.data(), data.size() * sizeof(float));
    if (--it->second.remaining == 0) pending_.erase(it);
  }

  struct Pending {
    std::pair<std::vector<float>, std::vector<float>> factors;
    int remaining = 0;
  };

  merge::TaskSettings task_settings(std::string_view module) const {
    merge::TaskSettings s = task_;
    s.stream = module;
    return s;
  }

  std::span<const std::shared_ptr<const Adapter>> adapters_;
  std::span<const double> weights_;
  CombineMethod method_;
  CombineSettings settings_;
  merge::TaskSettings task_;
  int64_t new_rank_ = 0;
  std::vector<CombinedModule> modules_;
  std::map<size_t, Pending> pending_;
};

}  // namespace

merge::TaskSettings task_settings_of(CombineMethod method, const CombineSettings& settings, const std::string& job) {
  merge::TaskSettings s;
  switch (method) {
    case CombineMethod::ties:
    case CombineMethod::ties_svd: s.how = merge::TaskArithmetic::ties; break;
    case CombineMethod::dare_linear:
    case CombineMethod::dare_linear_svd: s.how = merge::TaskArithmetic::dare_linear; break;
    case CombineMethod::dare_ties:
    case CombineMethod::dare_ties_svd: s.how = merge::TaskArithmetic::dare_ties; break;
    case CombineMethod::magnitude_prune:
    case CombineMethod::magnitude_prune_svd: s.how = merge::TaskArithmetic::magnitude_prune; break;
    case CombineMethod::cat:
    case CombineMethod::linear:
    case CombineMethod::svd: s.how = merge::TaskArithmetic::linear; break;
  }
  if (s.how != merge::TaskArithmetic::linear) {
    if (!settings.density)
      fail(PEFT_ERR_INVALID_ARGUMENT, job + " with \"" + method_name(method) +
                                          "\" needs a density (the fraction of values kept, from 0 to 1)");
    if (!(*settings.density >= 0.0 && *settings.density <= 1.0))
      fail(PEFT_ERR_INVALID_ARGUMENT, job + ": the density " + std::to_string(*settings.density) +
                                          " is not a number from 0 to 1");
    s.density = *settings.density;
  }
  s.sign = settings.majority_sign;
  s.seed = settings.seed;
  return s;
}

bool is_task_arithmetic(CombineMethod method) {
  return method == CombineMethod::linear || method == CombineMethod::ties || method == CombineMethod::dare_linear ||
         method == CombineMethod::dare_ties || method == CombineMethod::magnitude_prune;
}

std::string combine_input_name(const Adapter& adapter, size_t i) {
  return "adapter #" + std::to_string(i) + " (" + peft::quoted(adapter.dir()) + ")";
}

void combine_adapters(std::span<const std::shared_ptr<const Adapter>> adapters, std::span<const double> weights,
                      CombineMethod method, const std::string& out_dir, const ExportOptions& options,
                      const CombineSettings& settings) {
  if (adapters.empty()) fail(PEFT_ERR_INVALID_ARGUMENT, "combining adapters: no adapters given");
  for (const auto& adapter : adapters)
    if (adapter) {
      refuse_expert_modules(adapter->modules(), "combining adapters");
      refuse_activated_lora(*adapter, "a combination of adapters");
    }
  if (weights.size() != adapters.size())
    fail(PEFT_ERR_INVALID_ARGUMENT, "combining adapters: " + std::to_string(adapters.size()) + " adapters but " +
                                        std::to_string(weights.size()) + " weights");
  for (size_t i = 0; i < adapters.size(); ++i)
    if (!adapters[i]) fail(PEFT_ERR_INVALID_ARGUMENT, "combining adapters: adapter #" + std::to_string(i) + " is NULL");
  std::vector<JobInput> inputs;
  for (const auto& adapter : adapters)
    inputs.insert(inputs.end(), {{"an input adapter's folder", adapter->dir()}, {"the base model folder", adapter->base_dir()}});
  refuse_output_over_inputs(out_dir, inputs);
  Combiner(adapters, weights, method, settings).run(out_dir, options);
}

}  // namespace peft
