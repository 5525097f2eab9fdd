// The LoRA layers of one registered adapter, loaded into memory in the registry's storage dtype:
// what the registry counts against its budget, what peft_lora_apply() multiplies with and what a
// host model's swap merges. Built by LoadedAdapter::load (registry.cpp's loader), immutable
// afterwards, shared by every lease of that adapter version; freed when the registry evicts it
// and no lease or host model holds it.
//
// Thread safety: immutable; every method may be called from many threads at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <functional>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/dtype.hpp"
#include "core/huge_buffer.hpp"
#include "peft/adapter/adapter.hpp"

namespace peft::serve {

// One LoRA layer. Factors as PEFT stores them: A = lora_A [rank, a_cols] and B = lora_B [b_rows, rank]
// (embeddings: lora_embedding_A [rank, num_embeddings], lora_embedding_B [dim, rank]; Conv2d: A
// flattened to [rank, in * kh * kw]). For Linear and GPT-2 Conv1D layers a_cols is in_features and
// b_rows out_features.
struct LoadedLayer {
  std::string module;       // HuggingFace module path, e.g. "model.layers.0.self_attn.q_proj"
  LayerKind kind = LayerKind::linear;  // linear, conv1d, embedding or conv2d
  int64_t rank = 0;
  int64_t a_cols = 0;
  int64_t b_rows = 0;
  std::vector<int64_t> a_shape, b_shape;  // as stored in the file (Conv2d A is 4-D)
  double scaling = 0;       // PEFT's scaling after rank/alpha patterns and rslora
  // Element offsets into LoadedAdapter's storage; npos when absent.
  static constexpr size_t npos = static_cast<size_t>(-1);
  size_t a = npos;          // rank * a_cols elements
  size_t b = npos;          // b_rows * rank elements
  size_t bias = npos;       // lora_B.bias, b_rows elements (lora_bias=True)
  size_t magnitude = npos;  // DoRA lora_magnitude_vector, b_rows elements
};

class LoadedAdapter {
 public:
  // Bytes load() will allocate for `adapter`'s LoRA layers in `storage` (the budget charge); reads
  // only the header. UNSUPPORTED when a LoRA tensor is not F64/F32/F16/BF16.
  static uint64_t bytes_needed(const Adapter& adapter, DType storage);

  // Reads every LoRA layer's tensors and converts them to `storage` (F32, BF16 or F16), in one
  // allocation (in huge pages from 2 MiB on: allocate_huge). Full-tensor and trainable-token modules are not loaded (layers() skips them;
  // has_replacements() reports them), nor the modules of other methods (method_modules()) and the
  // LoRA on stacked expert parameters (expert_modules()). IO / format errors when the file cannot be read.
  static std::shared_ptr<const LoadedAdapter> load(std::shared_ptr<const Adapter> adapter, DType storage);

  DType dtype() const { return dtype_; }
  uint64_t bytes() const { return bytes_; }
  const Adapter& adapter() const { return *adapter_; }
  const std::shared_ptr<const Adapter>& adapter_ptr() const { return adapter_; }
  const std::vector<LoadedLayer>& layers() const { return layers_; }
  // Whether the adapter also has tensors that replace base tensors: modules_to_save copies, trainable
  // tokens, or tensors beside a LoRA layer's factors (a saved base_layer weight or bias, bias="all").
  bool has_replacements() const { return has_replacements_; }

  // The LoRA modules on stacked expert parameters (target_parameters), in file order. Like the
  // method modules they are not copied into the storage nor charged to the budget: a host model's
  // swap reads their factors from the adapter file when it merges them, and unmerged apply refuses
  // them.
  const std::vector<const AdapterModule*>& expert_modules() const { return expert_modules_; }
  // The expert module a name stands for: its module path, its parameter's name ("<experts
  // module>.<param>", in memory or as checkpoints name the module), or one of the tensors (or their
  // modules) a checkpoint saves per expert ("...experts.3.up_proj"); null when none.
  const AdapterModule* find_expert_module(std::string_view name) const;

  // The layer of a HuggingFace module path (exactly as in LoadedLayer::module); null when absent.
  // Callers normalise names first (see module_candidates in layer_module.hpp).
  const LoadedLayer* find(std::string_view module) const;

  // The modules of other PEFT methods (LoHa, LoKr, AdaLoRA, IA3 and every method the buffer merge
  // takes), in file order. They are not copied into the storage nor charged to the budget: a host
  // model's swap reads their parameters from the adapter file when it merges them (BufferMerge), and
  // unmerged apply refuses them (Lease::find_layer, UNSUPPORTED).
  const std::vector<const AdapterModule*>& method_modules() const { return method_modules_; }
  // The method module of a HuggingFace module path; null when absent.
  const AdapterModule* find_method_module(std::string_view module) const;

  // Pointer to element `offset` of the storage (in dtype() elements).
  const void* data(size_t offset) const;
  // Copies `count` elements from `offset` as f32 into `out`.
  void read_f32(size_t offset, size_t count, float* out) const;

 private:
  DType dtype_ = DType::F32;
  uint64_t bytes_ = 0;
  std::shared_ptr<const Adapter> adapter_;
  std::vector<LoadedLayer> layers_;
  struct NameHash {  // lets find() look up a string_view without making a string
    using is_transparent = void;
    size_t operator()(std::string_view name) const { return std::hash<std::string_view>{}(name); }
  };
  std::unordered_map<std::string, size_t, NameHash, std::equal_to<>> by_module_;
  bool has_replacements_ = false;
  std::vector<const AdapterModule*> method_modules_;
  std::vector<const AdapterModule*> expert_modules_;
  std::unordered_map<std::string, const AdapterModule*, NameHash, std::equal_to<>> expert_by_name_;
  HugeBuffer storage_;
};

}  // namespace peft::serve
