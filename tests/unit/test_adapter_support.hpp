// Helpers for the adapter tests: temporary folders holding hand-made adapters and base models.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "peft/adapter/adapter.hpp"

namespace adapter_test {

namespace fs = std::filesystem;

struct TempDir {
  fs::path path;
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "peft_adapter_test_XXXXXX").string();
    char* made = mkdtemp(pattern.data());
    if (made == nullptr) throw std::runtime_error("mkdtemp failed");
    path = made;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string str() const { return path.string(); }
};

inline void write_text(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary);
  out << text;
}

using TensorSpec = std::pair<std::string, std::vector<uint64_t>>;

// A safetensors file of F32 zeros (the header is built by hand: tests must not depend on the writer).
inline void write_safetensors(const fs::path& path, const std::vector<TensorSpec>& tensors) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  uint64_t offset = 0;
  for (const auto& [name, shape] : tensors) {
    uint64_t count = 1;
    for (uint64_t d : shape) count *= d;
    header[name] = {{"dtype", "F32"}, {"shape", shape}, {"data_offsets", {offset, offset + count * 4}}};
    offset += count * 4;
  }
  std::string text = header.dump();
  while ((8 + text.size()) % 8 != 0) text += ' ';
  fs::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary);
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
  out << text;
  std::string zeros(offset, '\0');
  out << zeros;
}

// A LoRA pair for a Linear module: lora_A [r, in], lora_B [out, r].
inline std::vector<TensorSpec> lora_pair(const std::string& module, uint64_t r, uint64_t in, uint64_t out,
                                         bool prefix = true) {
  std::string p = prefix ? "base_model.model." : "";
  return {{p + module + ".lora_A.weight", {r, in}}, {p + module + ".lora_B.weight", {out, r}}};
}

inline std::vector<TensorSpec> concat(std::vector<std::vector<TensorSpec>> parts) {
  std::vector<TensorSpec> out;
  for (auto& part : parts)
    for (auto& t : part) out.push_back(std::move(t));
  return out;
}

// The default config of these tests, with `patch` merged over it (a null value removes a field).
inline std::string config_text(const nlohmann::json& patch = nlohmann::json::object()) {
  nlohmann::json config = {{"peft_type", "LORA"},
                           {"r", 2},
                           {"lora_alpha", 4},
                           {"target_modules", {"q_proj", "v_proj"}},
                           {"base_model_name_or_path", "TinyLlama/TinyLlama-unit-test"}};
  for (const auto& [key, value] : patch.items()) {
    if (value.is_null())
      config.erase(key);
    else
      config[key] = value;
  }
  return config.dump(2);
}

// Two layers of q_proj / v_proj with rank 2 (hidden 8, kv 4).
inline std::vector<TensorSpec> llama_tensors(uint64_t r = 2) {
  return concat({lora_pair("model.layers.0.self_attn.q_proj", r, 8, 8),
                 lora_pair("model.layers.0.self_attn.v_proj", r, 8, 4),
                 lora_pair("model.layers.1.self_attn.q_proj", r, 8, 8),
                 lora_pair("model.layers.1.self_attn.v_proj", r, 8, 4)});
}

inline void write_adapter(const fs::path& dir, const std::string& config, const std::vector<TensorSpec>& tensors) {
  write_text(dir / "adapter_config.json", config);
  write_safetensors(dir / "adapter_model.safetensors", tensors);
}

struct Failure {
  int32_t code = PEFT_OK;
  std::string message;
};

inline Failure open_failure(const fs::path& dir, const peft::Adapter::Options& options = {}) {
  try {
    peft::Adapter::open(dir.string(), options);
  } catch (const peft::Error& e) {
    return {e.code(), e.what()};
  }
  return {};
}

inline bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace adapter_test
