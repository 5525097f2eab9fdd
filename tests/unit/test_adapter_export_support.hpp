// Helpers of the adapter export and combine tests: fixture and corpus adapter folders, small
// synthetic adapters written on the fly, and reading tensors back.
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "peft/adapter/adapter.hpp"
#include "checkpoint/checkpoint.hpp"
#include "safetensors/writer.hpp"
#include "test_error_support.hpp"
#include "test_writer_support.hpp"
#include "peft_test_paths.h"

namespace export_test {

namespace fs = std::filesystem;
using writer_test::read_file;
using writer_test::ScratchDir;
using writer_test::write_file;

using error_test::code_of;

// The message a call fails with ("" when it succeeds).
template <class Body>
std::string error_of(const Body& body) {
  try {
    body();
  } catch (const peft::Error& e) {
    return e.what();
  }
  return "";
}

inline std::string fixture_adapter(const std::string& name) {
  return std::string(PEFT_TEST_DATA) + "/adapters/" + name;
}

// Every fixture adapter folder, sorted.
inline std::vector<std::string> fixture_adapter_names() {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(std::string(PEFT_TEST_DATA) + "/adapters", ec))
    if (entry.is_directory() && fs::exists(entry.path() / "adapter_config.json"))
      names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// Every folder of the real corpus with an adapter_config.json and adapter_model.safetensors.
inline std::vector<std::string> corpus_adapter_dirs() {
  std::vector<std::string> dirs;
  std::error_code ec;
  if (!fs::is_directory(PEFT_CORPUS, ec)) return dirs;
  for (const auto& entry : fs::recursive_directory_iterator(PEFT_CORPUS, ec))
    if (entry.path().filename() == "adapter_config.json" &&
        fs::exists(entry.path().parent_path() / "adapter_model.safetensors"))
      dirs.push_back(entry.path().parent_path().string());
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

inline std::shared_ptr<const peft::Adapter> open_adapter(const std::string& dir) {
  return peft::Adapter::open(dir, {});
}

// Deterministic values in [-1, 1).
inline std::vector<float> pseudo_random(size_t count, uint32_t seed) {
  std::vector<float> out(count);
  uint32_t state = seed * 2654435761u + 12345u;
  for (float& v : out) {
    state = state * 1664525u + 1013904223u;
    v = static_cast<float>(state >> 8) / static_cast<float>(1u << 23) - 1.0f;
  }
  return out;
}

struct FakeTensor {
  std::string name;
  std::vector<uint64_t> shape;
  std::vector<float> values;  // written as F32
};

// A LoRA pair of a module: lora_A [rank, in] and lora_B [out, rank] under `prefix` + module.
inline std::vector<FakeTensor> lora_pair(const std::string& module, uint64_t rank, uint64_t in, uint64_t out,
                                         uint32_t seed, const std::string& prefix = "base_model.model.") {
  return {{prefix + module + ".lora_A.weight", {rank, in}, pseudo_random(rank * in, seed)},
          {prefix + module + ".lora_B.weight", {out, rank}, pseudo_random(out * rank, seed + 1)}};
}

// Writes an adapter folder: the config text as given and the tensors as F32 with {"format":"pt"}.
inline void write_adapter(const std::string& dir, const std::string& config_text,
                          const std::vector<FakeTensor>& tensors) {
  fs::create_directories(dir);
  write_file(dir + "/adapter_config.json", config_text);
  peft::FileWriter writer(dir + "/adapter_model.safetensors");
  writer.set_metadata("format", "pt");
  std::map<std::string, const FakeTensor*> by_name;
  for (const FakeTensor& t : tensors) {
    writer.add_tensor(t.name, peft::DType::F32, t.shape);
    by_name[t.name] = &t;
  }
  writer.start();
  for (size_t p = 0; p < writer.tensor_count(); ++p) {
    const FakeTensor& t = *by_name.at(writer.tensor_at(p).name);
    writer.write_tensor(t.name, peft::DType::F32, t.values.data(), t.values.size() * sizeof(float));
  }
  writer.finish();
}

// A minimal PEFT config (as PEFT 0.21 would read it) with extra fields merged in.
inline std::string config_text(const nlohmann::ordered_json& extra) {
  nlohmann::ordered_json c = {{"peft_type", "LORA"}, {"r", 4}, {"lora_alpha", 8}, {"task_type", "CAUSAL_LM"},
                              {"target_modules", {"q_proj", "v_proj"}}};
  for (const auto& [k, v] : extra.items()) c[k] = v;
  return c.dump(2);
}

inline nlohmann::json read_json(const std::string& path) { return nlohmann::json::parse(read_file(path)); }

// A tensor of an adapter folder's safetensors file as f32, by key.
inline std::vector<float> tensor_f32(const std::string& dir, const std::string& key) {
  auto ckpt = peft::Checkpoint::open(dir + "/adapter_model.safetensors");
  auto index = ckpt->find(key);
  if (!index) return {};
  return ckpt->read_f32(*index);
}

inline std::vector<uint64_t> tensor_shape(const std::string& dir, const std::string& key) {
  auto ckpt = peft::Checkpoint::open(dir + "/adapter_model.safetensors");
  auto index = ckpt->find(key);
  if (!index) return {};
  return ckpt->tensor(*index).shape;
}

}  // namespace export_test
