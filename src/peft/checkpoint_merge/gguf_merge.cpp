#include "peft/checkpoint_merge/gguf_merge.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <variant>

#include "core/convert.hpp"
#include "core/error.hpp"
#include "core/text.hpp"
#include "gguf/ggml_type.hpp"
#include "gguf/gguf_file.hpp"
#include "gguf/gguf_writer.hpp"
#include "peft/arch/arch_registry.hpp"
#include "peft/arch/gguf_experts.hpp"
#include "peft/arch/gguf_row_order.hpp"
#include "peft/arch/translator.hpp"
#include "peft/buffer_merge/buffer_merge.hpp"
#include "peft/buffer_merge/layer_module.hpp"
#include "peft/checkpoint_merge/gguf_lora_input.hpp"
#include "peft/methods/lora_math.hpp"
#include "safetensors/checkpoint.hpp"

namespace peft {
namespace {

namespace fs = std::filesystem;

// Copies go through a buffer of this size.
constexpr uint64_t kCopyChunk = uint64_t{4} << 20;

std::string architecture_of(const GgufHeader& header, const std::string& path) {
  const std::optional<std::string> architecture = metadata_string(header, "general.architecture");
  if (!architecture) fail(PEFT_ERR_INVALID_CHECKPOINT, path + ": the GGUF file has no string general.architecture");
  return *architecture;
}

// One adapter module merged into one GGUF tensor.
struct GgufTerm {
  BufferMergeModule module;  // factors in f32, laid out for the tensor (PyTorch orientation)
  double weight;
  uint64_t slice = 0;        // of a stacked tensor (gguf_experts.hpp): the module's 2-D slice
  bool torch_rows = true;    // its rows in PyTorch's order; false for a GGUF LoRA's (GGUF's order)
};

// A whole adapter tensor replacing a GGUF tensor (modules_to_save, saved base weights), PyTorch order.
struct GgufReplacement {
  std::shared_ptr<const Adapter> adapter;
  size_t index;      // in the adapter's checkpoint
  std::string what;  // for messages
};

// lora_B.bias added to a GGUF bias tensor: bias += coefficient x lora_B.bias.
struct GgufBiasTerm {
  std::shared_ptr<const Adapter> adapter;
  size_t index;
  double coefficient;
};

// What is done to one GGUF tensor, in this order: the replacement, the LoRA terms, the bias terms.
struct GgufTarget {
  GgufRows rows = GgufRows::same;
  std::optional<GgufReplacement> replacement;
  std::vector<GgufTerm> terms;
  std::vector<GgufBiasTerm> biases;
};

template <class Body>
auto with_file(const std::string& path, Body&& body) -> decltype(body()) {
  try {
    return body();
  } catch (const Error& e) {
    throw Error(e.code(), path + ": " + e.what());
  }
}

class GgufMerge {
 public:
  GgufMerge(const std::string& base_path, const CheckpointMergeOptions& options)
      : path_(base_path), options_(options) {
    base_ = Checkpoint::open(base_path, options.open);
    header_ = base_->gguf_header(0);
    if (header_ == nullptr) fail(PEFT_ERR_INVALID_ARGUMENT, base_path + " is not a GGUF file");
    architecture_ = architecture_of(*header_, path_);
    heads_ = gguf_heads_from_metadata(*header_, architecture_);
    table_ = with_file(path_, [&] {
      return builtin_table_for_gguf(architecture_, [&](const ArchTable& table) {
        for (const MergeInput& input : options_.adapters) {
          if (!input.adapter) continue;  // a GGUF LoRA: named as the base's tensors, no table needed
          for (const AdapterModule& module : input.adapter->modules())
            if (module.is_lora() && !gguf_slot(table, module.name)) return false;
        }
        return true;
      });
    });
    plan();
  }

  CheckpointMergeResult run(const std::string& out_path) {
    GgufWriter writer(out_path);
    for (const GgufKeyValue& kv : header_->metadata) writer.add_metadata(kv);
    uint64_t total = 0;
    for (size_t i = 0; i < base_->tensor_count(); ++i) {
      const TensorInfo& info = base_->tensor(i);
      writer.add_tensor(info.name, static_cast<uint32_t>(info.ggml_type), info.shape);
      total += info.nbytes();
    }
    writer.start();
    CheckpointMergeResult result;
    uint64_t done = 0;
    std::vector<uint8_t> chunk;
    for (size_t i = 0; i < base_->tensor_count(); ++i) {
      const TensorInfo& info = base_->tensor(i);
      if (auto it = targets_.find(i); it != targets_.end()) {
        const std::vector<uint8_t> bytes = merged_tensor(i, it->second);
        writer.write_tensor(info.name, bytes.data(), bytes.size());
        ++(it->second.replacement && it->second.terms.empty() && it->second.biases.empty() ? result.replaced : result.merged);
      } else {
        base_->check_unchanged(i);
        writer.begin_tensor(info.name);
        chunk.resize(static_cast<size_t>(std::min(kCopyChunk, std::max<uint64_t>(info.nbytes(), 1))));
        for (uint64_t offset = 0; offset < info.nbytes();) {
          const uint64_t n = std::min<uint64_t>(chunk.size(), info.nbytes() - offset);
          base_->read_bytes(i, offset, chunk.data(), n);
          writer.write(chunk.data(), n);
          offset += n;
        }
        ++result.copied;
      }
      done += info.nbytes();
      if (options_.progress && !options_.progress(done, total)) fail(PEFT_ERR_CANCELLED, "the merge was cancelled");
    }
    writer.finish();
    result.bytes = done;
    result.files.push_back(fs::path(out_path).filename().string());
    return result;
  }

 private:
  // Finds every module's GGUF tensor and refuses what cannot be merged, listing all of it at once.
  void plan() {
    std::vector<std::string> unresolved, unsupported, conflicts;
    // The index of GGUF tensor `tensor` when it can take a merge; nullopt (with the problem listed) otherwise.
    auto target_index = [&](const std::string& what, const std::string& tensor) -> std::optional<size_t> {
      const auto index = base_->find(tensor);
      if (!index) {
        unresolved.push_back(what + " (GGUF tensor " + peft::quoted(tensor) + " is not in the base)");
        return std::nullopt;
      }
      const TensorInfo& info = base_->tensor(*index);
      if (info.block_quantized || !(info.dtype == DType::F32 || info.dtype == DType::F16 || info.dtype == DType::BF16)) {
        const auto type = ggml_type(static_cast<uint32_t>(info.ggml_type));
        unsupported.push_back(what + " (GGUF tensor " + peft::quoted(tensor) + " is " +
                              std::string(type ? type->name : "of an unknown type") +
                              "; merges go into F32, F16 and BF16 tensors)");
        return std::nullopt;
      }
      return index;
    };
    for (const MergeInput& input : options_.adapters) {
      if (input.gguf_lora) {  // GGUF names and rows: checked and matched by gguf_lora_input
        for (GgufLoraTerm& term : gguf_lora_terms(*input.gguf_lora, input.weight, *base_, architecture_))
          targets_[term.tensor].terms.push_back({std::move(term.module), 1.0, term.slice, false});
        continue;
      }
      const std::string adapter_name = input.adapter->dir().empty() ? "adapter" : input.adapter->dir();
      for (const AdapterModule& module : input.adapter->modules()) {
        if (input.modules && !input.modules->contains(module.name)) continue;
        const std::string what = adapter_name + ": module " + peft::quoted(module.name);
        if (module.kind == LayerKind::trainable_tokens) {
          unsupported.push_back(what + " (trainable tokens are merged into safetensors checkpoints only)");
          continue;
        }
        const std::optional<GgufSlot> slot = gguf_slot(*table_, module.name);
        if (!slot) {
          unresolved.push_back(what + " (no GGUF name for it in table " + peft::quoted(table_->family()) + ")");
          continue;
        }
        const std::string& tensor = slot->tensor;
        const std::string stem = tensor.substr(0, tensor.size() - std::string_view(".weight").size());
        // Whole tensors (modules_to_save copies, saved base weights and biases) replace the GGUF tensor
        // of the same parameter (not a slice of a stacked one).
        for (const AdapterTensor& t : module.tensors) {
          if (t.role != TensorRole::full) continue;
          if (slot->slice) {
            unsupported.push_back(what + " (a whole tensor for one slice of the stacked GGUF tensor " +
                                  peft::quoted(tensor) + ")");
            continue;
          }
          const std::string replaced = stem + "." + t.base_tensor.substr(t.base_tensor.rfind('.') + 1);
          const auto index = target_index(what, replaced);
          if (!index) continue;
          GgufTarget& target = targets_[*index];
          if (target.replacement) {
            conflicts.push_back("GGUF tensor " + peft::quoted(replaced) + " is replaced by both " +
                                target.replacement->what + " and " + what);
            continue;
          }
          target.rows = slot->rule->gguf_rows;
          target.replacement = GgufReplacement{input.adapter, t.index, what};
        }
        if (!module.is_lora()) continue;
        const auto index = target_index(what, stem + ".weight");
        if (!index) continue;
        const TensorInfo& info = base_->tensor(*index);
        std::vector<int64_t> shape(info.shape.begin(), info.shape.end());
        if (slot->slice) {  // a stacked module: its slice of the tensor
          if (shape.size() != 3 || *slot->slice >= info.shape[0]) {
            unresolved.push_back(what + " (GGUF tensor " + peft::quoted(tensor) + " has no slice " +
                                 std::to_string(*slot->slice) + ")");
            continue;
          }
          shape.erase(shape.begin());
        }
        // GPT-2's Conv1D weights are [out, in] in GGUF (the converter transposes them): merged as Linear.
        AdapterModule oriented = module;
        if (oriented.kind == LayerKind::conv1d) oriented.kind = LayerKind::linear;
        BufferMergeModule term = buffer_merge_module(input.adapter, oriented, shape);
        term.lora_bias = nullptr;  // added to the bias tensor below
        GgufTarget& target = targets_[*index];
        target.rows = slot->rule->gguf_rows;
        target.terms.push_back({std::move(term), input.weight, slot->slice.value_or(0)});
        if (const AdapterTensor* bias = module.find(TensorRole::lora_b_bias)) {
          if (slot->slice) {
            unsupported.push_back(what + " (lora_B.bias of one slice of the stacked GGUF tensor " +
                                  peft::quoted(tensor) + ")");
            continue;
          }
          const auto bias_index = target_index(what + " lora_B.bias", stem + ".bias");
          if (!bias_index) continue;
          GgufTarget& bias_target = targets_[*bias_index];
          bias_target.rows = slot->rule->gguf_rows;
          bias_target.biases.push_back({input.adapter, bias->index,
                                        merge::lora_coefficient(input.weight, module.scaling, what)});
        }
      }
    }
    if (!conflicts.empty()) {
      std::string message = path_ + ": the adapters of the merge conflict:";
      for (const std::string& line : conflicts) message += "\n  " + line;
      fail(PEFT_ERR_INVALID_ARGUMENT, message);
    }
    if (!unsupported.empty()) {
      std::string message = path_ + ": " + std::to_string(unsupported.size()) + " module(s) cannot be merged into a GGUF file:";
      for (const std::string& line : unsupported) message += "\n  " + line;
      fail(PEFT_ERR_UNSUPPORTED, message);
    }
    if (!unresolved.empty()) {
      std::string message = path_ + ": " + std::to_string(unresolved.size()) + " module(s) have no tensor in the GGUF base:";
      for (const std::string& line : unresolved) message += "\n  " + line;
      fail(PEFT_ERR_UNRESOLVED_KEY, message);
    }
    for (const auto& [index, target] : targets_) {
      const TensorInfo& info = base_->tensor(index);
      if (const auto problem = gguf_rows_problem(target.rows, heads_, info.shape.empty() ? 0 : info.shape[0]))
        fail(PEFT_ERR_INVALID_CHECKPOINT, path_ + ": tensor " + peft::quoted(info.name) + ": " + *problem);
    }
  }

  // The tensor with every term added, in its own type.
  std::vector<uint8_t> merged_tensor(size_t index, const GgufTarget& target) const {
    const TensorInfo& info = base_->tensor(index);
    const int64_t rows = info.shape.empty() ? 1 : static_cast<int64_t>(info.shape[0]);
    const int64_t cols = rows == 0 ? 0 : static_cast<int64_t>(element_count(info) / static_cast<uint64_t>(rows));
    const uint64_t row_bytes = static_cast<uint64_t>(cols) * sizeof(float);
    const std::string what = path_ + ": tensor " + peft::quoted(info.name);
    // The values start in GGUF's row order, a replacement's in PyTorch's.
    std::vector<float> values;
    bool torch_rows = false;  // the values' row order now: GGUF's, or PyTorch's
    if (target.replacement) {
      const GgufReplacement& r = *target.replacement;
      const TensorInfo& source = r.adapter->checkpoint().tensor(r.index);
      if (source.shape != info.shape)
        fail(PEFT_ERR_SHAPE_MISMATCH, what + ": " + r.what + " replaces it with tensor " + peft::quoted(source.name) +
                                          " of shape " + shape_text(source.shape) + ", not " + shape_text(info.shape));
      values = r.adapter->checkpoint().read_f32(r.index);
      torch_rows = true;
    } else {
      values = base_->read_f32(index);
    }
    BufferMergeOptions merge_options;
    merge_options.threads = options_.threads;
    for (const GgufTerm& term : target.terms) {
      if (term.torch_rows != torch_rows) {
        reorder_gguf_rows(target.rows, heads_, values.data(), static_cast<uint64_t>(rows), row_bytes, term.torch_rows, what);
        torch_rows = term.torch_rows;
      }
      merge_options.weight = term.weight;
      const uint64_t slice_size = static_cast<uint64_t>(term.module.layout.rows() * term.module.layout.cols());
      const merge::WeightView view{values.data() + term.slice * slice_size, DType::F32, term.module.layout.rows(),
                                   term.module.layout.cols()};
      BufferMerge::apply(view, nullptr, term.module, merge_options);
    }
    if (!target.biases.empty() && !torch_rows) {
      reorder_gguf_rows(target.rows, heads_, values.data(), static_cast<uint64_t>(rows), row_bytes, true, what);
      torch_rows = true;
    }
    for (const GgufBiasTerm& term : target.biases) {
      const std::vector<float> bias = term.adapter->checkpoint().read_f32(term.index);
      if (bias.size() != values.size())
        fail(PEFT_ERR_SHAPE_MISMATCH, what + ": lora_B.bias has " + std::to_string(bias.size()) + " values for " +
                                          std::to_string(values.size()));
      const merge::WeightView view{values.data(), DType::F32, 1, static_cast<int64_t>(values.size())};
      merge::add_lora_bias(view, bias.data(), term.coefficient);
    }
    if (torch_rows)
      reorder_gguf_rows(target.rows, heads_, values.data(), static_cast<uint64_t>(rows), row_bytes, false, what);
    std::vector<uint8_t> out(static_cast<size_t>(info.nbytes()));
    convert(DType::F32, values.data(), info.dtype, out.data(), values.size());
    if (!options_.allow_nonfinite) check_finite(info, out.data(), values.size());
    return out;
  }

  void check_finite(const TensorInfo& info, const uint8_t* bytes, size_t count) const {
    std::vector<float> back(count);
    convert(info.dtype, bytes, DType::F32, back.data(), count);
    for (float v : back)
      if (!std::isfinite(v))
        fail(PEFT_ERR_NON_FINITE, path_ + ": merged tensor " + peft::quoted(info.name) +
                                      " holds an infinity or NaN (allow_nonfinite keeps such values)");
  }

  std::string path_;
  const CheckpointMergeOptions& options_;
  std::shared_ptr<const Checkpoint> base_;
  const GgufHeader* header_ = nullptr;
  GgufHeads heads_;
  std::string architecture_;
  std::shared_ptr<const ArchTable> table_;
  std::map<size_t, GgufTarget> targets_;
};

}  // namespace

CheckpointMergeResult merge_into_gguf(const std::string& base_path, const std::string& out_path,
                                      const CheckpointMergeOptions& options) {
  if (options.dtype)
    fail(PEFT_ERR_INVALID_ARGUMENT, "a merge into a GGUF file keeps each tensor's type: do not set a dtype");
  if (options.max_shard_size != 0)
    fail(PEFT_ERR_INVALID_ARGUMENT, "a merge into a GGUF file writes one file: do not set a shard size");
  std::error_code ec;
  if (fs::exists(out_path, ec) && fs::equivalent(base_path, out_path, ec))
    fail(PEFT_ERR_INVALID_ARGUMENT, "the output " + peft::quoted(out_path) + " is the base file itself");
  GgufMerge merge(base_path, options);
  return merge.run(out_path);
}

}  // namespace peft
