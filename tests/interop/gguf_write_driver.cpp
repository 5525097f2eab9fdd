// Test driver for tests/interop/test_gguf_writer.py: writes a GGUF file with GgufWriter from a JSON
// description, so that the pytest can compare its bytes with gguf-py's GGUFWriter.
//
// Usage: gguf_write_driver SPEC.json   (file names in the spec are relative to its folder)
//
// Spec: {"output": "out.gguf", "layout": "layout.json"?,
//        "metadata": [{"key": "...", "type": T, "value": V}, ...],
//        "tensors": [{"name": "...", "type": ggml type number, "shape": [outermost first],
//                     "data": "file", "source_dtype": "F32"?, "chunk": bytes per write?}, ...]}
// T is a value type name (U8 I8 U16 I16 U32 I32 F32 BOOL STRING ARRAY U64 I64 F64). V is, by type:
// integers a JSON integer; F32/F64 the bit pattern of the double holding the value (an unsigned
// integer, so that NaN and infinities pass through JSON); BOOL true/false; STRING the bytes in hex;
// ARRAY {"element_type": T, "items": [V, ...]}.
// Without "source_dtype" a tensor's data file holds its stored bytes; with it, elements of that
// safetensors dtype that the writer converts. "layout" receives the writer's layout:
// {"alignment", "data_start", "data_size", "tensors": [{"name", "begin", "end"}, ...]}.
// Exit status 0 on success; 2 with "CODE_NAME: message" on stderr for a peft error; 1 otherwise.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/dtype.hpp"
#include "core/error.hpp"
#include "gguf/gguf_writer.hpp"

namespace fs = std::filesystem;
using nlohmann::json;
using peft::GgufValue;
using peft::GgufValueType;

namespace {

GgufValueType value_type(const std::string& name) {
  static const char* const kNames[] = {"U8",     "I8",    "U16", "I16", "U32", "I32", "F32",
                                       "BOOL",   "STRING", "ARRAY", "U64", "I64", "F64"};
  for (uint32_t i = 0; i < std::size(kNames); ++i) {
    if (name == kNames[i]) return static_cast<GgufValueType>(i);
  }
  throw std::runtime_error("unknown value type " + name);
}

std::string from_hex(const std::string& hex) {
  if (hex.size() % 2 != 0) throw std::runtime_error("odd hex string");
  std::string out(hex.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<char>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  return out;
}

GgufValue decode(GgufValueType type, const json& raw) {
  GgufValue value;
  value.type = type;
  switch (type) {
    case GgufValueType::U8: case GgufValueType::U16: case GgufValueType::U32: case GgufValueType::U64:
      value.data = raw.get<uint64_t>();
      break;
    case GgufValueType::I8: case GgufValueType::I16: case GgufValueType::I32: case GgufValueType::I64:
      value.data = raw.get<int64_t>();
      break;
    case GgufValueType::F32: case GgufValueType::F64: {
      const uint64_t bits = raw.get<uint64_t>();
      double d;
      std::memcpy(&d, &bits, sizeof d);
      value.data = d;
      break;
    }
    case GgufValueType::BOOL:
      value.data = raw.get<bool>();
      break;
    case GgufValueType::STRING:
      value.data = from_hex(raw.get<std::string>());
      break;
    case GgufValueType::ARRAY: {
      peft::GgufArray array;
      array.element_type = value_type(raw.at("element_type").get<std::string>());
      for (const json& item : raw.at("items")) peft::gguf_array_append(array, decode(array.element_type, item));
      value.data = std::move(array);
      break;
    }
  }
  return value;
}

void run(const fs::path& spec_path) {
  std::ifstream spec_file(spec_path);
  if (!spec_file) throw std::runtime_error("cannot read " + spec_path.string());
  const json spec = json::parse(spec_file);
  const fs::path dir = spec_path.parent_path();

  peft::GgufWriter writer((dir / spec.at("output").get<std::string>()).string());
  for (const json& kv : spec.value("metadata", json::array())) {
    writer.add_metadata(kv.at("key").get<std::string>(),
                        decode(value_type(kv.at("type").get<std::string>()), kv.at("value")));
  }
  const json tensors = spec.value("tensors", json::array());
  for (const json& t : tensors) {
    writer.add_tensor(t.at("name").get<std::string>(), t.at("type").get<uint32_t>(),
                      t.at("shape").get<std::vector<uint64_t>>());
  }
  if (spec.contains("layout")) {
    json layout = {{"alignment", writer.alignment()}, {"data_start", writer.data_start()},
                   {"data_size", writer.data_size()}, {"tensors", json::array()}};
    for (const peft::TensorInfo& t : writer.tensors()) {
      layout["tensors"].push_back({{"name", t.name}, {"begin", t.begin}, {"end", t.end}});
    }
    std::ofstream(dir / spec.at("layout").get<std::string>()) << layout.dump();
  }

  writer.start();
  std::vector<char> buffer;
  for (const json& t : tensors) {
    const std::string name = t.at("name").get<std::string>();
    if (t.contains("source_dtype")) {
      const auto dtype = peft::dtype_from_name(t.at("source_dtype").get<std::string>());
      if (!dtype) throw std::runtime_error("unknown dtype for " + name);
      writer.begin_tensor(name, *dtype);
    } else {
      writer.begin_tensor(name);
    }
    std::ifstream data(dir / t.at("data").get<std::string>(), std::ios::binary);
    if (!data) throw std::runtime_error("cannot read the data of " + name);
    buffer.resize(t.value("chunk", size_t{1} << 20));
    while (data) {
      data.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
      const auto n = static_cast<uint64_t>(data.gcount());
      if (n > 0) writer.write(buffer.data(), n);
    }
  }
  writer.finish();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: gguf_write_driver SPEC.json\n";
    return 1;
  }
  try {
    run(argv[1]);
  } catch (const peft::Error& e) {
    std::cerr << peft::code_name(e.code()) << ": " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
