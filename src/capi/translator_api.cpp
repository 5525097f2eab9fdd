// The translator part of the adapter section of the C API: name translation HF <-> host, from the
// built-in tables, a file, JSON, a base folder or a GGUF file.
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "capi/adapter_handles.hpp"
#include "capi/capi_common.hpp"
#include "capi/checkpoint_handle.hpp"
#include "capi/string_list.hpp"
#include "core/error.hpp"
#include "core/text.hpp"
#include "peft/base/base_config.hpp"
#include "peft/arch/arch_registry.hpp"

namespace {

using peft::capi::copy_string;
using peft::capi::guarded;
using peft::capi::require_arg;

peft_translator* new_translator(peft::Translator translator) {
  return new peft_translator{std::move(translator)};
}

// Translates a batch; on success fills `out` with malloc'd strings (all or nothing).
template <class Translate>
void translate_batch(const char* const* keys, size_t count, char** out, Translate translate) {
  if (count > 0) {
    require_arg(keys, "keys");
    require_arg(out, "out");
  }
  std::vector<std::string> input;
  input.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    if (keys[i] == nullptr)
      peft::fail(PEFT_ERR_INVALID_ARGUMENT, "key " + std::to_string(i) + " of the batch is NULL");
    input.emplace_back(keys[i]);
  }
  std::vector<std::string> result = translate(input);
  std::vector<char*> copies;
  try {
    for (const std::string& s : result) copies.push_back(copy_string(s));
  } catch (...) {
    for (char* c : copies) std::free(c);
    throw;
  }
  for (size_t i = 0; i < count; ++i) out[i] = copies[i];
}

}  // namespace

extern "C" {

peft_error* peft_translator_new_builtin(const char* family, peft_translator** out) {
  return guarded([&] {
    require_arg(family, "family");
    require_arg(out, "out");
    *out = new_translator(peft::Translator::for_family(family));
  });
}

peft_error* peft_translator_from_file(const char* path, peft_translator** out) {
  return guarded([&] {
    require_arg(path, "path");
    require_arg(out, "out");
    *out = new_translator(peft::Translator::from_file(path));
  });
}

peft_error* peft_translator_from_json(const char* json, peft_translator** out) {
  return guarded([&] {
    require_arg(json, "json");
    require_arg(out, "out");
    *out = new_translator(peft::Translator::from_json(json));
  });
}

peft_error* peft_translator_detect(const char* base_dir, const char* model_name, peft_translator** out) {
  return guarded([&] {
    require_arg(out, "out");
    std::optional<std::string> dir, name;
    if (base_dir != nullptr) dir = base_dir;
    if (model_name != nullptr) name = model_name;
    *out = new_translator(peft::Translator::for_family(peft::detect_base_family(dir, name)));
  });
}

peft_error* peft_translator_from_gguf(const peft_checkpoint* checkpoint, peft_translator** out) {
  return guarded([&] {
    require_arg(checkpoint, "checkpoint");
    require_arg(out, "out");
    const peft::Checkpoint& ckpt = *checkpoint->impl;
    const peft::GgufHeader* header = ckpt.file_count() == 1 ? ckpt.gguf_header(0) : nullptr;
    if (header == nullptr)
      peft::fail(PEFT_ERR_INVALID_ARGUMENT,
                 "the checkpoint" + (ckpt.file_count() > 0 ? " " + peft::quoted(ckpt.file_path(0)) : std::string()) +
                     " is not one GGUF file; a translator of GGUF names reads a GGUF model file");
    *out = new_translator(peft::Translator::for_gguf_file(*header, ckpt.file_path(0)));
  });
}

peft_error* peft_translator_new_gguf(const char* architecture, uint64_t head_count, uint64_t head_count_kv,
                                     peft_translator** out) {
  return guarded([&] {
    require_arg(architecture, "architecture");
    require_arg(out, "out");
    if (head_count == 0) peft::fail(PEFT_ERR_INVALID_ARGUMENT, "head_count must be at least 1");
    peft::GgufHeads heads;
    heads.heads = head_count;
    heads.kv_heads = head_count_kv == 0 ? head_count : head_count_kv;
    *out = new_translator(peft::Translator::for_gguf(architecture, heads));
  });
}

peft_error* peft_translator_builtin_families(char** out) {
  return guarded([&] {
    require_arg(out, "out");
    std::string list;
    for (const std::string& family : peft::builtin_families()) list += family + "\n";
    *out = copy_string(list);
  });
}

peft_error* peft_translator_builtin_family_list(peft_string_list** out) {
  return guarded([&] {
    require_arg(out, "out");
    *out = new peft_string_list{peft::builtin_families()};
  });
}

void peft_translator_free(peft_translator* translator) { delete translator; }

const char* peft_translator_family(const peft_translator* translator) {
  return translator ? translator->impl.table().family().c_str() : nullptr;
}

peft_error* peft_translator_to_native(const peft_translator* translator, const char* hf_key, char** out) {
  return guarded([&] {
    require_arg(translator, "translator");
    require_arg(hf_key, "hf_key");
    require_arg(out, "out");
    *out = copy_string(translator->impl.to_native(hf_key));
  });
}

peft_error* peft_translator_to_hf(const peft_translator* translator, const char* native_key,
                                  int32_t with_peft_prefix, char** out) {
  return guarded([&] {
    require_arg(translator, "translator");
    require_arg(native_key, "native_key");
    require_arg(out, "out");
    *out = copy_string(translator->impl.to_hf(native_key, with_peft_prefix != 0));
  });
}

peft_error* peft_translator_to_native_batch(const peft_translator* translator, const char* const* hf_keys,
                                            size_t count, char** out) {
  return guarded([&] {
    require_arg(translator, "translator");
    translate_batch(hf_keys, count, out, [&](const std::vector<std::string>& keys) {
      return translator->impl.to_native(keys);
    });
  });
}

peft_error* peft_translator_to_hf_batch(const peft_translator* translator, const char* const* native_keys,
                                        size_t count, int32_t with_peft_prefix, char** out) {
  return guarded([&] {
    require_arg(translator, "translator");
    translate_batch(native_keys, count, out, [&](const std::vector<std::string>& keys) {
      return translator->impl.to_hf(keys, with_peft_prefix != 0);
    });
  });
}

}  // extern "C"
