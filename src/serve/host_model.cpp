// HostModel: an adapter swapped in and out of a host's weight buffers, all or nothing.
#include "serve/host_model.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <new>
#include <optional>
#include <set>
#include <string>
#include <utility>

#include "core/error.hpp"
#include "core/text.hpp"
#include "peft/adapter/adapter.hpp"
#include "peft/base/expert_base.hpp"
#include "peft/buffer_merge/layer_module.hpp"
#include "peft/kernels/merge_kernels.hpp"
#include "peft/kernels/merge_parallel.hpp"
#include "peft/methods/lora_math.hpp"
#include "peft/methods/method_table.hpp"

namespace peft::serve {

namespace testing {
SwapFaultHook swap_fault_hook = nullptr;
}  // namespace testing

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

void check_buffer_dtype(DType dtype, const std::string& what) {
  if (dtype != DType::F32 && dtype != DType::BF16 && dtype != DType::F16)
    fail(PEFT_ERR_UNSUPPORTED, what + " is " + std::string(dtype_name(dtype)) + "; host weights must be F32, BF16 or F16");
}

// The f32 factors of one adapter's merged layers, shared by their BufferMergeModules. The pin keeps
// the adapter loaded (and pinned in its registry) while any layer of it is merged; with F32
// storage the factors point into that LoadedAdapter, otherwise into `converted`.
struct AdapterFactors {
  std::shared_ptr<const Lease> pin;
  std::vector<float> converted;  // every element of the storage, at the same offsets
};

// The code and message of an exception caught inside a swap.
std::pair<int32_t, std::string> describe(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const Error& error) {
    return {error.code(), error.what()};
  } catch (const std::bad_alloc&) {
    return {PEFT_ERR_OUT_OF_MEMORY, "out of memory"};
  } catch (const std::exception& error) {
    return {PEFT_ERR_INTERNAL, std::string("internal error: ") + error.what()};
  } catch (...) {
    return {PEFT_ERR_INTERNAL, "internal error: unknown exception"};
  }
}

void fault_point(bool merging) {
  if (testing::swap_fault_hook) testing::swap_fault_hook(merging);
}

size_t element_bytes(DType dtype) { return dtype == DType::F32 ? 4 : 2; }

// memcpy over all cores: one thread does not reach the memory bandwidth (on the 2-core machine of
// bench/bench_serve.cpp, copying 1.62 GB of weights back took 0.27 s with one thread and 0.15 s
// with two; into fresh memory, page faults included, 0.94 s and 0.50 s). 4 MiB pieces, handed
// out dynamically, each copied by the merge kernels' copy (whole cache lines streamed on x86: the
// copy is not read back soon).
void copy_bytes(void* to, const void* from, size_t bytes) {
  constexpr size_t kPiece = size_t{4} << 20;
  const auto pieces = static_cast<int64_t>((bytes + kPiece - 1) / kPiece);
  const merge::kernels::Table& kernels = merge::kernels::active();
  merge::parallel_tasks(pieces, merge::worker_count(0, pieces), [&](int64_t piece, unsigned) {
    const size_t begin = static_cast<size_t>(piece) * kPiece;
    kernels.copy(static_cast<unsigned char*>(to) + begin, static_cast<const unsigned char*>(from) + begin,
                 std::min(kPiece, bytes - begin));
  });
}

// Whether merging `m` changes the layer's bias buffer `bias` (null when the host gave none): a
// lora_B.bias, or IA3 on a layer that is not feed-forward (ia3_l also scales the bias, as PEFT's merge).
bool changes_bias(const BufferMergeModule& m, const void* bias) {
  if (m.lora_bias != nullptr) return true;
  return bias != nullptr && m.method_module && effect_of(m.method_module->method) == MethodEffect::scale &&
         !m.method_module->settings.ia3_feedforward;
}

[[noreturn]] void fail_to_keep(size_t bytes, const std::string& what) {
  fail(PEFT_ERR_OUT_OF_MEMORY, "cannot allocate " + std::to_string(bytes) + " bytes to keep the original of " + what);
}

}  // namespace

size_t HostModel::Weight::bytes() const {
  size_t elements = 1;
  for (int64_t d : shape) elements *= static_cast<size_t>(d);
  return elements * element_bytes(dtype);
}

void HostModel::set_translator(std::optional<Translator> translator) {
  if (!weights_.empty())
    fail(PEFT_ERR_INVALID_ARGUMENT, "the translator of a host model must be set before its weights are added");
  translator_ = std::move(translator);
}

void HostModel::add_weight(std::string_view name, void* data, DType dtype, std::span<const int64_t> shape, void* bias,
                           DType bias_dtype, int64_t bias_elements) {
  const std::string what = "weight " + peft::quoted(std::string(name));
  if (data == nullptr) fail(PEFT_ERR_INVALID_ARGUMENT, what + ": data must not be NULL");
  if (current_ || !merged_.empty())
    fail(PEFT_ERR_INVALID_ARGUMENT, what + ": weights cannot be added while an adapter is merged (swap to none first)");
  check_buffer_dtype(dtype, what);
  if (bias != nullptr) {
    check_buffer_dtype(bias_dtype, what + ": the bias");
    if (bias_elements < 1)
      fail(PEFT_ERR_SHAPE_MISMATCH, what + ": the bias has " + std::to_string(bias_elements) + " elements");
  }
  if (shape.size() < 2 || shape.size() > 4)
    fail(PEFT_ERR_SHAPE_MISMATCH, what + " has " + std::to_string(shape.size()) +
                                      " dimensions; host weights have 2 (3 for a fused expert parameter, 4 for " +
                                      "Conv2d)");
  for (size_t i = 0; i < shape.size(); ++i)
    if (shape[i] < 1)
      fail(PEFT_ERR_SHAPE_MISMATCH, what + ": dimension " + std::to_string(i) + " is " + std::to_string(shape[i]));

  const Translator* translator = translator_ ? &*translator_ : nullptr;
  // A stacked GGUF expert tensor stands for one module per slice; other names for their candidates.
  std::vector<std::string> modules;
  if (translator != nullptr && shape.size() == 3) modules = translator->gguf_slice_modules(name, shape[0]);
  const bool stacked = !modules.empty();
  if (!stacked) modules = module_candidates(name, translator);
  const GgufRows rows = host_row_order(name, translator);
  if (rows != GgufRows::same)
    if (const auto problem = gguf_rows_problem(rows, translator->gguf()->heads, static_cast<uint64_t>(shape[0])))
      fail(PEFT_ERR_SHAPE_MISMATCH, what + ": " + *problem);
  for (const std::string& module : modules)
    if (auto it = weight_of_module_.find(module); it != weight_of_module_.end())
      fail(PEFT_ERR_INVALID_ARGUMENT, what + " stands for layer " + peft::quoted(module) + ", which weight " +
                                          peft::quoted(weights_[it->second].name) + " was given for already");
  // One buffer under several names (tied embeddings: the input embedding and lm_head sharing memory).
  size_t buffer = weights_.size();
  for (const Weight& other : weights_) {
    if (other.data != data) continue;
    if (other.dtype != dtype || !std::equal(other.shape.begin(), other.shape.end(), shape.begin(), shape.end()))
      fail(PEFT_ERR_INVALID_ARGUMENT, what + " is the buffer of weight " + peft::quoted(other.name) +
                                          " with another dtype or shape; a shared buffer is given with the same ones");
    buffer = other.buffer;
    break;
  }

  weights_.push_back({std::string(name), data, dtype, {shape.begin(), shape.end()}, bias, bias_dtype,
                      bias != nullptr ? bias_elements : 0, rows, buffer, stacked});
  try {
    for (const std::string& module : modules) weight_of_module_.emplace(module, weights_.size() - 1);
  } catch (...) {
    for (const std::string& module : modules) weight_of_module_.erase(module);
    weights_.pop_back();
    throw;
  }
}

// The weights of the adapter's LoRA on stacked expert parameters. Without a translator the fused
// parameter, when the host gave it ("model.layers.0.mlp.experts.gate_up_proj"), gets one layer
// merging every expert's slice. Otherwise each tensor a checkpoint saves per expert is a layer
// ("...experts.3.gate_proj", or its host name through a translator), except that the parts in one
// stacked GGUF tensor ("blk.0.ffn_gate_exps.weight") are one layer merging each into its slice.
// When the host gave no weight for any of them, the fused parameter's name (without a translator)
// or every per-expert module is what is missing.
std::vector<HostModel::ExpertLayer> HostModel::expert_layers(const LoadedAdapter& loaded,
                                                             const std::string& adapter) const {
  std::vector<ExpertLayer> out;
  for (const AdapterModule* m : loaded.expert_modules()) {
    const ExpertTarget& x = *m->expert;
    auto factors = std::make_shared<const ExpertFactors>(*m, loaded.adapter().checkpoint());
    const std::string fused = x.module + "." + x.param;
    if (!translator_) {
      std::optional<std::string> given;
      for (std::string name : {fused, x.checkpoint_module + "." + x.param})
        if (!given && weight_of_module_.contains(name)) given = std::move(name);
      if (given) {
        out.push_back({m, factors, *given, false});
        continue;
      }
    }
    const std::vector<ExpertPart> parts = per_expert_parts(*m, factors->shape());
    const bool any_part = std::any_of(parts.begin(), parts.end(), [&](const ExpertPart& p) {
      return weight_of_module_.contains(p.module());
    });
    if (translator_ && parts.empty())
      fail(PEFT_ERR_UNSUPPORTED, adapter + ": module " + peft::quoted(m->name) + " adapts " + peft::quoted(fused) +
                                     ", which table " + peft::quoted(translator_->table().family()) +
                                     " lists no per-expert tensors for (none a translator could name); give the " +
                                     "host model that buffer by its transformers name, without a translator");
    if (!translator_ && !any_part) {
      out.push_back({m, factors, fused, false});
      continue;
    }
    std::set<size_t> stacked_weights;  // one layer per stacked weight, for all of its slices
    for (const ExpertPart& part : parts) {
      const std::string key = part.module();
      const auto it = weight_of_module_.find(key);
      const bool stacked = it != weight_of_module_.end() && weights_[it->second].stacked;
      if (!stacked || stacked_weights.insert(it->second).second) out.push_back({m, factors, key, stacked});
    }
  }
  return out;
}

std::vector<HostModel::Layer> HostModel::prepare(const std::shared_ptr<const Lease>& pin, double weight) const {
  const LoadedAdapter& loaded = pin->loaded();
  const std::string adapter = "adapter " + peft::quoted(pin->name());
  refuse_activated_lora(loaded.adapter(), "a swap into the host's weights");
  if (loaded.has_replacements()) {
    const PeftMethod method = loaded.adapter().config().method;
    const std::string what =
        effect_of(method) == MethodEffect::replacement
            ? std::string("is a ") + peft_method_name(method) + " adapter, which replaces whole tensors"
            : "replaces whole tensors (modules_to_save, bias=\"all\" or saved base_layer weights)";
    std::vector<std::string> swappable;  // the methods merged from their parameters
    for (const MethodRow& row : method_table())
      if (row.effect != MethodEffect::lora && row.effect != MethodEffect::replacement)
        swappable.emplace_back(peft_method_name(row.method));
    fail(PEFT_ERR_UNSUPPORTED, adapter + " " + what + "; a swap merges the layers of LoRA and the methods merged " +
                                   "from their parameters (" + join_text(swappable, ", ") + "), not replacements: " +
                                   "merge it with peft_merge_buffer_apply() or peft_merge_checkpoint()");
  }

  // Every layer's module, the key of its weight: the LoRA layers, the other methods' (merged from
  // their parameters), then the LoRA on stacked expert parameters (expert_layers).
  std::vector<std::string> modules;
  for (const LoadedLayer& layer : loaded.layers()) modules.push_back(layer.module);
  for (const AdapterModule* m : loaded.method_modules()) modules.push_back(m->name);
  const std::vector<ExpertLayer> experts = expert_layers(loaded, adapter);
  for (const ExpertLayer& e : experts) modules.push_back(e.key);
  std::vector<std::string> missing;
  for (const std::string& module : modules)
    if (!weight_of_module_.contains(module)) missing.push_back(peft::quoted(module));
  if (!missing.empty()) {
    std::string message = "the host model has no weight for " + std::to_string(missing.size()) + " of the " +
                          std::to_string(modules.size()) + " layers of " + adapter + ": ";
    for (size_t i = 0; i < missing.size(); ++i) message += (i ? ", " : "") + missing[i];
    fail(PEFT_ERR_UNRESOLVED_KEY, message);
  }

  // One layer per weight: an exact removal writes back the weight's original, which would take
  // out every layer merged into it at once.
  std::unordered_map<size_t, const std::string*> layer_of_weight;
  for (const std::string& module : modules) {
    const size_t weight = weight_of_module_.at(module);
    const auto [it, first] = layer_of_weight.emplace(weight, &module);
    if (!first)
      fail(PEFT_ERR_INVALID_ARGUMENT, adapter + ": layers " + peft::quoted(*it->second) + " and " +
                                          peft::quoted(module) + " are both merged into weight " +
                                          peft::quoted(weights_[weight].name) + "; a swap merges one layer per weight");
  }

  const std::vector<bool> merged_once = shared_buffer_layers(loaded, modules, adapter);

  std::vector<Layer> layers;
  layers.reserve(modules.size());
  auto add_layer = [&](Layer&& layer) {
    layer.options.weight = weight;
    layer.options.refuse_non_finite = true;
    layer.options.caller_restores = exact_;  // the weight's original copy puts it back
    layer.options.layer = weights_[layer.weight].name;
    layer.exact = exact_;
    layers.push_back(std::move(layer));
  };
  for (const LoadedLayer& loaded_layer : loaded.layers()) {
    Layer layer;
    layer.weight = weight_of_module_.at(loaded_layer.module);
    const Weight& w = weights_[layer.weight];
    BufferMergeModule& m = layer.module;
    const LayerKind kind = host_layer_kind(loaded_layer.kind, translator_ ? &*translator_ : nullptr);
    m.layout = lora_layout(kind, w.shape, loaded_layer.a_shape, loaded_layer.b_shape, loaded_layer.module);
    // The storage holds rank x a_cols and b_rows x rank elements: the layout must read exactly those.
    if (m.layout.in != loaded_layer.a_cols || m.layout.out != loaded_layer.b_rows)
      fail(PEFT_ERR_INTERNAL, adapter + ": layer " + peft::quoted(loaded_layer.module) + " has " +
                                  std::to_string(loaded_layer.b_rows) + " x " + std::to_string(loaded_layer.a_cols) +
                                  " factors but a layout of " + std::to_string(m.layout.out) + " x " +
                                  std::to_string(m.layout.in));
    if (loaded_layer.bias != LoadedLayer::npos && w.bias == nullptr)
      fail(PEFT_ERR_INVALID_ARGUMENT, adapter + ": layer " + peft::quoted(loaded_layer.module) +
                                          " has a lora_B.bias; give the host model the layer's bias buffer with weight " +
                                          peft::quoted(w.name));
    if (loaded_layer.bias != LoadedLayer::npos && w.bias_elements != m.layout.out)
      fail(PEFT_ERR_SHAPE_MISMATCH, adapter + ": layer " + peft::quoted(loaded_layer.module) + " has " +
                                        std::to_string(m.layout.out) + " output features, but the bias given with " +
                                        "weight " + peft::quoted(w.name) + " has " +
                                        std::to_string(w.bias_elements) + " elements");
    m.rank = loaded_layer.rank;
    m.scaling = loaded_layer.scaling;
    add_layer(std::move(layer));
  }

  // The factors as f32, converted all at once (offsets stay those of the storage).
  auto factors = std::make_shared<AdapterFactors>();
  factors->pin = pin;
  const float* base = nullptr;
  if (!loaded.layers().empty()) {
    if (loaded.dtype() == DType::F32) {
      base = static_cast<const float*>(loaded.data(0));
    } else {
      const size_t elements = static_cast<size_t>(loaded.bytes() / (dtype_bits(loaded.dtype()) / 8));
      factors->converted.resize(elements);
      loaded.read_f32(0, elements, factors->converted.data());
      base = factors->converted.data();
    }
  }
  auto at = [base](size_t offset) { return offset == LoadedLayer::npos ? nullptr : base + offset; };
  for (size_t i = 0; i < layers.size(); ++i) {
    const LoadedLayer& loaded_layer = loaded.layers()[i];
    BufferMergeModule& m = layers[i].module;
    m.lora_a = at(loaded_layer.a);
    m.lora_b = at(loaded_layer.b);
    m.lora_bias = at(loaded_layer.bias);
    m.magnitude = at(loaded_layer.magnitude);
    m.keep_alive = factors;
    const Weight& w = weights_[layers[i].weight];
    if (w.rows != GgufRows::same)
      m = in_gguf_row_order(std::move(m), w.rows, translator_->gguf()->heads, adapter + ": weight " + peft::quoted(w.name));
  }
  // The other methods' layers: their parameters read from the adapter as f32 and checked against
  // the weight now (host_buffer_module), so that a swap fails before any buffer changes.
  for (const AdapterModule* method_module : loaded.method_modules()) {
    Layer layer;
    layer.weight = weight_of_module_.at(method_module->name);
    const Weight& w = weights_[layer.weight];
    layer.module = host_buffer_module(loaded.adapter_ptr(), *method_module, w.name, w.shape,
                                      translator_ ? &*translator_ : nullptr);
    layer.module.keep_alive = std::make_shared<std::pair<std::shared_ptr<const void>, std::shared_ptr<const Lease>>>(
        std::move(layer.module.keep_alive), pin);
    if (changes_bias(layer.module, w.bias) && w.bias_elements != layer.module.layout.out)
      fail(PEFT_ERR_SHAPE_MISMATCH, adapter + ": layer " + peft::quoted(method_module->name) + " scales the bias of " +
                                        std::to_string(layer.module.layout.out) + " output features, but the bias " +
                                        "given with weight " + peft::quoted(w.name) + " has " +
                                        std::to_string(w.bias_elements) + " elements");
    add_layer(std::move(layer));
  }
  // The LoRA on stacked expert parameters: each expert's pair read from the adapter as f32, once per
  // module, and checked against the weight now.
  for (const ExpertLayer& e : experts) {
    Layer layer;
    layer.weight = weight_of_module_.at(e.key);
    const Weight& w = weights_[layer.weight];
    if (e.stacked && w.rows != GgufRows::same)
      fail(PEFT_ERR_UNSUPPORTED, adapter + ": weight " + peft::quoted(w.name) +
                                     " holds stacked experts in a reordered row order, which no table gives them");
    // By the HuggingFace name the weight stands for (the host's own name may be a translator's); a
    // stacked GGUF tensor by its own name, each slice's part in place (as the buffer merge does).
    if (e.stacked) {
      std::optional<StackedBufferModule> stacked = gguf_stacked_buffer_module(
          loaded.adapter_ptr(), w.name, w.shape, translator_ ? &*translator_ : nullptr);
      if (!stacked)
        fail(PEFT_ERR_INTERNAL, "stacked GGUF weight " + peft::quoted(w.name) + " stands for " + peft::quoted(e.key) +
                                    ", which no translator places in a slice");
      layer.module = std::move(stacked->merge);
    } else {
      layer.module = expert_buffer_module(e.factors, *e.module, e.key, w.shape);
    }
    layer.module.keep_alive = std::make_shared<std::pair<std::shared_ptr<const void>, std::shared_ptr<const Lease>>>(
        std::move(layer.module.keep_alive), pin);
    add_layer(std::move(layer));
  }
  // A change the shared buffer's names make alike is merged once, into the buffer's first name.
  std::vector<Layer> kept;
  kept.reserve(layers.size());
  for (size_t i = 0; i < layers.size(); ++i)
    if (!merged_once[i]) kept.push_back(std::move(layers[i]));
  for (Layer& layer : kept) layer.weight = weights_[layer.weight].buffer;
  return kept;
}

// A buffer the host gave under several names is one tensor whatever name a layer addresses it by:
// an adapter whose layers change the names differently (one name alone: a LoRA on lm_head and none
// on the embedding tied to it) is refused, since the merge would change every name alike while
// PEFT's forward changes only the one. ensure_weight_tying gives the tied pair the same LoRA (PEFT
// ties the output embedding's to the input embedding's): merged once. Returns, per entry of
// `modules`, whether it is such a second layer and left out.
std::vector<bool> HostModel::shared_buffer_layers(const LoadedAdapter& loaded,
                                                  const std::vector<std::string>& modules,
                                                  const std::string& adapter) const {
  std::vector<bool> left_out(modules.size(), false);
  std::map<size_t, std::vector<size_t>> layers_on;  // shared buffer -> entries of modules
  for (size_t i = 0; i < modules.size(); ++i) layers_on[weights_[weight_of_module_.at(modules[i])].buffer].push_back(i);
  for (const auto& [buffer, entries] : layers_on) {
    std::vector<std::string> names;  // every name of the buffer
    for (const Weight& w : weights_)
      if (w.buffer == buffer) names.push_back(peft::quoted(w.name));
    if (names.size() < 2) continue;
    const bool tied_lora = loaded.adapter().config().ensure_weight_tying && entries.size() == names.size() &&
                           std::all_of(entries.begin(), entries.end(), [&](size_t i) { return i < loaded.layers().size(); });
    if (tied_lora) {  // the layer addressing the buffer's first name is kept
      size_t kept = entries.front();
      for (size_t i : entries)
        if (weight_of_module_.at(modules[i]) == buffer) kept = i;
      for (size_t i : entries) left_out[i] = i != kept;
      continue;
    }
    std::vector<std::string> changed;
    for (size_t i : entries) changed.push_back(peft::quoted(modules[i]));
    fail(PEFT_ERR_UNSUPPORTED,
         adapter + " changes " + join_text(changed, " and ") + " in the buffer the host model was given for " +
             join_text(names, " and ") + " (one buffer, as tied embeddings share it); merging would change every " +
             "name alike, while the adapter's forward changes " +
             (entries.size() == 1 ? "only that one" : "each by its own layer") +
             ": give the host model a buffer of its own for each name (untied copies), or merge with " +
             "peft_merge_checkpoint(), whose tied embeddings policy unties them");
  }
  return left_out;
}

merge::WeightView HostModel::weight_view(const Layer& layer) const {
  const Weight& w = weights_[layer.weight];
  return {w.data, w.dtype, layer.module.layout.rows(), layer.module.layout.cols()};
}

std::optional<merge::WeightView> HostModel::bias_view(const Layer& layer) const {
  const Weight& w = weights_[layer.weight];
  if (!changes_bias(layer.module, w.bias)) return std::nullopt;
  return merge::WeightView{w.bias, w.bias_dtype, 1, layer.module.layout.out};
}

// Before an exact merge of `layer` (no layer is merged into its weight): takes the originals the
// merge is about to change if they were not taken yet, and writes them back if an arithmetic merge
// changed the buffers since, or an exact layer was taken out without writing them back (stale). A
// failure (OUT_OF_MEMORY) leaves the buffers unmerged.
void HostModel::start_from_original(const Layer& layer) {
  Weight& w = weights_[layer.weight];
  if (w.original == nullptr) {
    std::unique_ptr<unsigned char[]> original;
    try {
      original = std::make_unique_for_overwrite<unsigned char[]>(w.bytes());  // not zeroed: the copy fills it
    } catch (const std::bad_alloc&) {
      fail_to_keep(w.bytes(), "weight " + peft::quoted(w.name));
    }
    copy_bytes(original.get(), w.data, w.bytes());
    w.original = std::move(original);
  } else if (w.drifted || w.stale) {
    forget_magnitude(w);
    copy_bytes(w.data, w.original.get(), w.bytes());
    if (!w.original_bias.empty()) std::memcpy(w.bias, w.original_bias.data(), w.original_bias.size());
  }
  w.drifted = false;
  w.stale = false;
  if (changes_bias(layer.module, w.bias) && w.original_bias.empty()) {
    // The first lora_bias (or IA3) layer on this weight (all have bias_elements outputs, prepare checks).
    const auto* from = static_cast<const unsigned char*>(w.bias);
    const size_t bytes = static_cast<size_t>(w.bias_elements) * element_bytes(w.bias_dtype);
    try {
      w.original_bias.assign(from, from + bytes);
    } catch (const std::bad_alloc&) {
      fail_to_keep(bytes, "the bias of weight " + peft::quoted(w.name));
    }
  }
}

// Takes an exact layer out: the originals of what it changed back into the buffers.
void HostModel::write_back_original(const Layer& layer) {
  Weight& w = weights_[layer.weight];
  forget_magnitude(w);
  copy_bytes(w.data, w.original.get(), w.bytes());
  w.stale = false;
  if (changes_bias(layer.module, w.bias)) std::memcpy(w.bias, w.original_bias.data(), w.original_bias.size());
}

// merged_ has room for the layer (swap reserves it before any buffer changes), so once the merge
// succeeded nothing can fail before it is recorded. A layer merged from the original reads its rows
// from the weight's copy and writes them with the delta in one pass, whatever the buffer holds
// (another exact layer's merge, taken out without writing the original back).
void HostModel::merge_layer(Layer layer) {
  fault_point(true);
  Weight& w = weights_[layer.weight];
  const bool from_original = layer.exact && layer.from_original && w.original != nullptr && !w.drifted;
  if (layer.exact && !from_original) start_from_original(layer);
  BufferMergeOptions options = layer.options;
  if (from_original) options.source = w.original.get();
  double& largest = weights_[w.buffer].largest_magnitude;
  if (!layer.exact) options.largest_magnitude = largest;
  largest = std::numeric_limits<double>::quiet_NaN();  // until the merge is in
  const std::optional<merge::WeightView> bias = bias_view(layer);
  BufferMerge record;
  try {
    record = BufferMerge::apply(weight_view(layer), bias ? &*bias : nullptr, layer.module, options);
  } catch (...) {
    // An exact layer's merge saves no rows (caller_restores): its weight goes back from the copy.
    if (layer.exact) write_back_original(layer);
    throw;
  }
  if (from_original) w.stale = false;
  if (!layer.exact) {
    largest = record.largest_magnitude_after();
    layer.record = std::move(record);
    weights_[layer.weight].drifted = true;
  }
  merged_.push_back(std::move(layer));
}

// Takes the newest merged layer out; on failure that layer stays merged and recorded. An exact layer
// on a weight the next merge reads from its original leaves the weight as it is (only its bias goes
// back) and marks it stale.
HostModel::Layer HostModel::unmerge_newest(const std::vector<bool>* read_original) {
  fault_point(false);
  Layer& layer = merged_.back();
  Weight& w = weights_[layer.weight];
  if (layer.exact && read_original != nullptr && (*read_original)[layer.weight]) {
    if (changes_bias(layer.module, w.bias)) std::memcpy(w.bias, w.original_bias.data(), w.original_bias.size());
    w.stale = true;
  } else if (layer.exact) {
    write_back_original(layer);
  } else {
    const std::optional<merge::WeightView> bias = bias_view(layer);
    double& largest = weights_[w.buffer].largest_magnitude;
    const double after = layer.record.largest_magnitude_after_remove(largest);
    largest = std::numeric_limits<double>::quiet_NaN();  // until the merge is out
    layer.record.remove(weight_view(layer), bias ? &*bias : nullptr);
    largest = after;
  }
  Layer out = std::move(layer);
  merged_.pop_back();
  return out;
}

// Every merged layer out, newest first; returns them (records empty) in application order. On
// failure the layers taken out so far are merged again and the error is rethrown.
std::vector<HostModel::Layer> HostModel::unmerge_all(const std::vector<bool>* read_original) {
  std::vector<Layer> removed;
  removed.reserve(merged_.size());  // the only allocation, before anything changes
  try {
    while (!merged_.empty()) removed.push_back(unmerge_newest(read_original));
  } catch (...) {
    std::reverse(removed.begin(), removed.end());
    restore(std::move(removed), merged_.size(), std::current_exception());
  }
  std::reverse(removed.begin(), removed.end());
  return removed;
}

// Undoes a failed step: takes out the layers merged after the first `keep`, merges `previous`
// again (in application order) and rethrows `failure`. If that fails as well, merged_ still lists
// exactly what is merged, no adapter is current, and the error says so.
void HostModel::restore(std::vector<Layer> previous, size_t keep, std::exception_ptr failure) {
  try {
    while (merged_.size() > keep) unmerge_newest();
    for (Layer& layer : previous) merge_layer(std::move(layer));
  } catch (...) {
    current_.reset();
    // A weight left stale with no layer merged into it gets its original back (a copy cannot fail).
    std::vector<bool> merged_into(weights_.size(), false);
    for (const Layer& layer : merged_) merged_into[layer.weight] = true;
    for (size_t i = 0; i < weights_.size(); ++i) {
      Weight& w = weights_[i];
      if (!w.stale || merged_into[i]) continue;
      forget_magnitude(w);
      copy_bytes(w.data, w.original.get(), w.bytes());
      w.stale = false;
    }
    const auto [code, message] = describe(failure);
    const auto [undo_code, undo_message] = describe(std::current_exception());
    fail(code, message + "; putting the previous adapter back failed too (" + undo_message + "): " +
                   std::to_string(merged_.size()) + " layers are merged and no adapter is current; swap again");
  }
  std::rethrow_exception(failure);
}

SwapStats HostModel::swap(const Lease* lease, double weight) {
  merge::require_merge_weight(weight);
  SwapStats stats{};
  stats.size = sizeof stats;

  // Everything about the new adapter is checked, and its factors converted, before a buffer changes.
  const Clock::time_point prepare_start = Clock::now();
  std::shared_ptr<const Lease> pin;
  std::vector<Layer> next;
  if (lease != nullptr) {
    pin = lease->clone();
    next = prepare(pin, weight);
  }
  merged_.reserve(next.size());
  // An exact plain LoRA layer into a weight that holds an exact layer now merges from the weight's
  // original in one pass, and that layer is taken out without writing the original back first.
  // (Into a weight that holds its original already, a merge in place moves fewer bytes.)
  std::vector<bool> holds_exact(weights_.size(), false), read_original(weights_.size(), false);
  for (const Layer& layer : merged_) holds_exact[layer.weight] = layer.exact;
  for (Layer& layer : next) {
    const Weight& w = weights_[layer.weight];
    layer.from_original = layer.exact && holds_exact[layer.weight] && w.original != nullptr && !w.drifted &&
                          merges_from_source(layer.module);
    if (layer.from_original) read_original[layer.weight] = true;
  }
  const double prepare_seconds = seconds_since(prepare_start);

  const Clock::time_point remove_start = Clock::now();
  stats.layers_removed = merged_.size();
  std::vector<Layer> previous = unmerge_all(&read_original);
  stats.remove_seconds = seconds_since(remove_start);

  const Clock::time_point merge_start = Clock::now();
  try {
    for (Layer& layer : next) merge_layer(std::move(layer));
  } catch (...) {
    restore(std::move(previous), 0, std::current_exception());
  }
  stats.merge_seconds = prepare_seconds + seconds_since(merge_start);
  stats.layers_merged = merged_.size();
  for (const Weight& w : weights_)
    if (w.original != nullptr) stats.saved_bytes += w.bytes() + w.original_bias.size();
  current_ = std::move(pin);
  return stats;
}

}  // namespace peft::serve
