// A PEFT adapter as a GGUF LoRA adapter plus a merged copy of its base, for adapters that a GGUF
// LoRA alone cannot hold:
//
//   adapter + base -> OUT.gguf (the modules a GGUF LoRA holds) + BASE_OUT (the base with the others merged)
//
// The modules gguf_lora_unsupported_modules() names (DoRA, lora_B.bias, whole tensors such as
// modules_to_save, trainable tokens, other layer kinds, one side of tied embeddings, a vision-language
// model's vision tower) are merged whole, PEFT-exactly, into a copy of the base by the
// existing merge pipelines: merge_into_gguf for a GGUF base (BASE_OUT a GGUF file), merge_checkpoint
// for a Hugging Face folder or hub id (BASE_OUT a model folder). The rest is written by
// export_gguf_adapter against the same base, so that llama.cpp applying OUT.gguf to BASE_OUT gives
// PEFT's merged model. A DoRA module is not separable and a lora_B.bias module is merged with its
// factors, so the adapter holds only plain LoRA pairs. With nothing to merge, BASE_OUT is a copy of
// the base.
//
// All or nothing: the adapter is written first under a temporary name next to OUT (".<name>.peft-tmp-
// XXXXXX"), then BASE_OUT (atomically, as each pipeline writes), then the adapter is renamed to OUT. A
// failure before the rename leaves neither output (and no temporary); if that last rename fails,
// BASE_OUT's files are removed again (its folder too when the merge created it). A process killed
// midway may leave the temporary, or a complete BASE_OUT without OUT.
//
// Errors: INVALID_ARGUMENT for an empty BASE_OUT or one that is the base or OUT; the errors of
// export_gguf_adapter for the exported modules and of the merge for the merged ones.
#pragma once

#include <memory>
#include <string>

#include "peft/adapter/adapter.hpp"
#include "peft/export/gguf_adapter_export.hpp"

namespace peft {

// options.skip is ignored (the split decides it). threads: for the merge (0: one per hardware thread).
void export_gguf_adapter_split(const std::shared_ptr<const Adapter>& adapter, const std::string& out_path,
                               const GgufAdapterExportOptions& options, const std::string& base_out,
                               unsigned threads = 0);

}  // namespace peft
