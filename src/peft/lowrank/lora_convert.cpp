#include "peft/lowrank/lora_convert.hpp"

#include <cmath>
#include <cstring>
#include <map>

#include "core/convert.hpp"
#include "core/error.hpp"
#include "core/file_identity.hpp"
#include "core/json_parse.hpp"
#include "core/text_file.hpp"
#include "core/text.hpp"
#include "peft/base/base_model.hpp"
#include "peft/arch/key_grammar.hpp"
#include "peft/lowrank/adapter_delta.hpp"
#include "peft/export/adapter_export.hpp"
#include "checkpoint/hub_cache.hpp"
#include "safetensors/writer.hpp"

namespace peft {
namespace {

using Json = nlohmann::ordered_json;

void refuse_extra_tensors(const Adapter& a, const std::string& what) {
  for (const AdapterModule& m : a.modules())
    for (const AdapterTensor& t : m.tensors)
      if (t.role != TensorRole::lora_a && t.role != TensorRole::lora_b)
        fail(PEFT_ERR_UNSUPPORTED, what + ": tensor " + peft::quoted(t.key) +
                                       " is not a lora_A or lora_B weight; PEFT's conversion keeps only those, so the "
                                       "result would not mean the same");
}

// Opens an adapter folder with init_lora_weights set to true, as PEFT does before it loads the
// initial adapter (the strict loader refuses "pissa" and the like, which rewrite the base on load).
std::shared_ptr<const Adapter> open_as_initialised(const std::string& location) {
  const std::string dir = resolve_model_location(location, {kAdapterConfigName, kAdapterWeightsName});
  const std::string config_path = dir + "/" + kAdapterConfigName;
  Json doc = parse_json_ordered(read_text_file(config_path, 64u << 20), PEFT_ERR_INVALID_CONFIG, config_path);
  if (!doc.is_object()) fail(PEFT_ERR_INVALID_CONFIG, peft::quoted(config_path) + " is not a JSON object");
  doc["init_lora_weights"] = true;
  const std::string weights = read_text_file(dir + "/" + kAdapterWeightsName, uint64_t{1} << 40);
  return Adapter::open_memory(doc.dump(), weights.data(), weights.size(), {});
}

}  // namespace

std::vector<LowRankModule> convert_to_lora(const Adapter& adapter, const std::string& out_dir,
                                           const LowRankOptions& options) {
  check_lowrank_options(options);
  refuse_output_over_inputs(out_dir, {{"the adapter folder", adapter.dir()}, {"the base model folder", adapter.base_dir()}});
  const LoraConfig& c = adapter.config();
  const std::string what = "adapter " + peft::quoted(adapter.dir());
  refuse_activated_lora(adapter, "a conversion to plain LoRA");
  if (c.lora_bias) fail(PEFT_ERR_UNSUPPORTED, what + " sets lora_bias, which PEFT's convert_to_lora does not support");
  if (c.document.contains("bias") && c.document["bias"] != "none")
    fail(PEFT_ERR_UNSUPPORTED, what + " sets bias " + c.document["bias"].dump() +
                                   ", which PEFT's convert_to_lora does not support");
  // The base: the options' folder, else the one the adapter was opened with (multiplicative methods
  // need it; additive ones take their layer shapes from it).
  const std::string base_dir = !options.base_dir.empty() ? options.base_dir : adapter.base_dir();
  std::optional<BaseModel> base_model;
  if (!base_dir.empty()) base_model = BaseModel::open(base_dir, {});
  const BaseModel* base = base_model ? &*base_model : nullptr;
  std::vector<DeltaSource> sources;
  for (const AdapterModule& m : adapter.modules()) {
    std::string why;
    if (!has_module_delta(adapter, m, base != nullptr, why))
      fail(PEFT_ERR_UNSUPPORTED, what + ": module " + peft::quoted(m.name) + " is " + why);
    const Adapter* a = &adapter;
    const AdapterModule* mp = &m;
    DeltaSource source{m.name, m.kind == LayerKind::conv1d,
                       [a, mp, base](int64_t& rows, int64_t& cols) -> std::optional<std::vector<float>> {
                         ModuleDelta d = module_delta(*a, *mp, base);
                         rows = d.rows;
                         cols = d.cols;
                         return std::move(d.values);
                       },
                       nullptr, nullptr};
    if (has_exact_lora(m))  // MiSS: B A is dW exactly, at MiSS's rank (PEFT's convert_to_lora does the same)
      source.exact = [a, mp, base](std::vector<float>& fa, std::vector<float>& fb) {
        ExactLora f = exact_lora(*a, *mp, base);
        fa = std::move(f.a);
        fb = std::move(f.b);
        return f.rank;
      };
    sources.push_back(std::move(source));
  }
  Json config = Json::object();
  const Json& doc = c.document;
  config["base_model_name_or_path"] = doc.contains("base_model_name_or_path") ? doc["base_model_name_or_path"] : Json();
  config["bias"] = "none";
  config["inference_mode"] = true;
  config["init_lora_weights"] = true;
  if (doc.contains("layers_pattern")) config["layers_pattern"] = doc["layers_pattern"];
  if (doc.contains("layers_to_transform")) config["layers_to_transform"] = doc["layers_to_transform"];
  config["lora_dropout"] = 0.0;
  config["peft_type"] = "LORA";
  const Json targets = doc.contains("target_modules") ? doc["target_modules"] : Json();
  // "all-linear" and an absent field become the list of the modules converted.
  config["target_modules"] = targets.is_array() || (targets.is_string() && targets != "all-linear") ? targets
                                                                                                    : Json::array();
  config["task_type"] = doc.contains("task_type") ? doc["task_type"] : Json();
  config["use_dora"] = false;
  config["use_rslora"] = false;
  return write_lowrank_adapter(sources, config, out_dir, options);
}

void convert_initial_to_lora(const std::string& tuned_dir, const std::string& initial_dir, const std::string& out_dir,
                             const std::optional<DType>& dtype) {
  const std::shared_ptr<const Adapter> tuned_ptr = open_as_initialised(tuned_dir);
  const std::shared_ptr<const Adapter> initial_ptr = open_as_initialised(initial_dir);
  refuse_output_over_inputs(out_dir, {{"the fine-tuned adapter folder", tuned_ptr->dir()}, {"the initial adapter folder", initial_ptr->dir()}});
  const Adapter& tuned = *tuned_ptr;
  const Adapter& initial = *initial_ptr;
  const std::string what = "adapter " + peft::quoted(tuned_dir);
  const std::string what0 = "initial adapter " + peft::quoted(initial_dir);
  refuse_extra_tensors(tuned, what);
  refuse_extra_tensors(initial, what0);
  const LoraConfig& c = tuned.config();
  if (c.use_rslora && (!c.rank_pattern.empty() || !c.alpha_pattern.empty()))
    fail(PEFT_ERR_UNSUPPORTED, what + ": converting with the initial adapter is not supported when rank_pattern or "
                                      "alpha_pattern is used with use_rslora (PEFT refuses it too)");
  std::map<std::string, const AdapterModule*> init_modules;
  for (const AdapterModule& m : initial.modules()) init_modules[m.name] = &m;
  if (init_modules.size() != tuned.modules().size())
    fail(PEFT_ERR_INVALID_ARGUMENT, what + " has " + std::to_string(tuned.modules().size()) + " modules but " + what0 +
                                        " has " + std::to_string(init_modules.size()));

  struct Pair {
    const AdapterTensor* now;
    const AdapterTensor* init;
    bool is_a;
  };
  std::vector<OutputTensor> tensors;
  const Checkpoint& ck = tuned.checkpoint();
  const Checkpoint& ck0 = initial.checkpoint();
  for (const AdapterModule& m : tuned.modules()) {
    auto it = init_modules.find(m.name);
    if (it == init_modules.end())
      fail(PEFT_ERR_INVALID_ARGUMENT, what0 + " has no module " + peft::quoted(m.name));
    for (const bool is_a : {true, false}) {
      const TensorRole role = is_a ? TensorRole::lora_a : TensorRole::lora_b;
      const AdapterTensor* now = m.find(role);
      const AdapterTensor* init = it->second->find(role);
      if (!now || !init) fail(PEFT_ERR_INVALID_CHECKPOINT, "module " + peft::quoted(m.name) + " lacks a factor");
      const TensorInfo& ti = ck.tensor(now->index);
      const TensorInfo& ti0 = ck0.tensor(init->index);
      if (ti.shape.size() != 2 || ti.shape != ti0.shape)
        fail(PEFT_ERR_SHAPE_MISMATCH, "module " + peft::quoted(m.name) + ": " + role_suffix(role) + " is " +
                                          shape_text(ti.shape) + " in " + what + " but " + shape_text(ti0.shape) +
                                          " in " + what0);
      auto plain_float = [](DType d) { return d == DType::F64 || d == DType::F32 || d == DType::F16 || d == DType::BF16; };
      if (!plain_float(ti.dtype) || !plain_float(ti0.dtype))
        fail(PEFT_ERR_UNSUPPORTED, "module " + peft::quoted(m.name) + ": factors must be F64, F32, F16 or BF16");
      const DType out = ti.dtype == ti0.dtype ? ti.dtype : DType::F32;
      OutputTensor t;
      t.key = peft_saved_key(m.name, role_suffix(role));
      t.dtype = out;
      t.shape = ti.shape;
      if (is_a) t.shape[0] *= 2;
      else t.shape[1] *= 2;
      const Pair p{now, init, is_a};
      t.write = [&ck, &ck0, p, out](TensorWriter& writer, const std::string& key) {
        const TensorInfo& i1 = ck.tensor(p.now->index);
        const size_t width = dtype_bits(out) / 8;
        const uint64_t n1 = i1.shape[0] * i1.shape[1];
        std::vector<uint8_t> x(n1 * width), y(n1 * width);
        ck.read(p.now->index, out, x.data(), x.size());
        ck0.read(p.init->index, out, y.data(), y.size());
        // -B0: the sign bit flipped, exact in every float dtype (as torch's negation).
        if (!p.is_a)
          for (size_t k = 0; k < n1; ++k) y[k * width + width - 1] ^= 0x80;
        if (p.is_a) {  // [A; A0]: rows
          writer.begin_tensor(key, out);
          writer.write(x.data(), x.size());
          writer.write(y.data(), y.size());
        } else {  // [B, -B0]: per row, B's columns then -B0's
          const size_t row = i1.shape[1] * width;
          std::vector<uint8_t> z(2 * n1 * width);
          for (uint64_t r = 0; r < i1.shape[0]; ++r) {
            std::memcpy(z.data() + r * 2 * row, x.data() + r * row, row);
            std::memcpy(z.data() + r * 2 * row + row, y.data() + r * row, row);
          }
          writer.write_tensor(key, out, z.data(), z.size());
        }
      };
      tensors.push_back(std::move(t));
    }
  }

  // The tuned adapter's own config (init_lora_weights was only changed for opening it).
  const std::string tuned_config_path =
      resolve_model_location(tuned_dir, {kAdapterConfigName}) + "/" + kAdapterConfigName;
  Json config = parse_json_ordered(read_text_file(tuned_config_path, 64u << 20), PEFT_ERR_INVALID_CONFIG,
                                   tuned_config_path);
  config["inference_mode"] = true;
  config["init_lora_weights"] = true;
  config["r"] = 2 * c.r;
  if (!c.use_rslora) {
    const auto alpha = c.document.find("lora_alpha");
    if (alpha != c.document.end() && alpha->is_number_integer()) config["lora_alpha"] = 2 * alpha->get<int64_t>();
    else config["lora_alpha"] = 2 * c.lora_alpha;
  } else {
    config["lora_alpha"] = c.lora_alpha * std::pow(2.0, 0.5);
  }
  for (const char* field : {"rank_pattern", "alpha_pattern"}) {
    if (!config.contains(field) || !config[field].is_object()) continue;
    for (auto& [key, value] : config[field].items()) {
      if (value.is_number_integer()) value = 2 * value.get<int64_t>();
      else if (value.is_number()) value = 2 * value.get<double>();
    }
  }
  write_adapter_folder(out_dir, config, tensors, dtype);
}

}  // namespace peft
