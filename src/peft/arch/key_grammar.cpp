#include "peft/arch/key_grammar.hpp"

#include <vector>

#include "peft/methods/method_table.hpp"

namespace peft {
namespace {

constexpr std::string_view kDefaultAdapter = "default";

std::vector<std::string_view> split_segments(std::string_view text) {
  std::vector<std::string_view> out;
  size_t start = 0;
  while (true) {
    size_t dot = text.find('.', start);
    out.push_back(text.substr(start, dot == std::string_view::npos ? std::string_view::npos : dot - start));
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  return out;
}

std::string join(const std::vector<std::string_view>& segs, size_t begin, size_t end) {
  std::string out;
  for (size_t i = begin; i < end; ++i) {
    if (i > begin) out += '.';
    out += segs[i];
  }
  return out;
}

bool tail_is(const std::vector<std::string_view>& segs, size_t from, std::initializer_list<std::string_view> want) {
  if (segs.size() - from != want.size()) return false;
  size_t i = from;
  for (std::string_view w : want)
    if (segs[i++] != w) return false;
  return true;
}

// A lora_* segment at `j`: decides the role from what follows it. Sets had_name when the tail
// carries the default adapter name.
std::optional<TensorRole> lora_role(const std::vector<std::string_view>& segs, size_t j, bool& had_name) {
  std::string_view s = segs[j];
  auto tail = [&](std::initializer_list<std::string_view> plain, std::initializer_list<std::string_view> named) {
    if (tail_is(segs, j + 1, plain)) return true;
    if (tail_is(segs, j + 1, named)) {
      had_name = true;
      return true;
    }
    return false;
  };
  if (s == "lora_A" && tail({"weight"}, {kDefaultAdapter, "weight"})) return TensorRole::lora_a;
  if (s == "lora_B" && tail({"weight"}, {kDefaultAdapter, "weight"})) return TensorRole::lora_b;
  if (s == "lora_B" && tail({"bias"}, {kDefaultAdapter, "bias"})) return TensorRole::lora_b_bias;
  if (s == "lora_embedding_A" && tail({}, {kDefaultAdapter})) return TensorRole::lora_embedding_a;
  if (s == "lora_embedding_B" && tail({}, {kDefaultAdapter})) return TensorRole::lora_embedding_b;
  if (s == "lora_magnitude_vector") {
    // PEFT writes "lora_magnitude_vector"; its loader also accepts "lora_magnitude_vector.weight".
    if (tail({}, {kDefaultAdapter}) || tail({"weight"}, {kDefaultAdapter, "weight"})) return TensorRole::lora_magnitude;
  }
  return std::nullopt;
}

// Whether `segment` is a parameter some method saves as "<module>.<name>[.default]" (with
// `tail` null) or "<module>.<name>[.default].<tail>".
bool is_method_param_with_tail(std::string_view segment, const char* tail) {
  for (const MethodRow& row : method_table())
    if ((row.key_tail == nullptr) == (tail == nullptr) && (tail == nullptr || std::string_view(row.key_tail) == tail) &&
        row_has_param(row, segment))
      return true;
  return false;
}

}  // namespace

bool is_method_param(std::string_view segment) { return is_method_param_with_tail(segment, nullptr); }

const char* role_suffix(TensorRole role) {
  switch (role) {
    case TensorRole::lora_a: return "lora_A.weight";
    case TensorRole::lora_b: return "lora_B.weight";
    case TensorRole::lora_b_bias: return "lora_B.bias";
    case TensorRole::lora_embedding_a: return "lora_embedding_A";
    case TensorRole::lora_embedding_b: return "lora_embedding_B";
    case TensorRole::lora_magnitude: return "lora_magnitude_vector";
    case TensorRole::trainable_tokens_delta: return "token_adapter.trainable_tokens_delta";
    case TensorRole::full: return "";
    case TensorRole::method_param: return "";
  }
  return "";
}

bool is_lora_role(TensorRole role) {
  return role != TensorRole::full && role != TensorRole::trainable_tokens_delta;
}

std::string ParsedKey::key(bool with_prefix) const {
  return (with_prefix ? std::string(kPeftPrefix) : std::string()) + module + "." + role_suffix;
}

std::optional<ParsedKey> parse_adapter_key(std::string_view key) {
  ParsedKey parsed;
  if (key.starts_with(kPeftPrefix)) {
    parsed.had_prefix = true;
    key.remove_prefix(kPeftPrefix.size());
  }
  if (key.empty()) return std::nullopt;
  std::vector<std::string_view> segs = split_segments(key);
  for (std::string_view s : segs)
    if (s.empty()) return std::nullopt;

  // OFT: <module>.oft_R[.default].weight (its OFTRotationModule's weight), role_suffix "oft_R":
  // the parameters whose method row has a key tail.
  {
    const size_t n = segs.size();
    const bool named = n >= 4 && segs[n - 2] == kDefaultAdapter;
    const size_t at = named ? n - 3 : n - 2;
    if (n >= 3 && at >= 1 && is_method_param_with_tail(segs[at], std::string(segs[n - 1]).c_str())) {
      parsed.module = join(segs, 0, at);
      parsed.role = TensorRole::method_param;
      parsed.role_suffix = std::string(segs[at]);
      parsed.had_adapter_name = named;
      return parsed;
    }
  }

  // Parameters of other methods: <module>.<param>[.default], the param last.
  {
    size_t last = segs.size() - 1;
    const bool named = segs.size() >= 3 && segs[last] == kDefaultAdapter && is_method_param(segs[last - 1]);
    if (named) --last;
    if (last >= 1 && is_method_param(segs[last])) {
      parsed.module = join(segs, 0, last);
      parsed.role = TensorRole::method_param;
      parsed.role_suffix = std::string(segs[last]);
      parsed.had_adapter_name = named;
      return parsed;
    }
  }

  // LoRA roles: the last lora_* segment decides; anything lora_* that is not a LoRA role of this
  // grammar (AdaLoRA's lora_E, KaSA's lora_diag, another adapter name) is not resolved.
  for (size_t j = segs.size(); j-- > 0;) {
    if (!segs[j].starts_with("lora_")) continue;
    if (j == 0) return std::nullopt;
    bool had_name = false;
    auto role = lora_role(segs, j, had_name);
    if (!role) return std::nullopt;
    parsed.module = join(segs, 0, j);
    parsed.role = *role;
    parsed.role_suffix = role_suffix(*role);
    parsed.had_adapter_name = had_name;
    return parsed;
  }

  // Trainable tokens: <module>.token_adapter.trainable_tokens_delta[.default]
  for (size_t j = 1; j < segs.size(); ++j) {
    if (segs[j] != "token_adapter") continue;
    bool had_name = false;
    if (tail_is(segs, j + 1, {"trainable_tokens_delta"})) {
    } else if (tail_is(segs, j + 1, {"trainable_tokens_delta", kDefaultAdapter})) {
      had_name = true;
    } else {
      return std::nullopt;
    }
    parsed.module = join(segs, 0, j);
    parsed.role = TensorRole::trainable_tokens_delta;
    parsed.role_suffix = role_suffix(parsed.role);
    parsed.had_adapter_name = had_name;
    return parsed;
  }

  // TRAINABLE_TOKENS adapters (peft_type TRAINABLE_TOKENS): <module>.trainable_tokens_delta[.default],
  // the same rows as LoRA's token_adapter.trainable_tokens_delta.
  {
    const size_t n = segs.size();
    const bool named = n >= 3 && segs[n - 1] == kDefaultAdapter && segs[n - 2] == "trainable_tokens_delta";
    const size_t last = named ? n - 2 : n - 1;
    if (last >= 1 && segs[last] == "trainable_tokens_delta" && segs[last - 1] != "token_adapter") {
      parsed.module = join(segs, 0, last);
      parsed.role = TensorRole::trainable_tokens_delta;
      parsed.role_suffix = "trainable_tokens_delta";  // as TRAINABLE_TOKENS saves it
      parsed.had_adapter_name = named;
      return parsed;
    }
  }

  // Full replacement tensors: <module>[.modules_to_save.default][.base_layer].<param>
  if (segs.size() < 2) return std::nullopt;
  for (std::string_view s : segs)
    if (s == "original_module" || s == "token_adapter") return std::nullopt;
  size_t end = segs.size() - 1;  // index of the parameter name
  std::string_view param = segs[end];
  for (size_t j = 0; j < end; ++j) {
    if (segs[j] != "modules_to_save") continue;
    // Only "<module>.modules_to_save.default.<param>" (the in-memory key of the default adapter).
    if (j == 0 || j + 2 != end || segs[j + 1] != kDefaultAdapter) return std::nullopt;
    parsed.had_adapter_name = true;
    end = j;
    break;
  }
  // LN_TUNING saves its tuned copy of a norm as <module>.ln_tuning_layers.<param> (kept in the suffix).
  bool base_layer = end >= 2 && (segs[end - 1] == "base_layer" || segs[end - 1] == "ln_tuning_layers");
  size_t module_end = base_layer ? end - 1 : end;
  if (module_end == 0) return std::nullopt;
  parsed.module = join(segs, 0, module_end);
  parsed.role = TensorRole::full;
  parsed.role_suffix = (base_layer ? std::string(segs[end - 1]) + "." : "") + std::string(param);
  parsed.base_tensor = parsed.module + "." + std::string(param);
  return parsed;
}

std::string suffix_parameter(std::string_view role_suffix) {
  const size_t dot = role_suffix.rfind('.');
  return std::string(dot == std::string_view::npos ? role_suffix : role_suffix.substr(dot + 1));
}

}  // namespace peft
