#include "peft/merge/gguf_merge.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <variant>

#include "core/convert.hpp"
#include "core/error.hpp"
#include "core/error_context.hpp"
#include "core/quant/ggml_quant.hpp"
#include "core/text.hpp"
#include "gguf/ggml_type.hpp"
#include "gguf/gguf_file.hpp"
#include "gguf/gguf_split.hpp"
#include "gguf/gguf_writer.hpp"
#include "peft/adapter/adapter.hpp"
#include "peft/adapter/adapter_config.hpp"
#include "peft/arch/arch_registry.hpp"
#include "peft/arch/gguf_experts.hpp"
#include "peft/arch/gguf_row_order.hpp"
#include "peft/arch/translator.hpp"
#include "peft/base/expert_base.hpp"
#include "peft/base/gguf_base.hpp"
#include "peft/buffer_merge/buffer_merge.hpp"
#include "peft/buffer_merge/layer_module.hpp"
#include "peft/merge/gguf_lora_input.hpp"
#include "peft/merge/gguf_requant.hpp"
#include "peft/merge/merge_compute.hpp"
#include "peft/merge/tied_embeddings.hpp"
#include "peft/methods/lora_math.hpp"
#include "checkpoint/checkpoint.hpp"

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
  const Adapter* adapter = nullptr;  // whose module it is (none for a GGUF LoRA's pair)
};

// A whole adapter tensor replacing a GGUF tensor (modules_to_save, saved base weights), PyTorch order.
struct GgufReplacement {
  std::shared_ptr<const Adapter> adapter;
  size_t index;      // in the adapter's checkpoint
  std::string what;  // for messages
  bool swaps_module = false;  // a modules_to_save copy (is_modules_to_save_copy), not a saved base weight
};

// lora_B.bias added to a GGUF bias tensor: bias += coefficient x lora_B.bias.
struct GgufBiasTerm {
  std::shared_ptr<const Adapter> adapter;
  size_t index;
  double coefficient;
};

// What is done to one GGUF tensor, in this order: the replacement, the LoRA terms, the bias terms.
struct GgufTarget {
  std::string what;  // the first module merged into it, for messages
  GgufRows rows = GgufRows::same;
  std::optional<GgufReplacement> replacement;
  std::vector<GgufTerm> terms;
  std::vector<GgufBiasTerm> biases;
};


class GgufMerge {
 public:
  GgufMerge(const std::string& base_path, const CheckpointMergeOptions& options)
      : path_(base_path), options_(options) {
    base_ = Checkpoint::open(base_path, options.open);
    header_ = base_->gguf_header(0);
    if (header_ == nullptr) fail(PEFT_ERR_INVALID_ARGUMENT, base_path + " is not a GGUF file");
    require_gguf_model(*header_, base_path);
    architecture_ = architecture_of(*header_, path_);
    heads_ = gguf_heads_from_metadata(*header_, architecture_);
    table_ = with_path(path_, [&] {
      return builtin_table_for_gguf(architecture_, [&](const ArchTable& table) {
        for (const MergeInput& input : options_.adapters) {
          if (!input.adapter) continue;  // a GGUF LoRA: named as the base's tensors, no table needed
          for (const AdapterModule& module : input.adapter->modules())
            if (module.is_lora() && !gguf_slot(table, saved_module_name(module))) return false;
        }
        return true;
      });
    });
    find_tied_embeddings();
    plan();
  }

  // The files the merge writes: `out_path`, or for a split base (unless joined) its parts' names.
  std::vector<std::string> output_paths(const std::string& out_path) const {
    const size_t parts = options_.join_split ? 1 : base_->file_count();
    if (parts == 1) return {out_path};
    const std::string prefix = gguf_split_output_prefix(out_path);
    std::vector<std::string> paths;
    for (size_t k = 0; k < parts; ++k)
      paths.push_back(gguf_split_path(prefix, static_cast<uint32_t>(k), static_cast<uint32_t>(parts)));
    return paths;
  }

  const Checkpoint& base() const { return *base_; }

  CheckpointMergeResult run(const std::vector<std::string>& out_paths) {
    // One writer per output file: a split base's parts keep their own metadata and tensors, in order.
    std::vector<std::unique_ptr<GgufWriter>> writers;
    for (size_t k = 0; k < out_paths.size(); ++k) {
      writers.push_back(std::make_unique<GgufWriter>(out_paths[k]));
      const bool joined = out_paths.size() == 1 && base_->file_count() > 1;
      for (const GgufKeyValue& kv : joined ? gguf_joined_metadata(*header_) : base_->gguf_header(k)->metadata)
        writers[k]->add_metadata(kv);
    }
    const auto writer_of = [&](size_t i) -> GgufWriter& { return *writers[writers.size() == 1 ? 0 : base_->tensor_file(i)]; };
    uint64_t total = 0;
    for (size_t i = 0; i < base_->tensor_count(); ++i) {
      const TensorInfo& info = base_->tensor(i);
      const bool target = targets_.contains(i);
      writer_of(i).add_tensor(info.name, target ? out_type(info) : static_cast<uint32_t>(info.ggml_type), info.shape);
      total += target ? out_bytes(info) : info.nbytes();
      if (adds_output() && i == tied_->input) {  // the untied output, after the embedding it copies
        writer_of(i).add_tensor(tied_->output_tensor, added_output_type(), info.shape);
        total += added_output_changed() ? out_bytes(info) : info.nbytes();
      }
    }
    for (const auto& writer : writers) writer->start();
    CheckpointMergeResult result;
    uint64_t done = 0;
    std::vector<uint8_t> chunk;
    Scratch scratch;
    for (size_t i = 0; i < base_->tensor_count(); ++i) {
      const TensorInfo& info = base_->tensor(i);
      GgufWriter& writer = writer_of(i);
      if (auto it = targets_.find(i); it != targets_.end()) {
        const TensorBuffer& bytes = merged_tensor(i, it->second, result, scratch);
        writer.write_tensor(info.name, bytes.data(), bytes.size());
        done += bytes.size();
        ++(it->second.replacement && it->second.terms.empty() && it->second.biases.empty() ? result.replaced : result.merged);
      } else {
        copy_tensor(i, info.name, writer, chunk);
        ++result.copied;
        done += info.nbytes();
      }
      if (adds_output() && i == tied_->input) {
        if (added_output_changed()) {
          const TensorBuffer& bytes = merged_tensor(i, targets_.at(output_slot()), result, scratch, tied_->output_tensor);
          writer.write_tensor(tied_->output_tensor, bytes.data(), bytes.size());
          done += bytes.size();
        } else {  // the original embedding, byte for byte
          copy_tensor(i, tied_->output_tensor, writer, chunk);
          done += info.nbytes();
        }
        ++result.added;
      }
      if (options_.progress && !options_.progress(done, total)) fail(PEFT_ERR_CANCELLED, "the merge was cancelled");
    }
    if (writers.size() == 1) {
      writers[0]->finish();
    } else {  // all parts or none
      for (const auto& writer : writers) writer->finish_staged();
      GgufWriter::commit_together(writers);
    }
    result.bytes = done;
    for (const std::string& path : out_paths) result.files.push_back(fs::path(path).filename().string());
    result.notes = notes_;
    result.untied_embeddings = untie_;
    return result;
  }

 private:
  // The buffers of one merged tensor at a time, reused from tensor to tensor: fresh ones cost page
  // faults and zeroing on the main thread while the workers wait (in the Q4_K_M merge of
  // docs/benchmarks.md, most of a second of system time and nearly a quarter of the wall time).
  struct Scratch {
    TensorBuffer stored;  // a block-quantized base tensor's bytes, as read
    TensorBuffer values;  // the tensor as f32 values, merged
    TensorBuffer out;     // the merged tensor's bytes, as written
  };

  // Base tensor `index`'s bytes written unchanged as tensor `name`.
  void copy_tensor(size_t index, const std::string& name, GgufWriter& writer, std::vector<uint8_t>& chunk) const {
    const TensorInfo& info = base_->tensor(index);
    base_->check_unchanged(index);
    writer.begin_tensor(name);
    chunk.resize(static_cast<size_t>(std::min(kCopyChunk, std::max<uint64_t>(info.nbytes(), 1))));
    for (uint64_t offset = 0; offset < info.nbytes();) {
      const uint64_t n = std::min<uint64_t>(chunk.size(), info.nbytes() - offset);
      base_->read_bytes(index, offset, chunk.data(), n);
      writer.write(chunk.data(), n);
      offset += n;
    }
  }

  // ---- Tied embeddings (docs/peft-semantics.md, "Tied embeddings") --------------------------------
  // llama.cpp's converter writes no output tensor for a model with tie_word_embeddings, and llama.cpp
  // then computes the output from token_embd. PEFT's forward sees an adapter's changes to lm_head in
  // the output only and those to embed_tokens in the input only; the policy says whether the merge
  // keeps them apart (untie: output.weight added, as the original embedding plus the output's own
  // changes) or lands them in the one shared tensor as PEFT's merge_and_unload does (shared). The
  // output's changes are gathered at output_slot() and settled once all are known.

  void find_tied_embeddings() { tied_ = gguf_tied_embeddings(*base_, *table_); }

  size_t output_slot() const { return base_->tensor_count(); }
  bool adds_output() const { return tied_ && untie_; }
  // Whether the added output holds changes of its own (else it is the original embedding's bytes).
  bool added_output_changed() const {
    auto it = targets_.find(output_slot());
    return it != targets_.end() && (it->second.replacement || !it->second.terms.empty());
  }
  uint32_t added_output_type() const {
    const TensorInfo& input = base_->tensor(tied_->input);
    return added_output_changed() ? out_type(input) : static_cast<uint32_t>(input.ggml_type);
  }
  // The base tensor a target index stands for: the added output reads the input embedding.
  const TensorInfo& target_info(size_t index) const {
    return base_->tensor(index == output_slot() && tied_ ? tied_->input : index);
  }

  // Whether the adapter's output LoRA is PEFT's ensure_weight_tying copy, left out (tied_embeddings.hpp).
  bool is_tied_lora_copy(const Adapter& adapter) const {
    if (!tied_) return false;
    return peft::is_tied_lora_copy(options_.tied_embeddings, adapter, adapter.modules(), tied_->output_module,
                                   [&](const AdapterModule& m) {
                                     const auto slot = gguf_slot(*table_, m.name);
                                     return slot && base_->find(slot->tensor) == tied_->input;
                                   });
  }

  void settle_tied_embeddings(std::vector<std::string>& unsupported) {
    if (!tied_) return;
    const size_t input = tied_->input;
    const std::string input_name = peft::quoted(base_->tensor(input).name);
    const std::string output = peft::quoted(tied_->output_module);
    // What PEFT applies to both sides: an ensure_weight_tying adapter's LoRA and a saved base_layer
    // weight (loaded into the shared parameter).
    auto shared_term = [&](const GgufTerm& t) { return t.adapter && tied_copies_.contains(t.adapter); };
    auto side = [&](size_t index) {
      auto it = targets_.find(index);
      if (it == targets_.end()) return TiedSide{};
      const GgufTarget& t = it->second;
      return tied_side(t.terms.size(), static_cast<size_t>(std::count_if(t.terms.begin(), t.terms.end(), shared_term)),
                       !t.biases.empty(), /*tokens=*/false,
                       t.replacement ? std::optional<bool>(t.replacement->swaps_module) : std::nullopt);
    };
    const TiedDecision d = decide_tied_embeddings(options_.tied_embeddings, side(input), side(output_slot()),
                                                  /*output_stored=*/false, input_name, output);
    if (!d.note.empty()) notes_.push_back(d.note);
    untie_ = d.untie;
    if (d.move_output_to_input) {
      GgufTarget& out = targets_[output_slot()];
      GgufTarget& shared = targets_[input];  // std::map: `out` stays valid
      if (shared.what.empty()) shared.what = out.what;
      shared.terms.insert(shared.terms.end(), std::make_move_iterator(out.terms.begin()),
                          std::make_move_iterator(out.terms.end()));
      out.terms.clear();
      if (out.replacement && !out.replacement->swaps_module) {  // a saved base_layer weight: the same parameter
        if (!shared.replacement) shared.replacement = out.replacement;
        out.replacement.reset();
      }
    }
    if (d.copy_shared_to_output) {
      const GgufTarget& in = targets_.at(input);
      GgufTarget& o = targets_[output_slot()];  // std::map: `in` stays valid
      if (o.what.empty()) o.what = in.what;
      std::vector<GgufTerm> copies;
      for (const GgufTerm& t : in.terms)
        if (shared_term(t)) copies.push_back(t);
      o.terms.insert(o.terms.begin(), copies.begin(), copies.end());
      if (in.replacement && !in.replacement->swaps_module && !o.replacement) o.replacement = in.replacement;
    }
    if (auto it = targets_.find(output_slot()); it != targets_.end() && !it->second.replacement && it->second.terms.empty())
      targets_.erase(it);
    if (!untie_) return;
    const std::string architecture = peft::quoted(architecture_);
    if (table_->gguf_output_always_tied(architecture_)) {
      unsupported.push_back("the tied embeddings " + input_name + " / " + output + " (llama.cpp computes a " +
                            architecture + " model's output from " + input_name + " and reads no " +
                            peft::quoted(tied_->output_tensor) + ", so the adapter's changes to one side cannot be "
                            "kept from the other; tied embeddings policy \"shared\" lands them in the shared tensor, "
                            "as PEFT's merge_and_unload does)");
      return;
    }
    if (base_->file_count() > 1 && !options_.join_split)
      unsupported.push_back("the tied embeddings " + input_name + " / " + output + " (untying them adds " +
                            peft::quoted(tied_->output_tensor) + ", which changes the split's tensor count: join the "
                            "parts (peftc merge --join-split) or keep the tie (tied embeddings policy \"shared\"))");
    notes_.push_back("the input embedding " + input_name + " and the output embedding " + output +
                     " no longer hold the same values: " + peft::quoted(tied_->output_tensor) +
                     " was added holding the original embedding" +
                     (d.output_changes ? " plus the output embedding's own changes" : "") +
                     " (llama.cpp reads it as the output instead of " + input_name + ")");
  }

  // The index of GGUF tensor `tensor` when it can take a merge; nullopt (with the problem listed) otherwise.
  std::optional<size_t> target_index(const std::string& what, const std::string& tensor,
                                     std::vector<std::string>& unresolved) {
    const auto index = tied_ && tensor == tied_->output_tensor ? std::optional<size_t>(output_slot()) : base_->find(tensor);
    if (!index) {
      unresolved.push_back(what + " (GGUF tensor " + peft::quoted(tensor) + " is not in the base)");
      return std::nullopt;
    }
    if (targets_[*index].what.empty()) targets_[*index].what = what;
    return index;
  }

  // A LoRA term of `module` (of `input`) on GGUF tensor `index` (its slice `slice` when stacked).
  void add_lora_term(size_t index, std::optional<uint64_t> slice, GgufRows rows, BufferMergeModule term,
                     const MergeInput& input, const AdapterModule& module, const std::string& what) {
    GgufTarget& target = targets_[index];
    target.rows = rows;
    double weight = input.weight;
    if (options_.arithmetic == merge::Arithmetic::ggml && effect_of(module.method) == MethodEffect::lora) {
      // llama-export-lora's scale of the converted adapter: weight * alpha / rank in float.
      term.scaling = merge::ggml_lora_coefficient(weight, module.alpha, module.rank, module.scaling, what);
      weight = 1.0;
    }
    target.terms.push_back({std::move(term), weight, slice.value_or(0), true, input.adapter.get()});
  }

  // A LoRA on a stacked expert parameter (target_parameters): expert e's share of each tensor the
  // checkpoint saves per expert (expert_base.hpp) is added to that module's slice of llama.cpp's
  // stacked tensor (Mixtral's experts.e.w1: slice e of ffn_gate_exps), as for a per-expert adapter.
  void plan_expert_module(const MergeInput& input, const AdapterModule& module, const std::string& what,
                          std::vector<std::string>& unresolved, std::vector<std::string>& unsupported) {
    const ExpertTarget& x = *module.expert;
    auto factors = std::make_shared<const ExpertFactors>(module, input.adapter->checkpoint());
    const ExpertFactorShape& f = factors->shape();
    const std::vector<ExpertPart> parts = per_expert_parts(module, f);
    if (parts.empty()) {
      unsupported.push_back(what + " (LoRA on the stacked expert parameter " + peft::quoted(x.module + "." + x.param) +
                            ": table " + peft::quoted(table_->family()) +
                            " gives no per-expert layout for it, which is what places it in GGUF)");
      return;
    }
    for (const ExpertPart& part : parts) {
      const std::optional<GgufSlot> slot = gguf_slot(*table_, part.module());
      if (!slot || !slot->slice) {
        unresolved.push_back(what + " (no stacked GGUF tensor for expert " + std::to_string(part.expert) + "'s " +
                             peft::quoted(part.module()) + " in table " + peft::quoted(table_->family()) + ")");
        return;
      }
      const auto index = target_index(what, slot->tensor, unresolved);
      if (!index) return;
      const TensorInfo& info = base_->tensor(*index);
      const std::vector<uint64_t> want{static_cast<uint64_t>(part.rows), static_cast<uint64_t>(f.in)};
      if (info.shape.size() != 3 || *slot->slice >= info.shape[0] ||
          std::vector<uint64_t>(info.shape.begin() + 1, info.shape.end()) != want)
        fail(PEFT_ERR_SHAPE_MISMATCH, path_ + ": " + what + ": expert " + std::to_string(part.expert) + "'s part " +
                                          shape_text(want) + " of " + peft::quoted(x.module + "." + x.param) +
                                          " has no slice in GGUF tensor " + peft::quoted(info.name) + " of shape " +
                                          shape_text(info.shape));
      add_lora_term(*index, slot->slice, slot->rule->gguf_rows,
                    expert_pair_module(factors, part, module.scaling), input,
                    module, what);
    }
  }

  // Finds every module's GGUF tensor and refuses what cannot be merged, listing all of it at once.
  void plan() {
    std::vector<std::string> unresolved, unsupported, conflicts;
    for (const MergeInput& input : options_.adapters) {
      if (input.gguf_lora) {  // GGUF names and rows: checked and matched by gguf_lora_input
        for (GgufLoraTerm& term : gguf_lora_terms(*input.gguf_lora, input.weight, *base_, architecture_))
{
          GgufTarget& target = targets_[term.tensor];
          if (target.what.empty()) target.what = input.gguf_lora->path + ": the pair of " + peft::quoted(base_->tensor(term.tensor).name);
          target.terms.push_back({std::move(term.module), 1.0, term.slice, false});
        }
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
        if (tied_ && module.name == tied_->output_module && is_tied_lora_copy(*input.adapter)) {
          tied_copies_.insert(input.adapter.get());  // its saved base_layer weight is the shared one too
          notes_.push_back(what + " is PEFT's tied copy of the input embedding's LoRA (ensure_weight_tying), so the "
                           "change lands once in " + peft::quoted(base_->tensor(tied_->input).name) + ", which stays tied");
          continue;
        }
        if (module.expert) {
          plan_expert_module(input, module, what, unresolved, unsupported);
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
          const auto index = target_index(what, replaced, unresolved);
          if (!index) continue;
          GgufTarget& target = targets_[*index];
          if (target.replacement) {
            conflicts.push_back("GGUF tensor " + peft::quoted(replaced) + " is replaced by both " +
                                target.replacement->what + " and " + what);
            continue;
          }
          target.rows = slot->rule->gguf_rows;
          target.replacement = GgufReplacement{input.adapter, t.index, what, is_modules_to_save_copy(*input.adapter, module, t)};
        }
        if (!module.is_lora()) continue;
        const bool dora = module.find(TensorRole::lora_magnitude) != nullptr;
        if (options_.arithmetic == merge::Arithmetic::ggml && (effect_of(module.method) != MethodEffect::lora || dora)) {
          unsupported.push_back(what + " (" + (dora ? std::string("DoRA") : peft_method_name(module.method)) +
                                ": the ggml arithmetic is defined for plain LoRA only)");
          continue;
        }
        const auto index = target_index(what, stem + ".weight", unresolved);
        if (!index) continue;
        const TensorInfo& info = target_info(*index);
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
        add_lora_term(*index, slot->slice, slot->rule->gguf_rows, std::move(term), input, module, what);
        if (const AdapterTensor* bias = module.find(TensorRole::lora_b_bias)) {
          if (slot->slice) {
            unsupported.push_back(what + " (lora_B.bias of one slice of the stacked GGUF tensor " +
                                  peft::quoted(tensor) + ")");
            continue;
          }
          const auto bias_index = target_index(what + " lora_B.bias", stem + ".bias", unresolved);
          if (!bias_index) continue;
          GgufTarget& bias_target = targets_[*bias_index];
          bias_target.rows = slot->rule->gguf_rows;
          bias_target.biases.push_back({input.adapter, bias->index,
                                        merge::lora_coefficient(input.weight, module.scaling, what)});
        }
      }
    }
    settle_tied_embeddings(unsupported);
    // Each target's types: its own read as f32 (unless replaced whole), its output type written.
    for (const auto& [index, target] : targets_) {
      const TensorInfo& info = target_info(index);
      const auto base_type = static_cast<uint32_t>(info.ggml_type);
      const uint32_t out = out_type(info);
      const std::string tensor = "GGUF tensor " + peft::quoted(info.name);
      if (!target.replacement && !ggml_can_dequantize(base_type)) {
        unsupported.push_back(target.what + " (" + tensor + " is " + type_name(base_type) +
                              ", which cannot be read as f32 numbers)");
        continue;
      }
      if (!ggml_can_quantize(out)) {
        unsupported.push_back(target.what + " (" + tensor + " would be written as " + type_name(out) +
                              ", which peft_c cannot quantize (ggml's quantizer for it needs an importance matrix): "
                              "choose another type for merged tensors, peftc merge --quant TYPE or --dtype f16|bf16|f32)");
        continue;
      }
      const auto type = ggml_type(out);
      if (type && !info.shape.empty() && info.shape.back() % type->block_size != 0)
        unsupported.push_back(target.what + " (" + tensor + " has rows of " + std::to_string(info.shape.back()) +
                              " values, not a multiple of " + type_name(out) + "'s blocks of " +
                              std::to_string(type->block_size) + ")");
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
      const TensorInfo& info = target_info(index);
      if (const auto problem = gguf_rows_problem(target.rows, heads_, info.shape.empty() ? 0 : info.shape[0]))
        fail(PEFT_ERR_INVALID_CHECKPOINT, path_ + ": tensor " + peft::quoted(info.name) + ": " + *problem);
    }
  }

  // The tensor with every term added, in its own type (in scratch.out, which it returns); `name`
  // (the added output's) for messages and the report.
  const TensorBuffer& merged_tensor(size_t index, const GgufTarget& target, CheckpointMergeResult& result,
                                    Scratch& scratch, const std::string& name = {}) const {
    TensorInfo info = base_->tensor(index);
    if (!name.empty()) info.name = name;
    const int64_t rows = info.shape.empty() ? 1 : static_cast<int64_t>(info.shape[0]);
    const int64_t cols = rows == 0 ? 0 : static_cast<int64_t>(element_count(info) / static_cast<uint64_t>(rows));
    const uint64_t row_bytes = static_cast<uint64_t>(cols) * sizeof(float);
    const std::string what = path_ + ": tensor " + peft::quoted(info.name);
    if (merged_as_stored(index, target, info, rows, cols, what, scratch.out)) return scratch.out;
    // The values start in GGUF's row order, a replacement's in PyTorch's.
    const uint64_t count = element_count(info);
    scratch.values.reserve(count * sizeof(float), what);
    float* values = reinterpret_cast<float*>(scratch.values.data());
    bool torch_rows = false;  // the values' row order now: GGUF's, or PyTorch's
    if (target.replacement) {
      const GgufReplacement& r = *target.replacement;
      const TensorInfo& source = r.adapter->checkpoint().tensor(r.index);
      if (source.shape != info.shape)
        fail(PEFT_ERR_SHAPE_MISMATCH, what + ": " + r.what + " replaces it with tensor " + peft::quoted(source.name) +
                                          " of shape " + shape_text(source.shape) + ", not " + shape_text(info.shape));
      r.adapter->checkpoint().read(r.index, DType::F32, values, count * sizeof(float));
      torch_rows = true;
    } else {
      base_values(index, values, scratch.stored);
    }
    std::vector<float> base;  // the base's own values, for the report
    if (options_.report && !target.replacement) base.assign(values, values + count);
    for (const GgufTerm& term : target.terms) {
      if (term.torch_rows && !torch_rows && add_term_in_gguf_rows(term, target, values, rows, what)) continue;
      if (term.torch_rows != torch_rows) {
        reorder_gguf_rows(target.rows, heads_, values, static_cast<uint64_t>(rows), row_bytes, term.torch_rows, what);
        torch_rows = term.torch_rows;
      }
      add_term(term, values, DType::F32);
    }
    if (!target.biases.empty() && !torch_rows) {
      reorder_gguf_rows(target.rows, heads_, values, static_cast<uint64_t>(rows), row_bytes, true, what);
      torch_rows = true;
    }
    for (const GgufBiasTerm& term : target.biases) {
      const std::vector<float> bias = term.adapter->checkpoint().read_f32(term.index);
      if (bias.size() != count)
        fail(PEFT_ERR_SHAPE_MISMATCH, what + ": lora_B.bias has " + std::to_string(bias.size()) + " values for " +
                                          std::to_string(count));
      const merge::WeightView view{values, DType::F32, 1, static_cast<int64_t>(count)};
      merge::add_lora_bias(view, bias.data(), term.coefficient);
    }
    if (torch_rows)
      reorder_gguf_rows(target.rows, heads_, values, static_cast<uint64_t>(rows), row_bytes, false, what);
    // Stored in the output type, in blocks of rows of the tensor's innermost dimension.
    const uint32_t type = out_type(info);
    const uint64_t cols_ne0 = info.shape.empty() ? 1 : info.shape.back();
    const uint64_t rows_ne0 = cols_ne0 == 0 ? 0 : count / cols_ne0;
    TensorBuffer& out = scratch.out;
    out.reserve(out_bytes(info), what);
    if (!options_.allow_nonfinite) require_finite_values(info.name, values, count, options_.threads);
    StoreError error;
    const bool measure = options_.report || !options_.allow_nonfinite;
    quantize_blocks(type, values, rows_ne0, cols_ne0, out.data(), options_.threads, measure ? &error : nullptr,
                    options_.report);
    if (!options_.allow_nonfinite && !error.finite)
      fail(PEFT_ERR_NON_FINITE, path_ + ": merged tensor " + peft::quoted(info.name) +
                                    " holds an infinity or NaN (allow_nonfinite keeps such values)");
    if (options_.report) {
      GgufStoreReport report;
      report.tensor = info.name;
      report.base_type = static_cast<uint32_t>(info.ggml_type);
      report.out_type = type;
      report.values = count;
      report.rms = error.rms();
      report.max = error.max;
      if (!base.empty()) {
        std::vector<uint8_t> discard(static_cast<size_t>(out.size()));
        StoreError base_error;
        quantize_blocks(type, base.data(), rows_ne0, cols_ne0, discard.data(), options_.threads, &base_error);
        report.base_rms = base_error.rms();
        report.base_max = base_error.max;
      }
      result.store_report.push_back(std::move(report));
    }
    return out;
  }

  // Adds `term` to the tensor whose values (F32, F16 or BF16, in the term's row order) are at `data`:
  // to its slice of a stacked tensor, with the term's weight.
  void add_term(const GgufTerm& term, void* data, DType dtype) const {
    BufferMergeOptions merge_options;
    merge_options.threads = options_.threads;
    merge_options.arithmetic = options_.arithmetic;
    merge_options.weight = term.weight;
    const merge::DeltaLayout& layout = term.module.layout;
    const uint64_t slice_bytes = static_cast<uint64_t>(layout.rows() * layout.cols()) * dtype_bits(dtype) / 8;
    const merge::WeightView view{static_cast<uint8_t*>(data) + term.slice * slice_bytes, dtype, layout.rows(),
                                 layout.cols()};
    BufferMerge::apply(view, nullptr, term.module, merge_options);
  }

  // A plain LoRA term of PyTorch's row order added to f32 `values` of a whole 2-D tensor kept in
  // GGUF's: B's rows are put in GGUF's order instead of the tensor's rows in PyTorch's and back (two
  // moves of the tensor on the main thread). Each element of B A is the same sum of the same products
  // whichever row it is in, so the values are the same bits. False, and nothing done, for another
  // case (those reorder the tensor).
  bool add_term_in_gguf_rows(const GgufTerm& term, const GgufTarget& target, float* values, int64_t rows,
                             const std::string& what) const {
    const merge::DeltaLayout& layout = term.module.layout;
    if (!merges_from_source(term.module) || term.slice != 0 || layout.transposed || layout.out != rows ||
        term.module.lora_b == nullptr || term.module.rank < 1)
      return false;
    const auto rank = static_cast<uint64_t>(term.module.rank);
    std::vector<float> b(term.module.lora_b, term.module.lora_b + static_cast<uint64_t>(rows) * rank);
    reorder_gguf_rows(target.rows, heads_, b.data(), static_cast<uint64_t>(rows), rank * sizeof(float), false, what);
    GgufTerm in_gguf_rows = term;
    in_gguf_rows.module.lora_b = b.data();
    add_term(in_gguf_rows, values, DType::F32);
    return true;
  }

  // One plain LoRA term into an F32, F16 or BF16 tensor written in its own type, without a report:
  // merged in the stored values themselves, as a checkpoint merge does, without the tensor in f32
  // and without converting it twice. The same bytes as merged_tensor's f32 path, which adds in f32
  // and rounds once to the type: add_delta does both steps per element. (Several terms are each
  // rounded to f32 there and to the type once at the end, so they take that path; so do the other
  // methods, DoRA, biases, replacements, conversions and reports.) False, and `out` untouched, when the
  // case is another.
  bool merged_as_stored(size_t index, const GgufTarget& target, const TensorInfo& info, int64_t rows, int64_t cols,
                        const std::string& what, TensorBuffer& out) const {
    const DType dtype = info.dtype;
    if (target.replacement || !target.biases.empty() || target.terms.size() != 1 || options_.report ||
        options_.allow_nonfinite || info.block_quantized || out_type(info) != static_cast<uint32_t>(info.ggml_type) ||
        (dtype != DType::F32 && dtype != DType::F16 && dtype != DType::BF16) ||
        !merges_from_source(target.terms[0].module))
      return false;
    const GgufTerm& term = target.terms[0];
    const uint64_t row_bytes = static_cast<uint64_t>(cols) * dtype_bits(dtype) / 8;
    out.reserve(info.nbytes(), what);
    base_->read_bytes(index, 0, out.data(), out.size());
    if (term.torch_rows) reorder_gguf_rows(target.rows, heads_, out.data(), static_cast<uint64_t>(rows), row_bytes, true, what);
    add_term(term, out.data(), dtype);
    if (term.torch_rows) reorder_gguf_rows(target.rows, heads_, out.data(), static_cast<uint64_t>(rows), row_bytes, false, what);
    const uint64_t elements = element_count(info);
    if (const uint64_t at = first_nonfinite(dtype, dtype, out.data(), elements); at != elements)
      fail(PEFT_ERR_NON_FINITE, path_ + ": merged tensor " + peft::quoted(info.name) + " holds an infinity or a NaN in " +
                                    std::string(dtype_name(dtype)) + " (element " + std::to_string(at) +
                                    "); nothing was written (allow_nonfinite / --allow-nonfinite writes it anyway)");
    return true;
  }

  // Tensor `index` of the base as f32 values, in GGUF's row order, into `values` (room for all of
  // them); a block-quantized tensor's bytes are read into `stored` first.
  void base_values(size_t index, float* values, TensorBuffer& stored) const {
    const TensorInfo& info = base_->tensor(index);
    const uint64_t elements = element_count(info);
    if (!info.block_quantized) {
      base_->read(index, DType::F32, values, elements * sizeof(float));
      return;
    }
    const uint64_t cols = info.shape.empty() ? 1 : info.shape.back();
    stored.reserve(info.nbytes(), path_ + ": tensor " + peft::quoted(info.name));
    base_->read_bytes(index, 0, stored.data(), stored.size());
    with_path(path_, [&] {
      dequantize_blocks(static_cast<uint32_t>(info.ggml_type), stored.data(), cols == 0 ? 0 : elements / cols, cols,
                        values, options_.threads);
    });
  }

  // The ggml type merged tensor `info` is written in: options.quant, else options.dtype, else its own;
  // tensors of fewer than two dimensions (biases, norms) keep their own.
  uint32_t out_type(const TensorInfo& info) const {
    const auto own = static_cast<uint32_t>(info.ggml_type);
    if (info.shape.size() < 2) return own;
    if (options_.quant) return *options_.quant;
    if (options_.dtype) return ggml_of_dtype(*options_.dtype).value_or(own);
    return own;
  }

  uint64_t out_bytes(const TensorInfo& info) const {
    const uint64_t cols = info.shape.empty() ? 1 : info.shape.back();
    return ggml_rows_bytes(out_type(info), cols == 0 ? 0 : element_count(info) / cols, cols);
  }

  static std::string type_name(uint32_t id) {
    const auto type = ggml_type(id);
    return type ? std::string(type->name) : "ggml type " + std::to_string(id);
  }

  std::string path_;
  const CheckpointMergeOptions& options_;
  std::shared_ptr<const Checkpoint> base_;
  const GgufHeader* header_ = nullptr;
  GgufHeads heads_;
  std::string architecture_;
  std::shared_ptr<const ArchTable> table_;
  std::map<size_t, GgufTarget> targets_;  // by base tensor index; output_slot(): a tied base's added output
  std::optional<GgufTiedEmbeddings> tied_;  // a base with tied embeddings (find_tied_embeddings)
  bool untie_ = false;                     // the merge adds the output (settle_tied_embeddings)
  std::set<const Adapter*> tied_copies_;   // ensure_weight_tying adapters whose output copy was left out
  std::vector<std::string> notes_;
};

}  // namespace

CheckpointMergeResult merge_into_gguf(const std::string& base_path, const std::string& out_path,
                                      const CheckpointMergeOptions& options) {
  if (options.dtype && options.quant)
    fail(PEFT_ERR_INVALID_ARGUMENT, "a merge into a GGUF file takes a dtype or a quantization type, not both");
  if (options.quant && !ggml_can_quantize(*options.quant))
    fail(PEFT_ERR_UNSUPPORTED, "merged tensors cannot be quantized to ggml type " + std::to_string(*options.quant));
  if (options.max_shard_size != 0)
    fail(PEFT_ERR_INVALID_ARGUMENT, "a merge into a GGUF file writes one file: do not set a shard size");
  GgufMerge merge(base_path, options);
  const std::vector<std::string> out_paths = merge.output_paths(out_path);
  for (const std::string& out : out_paths)
    for (size_t k = 0; k < merge.base().file_count(); ++k)
      refuse_output_over_merge_inputs(out, merge.base().file_path(k), options.adapters);
  return merge.run(out_paths);
}

}  // namespace peft
