#include "peft/arch/gguf_experts.hpp"

#include <algorithm>
#include <limits>

#include "core/error.hpp"

namespace peft {
namespace {

// gguf_slot for the module's own path (or with the base_model_prefix, or its checkpoint alias).
std::optional<GgufSlot> gguf_slot_as_named(const ArchTable& table, std::string_view module) {
  NameTemplate::Captures captures;
  std::string path(module);
  const ModuleRule* rule = table.rule_for_hf(path, &captures);
  if (rule == nullptr && !table.base_model_prefix().empty()) {
    path = table.base_model_prefix() + "." + path;
    rule = table.rule_for_hf(path, &captures);
  }
  if (rule != nullptr && !rule->gguf) {  // transformers 5's in-memory name of a checkpoint module
    for (const std::string& alias : table.aliases_of(path))
      if (const ModuleRule* other = table.rule_for_hf(alias, &captures); other != nullptr && other->gguf) {
        rule = other;
        break;
      }
  }
  if (rule == nullptr || !rule->gguf) return std::nullopt;
  GgufSlot slot{rule, rule->gguf->fill(captures) + ".weight", std::nullopt};
  if (rule->gguf_stack) {
    for (const auto& [name, value] : captures) {
      if (name != *rule->gguf_stack) continue;
      uint64_t index = 0;  // digits only (a placeholder's match); saturates, so a huge index is out of range
      for (char c : value)
        index = index > (std::numeric_limits<uint64_t>::max() - 9) / 10 ? std::numeric_limits<uint64_t>::max()
                                                                          : index * 10 + static_cast<uint64_t>(c - '0');
      slot.slice = index;
    }
  }
  return slot;
}

}  // namespace

std::optional<std::string> language_model_path(std::string_view module) {
  constexpr std::string_view component = "language_model.";
  for (size_t at = module.find(component); at != std::string_view::npos; at = module.find(component, at + 1))
    if (at == 0 || module[at - 1] == '.')
      return std::string(module.substr(0, at)) + std::string(module.substr(at + component.size()));
  return std::nullopt;
}

std::optional<GgufSlot> gguf_slot(const ArchTable& table, std::string_view module) {
  if (std::optional<GgufSlot> slot = gguf_slot_as_named(table, module)) return slot;
  if (const std::optional<std::string> path = language_model_path(module)) return gguf_slot_as_named(table, *path);
  return std::nullopt;
}

std::string gguf_stacked_module(const ModuleRule& rule, NameTemplate::Captures captures, uint64_t slice) {
  captures.emplace_back(rule.gguf_stack.value_or(""), std::to_string(slice));
  return rule.hf.fill(captures);
}

std::optional<uint64_t> gguf_experts_from_metadata(const GgufHeader& header, const std::string& architecture) {
  return metadata_count(header, architecture + ".expert_count");
}

std::optional<uint64_t> gguf_experts_from_config(const nlohmann::json& config) {
  if (!config.is_object()) return std::nullopt;
  auto it = config.find("num_local_experts");
  if (it == config.end() || !it->is_number_unsigned()) return std::nullopt;
  return it->get<uint64_t>();
}

std::string missing_slices(const std::vector<uint64_t>& present, uint64_t count) {
  // Bounded by the slices present, never by `count`, which a file declares (2^32 - 1 experts listed
  // one by one took gigabytes): the first few missing ones are named, the rest counted.
  constexpr size_t kNamed = 8;
  std::vector<uint64_t> have;
  for (uint64_t i : present)
    if (i < count) have.push_back(i);
  std::sort(have.begin(), have.end());
  have.erase(std::unique(have.begin(), have.end()), have.end());
  const uint64_t missing = count - have.size();
  std::string out;
  size_t named = 0;
  for (uint64_t i = 0, k = 0; i < count && named < std::min<uint64_t>(kNamed, missing); ++i) {
    if (k < have.size() && have[k] == i) {
      ++k;
      continue;
    }
    out += (out.empty() ? "" : ", ") + std::to_string(i);
    ++named;
  }
  if (missing > named) out += " and " + std::to_string(missing - named) + " more";
  return out;
}

LoraFactors stack_lora(const std::vector<LoraFactors>& slices, uint64_t rank, const std::string& what) {
  LoraFactors out;
  out.count = slices.size();
  out.rank = rank;
  out.in = slices.empty() ? 0 : slices[0].in;
  out.out = slices.empty() ? 0 : slices[0].out;
  out.a.assign(static_cast<size_t>(out.count * rank * out.in), 0.0f);
  out.b.assign(static_cast<size_t>(out.count * out.out * rank), 0.0f);
  for (uint64_t e = 0; e < out.count; ++e) {
    const LoraFactors& s = slices[e];
    if (s.in != out.in || s.out != out.out || s.rank > rank || s.count != 1)
      fail(PEFT_ERR_SHAPE_MISMATCH, what + ": slice " + std::to_string(e) + " is " + std::to_string(s.out) + " x " +
                                        std::to_string(s.in) + " (rank " + std::to_string(s.rank) + "), slice 0 " +
                                        std::to_string(out.out) + " x " + std::to_string(out.in));
    std::copy(s.a.begin(), s.a.end(), out.a.begin() + static_cast<std::ptrdiff_t>(e * rank * out.in));
    float* b = out.b.data() + e * out.out * rank;
    for (uint64_t row = 0; row < s.out; ++row)
      std::copy_n(s.b.data() + row * s.rank, s.rank, b + row * rank);
  }
  return out;
}

std::vector<LoraFactors> unstack_lora(const LoraFactors& stacked) {
  std::vector<LoraFactors> out;
  const uint64_t a_size = stacked.rank * stacked.in, b_size = stacked.out * stacked.rank;
  for (uint64_t e = 0; e < stacked.count; ++e) {
    LoraFactors s;
    s.rank = stacked.rank, s.in = stacked.in, s.out = stacked.out;
    s.a.assign(stacked.a.begin() + static_cast<std::ptrdiff_t>(e * a_size),
               stacked.a.begin() + static_cast<std::ptrdiff_t>((e + 1) * a_size));
    s.b.assign(stacked.b.begin() + static_cast<std::ptrdiff_t>(e * b_size),
               stacked.b.begin() + static_cast<std::ptrdiff_t>((e + 1) * b_size));
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace peft
