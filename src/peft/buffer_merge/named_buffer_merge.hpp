// A buffer merge as a host asks for one (peft_merge_buffer_apply()): the adapter module that the
// host's name for a weight addresses (layer_module.hpp), merged into the host's weight
// buffer and, for a lora_B.bias, its bias buffer (BufferMerge, buffer_merge.hpp), together with
// what taking it out again needs: the buffers' dtypes and shapes.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "core/dtype.hpp"
#include "peft/adapter/adapter.hpp"
#include "peft/buffer_merge/buffer_merge.hpp"
#include "peft/arch/translator.hpp"

namespace peft {

// PEFT_ERR_UNSUPPORTED "<what> dtype <name> is not supported (F32, BF16 and F16 are)" for a dtype
// a host buffer may not have (any int32_t value, as the C API passes it, is accepted here).
void require_buffer_dtype(DType dtype, const char* what);

struct NamedBufferMergeOptions {
  double weight = 1.0;              // multiplies the adapter's scaling
  bool keep_original_rows = false;  // removal restores the original bytes (BufferMergeOptions)
  unsigned threads = 0;             // 0: one per hardware thread
  std::optional<Translator> translator;  // names are the host's own (or GGUF's); otherwise HuggingFace's
};

class NamedBufferMerge {
 public:
  // Merges the LoRA module that `name` addresses (find_lora_module; a stacked GGUF expert tensor:
  // gguf_stacked_buffer_module) as the host holds it (host_buffer_module: with GGUF names, in the
  // converter's row order) into `weight`, a buffer of
  // `weight_dtype` (F32, BF16 or F16) and `shape`, and, when the module has a lora_B.bias, into
  // `bias`, a buffer of `bias_dtype` holding one element per output feature (required then,
  // ignored otherwise). Errors: those of find_lora_module, buffer_merge_module and BufferMerge::apply;
  // PEFT_ERR_INVALID_ARGUMENT for a missing bias, PEFT_ERR_UNSUPPORTED for its dtype
  // (require_buffer_dtype). The buffers are untouched when it throws.
  static NamedBufferMerge apply(const std::shared_ptr<const Adapter>& adapter, std::string_view name, void* weight,
                                DType weight_dtype, std::span<const int64_t> shape, void* bias, DType bias_dtype,
                                const NamedBufferMergeOptions& options);

  // Takes the merge out of the same buffers (they may have moved since). PEFT_ERR_INVALID_ARGUMENT
  // when it was taken out already or when it changed a bias and `bias` is null; otherwise
  // BufferMerge::remove's errors.
  void remove(void* weight, void* bias);

  const std::string& module() const { return module_; }  // the module's HuggingFace path
  bool active() const { return record_.active(); }
  uint64_t saved_bytes() const { return record_.saved_bytes(); }

 private:
  BufferMerge record_;
  std::string module_;
  DType weight_dtype_ = DType::F32;
  DType bias_dtype_ = DType::F32;
  int64_t rows_ = 0;
  int64_t cols_ = 0;
  int64_t bias_elements_ = 0;  // 0: the merge left the bias alone
};

}  // namespace peft
