// llama_adapter_driver MODEL.gguf ADAPTER.gguf: loads a GGUF model and a GGUF LoRA adapter with
// llama.cpp's own loader (llama_adapter_lora_init, which checks the adapter's metadata, architecture and
// every pair's shapes against the model) and prints, as one JSON line, what llama.cpp read:
//   {"alpha": "<adapter.lora.alpha as llama.cpp prints it>", "alora_invocation_tokens": [ ... ]}
// Exits 2 when the model does not load, 3 when the adapter does not (llama.cpp's log says why).
// For test_alora.py; built from the llama.cpp reference build (tests/interop/CMakeLists.txt).
#include <cstdint>
#include <cstdio>

#include <llama.h>

#include "llama_driver.hpp"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s MODEL.gguf ADAPTER.gguf\n", argv[0]);
    return 1;
  }
  llama_model* model = llama_driver::load_model(argv[1]);
  if (model == nullptr) return 2;
  llama_adapter_lora* adapter = llama_adapter_lora_init(model, argv[2]);
  if (adapter == nullptr) {
    std::fprintf(stderr, "llama.cpp did not load the adapter %s\n", argv[2]);
    llama_model_free(model);
    return 3;
  }
  char alpha[64] = "";
  if (llama_adapter_meta_val_str(adapter, "adapter.lora.alpha", alpha, sizeof alpha) < 0) alpha[0] = '\0';
  std::printf("{\"alpha\": \"%s\", \"alora_invocation_tokens\": [", alpha);
  const uint64_t count = llama_adapter_get_alora_n_invocation_tokens(adapter);
  const llama_token* tokens = llama_adapter_get_alora_invocation_tokens(adapter);
  for (uint64_t i = 0; i < count; ++i) std::printf("%s%d", i ? ", " : "", static_cast<int>(tokens[i]));
  std::printf("]}\n");
  llama_adapter_lora_free(adapter);
  llama_model_free(model);
  llama_backend_free();
  return 0;
}
