#include "peft/arch/gguf_row_order.hpp"

#include "core/error.hpp"
#include "gguf/qkv_rows.hpp"
#include "gguf/rope_rows.hpp"

namespace peft {
namespace {

std::optional<uint64_t> config_count(const nlohmann::json& config, const char* key) {
  if (!config.is_object()) return std::nullopt;
  auto it = config.find(key);
  if (it == config.end() || !it->is_number_unsigned()) return std::nullopt;
  return it->get<uint64_t>();
}

// The first of `keys` that the config gives.
std::optional<uint64_t> config_count(const nlohmann::json& config, std::initializer_list<const char*> keys) {
  for (const char* key : keys)
    if (auto count = config_count(config, key)) return count;
  return std::nullopt;
}

GgufHeads with_kv_default(GgufHeads heads) {
  if (!heads.kv_heads) heads.kv_heads = heads.heads;
  return heads;
}

bool is_fused_qkv(GgufRows order) { return order == GgufRows::qkv_per_head || order == GgufRows::qkv_per_kv_group; }

// The heads a RoPE order runs over: the attention heads for queries, the key/value heads for keys.
std::optional<uint64_t> rope_heads(GgufRows order, const GgufHeads& heads) {
  return order == GgufRows::rope_q ? heads.heads : heads.kv_heads;
}

// The key/value groups of a fused QKV order: one per attention head for qkv_per_head.
std::optional<uint64_t> qkv_groups(GgufRows order, const GgufHeads& heads) {
  return order == GgufRows::qkv_per_head ? heads.heads : heads.kv_heads;
}

std::optional<std::string> fused_qkv_problem(GgufRows order, const GgufHeads& heads, uint64_t rows) {
  const std::optional<uint64_t> groups = qkv_groups(order, heads);
  if (!heads.heads || *heads.heads == 0) return std::string("the base gives no attention head count for its GGUF row order");
  if (!groups || *groups == 0) return std::string("the base gives no key/value head count for its GGUF row order");
  if (*heads.heads % *groups != 0)
    return std::to_string(*heads.heads) + " attention heads do not split into " + std::to_string(*groups) +
           " key/value groups";
  const uint64_t fused = *heads.heads + 2 * *groups;
  if (rows == 0 || rows % fused != 0)
    return std::to_string(rows) + " rows are not " + std::to_string(*heads.heads) + " query + " +
           std::to_string(*groups) + " key + " + std::to_string(*groups) +
           " value heads of one size (llama.cpp's converter cannot reorder this fused query_key_value either)";
  return std::nullopt;
}

}  // namespace

GgufHeads gguf_heads_from_metadata(const GgufHeader& header, const std::string& architecture) {
  const std::string key = architecture + ".attention.head_count";
  return with_kv_default({metadata_count(header, key), metadata_count(header, key + "_kv")});
}

GgufHeads gguf_heads_from_config(const nlohmann::json& config) {
  GgufHeads heads{config_count(config, {"num_attention_heads", "n_head"}),
                  config_count(config, {"num_key_value_heads", "num_kv_heads", "n_head_kv"})};
  // Falcon's RefinedWeb configs (no transformers class: the converter reads config.json as it is) mean
  // one key/value head when they give none; transformers' FalconConfig means as many as attention heads.
  if (!heads.kv_heads && config.is_object()) {
    const auto model_type = config.find("model_type");
    if (model_type != config.end() && model_type->is_string() &&
        (*model_type == "RefinedWeb" || *model_type == "RefinedWebModel"))
      heads.kv_heads = 1;
  }
  return with_kv_default(heads);
}

std::optional<std::string> gguf_rows_problem(GgufRows order, const GgufHeads& heads, uint64_t rows) {
  if (order == GgufRows::same) return std::nullopt;
  if (is_fused_qkv(order)) return fused_qkv_problem(order, heads, rows);
  const std::optional<uint64_t> count = rope_heads(order, heads);
  const char* which = order == GgufRows::rope_q ? "attention head count" : "key/value head count";
  if (!count || *count == 0) return std::string("the base gives no ") + which + " for its GGUF row order";
  if (rows % (2 * *count) != 0)
    return std::to_string(rows) + " rows do not split into " + std::to_string(*count) + " heads of an even size (the " +
           which + ")";
  return std::nullopt;
}

void reorder_gguf_rows(GgufRows order, const GgufHeads& heads, void* data, uint64_t rows, uint64_t row_bytes,
                       bool to_pytorch, const std::string& what) {
  if (order == GgufRows::same) return;
  if (const auto problem = gguf_rows_problem(order, heads, rows)) fail(PEFT_ERR_SHAPE_MISMATCH, what + ": " + *problem);
  if (is_fused_qkv(order))
    reorder_fused_qkv_rows(data, rows, row_bytes, *heads.heads, *qkv_groups(order, heads), to_pytorch);
  else
    reorder_rope_rows(data, rows, row_bytes, *rope_heads(order, heads), to_pytorch);
}

}  // namespace peft
