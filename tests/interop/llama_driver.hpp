// What the llama.cpp test drivers (llama_adapter_driver, llama_cvec_driver) share: llama.cpp's log
// quietened to its errors, and the model loaded with llama.cpp's own loader.
#pragma once

#include <cstdio>

#include <llama.h>

namespace llama_driver {

inline void quiet_log(ggml_log_level level, const char* text, void*) {
  if (level == GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
}

// Starts llama.cpp with a quiet log and loads the GGUF model at `path`; nullptr (after saying so on
// stderr) when llama.cpp does not load it.
inline llama_model* load_model(const char* path) {
  llama_log_set(quiet_log, nullptr);
  llama_backend_init();
  llama_model* model = llama_model_load_from_file(path, llama_model_default_params());
  if (model == nullptr) std::fprintf(stderr, "llama.cpp did not load the model %s\n", path);
  return model;
}

}  // namespace llama_driver
