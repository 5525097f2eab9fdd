#include "peft/adapter/adapter_module.hpp"

namespace peft {

const char* layer_kind_name(LayerKind kind) {
  switch (kind) {
    case LayerKind::linear: return "linear";
    case LayerKind::conv1d: return "conv1d";
    case LayerKind::embedding: return "embedding";
    case LayerKind::conv2d: return "conv2d";
    case LayerKind::full: return "full";
    case LayerKind::trainable_tokens: return "trainable_tokens";
  }
  return "full";
}

const AdapterTensor* AdapterModule::find(TensorRole role) const {
  for (const AdapterTensor& t : tensors)
    if (t.role == role) return &t;
  return nullptr;
}

const AdapterTensor* AdapterModule::find_suffix(const std::string& suffix) const {
  for (const AdapterTensor& t : tensors)
    if (t.suffix == suffix) return &t;
  return nullptr;
}

const AdapterTensor* AdapterModule::find_param(std::string_view param) const {
  for (const AdapterTensor& t : tensors)
    if (t.role == TensorRole::method_param && t.suffix == param) return &t;
  return nullptr;
}

const AdapterTensor* AdapterModule::weight_factor() const {
  for (const AdapterTensor& t : tensors)
    if (t.role == TensorRole::lora_a || t.role == TensorRole::lora_embedding_a || t.role == TensorRole::method_param)
      return &t;
  return nullptr;
}

ModuleRoles module_roles(const AdapterModule& m) {
  ModuleRoles roles;
  for (const AdapterTensor& t : m.tensors) {
    roles.lora = roles.lora || t.role == TensorRole::lora_a || t.role == TensorRole::lora_b ||
                 t.role == TensorRole::lora_b_bias || t.role == TensorRole::lora_magnitude;
    roles.embedding =
        roles.embedding || t.role == TensorRole::lora_embedding_a || t.role == TensorRole::lora_embedding_b;
    roles.tokens = roles.tokens || t.role == TensorRole::trainable_tokens_delta;
    roles.method = roles.method || t.role == TensorRole::method_param;
  }
  return roles;
}

}  // namespace peft
