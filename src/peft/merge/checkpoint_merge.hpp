// Merging adapters into a checkpoint on disk, streaming (docs/architecture.md, "Merge a checkpoint,
// streaming"):
//
//   base folder + adapters (+ weights) -> a folder that transformers' from_pretrained loads unchanged
//
// The plan (merge_plan.hpp) is made and checked completely first, so that every error
// about the inputs comes before anything is written. Then each output tensor is produced in the
// writer's order (the base's order for a base written by safetensors): copied tensors stream from
// the mapped base file to the writer; merged tensors are built in memory by a producer thread that
// works one tensor ahead of the writer, so reading, computing and writing overlap. At most two
// merged tensors are in memory at once (the one being written and the next), so peak memory is
// about twice the largest merged tensor plus the adapters' factors, never the model. Pages of the
// base file are released as they are consumed.
//
// The output is all or nothing: files go to temporaries and are renamed into place only when every
// tensor is written (merged_folder_writer.hpp). A failure or a cancellation (the progress callback
// returns false) leaves the output folder as it was; a folder the merge created is removed again
// if it is still empty. The output folder must not be the base folder.
//
// Results do not depend on the number of threads.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "peft/merge/merge_plan.hpp"
#include "peft/methods/lora_math.hpp"

namespace peft {

// Called on the calling thread with the output bytes written so far and the total; false cancels.
using MergeProgress = std::function<bool(uint64_t done, uint64_t total)>;

struct CheckpointMergeOptions {
  std::vector<MergeInput> adapters;
  std::optional<DType> dtype;   // F32, BF16, F16; nullopt keeps the base's dtypes
  uint64_t max_shard_size = 0;  // 0: the base's files and shard names
  unsigned threads = 0;         // 0: one per hardware thread; 1: everything on the calling thread
  MergeProgress progress;       // optional
  OpenOptions open;             // header size cap for the base's files
  bool require_config = true;   // false: a base without a readable config.json is merged anyway
  bool allow_nonfinite = false; // true: merged weights may hold infinities and NaNs
  // GGUF bases only (gguf_merge.hpp): the ggml type of every merged tensor of two or more dimensions
  // (nullopt: dtype, else each tensor's own type), and whether to measure what storing it costs.
  std::optional<uint32_t> quant;
  bool report = false;
  // GGUF bases split into parts (gguf/gguf_split.hpp) only: write one joined file instead of the same
  // parts (gguf_merge.hpp).
  bool join_split = false;
  // The order of plain LoRA modules' f32 arithmetic (merge::Arithmetic): PEFT's, or llama-export-lora's
  // on ggml's scalar build (then DoRA and the other methods are refused, UNSUPPORTED, before anything
  // is written).
  merge::Arithmetic arithmetic = merge::Arithmetic::peft;
  // A base with tied embeddings changed on one side (TiedEmbeddingsPolicy): untied to equal the
  // adapter's forward (the default), or changed in the shared tensor as PEFT's merge_and_unload does.
  // GGUF bases too (gguf_merge.hpp: an untied output is added as output.weight).
  TiedEmbeddingsPolicy tied_embeddings = TiedEmbeddingsPolicy::untie;
  // Several adapters combined on their deltas before they go into a weight (PEFT's ties, dare_linear,
  // dare_ties or magnitude_prune of merge_utils, as the delta-space combination computes them):
  // W' = round(W + combine(w_i dW_i)), each dW_i the module's own change (adapter_delta.hpp,
  // PEFT's get_delta_weight layout, DARE's masks keyed by the module's name). nullopt, or linear: the
  // adapters are added one after the other. Checkpoint bases only; refused (UNSUPPORTED, listing the
  // modules, before anything is written) with DoRA, stacked expert parameters and modules whose change
  // is no delta (embeddings, conv), and with the ggml arithmetic (INVALID_ARGUMENT).
  std::optional<merge::TaskSettings> combine;
};

// What storing one merged GGUF tensor in its output type costs (CheckpointMergeOptions::report): the
// stored values read back against the exact f32 merge, and the same for the unmerged base's values
// stored in that type (what re-quantizing costs without any merge).
struct GgufStoreReport {
  std::string tensor;
  uint32_t base_type = 0, out_type = 0;  // ggml types
  uint64_t values = 0;
  double rms = 0, max = 0;            // merged: stored against exact
  double base_rms = 0, base_max = 0;  // base: stored against its own values (0 for a replaced tensor)
};

struct CheckpointMergeResult {
  size_t merged = 0;    // tensors changed by LoRA, DoRA, lora_B.bias or trainable-token rows
  size_t replaced = 0;  // tensors replaced whole by an adapter tensor
  size_t copied = 0;    // base tensors written unchanged (converted when the dtype changes)
  size_t added = 0;     // tensors that the base file does not hold (an untied output embedding)
  uint64_t bytes = 0;   // tensor bytes written
  std::vector<std::string> files;  // every file written, relative to the output folder
  std::vector<std::string> notes;
  bool untied_embeddings = false;
  std::vector<GgufStoreReport> store_report;  // GGUF bases with options.report: each merged tensor, in file order
};

CheckpointMergeResult merge_checkpoint(const std::string& base_dir, const std::string& out_dir,
                                       const CheckpointMergeOptions& options);

}  // namespace peft
