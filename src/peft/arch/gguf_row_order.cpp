#include "peft/arch/gguf_row_order.hpp"

#include "core/error.hpp"
#include "gguf/rope_rows.hpp"

namespace peft {
namespace {

std::optional<uint64_t> config_count(const nlohmann::json& config, const char* key) {
  if (!config.is_object()) return std::nullopt;
  auto it = config.find(key);
  if (it == config.end() || !it->is_number_unsigned()) return std::nullopt;
  return it->get<uint64_t>();
}

GgufHeads with_kv_default(GgufHeads heads) {
  if (!heads.kv_heads) heads.kv_heads = heads.heads;
  return heads;
}

// The heads a RoPE order runs over: the attention heads for queries, the key/value heads for keys.
std::optional<uint64_t> rope_heads(GgufRows order, const GgufHeads& heads) {
  return order == GgufRows::rope_q ? heads.heads : heads.kv_heads;
}

}  // namespace

GgufHeads gguf_heads_from_metadata(const GgufHeader& header, const std::string& architecture) {
  const std::string key = architecture + ".attention.head_count";
  return with_kv_default({metadata_count(header, key), metadata_count(header, key + "_kv")});
}

GgufHeads gguf_heads_from_config(const nlohmann::json& config) {
  return with_kv_default({config_count(config, "num_attention_heads"), config_count(config, "num_key_value_heads")});
}

std::optional<std::string> gguf_rows_problem(GgufRows order, const GgufHeads& heads, uint64_t rows) {
  if (order == GgufRows::same) return std::nullopt;
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
  reorder_rope_rows(data, rows, row_bytes, *rope_heads(order, heads), to_pytorch);
}

}  // namespace peft
