// The registry's shared state, RegistryCore, guarded by one mutex: the current version of every name,
// the loaded versions' pins and LRU order, the budget and the counters. Tensor loads run outside the
// lock, after their bytes were reserved under it; memory that leaves the registry (evicted, replaced,
// released) is collected under the lock and freed after it is released.
#include "serve/registry.hpp"

#include <algorithm>
#include <condition_variable>
#include <functional>
#include <list>
#include <mutex>
#include <shared_mutex>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "core/error.hpp"
#include "core/text.hpp"
#include "peft/buffer_merge/layer_module.hpp"

namespace peft::serve {

// One registered version of a name. Everything below `bytes` is guarded by the core's mutex.
struct RegistryEntry {
  RegistryEntry(std::string name_, std::shared_ptr<const Adapter> adapter_, uint64_t bytes_)
      : name(std::move(name_)),
        adapter(std::move(adapter_)),
        bytes(bytes_),
        lru_node{this},
        lru_pos(lru_node.begin()) {}

  const std::string name;
  uint64_t version = 0;  // set once under the lock, before any lease exists
  const std::shared_ptr<const Adapter> adapter;
  const uint64_t bytes;  // LoadedAdapter::bytes_needed: the budget charge once loaded

  std::shared_ptr<const LoadedAdapter> loaded;  // null when not in memory
  uint64_t pins = 0;                            // leases, and acquirers waiting for or doing the load
  bool loading = false;                         // a load of this version is under way
  bool current = true;                          // false once replaced or removed
  // The entry's node of the LRU list: here while the entry is not in the LRU, spliced into
  // RegistryCore::lru while it is (loaded, current, unpinned). Splicing never allocates, so
  // releasing a lease cannot fail.
  std::list<RegistryEntry*> lru_node;
  const std::list<RegistryEntry*>::iterator lru_pos;
  bool in_lru() const { return lru_node.empty(); }
};

// Memory leaving the registry: destroyed after the lock is released (declare it before the lock).
using Garbage = std::vector<std::shared_ptr<const LoadedAdapter>>;

struct RegistryCore {
  RegistryCore(DType storage_, uint64_t budget_, std::optional<Translator> translator_)
      : storage(storage_), translator(std::move(translator_)), budget(budget_) {}

  const DType storage;
  const std::optional<Translator> translator;

  mutable std::mutex mutex;
  std::condition_variable load_finished;
  std::unordered_map<std::string, std::shared_ptr<RegistryEntry>> current;
  std::vector<std::string> order;  // registered names, in order of first registration
  std::list<RegistryEntry*> lru;   // loaded, current, unpinned versions; most recently used first
  uint64_t budget;
  uint64_t loaded_bytes = 0;    // bytes of loaded versions
  uint64_t reserved_bytes = 0;  // bytes of loads under way (counted against the budget too)
  uint64_t next_version = 1;
  RegistryStats counters{};     // peak, loaded, pinned, loads, hits, evictions (size set by stats())
  BaseWeights base_weights;     // DoRA: the host's base weights and the scales (its own lock)

  // Lease::find_layer's cache: layer name -> the module paths it may stand for (module_candidates).
  struct NameHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  mutable std::shared_mutex names_mutex;
  std::unordered_map<std::string, std::vector<std::string>, NameHash, std::equal_to<>> candidates;
  static constexpr size_t kMaxCachedNames = 1 << 16;  // a bound against hosts asking arbitrary names

  // ---- under the lock ----

  void pin(RegistryEntry& e) {
    if (e.in_lru()) e.lru_node.splice(e.lru_node.begin(), lru, e.lru_pos);
    if (e.pins++ == 0 && e.loaded) ++counters.pinned;
  }

  void unload(RegistryEntry& e, Garbage& garbage) {
    loaded_bytes -= e.bytes;
    --counters.loaded;
    garbage.push_back(std::move(e.loaded));
  }

  void unpin(RegistryEntry& e, Garbage& garbage) {
    if (--e.pins != 0 || !e.loaded) return;
    --counters.pinned;
    if (e.current)
      lru.splice(lru.begin(), e.lru_node, e.lru_pos);
    else
      unload(e, garbage);  // a replaced or removed version goes with its last lease
  }

  void evict_last(Garbage& garbage) {
    RegistryEntry& e = *lru.back();
    e.lru_node.splice(e.lru_node.begin(), lru, e.lru_pos);
    unload(e, garbage);
    ++counters.evictions;
  }

  // The name no longer leads to `e`: unloaded at once when nothing pins it, else with its last pin.
  void retire(RegistryEntry& e, Garbage& garbage) {
    e.current = false;
    if (e.in_lru()) {
      e.lru_node.splice(e.lru_node.begin(), lru, e.lru_pos);
      unload(e, garbage);
    }
  }

  // Bytes that evicting every unpinned version cannot free.
  uint64_t unevictable_bytes() const {
    uint64_t evictable = 0;
    for (const RegistryEntry* e : lru) evictable += e->bytes;
    return loaded_bytes + reserved_bytes - evictable;
  }

  // Makes room for `e` (evicting least recently used first) and reserves its bytes.
  void reserve(const RegistryEntry& e, Garbage& garbage) {
    const uint64_t fixed = unevictable_bytes();
    if (fixed > budget || e.bytes > budget - fixed)
      fail(PEFT_ERR_OVER_BUDGET, "adapter " + quoted(e.name) + " needs " + std::to_string(e.bytes) +
                                     " bytes, but the budget is " + std::to_string(budget) + " bytes and " +
                                     std::to_string(fixed) + " of them are held by pinned adapters or loads under way");
    while (loaded_bytes + reserved_bytes + e.bytes > budget) evict_last(garbage);
    reserved_bytes += e.bytes;
  }

  void publish(RegistryEntry& e, std::shared_ptr<const LoadedAdapter> loaded) {
    reserved_bytes -= e.bytes;
    loaded_bytes += e.bytes;
    counters.peak_loaded_bytes = std::max(counters.peak_loaded_bytes, loaded_bytes);
    ++counters.loaded;
    ++counters.pinned;  // the loader's own pin
    ++counters.loads;
    e.loaded = std::move(loaded);
    e.loading = false;
  }

  // ---- entry points (take the lock) ----

  std::unique_ptr<Lease> acquire(const std::shared_ptr<RegistryCore>& self, const std::string& name) {
    Garbage garbage;
    std::unique_lock lock(mutex);
    auto found = current.find(name);
    if (found == current.end()) fail(PEFT_ERR_NOT_FOUND, "no adapter is registered as " + quoted(name));
    std::shared_ptr<RegistryEntry> entry = found->second;
    pin(*entry);  // the version current now is the one this call returns, even if replaced meanwhile
    for (;;) {
      if (entry->loaded) {
        ++counters.hits;
        return lease(self, entry, garbage);
      }
      if (!entry->loading) break;  // nobody loads it (or that load failed): this thread does
      load_finished.wait(lock);
    }
    try {
      reserve(*entry, garbage);
    } catch (...) {
      unpin(*entry, garbage);
      throw;
    }
    entry->loading = true;
    lock.unlock();
    garbage.clear();  // evicted memory goes before the new load allocates

    std::shared_ptr<const LoadedAdapter> loaded;
    try {
      loaded = LoadedAdapter::load(entry->adapter, storage);
    } catch (...) {
      lock.lock();
      reserved_bytes -= entry->bytes;
      entry->loading = false;
      unpin(*entry, garbage);
      load_finished.notify_all();  // waiters retry the load themselves
      throw;
    }
    lock.lock();
    publish(*entry, std::move(loaded));
    load_finished.notify_all();
    return lease(self, entry, garbage);
  }

  // A lease on a pinned, loaded entry, taking over that pin (given back if the lease cannot be made).
  std::unique_ptr<Lease> lease(const std::shared_ptr<RegistryCore>& self, const std::shared_ptr<RegistryEntry>& entry,
                               Garbage& garbage) {
    try {
      return std::unique_ptr<Lease>(new Lease(self, entry, entry->loaded));
    } catch (...) {
      unpin(*entry, garbage);
      throw;
    }
  }

  void release(RegistryEntry& e) {
    Garbage garbage;
    std::lock_guard lock(mutex);
    unpin(e, garbage);
  }

  void add_pin(RegistryEntry& e) {
    std::lock_guard lock(mutex);
    pin(e);
  }

  void add(const std::string& name, std::shared_ptr<RegistryEntry> entry) {
    Garbage garbage;
    std::lock_guard lock(mutex);
    entry->version = next_version++;
    auto [it, inserted] = current.try_emplace(name, entry);
    if (inserted) {
      order.push_back(name);
    } else {
      retire(*it->second, garbage);
      it->second = std::move(entry);
    }
  }

  void remove(const std::string& name) {
    Garbage garbage;
    std::lock_guard lock(mutex);
    auto it = current.find(name);
    if (it == current.end()) fail(PEFT_ERR_NOT_FOUND, "no adapter is registered as " + quoted(name));
    retire(*it->second, garbage);
    current.erase(it);
    order.erase(std::find(order.begin(), order.end(), name));
  }

  void remove_all() {
    Garbage garbage;
    std::lock_guard lock(mutex);
    for (auto& [name, entry] : current) retire(*entry, garbage);
    current.clear();
    order.clear();
  }

  void trim() {
    Garbage garbage;
    std::lock_guard lock(mutex);
    while (!lru.empty()) evict_last(garbage);
  }

  void set_budget(uint64_t new_budget) {
    Garbage garbage;
    std::lock_guard lock(mutex);
    const uint64_t fixed = unevictable_bytes();
    if (fixed > new_budget)
      fail(PEFT_ERR_OVER_BUDGET, "cannot set the budget to " + std::to_string(new_budget) +
                                     " bytes: pinned adapters and loads under way hold " + std::to_string(fixed) +
                                     " bytes");
    budget = new_budget;
    while (loaded_bytes + reserved_bytes > budget) evict_last(garbage);
  }

  RegistryStats stats() const {
    std::lock_guard lock(mutex);
    RegistryStats s = counters;
    s.size = sizeof s;
    s.budget_bytes = budget;
    s.loaded_bytes = loaded_bytes;
    s.registered = current.size();
    return s;
  }

  std::vector<std::string> names() const {
    std::lock_guard lock(mutex);
    return order;
  }

  std::shared_ptr<const Adapter> adapter(const std::string& name) const {
    std::lock_guard lock(mutex);
    auto it = current.find(name);
    if (it == current.end()) fail(PEFT_ERR_NOT_FOUND, "no adapter is registered as " + quoted(name));
    return it->second->adapter;
  }

  // The layer of `loaded` a name stands for: the name is translated once, then read from the cache.
  const LoadedLayer* find_layer(const LoadedAdapter& loaded, std::string_view name) {
    auto first_found = [&](const std::vector<std::string>& paths) -> const LoadedLayer* {
      for (const std::string& path : paths)
        if (const LoadedLayer* layer = loaded.find(path)) return layer;
      for (const std::string& path : paths)
        if (const AdapterModule* m = loaded.find_method_module(path))
          fail(PEFT_ERR_UNSUPPORTED, "adapter " + quoted(loaded.adapter().dir()) + ": layer " + quoted(path) + " is a " +
                                         peft_method_name(m->method) +
                                         " layer; unmerged apply takes LoRA layers only (swap the adapter into "
                                         "the host's weights with a host model, or merge it)");
      for (const std::string& path : paths)
        if (const AdapterModule* m = loaded.find_expert_module(path))
          fail(PEFT_ERR_UNSUPPORTED, "adapter " + quoted(loaded.adapter().dir()) + ": layer " + quoted(path) +
                                         " is adapted by module " + quoted(m->name) + ", a LoRA on the stacked " +
                                         "expert parameter " + quoted(m->expert->module + "." + m->expert->param) +
                                         " (target_parameters); unmerged apply takes LoRA layers only (swap the "
                                         "adapter into the host's weights with a host model, or merge it)");
      return nullptr;
    };
    {
      std::shared_lock lock(names_mutex);
      if (auto it = candidates.find(name); it != candidates.end()) return first_found(it->second);
    }
    std::vector<std::string> paths = module_candidates(name, translator ? &*translator : nullptr);
    const LoadedLayer* layer = first_found(paths);
    std::unique_lock lock(names_mutex);
    if (candidates.size() < kMaxCachedNames) candidates.try_emplace(std::string(name), std::move(paths));
    return layer;
  }
};

// ---- Lease ----

Lease::Lease(std::shared_ptr<RegistryCore> core, std::shared_ptr<RegistryEntry> entry,
             std::shared_ptr<const LoadedAdapter> loaded)
    : core_(std::move(core)), entry_(std::move(entry)), loaded_(std::move(loaded)) {}

Lease::~Lease() { core_->release(*entry_); }

const std::string& Lease::name() const { return entry_->name; }

uint64_t Lease::version() const { return entry_->version; }

const LoadedLayer* Lease::find_layer(std::string_view name) const {
  return core_->find_layer(*loaded_, name);
}

std::unique_ptr<Lease> Lease::clone() const {
  std::unique_ptr<Lease> copy(new Lease(core_, entry_, loaded_));
  core_->add_pin(*entry_);
  return copy;
}

std::shared_ptr<const DoraScale> Lease::dora_scale(const LoadedLayer& layer) const {
  return core_->base_weights.scale(loaded_, layer, entry_->name);
}

// ---- Registry ----

Registry::Registry(DType storage, uint64_t budget_bytes, std::optional<Translator> translator) {
  if (storage != DType::F32 && storage != DType::BF16 && storage != DType::F16)
    fail(PEFT_ERR_INVALID_ARGUMENT, "the registry's storage dtype must be F32, BF16 or F16, not " +
                                        std::string(dtype_name(storage)));
  // Unmerged apply adds B's rows into the host's outputs in PyTorch's order; GGUF's row orders
  // (gguf_rows) would need them reordered, which only merges do (host_buffer_module).
  if (translator && translator->gguf())
    fail(PEFT_ERR_INVALID_ARGUMENT, "a translator of GGUF names serves host models and buffer merges; a registry's "
                                    "translator (for unmerged apply) reads native names");
  core_ = std::make_shared<RegistryCore>(storage, budget_bytes, std::move(translator));
}

// Leases may outlive the registry: its names go now (freeing what nothing pins), the core with the
// last lease.
Registry::~Registry() { core_->remove_all(); }

void Registry::add(const std::string& name, std::shared_ptr<const Adapter> adapter) {
  if (name.empty()) fail(PEFT_ERR_INVALID_ARGUMENT, "an adapter's registry name must not be empty");
  if (name.find('\n') != std::string::npos)  // peft_registry_names() lists names one per line
    fail(PEFT_ERR_INVALID_ARGUMENT, "an adapter's registry name must not contain a newline: " + quoted(name));
  if (!adapter) fail(PEFT_ERR_INVALID_ARGUMENT, "no adapter given to register as " + quoted(name));
  const uint64_t bytes = LoadedAdapter::bytes_needed(*adapter, core_->storage);
  core_->add(name, std::make_shared<RegistryEntry>(name, std::move(adapter), bytes));
}

void Registry::remove(const std::string& name) { core_->remove(name); }

std::vector<std::string> Registry::names() const { return core_->names(); }

std::shared_ptr<const Adapter> Registry::adapter(const std::string& name) const { return core_->adapter(name); }

std::unique_ptr<Lease> Registry::acquire(const std::string& name) { return core_->acquire(core_, name); }

void Registry::trim() { core_->trim(); }

void Registry::set_budget(uint64_t budget_bytes) { core_->set_budget(budget_bytes); }

RegistryStats Registry::stats() const { return core_->stats(); }

void Registry::set_base_weight(std::string_view name, const void* data, DType dtype, std::span<const int64_t> shape,
                               const void* bias, DType bias_dtype, int64_t bias_elements) {
  core_->base_weights.set(name, data, dtype, shape, bias, bias_dtype, bias_elements,
                          core_->translator ? &*core_->translator : nullptr);
}

void Registry::base_weights_changed() { core_->base_weights.changed(); }

}  // namespace peft::serve
