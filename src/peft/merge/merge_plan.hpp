// Planning a checkpoint merge: which adapter terms hit which base tensor, what each output tensor
// is made of, which file it goes to, and everything that can be wrong with that, all decided
// before a single byte is written (checkpoint_merge.hpp executes the plan).
//
// The changes to one base tensor are applied in this order:
//   1. a full replacement (modules_to_save copies, bias="all" biases, saved `base_layer` weights):
//      the adapter's tensor, converted to the working dtype, replaces the base's;
//   2. the LoRA terms of every adapter, in the order the adapters were given. Plain LoRA terms that
//      follow each other are summed in f32 and rounded once (lora_math); a DoRA term is applied on
//      its own, with its norm taken from the weight as it is at that point, which is what PEFT's
//      merge of several active adapters does (it merges them one after the other);
//   3. lora_B.bias terms (lora_bias=True): summed in f32, added with one rounding;
//   4. trainable-token rows: copied over the embedding rows they stand for.
// An adapter's weight multiplies its LoRA scaling (and its lora_B.bias); replacement tensors and
// token rows are taken as they are.
//
// Conflicts are errors (PEFT_ERR_INVALID_ARGUMENT): two adapters replacing the same tensor, one
// adapter with two tensors for the same base tensor, trainable-token rows of two adapters on the same
// row. Tensors an adapter names that the base lacks are PEFT_ERR_UNRESOLVED_KEY and shapes that do
// not fit PEFT_ERR_SHAPE_MISMATCH, every problem of every adapter listed in one message.
//
// bitsandbytes bases (bnb_base.hpp): a quantized weight takes LoRA terms only. With `dtype` unset,
// a merged weight is quantized again in its format and every one of its state tensors rewritten
// (untouched weights are copied byte for byte); with `dtype` set, every quantized weight is written
// dequantized in that dtype, its state tensors are dropped and config.json loses quantization_config.
//
// Dtypes: with `dtype` unset each tensor keeps the base's dtype; with F32, BF16 or F16 every tensor
// of an ordinary floating-point dtype (F64, F32, F16, BF16) becomes it, and everything else (integers,
// F8 and smaller formats) is copied as it is. A tensor that is merged is computed in its output dtype
// when that equals the base's, otherwise in F32 and rounded to the output dtype when written.
//
// Quantized bases (base_quantization.hpp): an FP8 block-scale base keeps its layout when `dtype` is
// unset: an FP8 weight that an adapter changes is dequantized, changed in f32 and quantized again
// block by block (core/quant/fp8_block.hpp), and its weight_scale_inv is recomputed with it (the
// same computation, run once for each of the two output tensors); untouched weights and scales are
// copied byte for byte. With `dtype` set every FP8 weight is written dequantized in it, its
// weight_scale_inv and activation_scale are left out, and config.json loses quantization_config.
#pragma once

#include "peft/methods/lora_math.hpp"

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.hpp"
#include "core/quant/fp8_block.hpp"
#include "peft/adapter/adapter.hpp"
#include "peft/base/base_model.hpp"
#include "peft/base/base_validation.hpp"
#include "peft/merge/base_quantization.hpp"
#include "peft/merge/tied_embeddings.hpp"
#include "peft/base/bnb_base.hpp"
#include "peft/base/expert_base.hpp"
#include "safetensors/header_writer.hpp"

namespace peft {

struct GgufLoraFile;  // peft/adapter/gguf_lora_file.hpp

// One adapter of a merge: a PEFT adapter, or (merges into a GGUF base only, gguf_merge.hpp) a GGUF
// LoRA file, with `adapter` null.
// (Constructors rather than an aggregate, so that `{adapter, weight}` stays complete.)
struct MergeInput {
  MergeInput() = default;
  MergeInput(std::shared_ptr<const Adapter> a, double w = 1.0) : adapter(std::move(a)), weight(w) {}
  MergeInput(std::shared_ptr<const GgufLoraFile> lora, double w) : weight(w), gguf_lora(std::move(lora)) {}

  std::shared_ptr<const Adapter> adapter;
  double weight = 1.0;
  std::shared_ptr<const GgufLoraFile> gguf_lora;
  // Only these modules of the adapter (AdapterModule::name) are merged; unset: all of them. Used by
  // the GGUF split export, which merges what a GGUF LoRA cannot hold and exports the rest.
  std::optional<std::set<std::string>> modules = std::nullopt;
};

// Fails with PEFT_ERR_INVALID_ARGUMENT when `out` is the base or an input adapter (folder or GGUF
// LoRA file), by file identity (core/file_identity.hpp).
void refuse_output_over_merge_inputs(const std::string& out, const std::string& base,
                                     const std::vector<MergeInput>& adapters);

struct MergePlanOptions {
  std::optional<DType> dtype;   // F32, BF16 or F16; nullopt keeps the base's dtypes
  uint64_t max_shard_size = 0;  // 0: the base's files; otherwise reshard at this many bytes
  OpenOptions open;
  TiedEmbeddingsPolicy tied_embeddings = TiedEmbeddingsPolicy::untie;
  bool base_only = false;  // no adapters: the base's tensors and layout alone (a model combination's plan)
};

// One adapter after being checked against the base: its modules with base tensor names resolved.
struct PlannedAdapter {
  std::shared_ptr<const Adapter> adapter;
  double weight = 1.0;
  std::vector<AdapterModule> modules;  // never resized after planning: terms point into it
};

struct LoraTerm {
  const PlannedAdapter* adapter = nullptr;
  const AdapterModule* module = nullptr;
  double coefficient = 0.0;  // adapter weight x module scaling
  bool dora = false;
  // A stacked expert parameter (module->expert): the part of the experts' deltas this tensor holds.
  std::optional<ExpertSlot> expert = std::nullopt;
};

struct TensorSource {  // one tensor of an adapter's checkpoint
  const PlannedAdapter* adapter = nullptr;
  const AdapterTensor* tensor = nullptr;
  // The tensor belongs to a modules_to_save copy, which PEFT's merge swaps in for the base module
  // (other full tensors, like saved `base_layer` weights and bias="all" biases, are loaded into the
  // base module's own parameters).
  bool swaps_module = false;
};

struct TokenRows {
  const PlannedAdapter* adapter = nullptr;
  const AdapterModule* module = nullptr;  // its token_indices and trainable_tokens_delta
};

enum class TensorAction {
  copy,      // the base tensor as it is (converted if the dtype changes)
  replace,   // an adapter's tensor instead, nothing else
  compute,   // built in memory: replacement and/or LoRA, bias and token changes
  duplicate, // a copy of another base tensor's original data (an untied output embedding)
};

// An output tensor made from an FP8 block-scale weight of the base and its scales.
struct Fp8BlockSource {
  size_t weight_index = 0;  // base tensors: the F8_E4M3 weight and its F32 weight_scale_inv
  size_t scale_index = 0;
  Fp8BlockLayout layout;
  bool scale_output = false;  // this tensor is the recomputed weight_scale_inv, not the weight
};

struct PlannedTensor {
  std::string name;
  size_t base_index = 0;        // the base tensor it comes from (for duplicate: the one copied)
  DType base_dtype = DType::F32;
  DType out_dtype = DType::F32;
  DType work_dtype = DType::F32;  // compute: the dtype of the in-memory buffer
  std::vector<uint64_t> shape;
  uint64_t out_nbytes = 0;
  TensorAction action = TensorAction::copy;
  std::optional<TensorSource> replacement;
  std::vector<LoraTerm> lora;
  std::vector<LoraTerm> lora_bias;  // terms whose lora_B.bias adds to this (bias) tensor
  std::vector<TokenRows> tokens;
  // Set for an FP8 weight (or its scales) that is requantized or dequantized. For the scales, the
  // changes above are the weight's. work_dtype is what the buffer holds: F8_E4M3 (requantized
  // weight), F32 (scales, or a weight dequantized for an output dtype).
  std::optional<Fp8BlockSource> fp8;


  // A bitsandbytes weight (bnb_base.hpp), or one of its state tensors (bnb_part: this tensor's base
  // index): dequantized (with `dtype`: the weight in out_dtype, its shape, the state tensors dropped),
  // merged, and with `bnb_requantize` quantized again, this tensor holding its part of the result.
  const BnbWeight* bnb = nullptr;
  size_t bnb_part = 0;
  bool bnb_requantize = false;
  // An output embedding the base file does not store (its tied input embedding is base_index).
  bool added = false;
  // Token rows set before the LoRA terms are added: an untied output embedding, whose LoRA layer PEFT
  // wraps around the tied token layer (merges otherwise set the rows last, as merge_and_unload does).
  bool tokens_before_lora = false;

  bool changed() const { return replacement || !lora.empty() || !lora_bias.empty() || !tokens.empty(); }
};

struct PlannedFile {
  std::string name;              // relative to the output folder
  std::vector<size_t> members;   // indices into MergePlan::tensors
  WriterMetadata metadata;
};

struct MergePlan {
  BaseModel base;
  std::vector<std::unique_ptr<PlannedAdapter>> adapters;  // stable addresses
  std::vector<PlannedTensor> tensors;  // base order; an added tensor follows the one it copies
  std::vector<PlannedFile> files;
  bool write_index = false;
  std::string index_metadata_json = "{}";  // the base index's "metadata" (total_size recomputed)
  std::optional<DType> dtype;              // as asked
  bool untie_embeddings = false;           // config.json gets tie_config_key = false
  std::string tie_config_key;              // the base's key that ties the embeddings (tie_word_embeddings)
  std::vector<std::string> notes;          // for the caller: what was decided and why
  BaseQuantization quantization;           // config.json's quantization_config
  bool dequantized = false;                // quantized weights written dequantized: config loses quantization_config
  std::shared_ptr<const BnbBase> bnb;      // a bitsandbytes base's quantized weights
  // The last re-quantized bitsandbytes weight's tensors (weight and state, by base index): its parts
  // come one after the other, so each weight is merged and quantized once. Filled by compute_tensor,
  // which the merge calls from one thread at a time.
  struct BnbParts {
    const BnbWeight* weight = nullptr;
    std::map<size_t, std::vector<uint8_t>> parts;
  };
  mutable BnbParts bnb_parts;
  // The order of plain LoRA terms' f32 arithmetic (CheckpointMergeOptions::arithmetic), set after planning.
  merge::Arithmetic arithmetic = merge::Arithmetic::peft;
  // CheckpointMergeOptions::allow_nonfinite, set after planning: checked on merged f32 values before
  // a quantizer (bitsandbytes) can hide an infinity or NaN in its scales.
  bool allow_nonfinite = false;
  // CheckpointMergeOptions::combine (a pruning type), set after planning: each tensor's adapter
  // changes combined on their deltas instead of added in turn.
  std::optional<merge::TaskSettings> combine;

  uint64_t total_bytes() const;
  // Tensors by action; a computed tensor with no changes (a weight only dequantized) counts as a copy,
  // an added tensor (PlannedTensor::added) as a duplicate whatever its action.
  size_t count(TensorAction action) const;
};

// Opens the base (config.json and weights), checks every adapter against it and plans the output.
// Throws as described at the top of this file, plus the errors of opening the base.
MergePlan plan_merge(const std::string& base_dir, const std::vector<MergeInput>& inputs,
                     const MergePlanOptions& options);

// Whether a dtype is one of the ordinary floating-point formats that --dtype converts.
bool is_convertible_float(DType dtype);

}  // namespace peft
