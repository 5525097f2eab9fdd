#include "peft/export/gguf_adapter_export.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>

#include "core/convert.hpp"
#include "core/error.hpp"
#include "core/file_identity.hpp"
#include "core/shape.hpp"
#include "core/quant/q8_0.hpp"
#include "core/text.hpp"
#include "gguf/ggml_type.hpp"
#include "gguf/gguf_file.hpp"
#include "gguf/gguf_writer.hpp"
#include "peft/arch/gguf_experts.hpp"
#include "peft/base/expert_base.hpp"
#include "peft/base/gguf_base.hpp"

namespace peft {
namespace {

// In an adapter on a vision-language model (some of its modules are in the language model:
// language_model_path), a module outside the language model that has no GGUF name (its vision tower,
// its projector) is outside the GGUF model.
bool on_vision_language_model(const Adapter& adapter) {
  return std::ranges::any_of(adapter.modules(),
                             [](const AdapterModule& m) { return language_model_path(m.name).has_value(); });
}
bool outside_language_model(bool vision_language, const std::string& module, const std::optional<GgufSlot>& slot) {
  return vision_language && !slot && !language_model_path(module);
}

constexpr const char* kOutsideLanguageModel =
    "outside the language model, which is all a GGUF model of a vision-language model holds (llama.cpp "
    "writes the vision tower and projector to an mmproj file, to which it applies no LoRA)";

// One module as GGUF holds it.
struct GgufPair {
  const AdapterModule* module;
  std::string tensor;  // the GGUF base tensor, "blk.0.attn_q.weight"
  GgufRows rows = GgufRows::same;
  std::optional<uint64_t> slice;  // a stacked module's slice of `tensor` (gguf_experts.hpp)
  std::optional<ExpertPart> part;  // a LoRA on a stacked expert parameter: the share of one expert (expert_base.hpp)
};

// Every module's GGUF tensor; every problem listed at once. Modules in `skip` are left out.
std::vector<GgufPair> plan_pairs(const Adapter& adapter, const GgufBase& base, const std::set<std::string>& skip) {
  std::vector<GgufPair> pairs;
  std::vector<std::string> unsupported, unresolved;
  const ArchTable& table = *base.table;
  const bool vision_language = on_vision_language_model(adapter);
  for (const AdapterModule& module : adapter.modules()) {
    if (skip.contains(module.name)) continue;
    const std::string what = "module " + peft::quoted(module.name);
    if (const std::optional<std::string> problem = gguf_lora_problem(module)) {
      unsupported.push_back(what + ": " + *problem);
      continue;
    }
    // The module's pair in GGUF, or for a LoRA on a stacked expert parameter those of each saved
    // per-expert module it spans (its rows of gate_up_proj: gate, then up).
    auto add_pair = [&](const std::string& saved_module, std::optional<ExpertPart> part) {
      const std::string who = part ? what + " (expert " + std::to_string(part->expert) + "'s " +
                                         peft::quoted(saved_module) + ")"
                                   : what;
      const std::optional<GgufSlot> slot = gguf_slot(table, saved_module);
      if (outside_language_model(vision_language, saved_module, slot)) {
        unsupported.push_back(who + ": " + kOutsideLanguageModel);
        return;
      }
      if (!slot) {
        unresolved.push_back(who + ": table " + peft::quoted(table.family()) + " gives it no GGUF name");
        return;
      }
      GgufPair pair{&module, slot->tensor, slot->rule->gguf_rows, slot->slice, part};
      if (pair.slice && !(base.experts && *pair.slice < *base.experts)) {
        unresolved.push_back(who + ": the base has " + (base.experts ? std::to_string(*base.experts) : "no count of") +
                             " experts, so " + peft::quoted(pair.tensor) + " has no slice " + std::to_string(*pair.slice));
        return;
      }
      if (base.gguf && !base.gguf->find(pair.tensor)) {
        unresolved.push_back(who + ": the GGUF base has no tensor " + peft::quoted(pair.tensor));
        return;
      }
      if (const AdapterTensor* b = module.find(TensorRole::lora_b)) {
        const std::vector<uint64_t>& b_shape = adapter.checkpoint().tensor(b->index).shape;
        const uint64_t out = part ? static_cast<uint64_t>(part->rows) : b_shape.empty() ? 0 : b_shape[0];
        if (const auto problem = gguf_rows_problem(pair.rows, base.heads, out)) unresolved.push_back(who + ": " + *problem);
      }
      pairs.push_back(std::move(pair));
    };
    if (!module.expert) {
      add_pair(module.name, std::nullopt);
      continue;
    }
    const std::vector<ExpertPart> parts = per_expert_parts(module, expert_factor_shape(module, adapter.checkpoint()));
    if (parts.empty()) {
      unsupported.push_back(what + ": lora_B's rows do not split into the " +
                            std::to_string(module.expert->per_expert.size()) + " per-expert tensors of " +
                            peft::quoted(module.expert->module + "." + module.expert->param));
      continue;
    }
    for (const ExpertPart& part : parts) add_pair(part.module(), part);
  }
  // llama.cpp applies one pair to a whole stacked tensor: every slice needs its module.
  std::map<std::string, std::vector<uint64_t>> stacks;
  std::map<std::string, size_t> singles;
  for (const GgufPair& pair : pairs) {
    if (pair.slice) stacks[pair.tensor].push_back(*pair.slice);
    else if (++singles[pair.tensor] == 2)
      unsupported.push_back("GGUF tensor " + peft::quoted(pair.tensor) + ": the adapter has two modules for it");
  }
  for (const auto& [tensor, slices] : stacks) {
    // The declared count against the stacked tensor itself, before anything is sized by it.
    if (const std::optional<size_t> index = base.gguf ? base.gguf->find(tensor) : std::nullopt) {
      const std::vector<uint64_t>& shape = base.gguf->tensor(*index).shape;
      const uint64_t stacked = shape.empty() ? 0 : shape.front();
      if (stacked != *base.experts)
        fail(PEFT_ERR_INVALID_CHECKPOINT, base.name + ": its metadata declares " + std::to_string(*base.experts) +
                                              " experts, its tensor " + peft::quoted(tensor) + " stacks " +
                                              std::to_string(stacked));
    }
    if (const std::string missing = missing_slices(slices, *base.experts); !missing.empty())
      unsupported.push_back("GGUF tensor " + peft::quoted(tensor) + " stacks " + std::to_string(*base.experts) +
                            " experts, and llama.cpp applies a LoRA to all of them or none: the adapter lacks the "
                            "module of expert(s) " + missing);
    else if (slices.size() != *base.experts)
      unsupported.push_back("GGUF tensor " + peft::quoted(tensor) + ": the adapter has two modules for one expert");
  }
  if (!unsupported.empty()) {
    std::string message = std::to_string(unsupported.size()) +
                          " module(s) cannot be exported as a GGUF LoRA (--split-into merges them into a copy of the base):";
    for (const std::string& line : unsupported) message += "\n  " + line;
    fail(PEFT_ERR_UNSUPPORTED, message);
  }
  if (!unresolved.empty()) {
    std::string message = std::to_string(unresolved.size()) + " module(s) have no GGUF tensor in " + peft::quoted(base.name) + ":";
    for (const std::string& line : unresolved) message += "\n  " + line;
    fail(PEFT_ERR_UNRESOLVED_KEY, message);
  }
  return pairs;
}

// A factor stored with shape {rows, cols} (ne = [cols, rows]) in `ggml_type`.
struct GgufFactor {
  std::string name;
  uint32_t type;
  std::vector<uint64_t> shape;
  std::vector<uint8_t> bytes;
};

GgufFactor encode(std::string name, const std::vector<float>& values, std::vector<uint64_t> shape, uint32_t wanted) {
  GgufFactor out{std::move(name), wanted, std::move(shape), {}};
  if (out.type == 8 && out.shape.back() % kQ8_0BlockSize != 0) out.type = 1;  // llama.cpp's converter falls back to F16
  for (float v : values)
    if (!std::isfinite(v)) fail(PEFT_ERR_NON_FINITE, "tensor " + peft::quoted(out.name) + " holds an infinity or NaN");
  if (out.type == 8) {
    out.bytes.resize(static_cast<size_t>(values.size() / kQ8_0BlockSize * kQ8_0BlockBytes));
    quantize_q8_0(values.data(), values.size(), out.bytes.data());
  } else {
    const DType dtype = *dtype_of_ggml(out.type);
    out.bytes.resize(static_cast<size_t>(values.size() * dtype_bits(dtype) / 8));
    convert(DType::F32, values.data(), dtype, out.bytes.data(), values.size());
  }
  return out;
}

}  // namespace

std::optional<std::string> gguf_lora_problem(const AdapterModule& module) {
  if (module.expert && module.expert->per_expert.empty())
    return "LoRA on the stacked expert parameter " + peft::quoted(module.expert->module + "." + module.expert->param) +
           " (target_parameters), which the architecture data does not place in GGUF (no per-expert layout)";
  if (!module.is_lora())
    return layer_kind_name(module.kind) + std::string(" tensors replace base tensors, which a GGUF LoRA cannot hold");
  if (module.find(TensorRole::lora_magnitude) != nullptr) return "DoRA's magnitude vector has no place in a GGUF LoRA";
  if (module.find(TensorRole::lora_b_bias) != nullptr) return "lora_B.bias has no place in a GGUF LoRA";
  // GPT-2's Conv1D weights are [out, in] in GGUF (the converter transposes them): their lora_A/B go
  // in as a Linear layer's.
  if (module.kind != LayerKind::linear && module.kind != LayerKind::conv1d && module.kind != LayerKind::embedding)
    return layer_kind_name(module.kind) + std::string(" layers are not exported to GGUF");
  for (const AdapterTensor& t : module.tensors)
    if (t.role == TensorRole::full)
      return "its whole tensor " + peft::quoted(t.key) + " replaces a base tensor, which a GGUF LoRA cannot hold";
  return std::nullopt;
}

namespace {

// A base with tied embeddings: llama.cpp computes its output from token_embd.weight, under the
// embedding's own name, so a LoRA on token_embd changes both sides and one on output.weight has no
// tensor to apply to. An adapter that changes both sides alike (ensure_weight_tying's LoRA, whose
// lm_head copy is the input's factors transposed) is exported as its token_embd pair alone (the
// copy is added to `skip`); the modules that change one side only are returned, since no GGUF LoRA
// gives PEFT's forward with them.
struct OneSidedTied {
  const AdapterModule* output = nullptr;  // the output embedding's LoRA, when one side only
  const AdapterModule* input = nullptr;   // the input embedding's
  bool any() const { return output || input; }
};
OneSidedTied one_sided_tied_loras(const Adapter& adapter, const GgufBase& base, std::set<std::string>& skip) {
  if (!base.tied_embeddings) return {};
  const ArchTable& table = *base.table;
  const std::string output = table.output_embedding().value_or("");
  std::set<std::string> input_tensors;  // the input embeddings' GGUF names ("token_embd.weight")
  for (const std::string& input : table.input_embeddings())
    if (const auto slot = gguf_slot(table, input)) input_tensors.insert(slot->tensor);
  OneSidedTied found;
  for (const AdapterModule& m : adapter.modules()) {
    if (!m.is_lora() || skip.contains(m.name)) continue;
    if (m.name == output) found.output = &m;
    else if (const auto slot = gguf_slot(table, m.name); slot && input_tensors.contains(slot->tensor)) found.input = &m;
  }
  if (found.output && found.input && adapter.config().ensure_weight_tying) {
    skip.insert(found.output->name);
    return {};
  }
  return found;
}

void refuse_one_sided_tied_loras(const OneSidedTied& tied, const GgufBase& base) {
  if (!tied.any()) return;
  const AdapterModule& one = tied.output ? *tied.output : *tied.input;
  const bool both = tied.output && tied.input;
  fail(PEFT_ERR_UNSUPPORTED,
       "module " + peft::quoted(one.name) + ": the base " + peft::quoted(base.name) + " ties its output embedding to "
       "its input embedding, and llama.cpp computes the output from token_embd.weight, so a GGUF LoRA " +
       (tied.output ? "on the output has no tensor to apply to" : "on token_embd changes the output too") +
       (both ? " (and the adapter's two sides differ: it was not saved with ensure_weight_tying)" : "") +
       "; PEFT's forward changes " + (both ? "each side by its own LoRA" : "one side only") +
       ". Merge it instead (peftc merge unties the embeddings: docs/peft-semantics.md, \"Tied embeddings\"; "
       "--split-into merges such modules into a copy of the base)");
}

// The export's base, with the table that names every module the export writes.
GgufBase open_export_base(const Adapter& adapter, const GgufAdapterExportOptions& options) {
  const bool vision_language = on_vision_language_model(adapter);
  return open_gguf_base(gguf_export_base_name(adapter, options), [&](const ArchTable& table) {
    for (const AdapterModule& module : adapter.modules()) {
      if (!module.is_lora() || options.skip.contains(module.name)) continue;
      const std::string saved = saved_module_name(module);
      const std::optional<GgufSlot> slot = gguf_slot(table, saved);
      if (!slot && !outside_language_model(vision_language, saved, slot)) return false;
    }
    return true;
  });
}

}  // namespace

std::set<std::string> gguf_lora_unsupported_modules(const Adapter& adapter, const GgufAdapterExportOptions& options) {
  std::set<std::string> out;
  for (const AdapterModule& module : adapter.modules())
    if (gguf_lora_problem(module)) out.insert(module.name);
  GgufAdapterExportOptions rest = options;
  rest.skip.insert(out.begin(), out.end());
  const GgufBase base = open_export_base(adapter, rest);
  const bool vision_language = on_vision_language_model(adapter);
  for (const AdapterModule& module : adapter.modules()) {
    const std::string saved = saved_module_name(module);
    if (!rest.skip.contains(module.name) && outside_language_model(vision_language, saved, gguf_slot(*base.table, saved)))
      out.insert(module.name);
  }
  const OneSidedTied tied = one_sided_tied_loras(adapter, base, rest.skip);
  for (const AdapterModule* m : {tied.output, tied.input})
    if (m) out.insert(m->name);
  return out;
}

std::string gguf_export_base_name(const Adapter& adapter, const GgufAdapterExportOptions& options) {
  const std::string name = options.base.empty() ? adapter.config().base_model_name_or_path.value_or("") : options.base;
  if (name.empty())
    fail(PEFT_ERR_INVALID_ARGUMENT, "no base model: the adapter's config has no base_model_name_or_path; give one");
  return name;
}

void export_gguf_adapter(const Adapter& adapter, const std::string& out_path, const GgufAdapterExportOptions& options) {
  if (options.ggml_type != 0 && options.ggml_type != 1 && options.ggml_type != 30 && options.ggml_type != 8)
    fail(PEFT_ERR_INVALID_ARGUMENT, "GGUF adapter factors are written as F32, F16, BF16 or Q8_0 (ggml type " +
                                        std::to_string(options.ggml_type) + " is none of them)");
  const GgufBase base = open_export_base(adapter, options);
  refuse_output_over_inputs(out_path, {{"the adapter folder", adapter.dir()},
                                       {"the base model folder", adapter.base_dir()},
                                       {"the base model", base.name}});
  std::set<std::string> skip = options.skip;
  refuse_one_sided_tied_loras(one_sided_tied_loras(adapter, base, skip), base);
  const std::vector<GgufPair> pairs = plan_pairs(adapter, base, skip);
  const double alpha = adapter.config().lora_alpha;
  // llama.cpp stores alpha as f32 and scales by alpha / rank (or 1 for alpha 0); B carries the rest.
  const float file_alpha = static_cast<float>(alpha);

  // One entry per GGUF tensor: a module, or the modules of a stacked tensor by slice.
  std::vector<std::vector<const GgufPair*>> groups;
  std::map<std::string, size_t> group_of;
  for (const GgufPair& pair : pairs) {
    auto [it, added] = group_of.emplace(pair.tensor, groups.size());
    if (added) groups.emplace_back();
    groups[it->second].push_back(&pair);
  }
  std::vector<GgufFactor> factors;
  std::map<const AdapterModule*, ExpertFactors> expert_factors;  // read once per module
  for (std::vector<const GgufPair*>& group : groups) {
    std::sort(group.begin(), group.end(), [](const GgufPair* x, const GgufPair* y) { return x->slice < y->slice; });
    const GgufPair& first = *group.front();
    std::vector<LoraFactors> slices;
    uint64_t rank = 0;  // the largest: llama.cpp has one rank per tensor
    for (const GgufPair* pair : group) {
      const AdapterModule& m = *pair->module;
      if (pair->part) {  // one expert's share of a stacked expert parameter's LoRA
        auto it = expert_factors.find(&m);
        if (it == expert_factors.end()) it = expert_factors.emplace(&m, ExpertFactors(m, adapter.checkpoint())).first;
        const ExpertFactors& x = it->second;
        const ExpertPart& part = *pair->part;
        const auto r = static_cast<uint64_t>(x.shape().rank), in = static_cast<uint64_t>(x.shape().in);
        slices.push_back({std::vector<float>(x.a(part.expert), x.a(part.expert) + r * in),
                          x.b(part.expert, part.row_begin, part.rows, part.row_stride), r, in,
                          static_cast<uint64_t>(part.rows), 1});
        rank = std::max(rank, r);
        continue;
      }
      const bool embedding = m.kind == LayerKind::embedding;
      const AdapterTensor* a = m.find(embedding ? TensorRole::lora_embedding_a : TensorRole::lora_a);
      const AdapterTensor* b = m.find(embedding ? TensorRole::lora_embedding_b : TensorRole::lora_b);
      if (a == nullptr || b == nullptr)
        fail(PEFT_ERR_INVALID_ARGUMENT, "module " + peft::quoted(m.name) + " lacks its A or B factor");
      const TensorInfo& a_info = adapter.checkpoint().tensor(a->index);
      const TensorInfo& b_info = adapter.checkpoint().tensor(b->index);
      if (a_info.shape.size() != 2 || b_info.shape.size() != 2)
        fail(PEFT_ERR_UNSUPPORTED, "module " + peft::quoted(m.name) + ": only 2-D factors are exported to GGUF");
      slices.push_back({adapter.checkpoint().read_f32(a->index), adapter.checkpoint().read_f32(b->index),
                        a_info.shape[0], a_info.shape[1], b_info.shape[0], 1});
      rank = std::max(rank, a_info.shape[0]);
    }
    const double llama_scale = file_alpha == 0.0f ? 1.0 : static_cast<double>(file_alpha) / static_cast<double>(rank);
    for (size_t i = 0; i < group.size(); ++i) {
      const AdapterModule& m = *group[i]->module;
      LoraFactors& f = slices[i];
      // PEFT's scale over llama.cpp's: exactly 1 for a plain module whose alpha f32 holds exactly.
      const double ratio = m.scaling / llama_scale;
      if (static_cast<float>(ratio) != 1.0f)
        for (float& v : f.b) v = static_cast<float>(static_cast<double>(v) * ratio);
      reorder_gguf_rows(first.rows, base.heads, f.b.data(), f.out, f.rank * sizeof(float), false,
                        "module " + peft::quoted(m.name));
    }
    if (first.slice) {
      const LoraFactors stacked = stack_lora(slices, rank, "GGUF tensor " + peft::quoted(first.tensor));
      factors.push_back(encode(first.tensor + ".lora_a", stacked.a, {stacked.count, rank, stacked.in}, options.ggml_type));
      factors.push_back(encode(first.tensor + ".lora_b", stacked.b, {stacked.count, stacked.out, rank}, options.ggml_type));
      continue;
    }
    const LoraFactors& f = slices.front();
    if (first.module->kind == LayerKind::embedding) {
      // llama.cpp applies token_embd's pair transposed: lora_a = A^T (num, r).
      factors.push_back(encode(first.tensor + ".lora_a", transposed(f.a, f.rank, f.in), {f.in, f.rank}, options.ggml_type));
    } else {
      factors.push_back(encode(first.tensor + ".lora_a", f.a, {f.rank, f.in}, options.ggml_type));
    }
    factors.push_back(encode(first.tensor + ".lora_b", f.b, {f.out, f.rank}, options.ggml_type));
  }

  GgufWriter writer(out_path);
  writer.add_metadata("general.architecture", GgufValue{GgufValueType::STRING, base.architecture});
  writer.add_metadata("general.type", GgufValue{GgufValueType::STRING, std::string("adapter")});
  writer.add_metadata("adapter.type", GgufValue{GgufValueType::STRING, std::string("lora")});
  writer.add_metadata("adapter.lora.alpha", GgufValue{GgufValueType::F32, static_cast<double>(file_alpha)});
  // An activated LoRA's invocation sequence, where convert_lora_to_gguf.py puts it; llama.cpp's server
  // turns the adapter on from it (llama-adapter.cpp).
  if (const std::vector<uint32_t>& tokens = adapter.config().alora_invocation_tokens; !tokens.empty()) {
    GgufArray ids(GgufValueType::U32);
    for (uint32_t token : tokens) gguf_array_append(ids, GgufValue{GgufValueType::U32, uint64_t{token}});
    writer.add_metadata("adapter.alora.invocation_tokens", GgufValue{GgufValueType::ARRAY, std::move(ids)});
  }
  for (const GgufFactor& f : factors) writer.add_tensor(f.name, f.type, f.shape);
  writer.start();
  for (const GgufFactor& f : factors) writer.write_tensor(f.name, f.bytes.data(), f.bytes.size());
  writer.finish();
}

}  // namespace peft
