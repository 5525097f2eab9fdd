#include "peft/import/gguf_adapter_import.hpp"

#include <algorithm>
#include <map>

#include "core/error.hpp"
#include "core/file_identity.hpp"
#include "core/shape.hpp"
#include "core/text.hpp"
#include "peft/adapter/gguf_lora_file.hpp"
#include "peft/arch/arch_registry.hpp"
#include "peft/arch/gguf_experts.hpp"
#include "peft/export/adapter_export.hpp"
#include "peft/base/gguf_base.hpp"
#include "safetensors/writer.hpp"

namespace peft {
namespace {

constexpr std::string_view kA = ".weight.lora_a";
constexpr std::string_view kB = ".weight.lora_b";

struct ImportedModule {
  std::string gguf;  // "blk.0.attn_q"
  std::string path;  // "model.layers.0.self_attn.q_proj"
  const ModuleRule* rule = nullptr;
  NameTemplate::Captures captures;
  std::optional<size_t> a, b;  // tensor indices
  uint64_t rank = 0;
  std::vector<float> a_values, b_values;
  std::vector<uint64_t> a_shape, b_shape;
};

std::string listing(const std::vector<std::string>& lines) {
  std::string out;
  for (const std::string& line : lines) out += "\n  " + line;
  return out;
}

}  // namespace

void import_gguf_adapter(const std::string& gguf_path, const std::string& out_dir, const std::string& base_name) {
  if (base_name.empty())
    fail(PEFT_ERR_INVALID_ARGUMENT, "a GGUF LoRA adapter is imported against its base model: give the base "
                                    "(a Hugging Face folder or hub id, or a GGUF model file)");
  // The metadata checks (general.type, adapter.type, architecture, alpha) and factor reading are
  // gguf_lora_file's.
  const std::shared_ptr<const GgufLoraFile> lora = open_gguf_lora(gguf_path);
  refuse_output_over_inputs(out_dir, {{"the GGUF LoRA file", gguf_path}, {"the base model", base_name}});
  const std::shared_ptr<const Checkpoint> file = lora->file;
  const std::optional<std::string> architecture = lora->architecture;
  const double alpha = lora->alpha;

  // Pair the tensors by GGUF module, every problem listed at once.
  std::map<std::string, ImportedModule> modules;
  std::vector<std::string> unsupported, unresolved, broken;
  for (size_t i = 0; i < file->tensor_count(); ++i) {
    const std::string& name = file->tensor(i).name;
    const bool is_a = name.ends_with(kA), is_b = name.ends_with(kB);
    if (!is_a && !is_b) {
      unsupported.push_back(peft::quoted(name));
      continue;
    }
    const std::string gguf = name.substr(0, name.size() - kA.size());
    ImportedModule& m = modules[gguf];
    m.gguf = gguf;
    (is_a ? m.a : m.b) = i;
  }
  if (!unsupported.empty())
    fail(PEFT_ERR_UNSUPPORTED, peft::quoted(gguf_path) + ": " + std::to_string(unsupported.size()) +
                                   " tensor(s) are not LoRA factors (\"<tensor>.weight.lora_a\"/\".lora_b\"), which "
                                   "is all a PEFT LoRA adapter can hold:" + listing(unsupported));
  // The table that names every module of the file (llama, mistral and mixtral all read "llama").
  const auto names_all = [&](const ArchTable& candidate) {
    for (const auto& [gguf, m] : modules)
      if (candidate.rule_for_gguf(gguf) == nullptr) return false;
    return true;
  };
  const std::shared_ptr<const ArchTable> table = builtin_table_for_gguf(*architecture, names_all);
  const GgufBase base = open_gguf_base(base_name, names_all);
  if (base.architecture != *architecture)
    fail(PEFT_ERR_INVALID_ARGUMENT, peft::quoted(gguf_path) + " is an adapter for GGUF architecture " +
                                        peft::quoted(*architecture) + " but the base " + peft::quoted(base_name) +
                                        " is " + peft::quoted(base.architecture));
  for (auto& [gguf, m] : modules) {
    NameTemplate::Captures captures;
    m.rule = table->rule_for_gguf(gguf, &captures);
    if (m.rule == nullptr) {
      unresolved.push_back(peft::quoted(gguf) + ": table " + peft::quoted(table->family()) + " has no module for it");
      continue;
    }
    m.captures = captures;
    m.path = m.rule->hf.fill(captures);
    if (!m.a || !m.b) broken.push_back(peft::quoted(gguf) + ": lora_" + (m.a ? "b" : "a") + " is missing");
    if (m.rule->kind != ModuleKind::linear && m.rule->kind != ModuleKind::conv1d && m.rule->kind != ModuleKind::embedding)
      unsupported.push_back(peft::quoted(gguf) + ": a " + module_kind_name(m.rule->kind) + " module");
    if (m.b) {
      const std::vector<uint64_t>& b_shape = file->tensor(*m.b).shape;
      if (const auto problem = gguf_rows_problem(m.rule->gguf_rows, base.heads, b_shape.empty() ? 0 : b_shape[0]))
        unresolved.push_back(peft::quoted(gguf) + ": " + *problem);
    }
  }
  if (!unresolved.empty())
    fail(PEFT_ERR_UNRESOLVED_KEY, peft::quoted(gguf_path) + ": " + std::to_string(unresolved.size()) +
                                      " GGUF module(s) have no PEFT module:" + listing(unresolved));
  if (!broken.empty())
    fail(PEFT_ERR_INVALID_CHECKPOINT, peft::quoted(gguf_path) + ": incomplete LoRA pairs:" + listing(broken));
  if (!unsupported.empty())
    fail(PEFT_ERR_UNSUPPORTED, peft::quoted(gguf_path) + ": modules PEFT LoRA is not imported for:" + listing(unsupported));
  if (modules.empty()) fail(PEFT_ERR_INVALID_CHECKPOINT, peft::quoted(gguf_path) + " holds no LoRA pair");

  // Factors in PEFT's layout; a stacked pair (gguf_experts.hpp) becomes one module per slice.
  std::map<uint64_t, size_t> rank_counts;
  std::map<std::string, ImportedModule> unstacked;
  for (auto it = modules.begin(); it != modules.end();) {
    ImportedModule& m = it->second;
    if (!m.rule->gguf_stack) {
      ++it;
      continue;
    }
    const TensorInfo& a_info = file->tensor(*m.a);
    const TensorInfo& b_info = file->tensor(*m.b);
    if (a_info.shape.size() != 3 || b_info.shape.size() != 3 || a_info.shape[0] != b_info.shape[0] ||
        a_info.shape[0] == 0 || a_info.shape[1] == 0 || b_info.shape[2] != a_info.shape[1])
      fail(PEFT_ERR_SHAPE_MISMATCH, peft::quoted(it->first) + ": a stacked tensor's LoRA factors must be "
                                                              "(n, r, in) and (n, out, r)");
    if (base.experts && a_info.shape[0] != *base.experts)
      fail(PEFT_ERR_SHAPE_MISMATCH, peft::quoted(it->first) + ": the LoRA stacks " + std::to_string(a_info.shape[0]) +
                                        " experts, the base has " + std::to_string(*base.experts));
    LoraFactors stacked{read_gguf_lora_factor(*file, *m.a), read_gguf_lora_factor(*file, *m.b), a_info.shape[1], a_info.shape[2],
                        b_info.shape[1], a_info.shape[0]};
    std::vector<LoraFactors> slices = unstack_lora(stacked);
    for (uint64_t e = 0; e < slices.size(); ++e) {
      ImportedModule one;
      one.gguf = it->first;
      one.path = gguf_stacked_module(*m.rule, m.captures, e);
      one.rule = m.rule;
      one.rank = stacked.rank;
      one.a_values = std::move(slices[e].a);
      one.b_values = std::move(slices[e].b);
      one.a_shape = {stacked.rank, stacked.in};
      one.b_shape = {stacked.out, stacked.rank};
      ++rank_counts[one.rank];
      unstacked.emplace(one.path, std::move(one));
    }
    it = modules.erase(it);
  }
  for (auto& [gguf, m] : modules) {
    const TensorInfo& a_info = file->tensor(*m.a);
    const TensorInfo& b_info = file->tensor(*m.b);
    if (a_info.shape.size() != 2 || b_info.shape.size() != 2)
      fail(PEFT_ERR_SHAPE_MISMATCH, peft::quoted(gguf) + ": LoRA factors must be 2-D");
    const bool embedding = m.rule->kind == ModuleKind::embedding;
    std::vector<float> a = read_gguf_lora_factor(*file, *m.a);
    m.b_values = read_gguf_lora_factor(*file, *m.b);
    if (embedding) {  // lora_a = A^T (num, r)
      m.rank = a_info.shape[1];
      m.a_values = transposed(a, a_info.shape[0], a_info.shape[1]);
      m.a_shape = {m.rank, a_info.shape[0]};
    } else {
      m.rank = a_info.shape[0];
      m.a_values = std::move(a);
      m.a_shape = a_info.shape;
    }
    m.b_shape = b_info.shape;
    if (m.rank == 0 || b_info.shape[1] != m.rank)
      fail(PEFT_ERR_SHAPE_MISMATCH, peft::quoted(gguf) + ": lora_b has " + std::to_string(b_info.shape[1]) +
                                        " columns for rank " + std::to_string(m.rank));
    reorder_gguf_rows(m.rule->gguf_rows, base.heads, m.b_values.data(), b_info.shape[0], m.rank * sizeof(float), true,
                      peft::quoted(gguf));
    ++rank_counts[m.rank];
  }
  for (auto& [path, m] : unstacked) modules.emplace(path, std::move(m));

  // r: the most common rank (the smallest among equals); the others through rank_pattern.
  uint64_t r = 0;
  size_t best = 0;
  for (const auto& [rank, count] : rank_counts)
    if (count > best) r = rank, best = count;
  const float file_alpha = static_cast<float>(alpha);
  nlohmann::ordered_json rank_pattern = nlohmann::ordered_json::object();
  nlohmann::ordered_json alpha_pattern = nlohmann::ordered_json::object();
  std::vector<std::string> targets;
  bool conv1d = false;  // GPT-2: GGUF's [out, in] factors are PEFT's Conv1D factors as they are
  for (const auto& [gguf, m] : modules) {
    targets.push_back(m.path);
    conv1d = conv1d || m.rule->kind == ModuleKind::conv1d;
    if (m.rank == r) continue;
    rank_pattern[m.path] = m.rank;
    if (file_alpha == 0.0f) alpha_pattern[m.path] = m.rank;
  }
  std::sort(targets.begin(), targets.end());
  nlohmann::ordered_json config = nlohmann::ordered_json::object();
  // An activated LoRA keeps its invocation sequence (PEFT 0.18's field, sorted first as PEFT writes keys).
  if (!lora->alora_invocation_tokens.empty()) config["alora_invocation_tokens"] = lora->alora_invocation_tokens;
  config["alpha_pattern"] = alpha_pattern;
  config["base_model_name_or_path"] = base_name;
  config["bias"] = "none";
  config["fan_in_fan_out"] = conv1d;
  config["inference_mode"] = true;
  config["init_lora_weights"] = true;
  // alpha as the f32 llama.cpp reads, written exactly (as a double).
  if (file_alpha == 0.0f)
    config["lora_alpha"] = r;
  else
    config["lora_alpha"] = static_cast<double>(file_alpha);
  config["lora_dropout"] = 0.0;
  config["peft_type"] = "LORA";
  config["r"] = r;
  config["rank_pattern"] = rank_pattern;
  config["target_modules"] = targets;
  config["task_type"] = "CAUSAL_LM";
  config["use_dora"] = false;
  config["use_rslora"] = false;

  std::vector<OutputTensor> tensors;
  for (const auto& [gguf, m] : modules) {
    const bool embedding = m.rule->kind == ModuleKind::embedding;
    const ImportedModule* module = &m;
    for (const bool is_a : {true, false}) {
      OutputTensor t;
      t.key = peft_saved_key(m.path, embedding ? (is_a ? "lora_embedding_A" : "lora_embedding_B")
                                               : (is_a ? "lora_A.weight" : "lora_B.weight"));
      t.dtype = DType::F32;
      t.shape = is_a ? m.a_shape : m.b_shape;
      t.write = [module, is_a](TensorWriter& writer, const std::string& key) {
        const std::vector<float>& v = is_a ? module->a_values : module->b_values;
        writer.write_tensor(key, DType::F32, v.data(), v.size() * sizeof(float));
      };
      tensors.push_back(std::move(t));
    }
  }
  write_adapter_folder(out_dir, config, tensors, DType::F32);
}

}  // namespace peft
