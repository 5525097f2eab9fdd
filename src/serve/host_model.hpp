// The weight buffers of a host's model and the adapter merged into them, switched in place
// (peft_c.h, "Serving many adapters", hot-swap):
//
//   HostModel host;
//   const std::vector<int64_t> shape{4096, 4096};
//   host.add_weight("model.layers.0.self_attn.q_proj.weight", q, DType::BF16, shape, nullptr, DType::F32);
//   ...                              // every weight an adapter may adapt
//   host.swap(lease_a.get(), 1.0);   // A merged
//   host.swap(lease_b.get(), 1.0);   // A out (bit for bit), B in
//   host.swap(nullptr, 1.0);         // the buffers as they were given
//
// A swap checks everything about the new adapter (every LoRA layer has a weight, shapes fit, no
// replaced tensors, no two layers on one weight, a bias buffer where lora_bias needs one) and
// converts its factors to f32 before any buffer changes (layers of other PEFT methods, LoHa, LoKr,
// AdaLoRA, IA3..., have their parameters read from the adapter file as f32 then, and merge by their
// own arithmetic; IA3 also scales the bias buffer of a non-feed-forward layer, kept like a
// lora_bias layer's; a LoRA on stacked expert parameters has its factors read the same way and
// merges into the fused parameter's buffer, one slice per expert, or else into each per-expert
// tensor, see expert_layers); then it takes the current adapter out,
// newest layer first, and merges the new one layer by layer (BufferMerge::apply,
// buffer_merge.hpp). Should a step fail after that (out of memory), the swap undoes what it did
// and merges the previous adapter back, then throws. If undoing fails too, the host model records
// exactly the layers that are still merged (current() is then null) and the next swap takes them
// out.
//
// Exact mode (the default): the first time a weight is merged in exact mode, the host model copies
// the bytes its buffer holds then (and its bias's, the first time a lora_bias layer changes it)
// and keeps that copy, the original, for its own lifetime; taking a layer out writes the original
// back, whatever the buffer holds, and an exact merge always starts from the original. So in exact
// mode the buffers hold the original bytes with the current adapter merged in, bit for bit the same
// whatever was merged before, and a failed swap puts back the very bytes of before. A swap A -> B
// costs one copy of the weights back and one merge; for a plain LoRA layer of B (no DoRA, no
// lora_B.bias) on a weight A's exact layer holds, one pass: the merge reads the rows from the
// original and writes them with B's delta (Layer::from_original; on x86 non-temporal stores, so
// the weight is not read first), A's layer taken out without writing the original back
// (Weight::stale). The host model owns the contents of the
// buffers while it lives: the host must not write into them (a write into a buffer is undone, or
// merged over, at the next swap).
//
// Arithmetic mode (set_exact(false)): PEFT's unmerge through each layer's BufferMerge, which in
// BF16/F16 leaves last-bit differences that accumulate swap after swap; the undo of a failed swap
// is itself an unmerge and re-merge, so the buffers may differ from before in last bits. Layers
// come out the way they went in, whatever the mode is now. An exact merge into a weight whose
// original was taken before writes the original back first, dropping what arithmetic unmerges
// left; a weight merged in exact mode for the first time after arithmetic swaps keeps the bytes
// they left as its original.
//
// Memory: the merged adapter stays pinned in its registry, its factors are held as f32 (borrowed
// from the registry's storage when that is F32, converted copies otherwise), and the originals of
// every weight (and bias) ever merged in exact mode are kept, once each (SwapStats::saved_bytes).
//
// Thread safety: a HostModel belongs to one thread at a time; nothing else may read or write its
// buffers during a swap.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/dtype.hpp"
#include "peft/arch/translator.hpp"
#include "peft/base/expert_base.hpp"
#include "peft/buffer_merge/buffer_merge.hpp"
#include "peft/buffer_merge/layer_module.hpp"
#include "serve/registry.hpp"

namespace peft::serve {

// What a swap did: the public struct itself (its fields documented in peft_c.h; `size` is sizeof the
// struct). merge_seconds counts checking and converting the new adapter as well as merging it in.
using SwapStats = peft_swap_stats;

class HostModel {
 public:
  HostModel() = default;
  // Releases the merged adapter's pin without touching the buffers.
  ~HostModel() = default;
  HostModel(const HostModel&) = delete;
  HostModel& operator=(const HostModel&) = delete;

  // Names of weights added later are read through `translator` (nullopt: HuggingFace names). With
  // a translator of GGUF names, a weight whose GGUF tensor the converter reordered (gguf_rows) gets
  // each adapter's lora_B rows in that order (in_gguf_row_order, layer_module.hpp), and Conv1D
  // layers are laid out as Linear, as GGUF holds them. INVALID_ARGUMENT once weights were added.
  void set_translator(std::optional<Translator> translator);
  // Exact removal (write back a copy of the original bytes, the default) or PEFT's arithmetic
  // unmerge; applies to layers merged from the next swap on (see above).
  void set_exact(bool exact) { exact_ = exact; }
  bool exact() const { return exact_; }

  // One weight buffer, owned by the caller and kept in place while this lives. `name` is the
  // weight's or its layer's name (module_candidates, layer_module.hpp; with GGUF names a stacked
  // expert tensor, [experts, out, in], stands for each expert's module); shape has 2 dimensions, 3
  // for a fused expert parameter or a stacked GGUF expert tensor, 4 for Conv2d; bias (may be null) is the layer's bias, of bias_elements elements (a
  // swap refuses a lora_B.bias of another length with SHAPE_MISMATCH). UNRESOLVED_KEY when the
  // translator does not resolve the name; INVALID_ARGUMENT for a null pointer, a layer given twice
  // or while an adapter is merged; UNSUPPORTED for a dtype other than F32/BF16/F16;
  // SHAPE_MISMATCH for another number of dimensions or a zero dimension, or (GGUF names) for rows
  // that the weight's row order cannot split into its heads. A buffer given again under another
  // name (tied embeddings) is one tensor with two names: INVALID_ARGUMENT unless dtype and shape are
  // the same; a swap then merges into it once (shared_buffer_layers).
  void add_weight(std::string_view name, void* data, DType dtype, std::span<const int64_t> shape, void* bias,
                  DType bias_dtype, int64_t bias_elements);
  size_t weight_count() const { return weights_.size(); }

  // Takes the current adapter out and merges `lease`'s in (null: none), scaled by `weight`. The
  // host model pins the new adapter itself (Lease::clone). Errors (buffers as before, see above):
  // INVALID_ARGUMENT for a weight that is not finite, a missing bias buffer or two layers of the
  // adapter on one weight; UNSUPPORTED for an adapter changing a shared buffer's names otherwise than
  // alike (naming the layers, the names and the way out), or with replaced tensors
  // (modules_to_save, bias="all", trainable tokens); UNRESOLVED_KEY listing every layer without a
  // weight; SHAPE_MISMATCH naming a layer whose weight does not fit; OUT_OF_MEMORY.
  SwapStats swap(const Lease* lease, double weight);

  // The adapter merged now; null when none.
  const Lease* current() const { return current_.get(); }
  // Layers merged now (in application order).
  size_t merged_layers() const { return merged_.size(); }

 private:
  struct Weight {
    std::string name;
    void* data = nullptr;
    DType dtype = DType::F32;
    std::vector<int64_t> shape;
    void* bias = nullptr;
    DType bias_dtype = DType::F32;
    int64_t bias_elements = 0;  // 0 without a bias
    GgufRows rows = GgufRows::same;  // with GGUF names: the converter's row order (host_row_order)
    size_t buffer = 0;  // the first weight given with the same buffer (its own index when none was)
    bool stacked = false;  // a stacked GGUF expert tensor (ffn_*_exps): slice e stands for expert e's module
    // Exact mode: the bytes the buffers held before the first exact merge changed them (the bias's
    // once a lora_bias layer changed it); null and empty until then, kept from then on.
    std::unique_ptr<unsigned char[]> original{};
    std::vector<unsigned char> original_bias{};
    // An arithmetic merge wrote into the buffers since the originals were last there.
    bool drifted = false;
    // An exact layer was taken out without writing the original back, because the next merge reads
    // the original itself (Layer::from_original): the buffer holds neither.
    bool stale = false;
    // Kept in the weight that first gave the buffer (weights_[buffer]): an upper bound of |w| over
    // the buffer, known from the arithmetic merges and removals that wrote it last (the host does
    // not write the buffers while the host model lives), so that the next arithmetic merge need not
    // read the weight to show that it cannot fail (BufferMergeOptions::largest_magnitude). NaN:
    // not known (before the first such merge, and after anything else wrote the buffer).
    double largest_magnitude = std::numeric_limits<double>::quiet_NaN();
    size_t bytes() const;
  };
  // One layer of an adapter in one weight: what to merge, and how to take it out while merged.
  struct Layer {
    size_t weight = 0;  // index into weights_
    BufferMergeModule module;
    BufferMergeOptions options;
    bool exact = true;    // taken out by writing the originals back
    // Exact, plain LoRA, into a weight whose original was kept: merged from the original in one
    // pass (BufferMergeOptions::source), so that the previous layer on the weight is not written
    // back first.
    bool from_original = false;
    BufferMerge record;   // arithmetic layers while merged: the unmerge
  };

  // One layer of a LoRA on a stacked expert parameter: its module, its factors (read once per
  // module), the key of the weight it merges into (weight_of_module_), and whether that weight is
  // a stacked GGUF tensor (merged through gguf_stacked_buffer_module, every slice at once).
  struct ExpertLayer {
    const AdapterModule* module = nullptr;
    std::shared_ptr<const ExpertFactors> factors;
    std::string key;
    bool stacked = false;
  };

  std::vector<Layer> prepare(const std::shared_ptr<const Lease>& pin, double weight) const;
  std::vector<ExpertLayer> expert_layers(const LoadedAdapter& loaded, const std::string& adapter) const;
  std::vector<bool> shared_buffer_layers(const LoadedAdapter& loaded, const std::vector<std::string>& modules,
                                         const std::string& adapter) const;
  merge::WeightView weight_view(const Layer& layer) const;
  std::optional<merge::WeightView> bias_view(const Layer& layer) const;
  void start_from_original(const Layer& layer);
  void write_back_original(const Layer& layer);
  // Before anything but an arithmetic merge or removal writes w's buffer: its bound is not known.
  void forget_magnitude(const Weight& w) { weights_[w.buffer].largest_magnitude = std::numeric_limits<double>::quiet_NaN(); }
  void merge_layer(Layer layer);
  // `read_original` (indexed by weight; may be null): weights the next merge reads from their
  // original, whose exact layer is taken out without writing it back (Weight::stale).
  Layer unmerge_newest(const std::vector<bool>* read_original = nullptr);
  std::vector<Layer> unmerge_all(const std::vector<bool>* read_original = nullptr);
  [[noreturn]] void restore(std::vector<Layer> previous, size_t keep, std::exception_ptr failure);

  std::optional<Translator> translator_;
  bool exact_ = true;
  std::vector<Weight> weights_;
  std::unordered_map<std::string, size_t> weight_of_module_;  // every module path a weight stands for
  std::shared_ptr<const Lease> current_;  // the pin on the merged adapter
  std::vector<Layer> merged_;             // application order
};

namespace testing {

// Fault injection for tests only (not exported from the shared library, which hides every
// non-peft_ symbol). When set, it runs before each layer a swap merges (`merging`) or takes out
// (not `merging`), the steps of undoing a failed swap included; what it throws, that step throws.
// Null (the default) injects nothing.
using SwapFaultHook = void (*)(bool merging);
extern SwapFaultHook swap_fault_hook;

}  // namespace testing

}  // namespace peft::serve
