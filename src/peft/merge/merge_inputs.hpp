// The adapters of a checkpoint merge as a caller lists them (opened already, or folders still to
// open against the base), and opening them into the merge's inputs with every adapter's problems
// reported together.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "peft/adapter/adapter.hpp"
#include "peft/merge/merge_plan.hpp"

namespace peft {

// One adapter to merge: `adapter` when it is open already; otherwise the folder `dir`, opened
// against the base when the merge starts, or a GGUF LoRA file (peft/adapter/gguf_lora_file.hpp).
struct MergeAdapter {
  std::shared_ptr<const Adapter> adapter;
  std::string dir;
  double weight = 1.0;
};

// The merge's inputs, in the given order: each folder opened with `base_dir` as its base model
// (Adapter::open; an empty `base_dir` opens them without a base). Adapters that do not fit the base are all tried before failing, with
// PEFT_ERR_UNRESOLVED_KEY when any has an unresolved tensor (PEFT_ERR_SHAPE_MISMATCH otherwise) and
// a message holding every adapter's problem; any other error is thrown as it comes.
// A GGUF base file as `base_dir`: folders are opened without a base (the GGUF merge checks them) and
// GGUF LoRA files are opened (open_gguf_lora; the merge checks them against the base). GGUF LoRA files
// with any other base: PEFT_ERR_UNSUPPORTED, pointing to the conversion to a PEFT folder.
std::vector<MergeInput> open_merge_inputs(const std::vector<MergeAdapter>& adapters, const std::string& base_dir);

}  // namespace peft
