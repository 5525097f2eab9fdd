// The one entry point of a checkpoint merge, for either base format: the base told apart (a GGUF
// file, or a checkpoint folder, file or hub model id resolved through the hub cache), the adapters
// opened against it, the merge run by gguf_merge or checkpoint_merge, and its store report as JSON.
#pragma once

#include <string>
#include <vector>

#include "peft/merge/checkpoint_merge.hpp"
#include "peft/merge/merge_inputs.hpp"

namespace peft {

// Merges options.adapters into `base`: a GGUF base file through merge_into_gguf (gguf_merge.hpp),
// anything else (a checkpoint folder or file, or a hub model id) through merge_checkpoint. Fails as
// those.
CheckpointMergeResult merge_into_base(const std::string& base, const std::string& out,
                                      const CheckpointMergeOptions& options);

// Opens `adapters` against `base` (open_merge_inputs) in place of options.adapters and merges them
// (merge_into_base). Fails as those.
CheckpointMergeResult merge_adapters(const std::string& base, const std::string& out,
                                     const std::vector<MergeAdapter>& adapters, CheckpointMergeOptions options);

// The store report as a JSON array of objects {"tensor", "base_type", "type", "values", "rms", "max",
// "base_rms", "base_max"}, types by name (their number when ggml has no name for it), invalid UTF-8
// in a tensor name replaced: what peft_merge_result_report_json() gives.
std::string store_report_json(const std::vector<GgufStoreReport>& report);

}  // namespace peft
