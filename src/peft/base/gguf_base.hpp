// The base model a GGUF LoRA adapter is written for or read against, as both directions of the
// PEFT <-> GGUF adapter conversion need it: its architecture table, GGUF architecture name and
// attention head counts (for the RoPE row order of q/k), and, for a GGUF model file, its tensors.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "gguf/gguf_header.hpp"
#include "peft/arch/arch_table.hpp"
#include "peft/arch/gguf_row_order.hpp"
#include "checkpoint/checkpoint.hpp"

namespace peft {

struct GgufBase {
  std::shared_ptr<const ArchTable> table;
  std::string architecture;
  GgufHeads heads;
  std::optional<uint64_t> experts;         // Mixtral's expert count (gguf_experts.hpp), if the base has one
  std::shared_ptr<const Checkpoint> gguf;  // a GGUF base: its tensors; null for a Hugging Face folder
  std::string name;                        // for messages
  // Its output embedding is tied to its input embedding (gguf_tied_embeddings for a GGUF model,
  // config_ties_embeddings for a folder): llama.cpp then computes the output from token_embd.
  bool tied_embeddings = false;
};

// A GGUF model with tied embeddings: llama.cpp's converter wrote no tensor for the table's output
// embedding ("output.weight") but one for an input embedding ("token_embd.weight"), from which
// llama.cpp then computes the output. nullopt otherwise.
struct GgufTiedEmbeddings {
  size_t input;               // the input embedding's tensor index
  std::string output_module;  // "lm_head"
  std::string output_tensor;  // "output.weight", which the file does not hold
};
std::optional<GgufTiedEmbeddings> gguf_tied_embeddings(const Checkpoint& gguf, const ArchTable& table);

// `name`: a Hugging Face model folder or hub id (config.json: model_type, head counts), or a GGUF
// model file (general.architecture, head counts). INVALID_ARGUMENT for an empty name; the errors
// of opening the base; UNSUPPORTED for a model_type with no known GGUF architecture. For a GGUF
// model file, `fits` picks among the tables of its architecture (builtin_table_for_gguf).
GgufBase open_gguf_base(const std::string& name, const std::function<bool(const ArchTable&)>& fits = {});

// Fails with INVALID_ARGUMENT when the GGUF file `name`, given as a base, is an adapter
// (general.type "adapter", or an adapter.type key, as llama.cpp's converters write them): the base
// of a merge, an export or an import is a model. open_gguf_base and the GGUF merge check it.
void require_gguf_model(const GgufHeader& header, const std::string& name);

}  // namespace peft
