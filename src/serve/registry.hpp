// The adapter registry of the serving section (peft_c.h, "Serving many adapters"): adapters
// registered under names, loaded on first use into LoadedAdapter, kept under a byte budget with
// least-recently-used eviction, pinned by leases, replaced for new users while old users finish.
//
//   Registry registry(DType::BF16, 2 << 30, std::nullopt);
//   registry.add("support", Adapter::open(dir, {}));          // header only, no tensor reads
//   std::unique_ptr<Lease> lease = registry.acquire("support"); // loads once, pins
//   lease->loaded().layers() ...
//   lease.reset();                                             // unpins; evictable again
//
// Budget: the sum of LoadedAdapter::bytes over every loaded version (current or replaced, pinned
// or not) never exceeds the budget; room is reserved under the lock before a load starts, so
// concurrent loads cannot overshoot it together. A load that does not fit after evicting every
// unpinned version fails with PEFT_ERR_OVER_BUDGET.
//
// Thread safety: every method of Registry and Lease may be called from many threads at once. The
// registry's state lives in a shared core that leases keep alive, so leases may outlive the
// Registry object.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.hpp"
#include "peft_c.h"
#include "peft/adapter/adapter.hpp"
#include "peft/arch/translator.hpp"
#include "serve/base_weights.hpp"
#include "serve/loaded_adapter.hpp"

namespace peft::serve {

// The registry's counters are the public struct itself (its fields documented in peft_c.h; `size`
// is sizeof the struct), so the C API hands them out as they are.
using RegistryStats = peft_registry_stats;

struct RegistryCore;  // registry.cpp
struct RegistryEntry;  // registry.cpp: one registered version

// A pin on one loaded adapter version; destroying it unpins.
class Lease {
 public:
  ~Lease();
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;

  const std::string& name() const;
  uint64_t version() const;
  const LoadedAdapter& loaded() const { return *loaded_; }
  const std::shared_ptr<const LoadedAdapter>& loaded_ptr() const { return loaded_; }
  // The layer a name given to peft_lora_apply() addresses: a HuggingFace module path or weight
  // name (with or without "base_model.model."), or with the registry's translator the host's
  // name; null when this adapter has no such LoRA layer. Resolved names are cached per registry.
  // UNRESOLVED_KEY when the translator does not resolve the name; UNSUPPORTED for a layer of another
  // PEFT method or one a LoRA on stacked expert parameters adapts (LoadedAdapter::find_expert_module).
  const LoadedLayer* find_layer(std::string_view name) const;
  // A second, independent pin on the same version (a host model keeps one while merged).
  std::unique_ptr<Lease> clone() const;
  // The DoRA scale of `layer` (one of loaded()'s layers with a magnitude) from the registry's base
  // weights (BaseWeights::scale: NOT_FOUND without a base weight for it, SHAPE_MISMATCH, UNSUPPORTED).
  std::shared_ptr<const DoraScale> dora_scale(const LoadedLayer& layer) const;

 private:
  friend struct RegistryCore;
  Lease(std::shared_ptr<RegistryCore> core, std::shared_ptr<RegistryEntry> entry,
        std::shared_ptr<const LoadedAdapter> loaded);
  std::shared_ptr<RegistryCore> core_;
  std::shared_ptr<RegistryEntry> entry_;
  std::shared_ptr<const LoadedAdapter> loaded_;
};

class Registry {
 public:
  // storage: F32, BF16 or F16 (INVALID_ARGUMENT otherwise). translator: for Lease::find_layer;
  // INVALID_ARGUMENT for one of GGUF names (unmerged apply does not reorder rows).
  Registry(DType storage, uint64_t budget_bytes, std::optional<Translator> translator);
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Registers `adapter` under `name` (not empty), replacing the current version of that name for
  // new acquisitions. UNSUPPORTED when a LoRA tensor cannot be converted (LoadedAdapter::bytes_needed).
  void add(const std::string& name, std::shared_ptr<const Adapter> adapter);
  // NOT_FOUND for a name not registered.
  void remove(const std::string& name);
  std::vector<std::string> names() const;  // in order of first registration
  // The adapter registered under `name` now (its current version); NOT_FOUND for a name not registered.
  std::shared_ptr<const Adapter> adapter(const std::string& name) const;

  // Loads if needed (one load per version even with concurrent callers) and pins. NOT_FOUND,
  // OVER_BUDGET, or the loader's errors (then nothing stays reserved or pinned).
  std::unique_ptr<Lease> acquire(const std::string& name);
  void trim();                              // evicts every unpinned loaded version
  void set_budget(uint64_t budget_bytes);   // OVER_BUDGET (nothing changed) if pinned bytes exceed it
  RegistryStats stats() const;

  // DoRA in unmerged apply (base_weights.hpp): the host's base weight of a layer, named as
  // Lease::find_layer names are (BaseWeights::set's errors), and the notice that the host changed
  // the contents of its base weights (every DoRA scale is computed again at its next use).
  void set_base_weight(std::string_view name, const void* data, DType dtype, std::span<const int64_t> shape,
                       const void* bias, DType bias_dtype, int64_t bias_elements);
  void base_weights_changed();

 private:
  std::shared_ptr<RegistryCore> core_;
};

}  // namespace peft::serve
