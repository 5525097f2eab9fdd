// Test driver for tests/interop/test_bnb_quant.py: runs peft_c's bitsandbytes (de)quantizers
// (core/quant/bnb_4bit, bnb_int8) on raw little-endian files the pytest wrote, so that it can compare
// the bytes with the bitsandbytes package's.
//
// Usage (counts and sizes are decimal; f32 files are raw float32):
//   bnb_quant_driver deq4  PACKED ABSMAX CODE16 BLOCKSIZE COUNT nf4|fp4 LAST_DIM OUT
//   bnb_quant_driver q4    VALUES COUNT BLOCKSIZE nf4|fp4 OUT_PACKED OUT_ABSMAX
//   bnb_quant_driver deq8  Q ABSMAX CODE256 BLOCKSIZE COUNT OUT
//   bnb_quant_driver q8    VALUES COUNT BLOCKSIZE CODE256 OUT_Q OUT_ABSMAX
//   bnb_quant_driver mean  VALUES COUNT OUT
//   bnb_quant_driver deqi8 Q SCB ROWS COLS OUT
//   bnb_quant_driver qi8   VALUES ROWS COLS OUT_Q OUT_SCB
// Exit status 0 on success; 1 with a message on stderr otherwise.
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/quant/bnb_4bit.hpp"
#include "core/quant/bnb_int8.hpp"

namespace {

std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

template <class T>
std::vector<T> read_as(const std::string& path) {
  const auto bytes = read_file(path);
  std::vector<T> v(bytes.size() / sizeof(T));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(T));
  return v;
}

template <class T>
void write_file(const std::string& path, const std::vector<T>& v) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(T)));
  if (!out) throw std::runtime_error("cannot write " + path);
}

uint64_t number(const char* s) { return std::stoull(s); }

int run(int argc, char** argv) {
  if (argc < 2) throw std::runtime_error("usage: bnb_quant_driver OP ARGS...");
  const std::string op = argv[1];
  auto need = [&](int n) {
    if (argc != n + 2) throw std::runtime_error(op + " takes " + std::to_string(n) + " arguments");
  };
  namespace bnb = peft::bnb;
  if (op == "deq4") {
    need(8);
    const auto packed = read_file(argv[2]);
    const auto absmax = read_as<float>(argv[3]);
    auto code = read_as<float>(argv[4]);
    const uint64_t blocksize = number(argv[5]), count = number(argv[6]);
    const auto type = std::string(argv[7]) == "nf4" ? bnb::FourBit::nf4 : bnb::FourBit::fp4;
    bnb::cpu_dequantize_code(type, number(argv[8]), blocksize, code.data());
    std::vector<float> out(count);
    bnb::dequantize_4bit(packed.data(), absmax.data(), code.data(), blocksize, count, out.data());
    write_file(argv[9], out);
  } else if (op == "q4") {
    need(6);
    const auto values = read_as<float>(argv[2]);
    const uint64_t count = number(argv[3]), blocksize = number(argv[4]);
    const auto type = std::string(argv[5]) == "nf4" ? bnb::FourBit::nf4 : bnb::FourBit::fp4;
    std::vector<uint8_t> packed((count + 1) / 2);
    std::vector<float> absmax((count + blocksize - 1) / blocksize);
    bnb::quantize_4bit(values.data(), count, blocksize, type, packed.data(), absmax.data());
    write_file(argv[6], packed);
    write_file(argv[7], absmax);
  } else if (op == "deq8") {
    need(6);
    const auto q = read_file(argv[2]);
    const auto absmax = read_as<float>(argv[3]), code = read_as<float>(argv[4]);
    const uint64_t blocksize = number(argv[5]), count = number(argv[6]);
    std::vector<float> out(count);
    bnb::dequantize_blockwise(q.data(), absmax.data(), code.data(), blocksize, count, out.data());
    write_file(argv[7], out);
  } else if (op == "q8") {
    need(6);
    const auto values = read_as<float>(argv[2]);
    const uint64_t count = number(argv[3]), blocksize = number(argv[4]);
    const auto code = read_as<float>(argv[5]);
    std::vector<uint8_t> q(count);
    std::vector<float> absmax((count + blocksize - 1) / blocksize);
    bnb::quantize_blockwise(values.data(), count, blocksize, code.data(), q.data(), absmax.data());
    write_file(argv[6], q);
    write_file(argv[7], absmax);
  } else if (op == "mean") {
    need(3);
    const auto values = read_as<float>(argv[2]);
    write_file(argv[4], std::vector<float>{bnb::torch_mean_f32(values.data(), number(argv[3]))});
  } else if (op == "deqi8") {
    need(5);
    const auto q = read_as<int8_t>(argv[2]);
    const auto scb = read_as<float>(argv[3]);
    const uint64_t rows = number(argv[4]), cols = number(argv[5]);
    std::vector<float> out(rows * cols);
    bnb::dequantize_int8(q.data(), scb.data(), rows, cols, out.data());
    write_file(argv[6], out);
  } else if (op == "qi8") {
    need(5);
    const auto values = read_as<float>(argv[2]);
    const uint64_t rows = number(argv[3]), cols = number(argv[4]);
    std::vector<int8_t> q(rows * cols);
    std::vector<float> scb(rows);
    bnb::quantize_int8(values.data(), rows, cols, q.data(), scb.data());
    write_file(argv[5], q);
    write_file(argv[6], scb);
  } else {
    throw std::runtime_error("unknown op " + op);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "bnb_quant_driver: " << e.what() << "\n";
    return 1;
  }
}
