// Opens a safetensors or GGUF file repeatedly through the public C API, indexes every tensor (name,
// dtype, shape, find by name) and prints the median and best time per open in microseconds.
// usage: bench_open FILE [ITERATIONS]
#include <cstdio>

#include "open_timing.hpp"
#include "peft_c.h"

int main(int argc, char** argv) {
  return run_open_benchmark(argc, argv, "bench_open", [](const char* path, size_t& checksum) {
    peft_checkpoint* ckpt = nullptr;
    if (peft_error* err = peft_checkpoint_open(path, nullptr, &ckpt)) {
      std::fprintf(stderr, "bench_open: %s\n", peft_error_message(err));
      peft_error_free(err);
      return false;
    }
    const size_t count = peft_checkpoint_tensor_count(ckpt);
    for (size_t i = 0; i < count; ++i) {
      const char* name = peft_checkpoint_tensor_name(ckpt, i);
      size_t found = 0;
      peft_error_free(peft_checkpoint_find(ckpt, name, &found));
      checksum += found + peft_checkpoint_tensor_ndim(ckpt, i) + static_cast<size_t>(peft_checkpoint_tensor_dtype(ckpt, i));
    }
    peft_checkpoint_free(ckpt);
    return true;
  });
}
