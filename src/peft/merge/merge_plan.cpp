// plan_merge: adapters checked against the base, changes gathered per base tensor, dtypes and
// conflicts validated, tied embeddings handled, output files laid out.
#include "peft/merge/merge_plan.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>

#include "core/convert.hpp"
#include "core/error.hpp"
#include "core/f8.hpp"
#include "core/file_identity.hpp"
#include "core/path.hpp"
#include "core/shape.hpp"
#include "core/text.hpp"
#include "peft/adapter/gguf_lora_file.hpp"
#include "peft/adapter/method_params.hpp"
#include "peft/arch/arch_registry.hpp"
#include "peft/methods/lora_math.hpp"
#include "checkpoint/checkpoint_layout.hpp"

namespace peft {
namespace {

namespace fs = std::filesystem;

[[noreturn]] void fail_listing(int32_t code, const std::string& what, const std::vector<std::string>& problems) {
  fail(code, what + " (" + std::to_string(problems.size()) + (problems.size() == 1 ? " problem" : " problems") +
                 "): " + join_text(problems, "; "));
}

std::string adapter_label(const PlannedAdapter& a) { return "adapter " + peft::quoted(a.adapter->dir()); }

// PEFT's _set_trainable wraps every module whose name ends with a modules_to_save entry (a plain
// suffix test); its tensors are saved without "base_layer".
bool is_merge_storage(DType d) { return d == DType::F32 || d == DType::BF16 || d == DType::F16; }

std::shared_ptr<const ArchTable> table_for(const Adapter* adapter, const BaseModel& base) {
  if (adapter && adapter->table()) return adapter->table();
  const nlohmann::json* config = base.config.is_object() ? &base.config : nullptr;
  auto guess = detect_family(config, adapter ? adapter->config().base_model_name_or_path : std::nullopt);
  if (!guess) return nullptr;
  try {
    return builtin_arch_table(guess->family);
  } catch (const Error&) {
    return nullptr;  // no table installed: Linear vs Conv1D is then decided by shapes alone
  }
}

// Every tensor of one module that is not a LoRA factor: what it changes in the base.
struct Changes {
  std::optional<TensorSource> replacement;
  std::vector<LoraTerm> lora;
  std::vector<LoraTerm> lora_bias;
  std::vector<TokenRows> tokens;
  bool any() const { return replacement || !lora.empty() || !lora_bias.empty() || !tokens.empty(); }
};

class Planner {
 public:
  Planner(const std::string& base_dir, const MergePlanOptions& options) : options_(options) {
    plan_.base = BaseModel::open(base_dir, options.open);
    plan_.quantization = recognise_base_quantization(plan_.base.config, base_dir);
    plan_.dtype = options.dtype;
    plan_.dequantized = plan_.quantization.method != BaseQuantMethod::none && options.dtype.has_value();
    base_dir_ = base_dir;
    if (plan_.quantization.method == BaseQuantMethod::bitsandbytes)
      if (auto bnb = recognise_bnb_base(plan_.base.config, *plan_.base.weights, plan_.base.dir))
        plan_.bnb = std::make_shared<const BnbBase>(std::move(*bnb));
  }

  MergePlan run(const std::vector<MergeInput>& inputs) {
    check_adapters(inputs);
    find_tied_embeddings();
    gather_changes();
    settle_tied_embeddings();
    find_fp8_weights();
    build_tensors();
    std::erase_if(plan_.tensors, [&](const PlannedTensor& p) {
      if (p.bnb) return p.action == TensorAction::copy;
      return !p.added && dropped_.contains(p.base_index);
    });
    lay_out_files();
    return std::move(plan_);
  }

 private:
  const Checkpoint& base() const { return *plan_.base.weights; }

  void check_adapters(const std::vector<MergeInput>& inputs) {
    if (inputs.empty() && !options_.base_only) fail(PEFT_ERR_INVALID_ARGUMENT, "a merge needs at least one adapter");
    std::vector<std::string> unresolved, mismatched;
    for (const MergeInput& input : inputs) {
      if (!input.adapter) fail(PEFT_ERR_INVALID_ARGUMENT, "an adapter of the merge is null");
      if (!std::isfinite(input.weight))
        fail(PEFT_ERR_INVALID_ARGUMENT, "adapter " + peft::quoted(input.adapter->dir()) + " has a weight that is not finite");
      auto planned = std::make_unique<PlannedAdapter>();
      planned->adapter = input.adapter;
      planned->weight = input.weight;
      planned->modules = input.adapter->modules();
      if (input.modules)
        std::erase_if(planned->modules, [&](const AdapterModule& m) { return !input.modules->contains(m.name); });
      // Linear vs Conv1D is decided again from this base (the adapter may have been opened without one).
      for (AdapterModule& m : planned->modules)
        if (m.kind == LayerKind::conv1d) m.kind = LayerKind::linear;
      auto table = table_for(input.adapter.get(), plan_.base);
      ValidationResult result = check_against_base(planned->modules, input.adapter->checkpoint(),
                                                   input.adapter->config(), plan_.base, table.get());
      for (const std::string& p : result.unresolved) unresolved.push_back(adapter_label(*planned) + ": " + p);
      for (const std::string& p : result.mismatched) mismatched.push_back(adapter_label(*planned) + ": " + p);
      plan_.adapters.push_back(std::move(planned));
    }
    std::vector<std::string> all;
    for (const std::string& p : unresolved) all.push_back("unresolved: " + p);
    for (const std::string& p : mismatched) all.push_back("shape mismatch: " + p);
    if (!all.empty())
      fail_listing(unresolved.empty() ? PEFT_ERR_SHAPE_MISMATCH : PEFT_ERR_UNRESOLVED_KEY,
                   "the adapters do not fit base model " + peft::quoted(base_dir_), all);
  }

  size_t base_index_of(const std::string& name, const PlannedAdapter& a) {
    auto index = base().find(name);
    if (!index)
      fail(PEFT_ERR_UNRESOLVED_KEY, adapter_label(a) + ": the base has no tensor " + peft::quoted(name));
    return *index;
  }

  // ---- Tied embeddings (docs/architecture.md, "Tied embeddings") -----------------------------------
  // transformers ties the output embedding to the input embedding when the table's config key
  // (tie_word_embeddings) is true, and saves only the input. PEFT wraps each side in its own layer, so
  // its forward sees each side's own changes, while its merge_and_unload writes them all into the one
  // shared tensor. The output embedding's changes are gathered apart (output_slot_: the stored output
  // tensor, or one past the base's tensors) and settled per policy once all are known.

  void find_tied_embeddings() {
    if (plan_.adapters.empty()) return;  // base_only: nothing changes either side
    auto table = table_for(plan_.adapters.front()->adapter.get(), plan_.base);
    tied_ = plan_.base.tied_embeddings(table.get());
    if (tied_) output_slot_ = tied_->output ? *tied_->output : base().tensor_count();
  }

  bool added_output() const { return tied_ && !tied_->output; }

  std::string tensor_name(size_t index) const {
    return index == base().tensor_count() && tied_ ? tied_->output_weight : base().tensor(index).name;
  }

  // The base tensor a module's tensor changes, or output_slot_ for the weight of a tied output
  // embedding the base does not store (its adapters keep its own name: BaseModel::is_tied_output).
  size_t target_of(const PlannedAdapter& a, const std::string& base_tensor) {
    if (added_output() && base_tensor == tied_->output_weight) return output_slot_;
    return base_index_of(base_tensor, a);
  }

  // Whether the adapter's output LoRA is PEFT's ensure_weight_tying copy, left out (tied_embeddings.hpp).
  bool is_tied_lora_copy(const PlannedAdapter& a) const {
    if (!tied_) return false;
    const std::string& input = base().tensor(tied_->input).name;
    return peft::is_tied_lora_copy(options_.tied_embeddings, *a.adapter, a.modules, tied_->output_module,
                                   [&](const AdapterModule& m) { return m.weight_factor()->base_tensor == input; });
  }

  void settle_tied_embeddings() {
    if (!tied_) return;
    Changes& in = changes_[tied_->input];
    Changes& out = changes_[output_slot_];
    const std::string input = peft::quoted(base().tensor(tied_->input).name);
    const std::string output = peft::quoted(tied_->output_module);
    // Changes PEFT makes to both sides: the LoRA of an ensure_weight_tying adapter whose output copy
    // was left out, token rows, and saved base_layer weights (loaded into the shared parameter).
    auto shared_term = [&](const LoraTerm& t) { return tied_copies_.contains(t.adapter); };
    const TiedDecision d = decide_tied_embeddings(options_.tied_embeddings, tied_side(in, shared_term),
                                                  tied_side(out, shared_term), !added_output(), input, output);
    if (!d.note.empty()) plan_.notes.push_back(d.note);
    if (d.move_output_to_input) {
      in.lora.insert(in.lora.end(), out.lora.begin(), out.lora.end());
      in.tokens.insert(in.tokens.end(), out.tokens.begin(), out.tokens.end());
      out.lora.clear();
      out.tokens.clear();
      if (out.replacement && !out.replacement->swaps_module) {  // a saved base_layer: the same parameter
        if (!in.replacement) in.replacement = out.replacement;
        out.replacement.reset();
      }
    }
    if (d.copy_shared_to_output) {
      for (const LoraTerm& t : in.lora)
        if (shared_term(t)) out.lora.push_back(t);
      out.tokens.insert(out.tokens.end(), in.tokens.begin(), in.tokens.end());
      if (in.replacement && !in.replacement->swaps_module && !out.replacement) out.replacement = in.replacement;
    }
    if (!d.untie) return;
    plan_.untie_embeddings = true;
    plan_.tie_config_key = tied_->config_key;
    std::string note = tied_->config_key + " set to false: the input embedding " + input + " and the output embedding " +
                       output + " no longer hold the same values";
    if (added_output())
      note += "; " + peft::quoted(tied_->output_weight) + " was added holding the original embedding" +
              (d.output_changes ? " plus the output embedding's own changes" : "");
    plan_.notes.push_back(note);
  }

  template <class IsShared>
  static TiedSide tied_side(const Changes& c, IsShared is_shared) {
    return peft::tied_side(c.lora.size(), static_cast<size_t>(std::count_if(c.lora.begin(), c.lora.end(), is_shared)),
                           !c.lora_bias.empty(), !c.tokens.empty(),
                           c.replacement ? std::optional<bool>(c.replacement->swaps_module) : std::nullopt);
  }

  // The output embedding the base does not store, after the input embedding it copies (untied only).
  void plan_added_output(std::vector<std::string>& unsupported) {
    if (!added_output() || !plan_.untie_embeddings) return;
    const size_t input = tied_->input;
    if (fp8_weights_.contains(input) || (plan_.bnb && (plan_.bnb->weights.contains(input) || plan_.bnb->owner.contains(input)))) {
      unsupported.push_back("the tied input embedding " + peft::quoted(base().tensor(input).name) +
                            " is quantized, so an untied output embedding cannot be added (tied embeddings policy \"shared\" keeps the tie)");
      return;
    }
    PlannedTensor p = plan_plain_tensor(input, tied_->output_weight, changes_[output_slot_], unsupported);
    if (p.action == TensorAction::copy) p.action = TensorAction::duplicate;
    p.added = true;
    p.tokens_before_lora = true;
    auto at = std::find_if(plan_.tensors.begin(), plan_.tensors.end(),
                           [&](const PlannedTensor& t) { return t.base_index == input; });
    plan_.tensors.insert(at == plan_.tensors.end() ? at : at + 1, std::move(p));
  }

  const TensorInfo& info(const PlannedAdapter& a, const AdapterTensor& t) const {
    return a.adapter->checkpoint().tensor(t.index);
  }

  void gather_changes() {
    changes_.resize(base().tensor_count() + 1);  // the last: an output embedding the base does not store
    std::vector<std::string> conflicts;
    // (base tensor, adapter) pairs already holding LoRA terms, and token rows per base tensor.
    std::set<std::pair<size_t, const PlannedAdapter*>> lora_seen, bias_seen;
    std::map<size_t, std::map<int64_t, const PlannedAdapter*>> token_rows;
    for (const auto& owned : plan_.adapters) {
      const PlannedAdapter& a = *owned;
      check_replacement_weight(*a.adapter, a.weight);
      const bool skip_tied_copy = is_tied_lora_copy(a);
      for (const AdapterModule& m : a.modules) {
        if (skip_tied_copy && m.name == tied_->output_module) {
          tied_copies_.insert(&a);
          plan_.notes.push_back(adapter_label(a) + ": module " + peft::quoted(m.name) + " is PEFT's tied copy of the " +
                                "input embedding's LoRA (ensure_weight_tying), so the change lands once in " +
                                peft::quoted(base().tensor(tied_->input).name) + ", which stays tied");
          continue;
        }
        if (m.expert) {  // a stacked expert parameter: the fused tensor, or each expert's tensors
          std::vector<std::string> unresolved, mismatched;  // reported by check_adapters already
          const auto table = table_for(a.adapter.get(), plan_.base);
          const double c = merge::lora_coefficient(a.weight, m.scaling, adapter_label(a) + ", module " + peft::quoted(m.name));
          for (const ExpertSlot& slot : expert_slots(m, a.adapter->checkpoint(), plan_.base, table.get(), unresolved, mismatched)) {
            if (!lora_seen.insert({slot.base_index, &a}).second)
              conflicts.push_back(adapter_label(a) + " has two LoRA modules on base tensor " +
                                  peft::quoted(tensor_name(slot.base_index)));
            changes_[slot.base_index].lora.push_back(LoraTerm{&a, &m, c, false, slot});
          }
          continue;
        }
        if (m.is_lora()) {
          const AdapterTensor* factor = m.weight_factor();
          const size_t target = target_of(a, factor->base_tensor);
          LoraTerm term{&a, &m,
                        merge::lora_coefficient(a.weight, m.scaling, adapter_label(a) + ", module " + peft::quoted(m.name)), m.find(TensorRole::lora_magnitude) != nullptr};
          if (!lora_seen.insert({target, &a}).second)
            conflicts.push_back(adapter_label(a) + " has two LoRA modules on base tensor " +
                                peft::quoted(tensor_name(target)));
          if (is_rotation(m.method)) check_rotation_weight(m, a.weight);  // before anything is written
          changes_[target].lora.push_back(term);
          if (effect_of(m.method) == MethodEffect::scale && !m.ia3_bias.empty())  // ia3_l scales the bias too
            changes_[base_index_of(m.ia3_bias, a)].lora_bias.push_back(term);
          if (const AdapterTensor* bias = m.find(TensorRole::lora_b_bias)) {
            const size_t bias_target = base_index_of(bias->base_tensor, a);
            if (!bias_seen.insert({bias_target, &a}).second)
              conflicts.push_back(adapter_label(a) + " has two lora_B.bias tensors for base tensor " +
                                  peft::quoted(base().tensor(bias_target).name));
            changes_[bias_target].lora_bias.push_back(term);
          }
        }
        if (m.kind == LayerKind::trainable_tokens) {
          const AdapterTensor* delta = m.find(TensorRole::trainable_tokens_delta);
          const size_t target = target_of(a, delta->base_tensor);
          auto& rows = token_rows[target];
          for (int64_t row : m.token_indices) {
            auto [it, fresh] = rows.emplace(row, &a);
            if (!fresh && it->second != &a)
              conflicts.push_back("trainable token row " + std::to_string(row) + " of " +
                                  peft::quoted(tensor_name(target)) + " is set by both " +
                                  adapter_label(*it->second) + " and " + adapter_label(a));
          }
          changes_[target].tokens.push_back({&a, &m});
        }
        for (const AdapterTensor& t : m.tensors) {
          if (t.role != TensorRole::full) continue;
          const size_t target = target_of(a, t.base_tensor);
          auto& slot = changes_[target].replacement;
          if (slot) {
            conflicts.push_back("base tensor " + peft::quoted(tensor_name(target)) + " is replaced by both " +
                                peft::quoted(slot->adapter->adapter->dir() + ": " + slot->tensor->key) + " and " +
                                peft::quoted(a.adapter->dir() + ": " + t.key));
            continue;
          }
          slot = TensorSource{&a, &t, is_modules_to_save_copy(*a.adapter, m, t)};
        }
      }
    }
    if (!conflicts.empty()) fail_listing(PEFT_ERR_INVALID_ARGUMENT, "the adapters of the merge conflict", conflicts);
  }

  // The dtype a tensor is written in.
  DType out_dtype_of(DType base_dtype) const {
    return options_.dtype && is_convertible_float(base_dtype) ? *options_.dtype : base_dtype;
  }

  // An FP8 block-scale base: every "<m>.weight_scale_inv" and its F8_E4M3 "<m>.weight"; each weight's
  // scales, activation_scale and weight are tied together here (transformers' FP8Linear names).
  void find_fp8_weights() {
    if (plan_.quantization.method != BaseQuantMethod::fp8_block) return;
    const std::string suffix = ".weight_scale_inv";
    std::vector<std::string> problems;
    for (size_t i = 0; i < base().tensor_count(); ++i) {
      const TensorInfo& s = base().tensor(i);
      if (!s.name.ends_with(suffix)) continue;
      const std::string module = s.name.substr(0, s.name.size() - suffix.size());
      const auto w = base().find(module + ".weight");
      const std::string who = "FP8 scales " + peft::quoted(s.name);
      if (!w) {
        problems.push_back(who + " have no weight " + peft::quoted(module + ".weight"));
        continue;
      }
      const TensorInfo& t = base().tensor(*w);
      const Fp8BlockLayout layout =
          fp8_block_layout(t.shape, plan_.quantization.block_rows, plan_.quantization.block_cols);
      const std::vector<uint64_t> expected = fp8_scale_shape(t.shape, layout);
      const size_t n = t.shape.size();
      if (t.dtype != DType::F8_E4M3 || n < 2)
        problems.push_back("weight " + peft::quoted(t.name) + " is " + std::string(dtype_name(t.dtype)) + " " +
                           shape_text(t.shape) + "; an FP8 block weight is F8_E4M3 with at least 2 dimensions");
      else if (s.dtype != DType::F32)
        problems.push_back(who + " are " + std::string(dtype_name(s.dtype)) + "; F32 scales are supported");
      else if (s.shape != expected)
        problems.push_back(who + " have shape " + shape_text(s.shape) + ", not " + shape_text(expected) + " (weight " +
                           shape_text(t.shape) + " in blocks of " + std::to_string(layout.block_rows) + "x" +
                           std::to_string(layout.block_cols) + ")");
      else {
        fp8_weights_[*w] = Fp8BlockSource{*w, i, layout, false};
        fp8_scales_[i] = *w;
      }
    }
    if (plan_.dequantized) {
      for (const auto& [w, source] : fp8_weights_) {
        dropped_.insert(source.scale_index);
        const std::string& name = base().tensor(w).name;
        if (auto a = base().find(name.substr(0, name.size() - 7) + ".activation_scale")) dropped_.insert(*a);
      }
      // Nothing quantized may stay behind once quantization_config is gone.
      for (size_t i = 0; i < base().tensor_count(); ++i)
        if (is_f8(base().tensor(i).dtype) && !fp8_weights_.contains(i) && !dropped_.contains(i))
          problems.push_back("tensor " + peft::quoted(base().tensor(i).name) + " is " +
                             std::string(dtype_name(base().tensor(i).dtype)) +
                             " without block scales, so it cannot be written dequantized");
    }
    if (!problems.empty())
      fail_listing(PEFT_ERR_UNSUPPORTED, "the FP8 base model " + peft::quoted(base_dir_) + " cannot be merged", problems);
  }

  // An FP8 weight (or its scales, `scale_index` set) becomes a computed tensor when it is changed or
  // written dequantized; false: it is copied as it is.
  bool plan_fp8(PlannedTensor& p, size_t index, std::vector<std::string>& unsupported) {
    std::optional<Fp8BlockSource> source;
    if (auto it = fp8_weights_.find(index); it != fp8_weights_.end()) {
      source = it->second;
    } else if (auto scale = fp8_scales_.find(index); scale != fp8_scales_.end()) {
      source = fp8_weights_.at(scale->second);
      source->scale_output = true;
      const Changes& weight_changes = changes_[scale->second];  // the scales follow their weight's changes
      p.replacement = weight_changes.replacement;
      p.lora = weight_changes.lora;
    }
    if (!source) return false;
    if (!source->scale_output && (!p.lora_bias.empty() || !p.tokens.empty()))
      unsupported.push_back("FP8 weight " + peft::quoted(p.name) + ": only LoRA terms and replacements can change it");
    if (plan_.dequantized) {
      p.action = TensorAction::compute;
      p.out_dtype = *plan_.dtype;
      p.work_dtype = DType::F32;
    } else if (p.changed()) {
      p.action = TensorAction::compute;
      p.out_dtype = source->scale_output ? DType::F32 : DType::F8_E4M3;
      p.work_dtype = p.out_dtype;
    } else {
      p.action = TensorAction::copy;
    }
    if (p.action == TensorAction::compute) {
      p.fp8 = source;
      check_sources(p, unsupported);
    }
    return true;
  }

  // Plans tensor i when it belongs to a bitsandbytes weight; false when it is planned as any other.
  bool plan_bnb(size_t i, std::vector<std::string>& unsupported) {
    if (!plan_.bnb) return false;
    const BnbBase& b = *plan_.bnb;
    auto own = b.weights.find(i);
    auto owner = b.owner.find(i);
    if (own == b.weights.end() && owner == b.owner.end()) return false;
    const BnbWeight& w = own != b.weights.end() ? own->second : b.weights.at(owner->second);
    const TensorInfo& t = base().tensor(i);
    const Changes& c = changes_[w.weight];
    if (i == w.weight && (c.replacement || !c.tokens.empty()))
      unsupported.push_back("base tensor " + peft::quoted(t.name) + " is a bitsandbytes weight: only LoRA terms merge into it");
    for (const LoraTerm& term : bnb_terms_[w.weight])
      if (term.dora) unsupported.push_back("base tensor " + peft::quoted(base().tensor(w.weight).name) +
                                           " is a bitsandbytes weight: DoRA terms do not merge into it");
    const bool merged = !bnb_terms_[w.weight].empty();
    PlannedTensor p;
    p.name = t.name;
    p.base_index = i;
    p.base_dtype = t.dtype;
    p.bnb = &w;
    p.bnb_part = i;
    p.lora = bnb_terms_[w.weight];
    p.action = TensorAction::compute;
    if (options_.dtype) {
      if (i != w.weight) {  // a state tensor: dropped once the tied embeddings are settled (run())
        p.action = TensorAction::copy;
        p.shape = t.shape;
        plan_.tensors.push_back(std::move(p));
        return true;
      }
      p.out_dtype = *options_.dtype;
      p.work_dtype = DType::F32;
      p.shape = w.shape;
    } else {
      if (!merged) return false;  // copied as it is
      p.out_dtype = p.work_dtype = t.dtype;
      p.shape = t.shape;
      p.bnb_requantize = true;
    }
    p.out_nbytes = converted_byte_size(p.out_dtype, shape_elements(p.shape, "tensor " + peft::quoted(p.name)));
    plan_.tensors.push_back(std::move(p));
    return true;
  }

  // A base tensor (`index`) written as `name` with changes `c` (moved out): copied, replaced or computed.
  PlannedTensor plan_plain_tensor(size_t index, const std::string& name, Changes& c, std::vector<std::string>& unsupported) {
    const TensorInfo& t = base().tensor(index);
    PlannedTensor p;
    p.name = name;
    p.base_index = index;
    p.base_dtype = t.dtype;
    p.out_dtype = out_dtype_of(t.dtype);
    p.work_dtype = p.out_dtype;
    p.shape = t.shape;
    p.replacement = c.replacement;
    p.lora = c.lora;  // copied: an FP8 weight's scales read them too (plan_fp8)
    p.lora_bias = std::move(c.lora_bias);
    p.tokens = std::move(c.tokens);
    const std::string who = "base tensor " + peft::quoted(name) + " (" + std::string(dtype_name(t.dtype)) + ")";
    if (dropped_.contains(index) || plan_fp8(p, index, unsupported)) {
      // an FP8 weight or its scales (planned by plan_fp8), or a tensor left out
    } else if (!p.lora.empty() || !p.lora_bias.empty() || !p.tokens.empty()) {
      p.action = TensorAction::compute;
      if (p.out_dtype == p.base_dtype && is_merge_storage(p.out_dtype)) {
        p.work_dtype = p.out_dtype;
      } else if (is_merge_storage(p.out_dtype) && is_convertible_float(p.base_dtype)) {
        p.work_dtype = DType::F32;
      } else {
        unsupported.push_back(who + ": merging into " + std::string(dtype_name(p.out_dtype)) +
                              " is not supported (F32, BF16 and F16 are; choose an output dtype)");
      }
      check_sources(p, unsupported);
    } else if (p.replacement) {
      p.action = TensorAction::replace;
      const DType src = info(*p.replacement->adapter, *p.replacement->tensor).dtype;
      if (!can_convert(src, p.out_dtype))
        unsupported.push_back(who + ": its replacement " + peft::quoted(p.replacement->tensor->key) + " is " +
                              std::string(dtype_name(src)) + ", which does not convert to " +
                              std::string(dtype_name(p.out_dtype)));
    } else {
      p.action = TensorAction::copy;
    }
    p.out_nbytes = converted_byte_size(p.out_dtype, shape_elements(p.shape, "tensor " + peft::quoted(p.name)));
    return p;
  }

  void build_tensors() {
    std::vector<std::string> unsupported;
    if (plan_.bnb)
      for (const auto& [index, weight] : plan_.bnb->weights) bnb_terms_[index] = changes_[index].lora;
    for (size_t i = 0; i < base().tensor_count(); ++i) {
      if (plan_bnb(i, unsupported)) continue;
      plan_.tensors.push_back(plan_plain_tensor(i, base().tensor(i).name, changes_[i], unsupported));
    }
    plan_added_output(unsupported);
    if (!unsupported.empty()) fail_listing(PEFT_ERR_UNSUPPORTED, "the merge cannot be computed", unsupported);
  }

  // Every adapter tensor a computed tensor reads must convert to what it is read as.
  void check_sources(const PlannedTensor& p, std::vector<std::string>& problems) {
    const DType work = p.fp8 ? DType::F32 : p.work_dtype;  // FP8 weights are changed in f32
    auto need = [&](const PlannedAdapter& a, const AdapterTensor* t, DType as) {
      if (t == nullptr) return;
      const DType d = info(a, *t).dtype;
      if (!can_convert(d, as))
        problems.push_back("adapter tensor " + peft::quoted(t->key) + " is " + std::string(dtype_name(d)) +
                           ", which does not convert to " + std::string(dtype_name(as)));
    };
    if (p.replacement) need(*p.replacement->adapter, p.replacement->tensor, work);
    for (const LoraTerm& term : p.lora)
      for (const AdapterTensor& t : term.module->tensors)
        if (t.role != TensorRole::full && t.role != TensorRole::lora_b_bias) need(*term.adapter, &t, DType::F32);
    for (const LoraTerm& term : p.lora_bias)
      need(*term.adapter, term.module->find(effect_of(term.module->method) == MethodEffect::scale ? TensorRole::method_param
                                                                                  : TensorRole::lora_b_bias),
           DType::F32);
    for (const TokenRows& rows : p.tokens)
      need(*rows.adapter, rows.module->find(TensorRole::trainable_tokens_delta), work);
  }

  void lay_out_files() {
    if (options_.max_shard_size > 0) {
      std::vector<uint64_t> sizes;
      for (const PlannedTensor& p : plan_.tensors) sizes.push_back(p.out_nbytes);
      for (ShardFile& shard : save_pretrained_shards(sizes, options_.max_shard_size)) {
        PlannedFile f;
        f.name = std::move(shard.name);
        f.members = std::move(shard.members);
        f.metadata = std::map<std::string, std::string>{{"format", "pt"}};
        plan_.files.push_back(std::move(f));
      }
      plan_.write_index = plan_.files.size() > 1;
      if (plan_.write_index && base().index_metadata_json()) plan_.index_metadata_json = *base().index_metadata_json();
      return;
    }
    const std::string prefix = join_path(plan_.base.dir, "");
    for (size_t k = 0; k < base().file_count(); ++k) {
      PlannedFile f;
      const std::string& path = base().file_path(k);
      f.name = path.starts_with(prefix) ? path.substr(prefix.size()) : fs::path(path).filename().string();
      const std::optional<Metadata>& metadata = base().file_metadata(k);
      if (metadata) f.metadata = std::map<std::string, std::string>(metadata->begin(), metadata->end());
      plan_.files.push_back(std::move(f));
    }
    for (size_t i = 0; i < plan_.tensors.size(); ++i)
      plan_.files[base().tensor_file(plan_.tensors[i].base_index)].members.push_back(i);
    std::error_code ec;
    plan_.write_index = fs::exists(fs::path(plan_.base.dir) / kIndexFileName, ec);
    if (base().index_metadata_json()) plan_.index_metadata_json = *base().index_metadata_json();
  }

  const MergePlanOptions& options_;
  std::string base_dir_;
  MergePlan plan_;
  std::vector<Changes> changes_;                   // per base tensor, then the added output embedding's
  std::optional<TiedEmbeddings> tied_;
  std::set<const PlannedAdapter*> tied_copies_;    // adapters whose tied output LoRA copy was left out
  size_t output_slot_ = 0;                         // where the output embedding's changes gather (tied_ set)
  std::map<size_t, Fp8BlockSource> fp8_weights_;  // FP8 block weights by base index
  std::map<size_t, size_t> fp8_scales_;            // their scales' base index -> the weight's
  std::set<size_t> dropped_;                       // base tensors not written (scales of dequantized weights)
  std::map<size_t, std::vector<LoraTerm>> bnb_terms_;  // a bitsandbytes weight's LoRA terms
};

}  // namespace

bool is_convertible_float(DType dtype) {
  return dtype == DType::F64 || dtype == DType::F32 || dtype == DType::F16 || dtype == DType::BF16;
}

uint64_t MergePlan::total_bytes() const {
  uint64_t total = 0;
  for (const PlannedTensor& p : tensors)
    if (__builtin_add_overflow(total, p.out_nbytes, &total))
      fail(PEFT_ERR_VALIDATION_OVERFLOW, "the merged checkpoint's size overflows 64 bits");
  return total;
}

size_t MergePlan::count(TensorAction action) const {
  return static_cast<size_t>(std::count_if(tensors.begin(), tensors.end(), [&](const PlannedTensor& p) {
    const bool dequantized_only = p.action == TensorAction::compute && !p.changed();
    if (p.added) return action == TensorAction::duplicate;
    return (dequantized_only ? TensorAction::copy : p.action) == action;
  }));
}

MergePlan plan_merge(const std::string& base_dir, const std::vector<MergeInput>& inputs,
                     const MergePlanOptions& options) {
  if (options.dtype && !is_merge_storage(*options.dtype))
    fail(PEFT_ERR_INVALID_ARGUMENT, "the output dtype must be F32, BF16 or F16, not " +
                                        std::string(dtype_name(*options.dtype)));
  return Planner(base_dir, options).run(inputs);
}

void refuse_output_over_merge_inputs(const std::string& out, const std::string& base,
                                     const std::vector<MergeInput>& adapters) {
  std::vector<JobInput> inputs{{"the base model", base}};
  for (const MergeInput& input : adapters)
    inputs.push_back({"an adapter being merged",
                      input.gguf_lora ? input.gguf_lora->path : input.adapter ? input.adapter->dir() : ""});
  refuse_output_over_inputs(out, inputs);
}

}  // namespace peft
