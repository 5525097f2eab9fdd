// The reference for bench/open_vs_native.py: opens a GGUF file repeatedly with llama.cpp's reader,
// gguf_init_from_file (no_alloc, with the ggml context of tensor shapes that llama.cpp's model loader
// asks for), builds the name index the loader builds (its weights map; a hash map here, which is faster
// than the loader's std::map), finds every tensor by name and reads its type and shape. Prints the
// median and best time per open in microseconds, as bench_open does (bench/open_timing.hpp).
// Built by bench/open_vs_native.py against the static ggml-base of scripts/llama-cpp.sh's build.
// usage: llama_gguf_open FILE [ITERATIONS]
#include <cstdio>
#include <string>
#include <unordered_map>

#include "../open_timing.hpp"
#include "ggml.h"
#include "gguf.h"

int main(int argc, char** argv) {
  return run_open_benchmark(argc, argv, "llama_gguf_open", [](const char* path, size_t& checksum) {
    ggml_context* shapes = nullptr;
    gguf_init_params params{/*no_alloc=*/true, /*ctx=*/&shapes};
    gguf_context* file = gguf_init_from_file(path, params);
    if (file == nullptr) {
      std::fprintf(stderr, "llama_gguf_open: gguf_init_from_file failed on %s\n", path);
      return false;
    }
    std::unordered_map<std::string, ggml_tensor*> index;
    index.reserve(static_cast<size_t>(gguf_get_n_tensors(file)));
    for (ggml_tensor* t = ggml_get_first_tensor(shapes); t != nullptr; t = ggml_get_next_tensor(shapes, t)) {
      index.emplace(ggml_get_name(t), t);
    }
    for (int64_t i = 0; i < gguf_get_n_tensors(file); ++i) {
      ggml_tensor* t = index.at(gguf_get_tensor_name(file, i));
      checksum += static_cast<size_t>(ggml_n_dims(t)) + static_cast<size_t>(t->type);
    }
    gguf_free(file);
    ggml_free(shapes);
    return true;
  });
}
