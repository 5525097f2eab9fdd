// The row orders llama.cpp's converter gives some weights in GGUF (a rule's "gguf_rows"), with the
// head counts they run over. One place for every path that moves rows between GGUF and PyTorch:
// merges into GGUF bases, the GGUF adapter export and import.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "gguf/gguf_header.hpp"
#include "peft/arch/arch_table.hpp"

namespace peft {

struct GgufHeads {
  std::optional<uint64_t> heads;     // attention heads
  std::optional<uint64_t> kv_heads;  // key/value heads; the attention heads when the source gives none
};

// From a GGUF file's "<architecture>.attention.head_count" and "..._kv".
GgufHeads gguf_heads_from_metadata(const GgufHeader& header, const std::string& architecture);
// From a config.json as llama.cpp's converter reads it: attention heads from num_attention_heads or
// n_head (BLOOM); key/value heads from num_key_value_heads, num_kv_heads or n_head_kv (Falcon), else
// 1 for Falcon's RefinedWeb model_types, else the attention heads.
GgufHeads gguf_heads_from_config(const nlohmann::json& config);

// Why `order` cannot reorder a weight of `rows` rows with `heads` (a phrase for a message), or
// nullopt when it can. Always nullopt for GgufRows::same.
std::optional<std::string> gguf_rows_problem(GgufRows order, const GgufHeads& heads, uint64_t rows);

// Reorders the rows (`row_bytes` each) of a row-major matrix from GGUF's order to PyTorch's
// (to_pytorch) or back. Nothing to do for GgufRows::same. PEFT_ERR_SHAPE_MISMATCH, naming `what`,
// where gguf_rows_problem() gives a problem.
void reorder_gguf_rows(GgufRows order, const GgufHeads& heads, void* data, uint64_t rows, uint64_t row_bytes,
                       bool to_pytorch, const std::string& what);

}  // namespace peft
