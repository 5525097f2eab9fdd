// The registry part of the serving section of the C API: registries, registration, leases, stats.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "capi/adapter_handles.hpp"
#include "capi/capi_common.hpp"
#include "capi/serve_handles.hpp"
#include "capi/string_list.hpp"
#include "core/error.hpp"
#include "core/text.hpp"

namespace {

using peft::capi::guarded;
using peft::capi::require_arg;

std::string registry_name(const char* name) {
  require_arg(name, "name");
  if (name[0] == '\0') peft::fail(PEFT_ERR_INVALID_ARGUMENT, "name must not be empty");
  return name;
}

}  // namespace

extern "C" {

peft_error* peft_registry_new(int32_t storage_dtype, uint64_t budget_bytes, const peft_translator* translator,
                              peft_registry** out) {
  return guarded([&] {
    require_arg(out, "out");
    const peft::DType storage = peft::capi::dtype_arg(storage_dtype, "storage dtype", peft::capi::kFloatDTypes);
    std::optional<peft::Translator> names;
    if (translator != nullptr) names = translator->impl;
    auto registry = std::make_unique<peft_registry>();
    registry->impl = std::make_unique<peft::serve::Registry>(storage, budget_bytes,
                                                             std::move(names));
    *out = registry.release();
  });
}

void peft_registry_free(peft_registry* registry) { delete registry; }

peft_error* peft_registry_register(peft_registry* registry, const char* name, const char* dir,
                                   const peft_adapter_options* opts) {
  return guarded([&] {
    require_arg(registry, "registry");
    const std::string key = registry_name(name);
    require_arg(dir, "dir");
    registry->impl->add(key, peft::Adapter::open(dir, peft::capi::options_of(opts)));
  });
}

peft_error* peft_registry_register_memory(peft_registry* registry, const char* name, const char* config_json,
                                          const void* weights, size_t weights_size,
                                          const peft_adapter_options* opts) {
  return guarded([&] {
    require_arg(registry, "registry");
    const std::string key = registry_name(name);
    require_arg(config_json, "config_json");
    if (weights_size != 0) require_arg(weights, "weights");
    registry->impl->add(key, peft::Adapter::open_memory(config_json, weights, weights_size, peft::capi::options_of(opts)));
  });
}

peft_error* peft_registry_unregister(peft_registry* registry, const char* name) {
  return guarded([&] {
    require_arg(registry, "registry");
    require_arg(name, "name");
    registry->impl->remove(name);
  });
}

peft_error* peft_registry_names(const peft_registry* registry, char** out) {
  return guarded([&] {
    require_arg(registry, "registry");
    require_arg(out, "out");
    std::string list;
    for (const std::string& name : registry->impl->names()) list += name + "\n";
    *out = peft::capi::copy_string(list);
  });
}

peft_error* peft_registry_name_list(const peft_registry* registry, peft_string_list** out) {
  return guarded([&] {
    require_arg(registry, "registry");
    require_arg(out, "out");
    *out = new peft_string_list{registry->impl->names()};
  });
}

peft_error* peft_registry_warning_list(const peft_registry* registry, const char* name, peft_string_list** out) {
  return guarded([&] {
    require_arg(registry, "registry");
    require_arg(name, "name");
    require_arg(out, "out");
    *out = new peft_string_list{registry->impl->adapter(name)->warnings()};
  });
}

peft_error* peft_registry_acquire(peft_registry* registry, const char* name, peft_lease** out) {
  return guarded([&] {
    require_arg(registry, "registry");
    require_arg(name, "name");
    require_arg(out, "out");
    auto lease = std::make_unique<peft_lease>();
    lease->impl = registry->impl->acquire(name);
    *out = lease.release();
  });
}

peft_error* peft_registry_trim(peft_registry* registry) {
  return guarded([&] {
    require_arg(registry, "registry");
    registry->impl->trim();
  });
}

peft_error* peft_registry_set_budget(peft_registry* registry, uint64_t budget_bytes) {
  return guarded([&] {
    require_arg(registry, "registry");
    registry->impl->set_budget(budget_bytes);
  });
}

peft_error* peft_registry_get_stats(const peft_registry* registry, peft_registry_stats* stats) {
  return guarded([&] {
    require_arg(registry, "registry");
    require_arg(stats, "stats");
    constexpr size_t kFirstField = offsetof(peft_registry_stats, budget_bytes);
    if (stats->size < kFirstField + sizeof(uint64_t))
      peft::fail(PEFT_ERR_INVALID_ARGUMENT,
                 "stats->size is " + std::to_string(stats->size) + "; set it to sizeof(peft_registry_stats)");
    peft::capi::copy_to_sized(registry->impl->stats(), stats);
  });
}

void peft_lease_free(peft_lease* lease) { delete lease; }

void peft_lease_release(peft_lease* lease) { peft_lease_free(lease); }

const char* peft_lease_name(const peft_lease* lease) { return lease ? lease->impl->name().c_str() : nullptr; }

uint64_t peft_lease_version(const peft_lease* lease) { return lease ? lease->impl->version() : 0; }

uint64_t peft_lease_bytes(const peft_lease* lease) { return lease ? lease->impl->loaded().bytes() : 0; }

int32_t peft_lease_has_module(const peft_lease* lease, const char* module) {
  if (lease == nullptr || module == nullptr) return 0;
  try {
    return lease->impl->find_layer(module) != nullptr ? 1 : 0;
  } catch (...) {
    return 0;  // a name the translator does not resolve is not a layer of the adapter
  }
}

peft_error* peft_registry_set_base_weight(peft_registry* registry, const char* name, const void* data, int32_t dtype,
                                          const uint64_t* shape, size_t ndim, const void* bias, int32_t bias_dtype,
                                          uint64_t bias_elements) {
  return guarded([&] {
    require_arg(registry, "registry");
    require_arg(name, "name");
    require_arg(data, "data");
    if (ndim > 0) require_arg(shape, "shape");
    const std::vector<int64_t> dims = peft::capi::buffer_shape(shape, ndim, "base weight " + peft::quoted(name) + ": ");
    if (bias != nullptr && (bias_elements == 0 || bias_elements > static_cast<uint64_t>(INT64_MAX)))
      peft::fail(PEFT_ERR_SHAPE_MISMATCH, "base weight " + peft::quoted(name) + ": the bias has " +
                                              std::to_string(bias_elements) + " elements");
    registry->impl->set_base_weight(name, data, static_cast<peft::DType>(dtype), dims, bias,
                                    static_cast<peft::DType>(bias_dtype), static_cast<int64_t>(bias_elements));
  });
}

peft_error* peft_registry_base_weights_changed(peft_registry* registry) {
  return guarded([&] {
    require_arg(registry, "registry");
    registry->impl->base_weights_changed();
  });
}

}  // extern "C"
