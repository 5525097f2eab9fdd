// ggml's own quantizer and dequantizer on a file of values, for the GGUF merge tests
// (test_gguf_quant_merge.py): linked from the llama.cpp reference build's libggml-base like
// ggml_quant_compare.
//
// Usage: ggml_quant_driver quantize TYPE ROWS COLS IN.f32 OUT     ggml_quantize_chunk, no importance matrix
//        ggml_quant_driver dequantize TYPE ROWS COLS IN OUT.f32   the type's to_float
// TYPE is ggml's type number; files hold raw little-endian data. Exit status 0 on success.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <vector>

#include "ggml.h"

namespace {

std::vector<char> read_all(const char* path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

bool write_all(const char* path, const void* data, size_t size) {
  std::ofstream out(path, std::ios::binary);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
  return static_cast<bool>(out);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 7) {
    std::fprintf(stderr, "usage: %s quantize|dequantize TYPE ROWS COLS IN OUT\n", argv[0]);
    return 2;
  }
  const auto type = static_cast<ggml_type>(std::atoi(argv[2]));
  const int64_t rows = std::atoll(argv[3]), cols = std::atoll(argv[4]);
  const size_t row_bytes = ggml_row_size(type, cols);
  const std::vector<char> in = read_all(argv[5]);
  if (std::strcmp(argv[1], "quantize") == 0) {
    if (in.size() != static_cast<size_t>(rows * cols) * sizeof(float)) {
      std::fprintf(stderr, "%s: %zu bytes, expected %lld floats\n", argv[5], in.size(), static_cast<long long>(rows * cols));
      return 1;
    }
    std::vector<uint8_t> out(row_bytes * static_cast<size_t>(rows));
    ggml_quantize_init(type);
    ggml_quantize_chunk(type, reinterpret_cast<const float*>(in.data()), out.data(), 0, rows, cols, nullptr);
    return write_all(argv[6], out.data(), out.size()) ? 0 : 1;
  }
  if (std::strcmp(argv[1], "dequantize") == 0) {
    if (in.size() != row_bytes * static_cast<size_t>(rows)) {
      std::fprintf(stderr, "%s: %zu bytes, expected %zu\n", argv[5], in.size(), row_bytes * static_cast<size_t>(rows));
      return 1;
    }
    std::vector<float> out(static_cast<size_t>(rows * cols));
    if (type == GGML_TYPE_F32)  // no to_float: the values themselves
      std::memcpy(out.data(), in.data(), in.size());
    else
      ggml_get_type_traits(type)->to_float(in.data(), out.data(), rows * cols);
    return write_all(argv[6], out.data(), out.size() * sizeof(float)) ? 0 : 1;
  }
  std::fprintf(stderr, "unknown mode %s\n", argv[1]);
  return 2;
}
