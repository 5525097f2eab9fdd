// The adapter section of the C API: adapters, their modules and tensors, validation.
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>

#include "capi/adapter_handles.hpp"
#include "capi/capi_common.hpp"
#include "capi/checkpoint_handle.hpp"
#include "core/error.hpp"
#include "core/json_parse.hpp"
#include "core/text.hpp"
#include "core/text_file.hpp"
#include "peft/base/base_config.hpp"
#include "peft/base/base_validation.hpp"

namespace {

using peft::capi::guarded;
using peft::capi::require_arg;

const peft::AdapterModule* module_or_null(const peft_adapter* a, size_t module) {
  if (a == nullptr || module >= a->impl->modules().size()) return nullptr;
  return &a->impl->modules()[module];
}

const peft::AdapterTensor* tensor_or_null(const peft_adapter* a, size_t module, size_t tensor) {
  const peft::AdapterModule* m = module_or_null(a, module);
  if (m == nullptr || tensor >= m->tensors.size()) return nullptr;
  return &m->tensors[tensor];
}

const peft::TensorInfo* info_or_null(const peft_adapter* a, size_t module, size_t tensor) {
  const peft::AdapterTensor* t = tensor_or_null(a, module, tensor);
  return t == nullptr ? nullptr : &a->impl->checkpoint().tensor(t->index);
}

const char* optional_c_str(const std::optional<std::string>& value) { return value ? value->c_str() : nullptr; }

}  // namespace

extern "C" {

peft_error* peft_adapter_options_new(peft_adapter_options** out) { return peft::capi::new_handle(out); }

void peft_adapter_options_free(peft_adapter_options* opts) { delete opts; }

peft_error* peft_adapter_options_set_base_dir(peft_adapter_options* opts, const char* base_dir) {
  return peft::capi::set_option(opts, [&](auto& o) { o.base_dir = base_dir == nullptr ? "" : base_dir; });
}

peft_error* peft_adapter_options_set_translator(peft_adapter_options* opts, const peft_translator* translator) {
  return peft::capi::set_option(opts, [&](auto& o) {
    o.table = translator == nullptr ? nullptr : translator->impl.table_ptr();
  });
}

peft_error* peft_adapter_options_set_lenient(peft_adapter_options* opts, int32_t lenient) {
  return peft::capi::set_option(opts, [&](auto& o) { o.lenient = lenient != 0; });
}

peft_error* peft_adapter_open(const char* dir, const peft_adapter_options* opts, peft_adapter** out) {
  return guarded([&] {
    require_arg(dir, "dir");
    require_arg(out, "out");
    auto handle = std::make_unique<peft_adapter>();
    handle->impl = peft::Adapter::open(dir, peft::capi::options_of(opts));
    handle->config_json = handle->impl->config().canonical_json();
    for (const auto& [key, value] : handle->impl->config().document.items())
      handle->field_json.emplace(key, value.dump(-1, ' ', /*ensure_ascii=*/false,
                                                 nlohmann::json::error_handler_t::replace));
    if (handle->impl->table()) handle->family = handle->impl->table()->family();
    *out = handle.release();
  });
}

void peft_adapter_free(peft_adapter* adapter) { delete adapter; }

peft_error* peft_adapter_validate(const peft_adapter* adapter, const char* base_dir) {
  return guarded([&] {
    require_arg(adapter, "adapter");
    require_arg(base_dir, "base_dir");
    adapter->impl->validate(base_dir);
  });
}

const char* peft_adapter_config_json(const peft_adapter* adapter) {
  return adapter == nullptr ? nullptr : adapter->config_json.c_str();
}

const char* peft_adapter_config_field(const peft_adapter* adapter, const char* field) {
  if (adapter == nullptr || field == nullptr) return nullptr;
  auto it = adapter->field_json.find(std::string_view(field));
  return it == adapter->field_json.end() ? nullptr : it->second.c_str();
}

int64_t peft_adapter_r(const peft_adapter* adapter) { return adapter ? adapter->impl->config().r : 0; }
double peft_adapter_lora_alpha(const peft_adapter* adapter) { return adapter ? adapter->impl->config().lora_alpha : 0; }
int32_t peft_adapter_use_rslora(const peft_adapter* adapter) { return adapter && adapter->impl->config().use_rslora; }
int32_t peft_adapter_use_dora(const peft_adapter* adapter) { return adapter && adapter->impl->config().use_dora; }
int32_t peft_adapter_lora_bias(const peft_adapter* adapter) { return adapter && adapter->impl->config().lora_bias; }
int32_t peft_adapter_fan_in_fan_out(const peft_adapter* adapter) {
  return adapter && adapter->impl->config().fan_in_fan_out;
}

const char* peft_adapter_peft_type(const peft_adapter* adapter) {
  return adapter ? adapter->impl->config().peft_type.c_str() : nullptr;
}
const char* peft_adapter_bias(const peft_adapter* adapter) {
  return adapter ? adapter->impl->config().bias.c_str() : nullptr;
}
const char* peft_adapter_task_type(const peft_adapter* adapter) {
  return adapter ? optional_c_str(adapter->impl->config().task_type) : nullptr;
}
const char* peft_adapter_base_model_name_or_path(const peft_adapter* adapter) {
  return adapter ? optional_c_str(adapter->impl->config().base_model_name_or_path) : nullptr;
}
const char* peft_adapter_family(const peft_adapter* adapter) {
  return adapter == nullptr || adapter->family.empty() ? nullptr : adapter->family.c_str();
}

peft_error* peft_adapter_translator(const peft_adapter* adapter, peft_translator** out) {
  return guarded([&] {
    require_arg(adapter, "adapter");
    require_arg(out, "out");
    if (!adapter->impl->table())
      peft::fail(PEFT_ERR_NOT_FOUND, "adapter " + peft::quoted(adapter->impl->dir()) +
                                         " has no architecture table (its family was not recognised)");
    *out = new peft_translator{peft::Translator(adapter->impl->table())};
  });
}

size_t peft_adapter_note_count(const peft_adapter* adapter) { return adapter ? adapter->impl->notes().size() : 0; }

const char* peft_adapter_note(const peft_adapter* adapter, size_t index) {
  if (adapter == nullptr || index >= adapter->impl->notes().size()) return nullptr;
  return adapter->impl->notes()[index].c_str();
}

size_t peft_adapter_warning_count(const peft_adapter* adapter) {
  return adapter ? adapter->impl->warnings().size() : 0;
}

const char* peft_adapter_warning(const peft_adapter* adapter, size_t index) {
  if (adapter == nullptr || index >= adapter->impl->warnings().size()) return nullptr;
  return adapter->impl->warnings()[index].c_str();
}

size_t peft_adapter_module_count(const peft_adapter* adapter) {
  return adapter ? adapter->impl->modules().size() : 0;
}

peft_error* peft_adapter_find_module(const peft_adapter* adapter, const char* name, size_t* out_index) {
  return guarded([&] {
    require_arg(adapter, "adapter");
    require_arg(name, "name");
    require_arg(out_index, "out_index");
    const auto& modules = adapter->impl->modules();
    for (size_t i = 0; i < modules.size(); ++i) {
      if (modules[i].name == name) {
        *out_index = i;
        return;
      }
    }
    peft::fail(PEFT_ERR_NOT_FOUND, "the adapter has no module " + peft::quoted(name));
  });
}

const char* peft_adapter_module_name(const peft_adapter* adapter, size_t module) {
  const peft::AdapterModule* m = module_or_null(adapter, module);
  return m ? m->name.c_str() : nullptr;
}

int32_t peft_adapter_module_kind(const peft_adapter* adapter, size_t module) {
  const peft::AdapterModule* m = module_or_null(adapter, module);
  return m ? static_cast<int32_t>(m->kind) : -1;
}

int64_t peft_adapter_module_rank(const peft_adapter* adapter, size_t module) {
  const peft::AdapterModule* m = module_or_null(adapter, module);
  return m ? m->rank : 0;
}

double peft_adapter_module_alpha(const peft_adapter* adapter, size_t module) {
  const peft::AdapterModule* m = module_or_null(adapter, module);
  return m ? m->alpha : 0;
}

double peft_adapter_module_scaling(const peft_adapter* adapter, size_t module) {
  const peft::AdapterModule* m = module_or_null(adapter, module);
  return m ? m->scaling : 0;
}

size_t peft_adapter_module_tensor_count(const peft_adapter* adapter, size_t module) {
  const peft::AdapterModule* m = module_or_null(adapter, module);
  return m ? m->tensors.size() : 0;
}

const char* peft_adapter_module_tensor_role(const peft_adapter* adapter, size_t module, size_t tensor) {
  const peft::AdapterTensor* t = tensor_or_null(adapter, module, tensor);
  return t ? t->suffix.c_str() : nullptr;
}

const char* peft_adapter_module_tensor_key(const peft_adapter* adapter, size_t module, size_t tensor) {
  const peft::AdapterTensor* t = tensor_or_null(adapter, module, tensor);
  return t ? t->key.c_str() : nullptr;
}

const char* peft_adapter_module_tensor_base_name(const peft_adapter* adapter, size_t module, size_t tensor) {
  const peft::AdapterTensor* t = tensor_or_null(adapter, module, tensor);
  return t ? t->base_tensor.c_str() : nullptr;
}

int32_t peft_adapter_module_tensor_dtype(const peft_adapter* adapter, size_t module, size_t tensor) {
  const peft::TensorInfo* info = info_or_null(adapter, module, tensor);
  return info ? static_cast<int32_t>(info->dtype) : -1;
}

size_t peft_adapter_module_tensor_ndim(const peft_adapter* adapter, size_t module, size_t tensor) {
  const peft::TensorInfo* info = info_or_null(adapter, module, tensor);
  return info ? info->shape.size() : 0;
}

const uint64_t* peft_adapter_module_tensor_shape(const peft_adapter* adapter, size_t module, size_t tensor) {
  const peft::TensorInfo* info = info_or_null(adapter, module, tensor);
  return info == nullptr || info->shape.empty() ? nullptr : info->shape.data();
}

peft_error* peft_adapter_module_tensor_read(const peft_adapter* adapter, size_t module, size_t tensor,
                                            int32_t dtype, void* dst, uint64_t dst_nbytes) {
  return guarded([&] {
    require_arg(adapter, "adapter");
    const peft::AdapterTensor* t = tensor_or_null(adapter, module, tensor);
    if (t == nullptr)
      peft::fail(PEFT_ERR_INVALID_ARGUMENT, "module " + std::to_string(module) + " tensor " +
                                                std::to_string(tensor) + " is out of range");
    adapter->impl->checkpoint().read(t->index, peft::capi::dtype_arg(dtype, "dtype"), dst, dst_nbytes);
  });
}

const int64_t* peft_adapter_module_token_indices(const peft_adapter* adapter, size_t module, size_t* out_count) {
  const peft::AdapterModule* m = module_or_null(adapter, module);
  if (out_count) *out_count = m ? m->token_indices.size() : 0;
  return m == nullptr || m->token_indices.empty() ? nullptr : m->token_indices.data();
}

}  // extern "C"
