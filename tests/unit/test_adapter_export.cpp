// Adapter export: byte-identical round trips of every fixture and
// corpus adapter, canonical keys, dtype conversion, and atomic writes.
#include <doctest/doctest.h>

#include <cstring>

#include "core/convert.hpp"
#include "core/error.hpp"
#include "peft/export/adapter_export.hpp"
#include "safetensors/header_parser.hpp"
#include "test_adapter_export_support.hpp"
#include "peft_test_paths.h"

using namespace export_test;

namespace {

// The header JSON of a safetensors file (without the 8-byte length and the padding).
nlohmann::json header_json(const std::string& bytes) {
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  return nlohmann::json::parse(bytes.substr(8, n));
}

uint64_t header_length(const std::string& bytes) {
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  return n;
}

}  // namespace

TEST_CASE("adapter export: every fixture adapter re-exports byte for byte") {
  const auto names = fixture_adapter_names();
  REQUIRE(names.size() > 20);
  ScratchDir scratch;
  size_t exported = 0;
  for (const std::string& name : names) {
    CAPTURE(name);
    const std::string dir = fixture_adapter(name);
    std::shared_ptr<const peft::Adapter> adapter;
    const int32_t open_code = code_of([&] { adapter = open_adapter(dir); });
    REQUIRE(open_code == PEFT_OK);
    const std::string out = scratch.path(name);
    peft::export_adapter(*adapter, out, {});
    // PEFT 0.21.2 wrote the fixtures, so both files are exactly what PEFT writes.
    CHECK(read_file(out + "/adapter_model.safetensors") == read_file(dir + "/adapter_model.safetensors"));
    CHECK(read_file(out + "/adapter_config.json") == read_file(dir + "/adapter_config.json"));
    CHECK(writer_test::temporaries(out).empty());
    ++exported;
  }
  CHECK(exported == names.size());
}

TEST_CASE("adapter export: every corpus adapter re-exports with identical tensors and an equal config") {
  const auto dirs = corpus_adapter_dirs();
  if (dirs.empty()) {
    MESSAGE("skipped: corpus not found at " PEFT_CORPUS);
    return;
  }
  ScratchDir scratch;
  size_t index = 0, byte_identical = 0;
  for (const std::string& dir : dirs) {
    CAPTURE(dir);
    auto adapter = open_adapter(dir);
    const std::string out = scratch.path(std::to_string(index++));
    peft::export_adapter(*adapter, out, {});
    const std::string source = read_file(dir + "/adapter_model.safetensors");
    const std::string written = read_file(out + "/adapter_model.safetensors");
    nlohmann::json source_header = header_json(source);
    const nlohmann::json written_header = header_json(written);
    const auto metadata = source_header.find("__metadata__");
    const bool pt_metadata = metadata != source_header.end() && *metadata == nlohmann::json{{"format", "pt"}};
    if (pt_metadata) {
      CHECK(written == source);
      byte_identical += written == source;
    } else {
      // PEFT would write {"format":"pt"}: only the metadata differs; the data section is the same.
      REQUIRE((metadata == source_header.end() || metadata->size() <= 1));
      source_header["__metadata__"] = {{"format", "pt"}};
      CHECK(written_header == source_header);
      CHECK(written.substr(8 + header_length(written)) == source.substr(8 + header_length(source)));
    }
    nlohmann::json expected_config = read_json(dir + "/adapter_config.json");
    expected_config["inference_mode"] = true;
    CHECK(read_json(out + "/adapter_config.json") == expected_config);
  }
  CHECK(byte_identical + 1 >= dirs.size());  // one corpus file has no metadata at all
}

TEST_CASE("adapter export: keys become PEFT's canonical keys") {
  ScratchDir scratch;
  const std::string src = scratch.path("src");
  std::vector<FakeTensor> tensors = lora_pair("model.layers.0.self_attn.q_proj", 4, 8, 8, 1, "");  // no prefix
  tensors.push_back({"base_model.model.model.layers.0.self_attn.v_proj.lora_A.default.weight", {4, 8},
                     pseudo_random(32, 3)});
  tensors.push_back({"base_model.model.model.layers.0.self_attn.v_proj.lora_B.default.weight", {8, 4},
                     pseudo_random(32, 4)});
  tensors.push_back({"base_model.model.model.layers.0.self_attn.v_proj.lora_magnitude_vector.weight", {8},
                     pseudo_random(8, 5)});
  tensors.push_back({"base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector", {8}, pseudo_random(8, 6)});
  write_adapter(src, config_text({{"use_dora", true}}), tensors);
  auto adapter = open_adapter(src);
  peft::export_adapter(*adapter, scratch.path("out"), {});
  auto ckpt = peft::Checkpoint::open(scratch.path("out") + "/adapter_model.safetensors");
  std::vector<std::string> keys;
  for (size_t i = 0; i < ckpt->tensor_count(); ++i) keys.push_back(ckpt->tensor(i).name);
  std::sort(keys.begin(), keys.end());
  const std::vector<std::string> expected = {
      "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight",
      "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight",
      "base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector",
      "base_model.model.model.layers.0.self_attn.v_proj.lora_A.weight",
      "base_model.model.model.layers.0.self_attn.v_proj.lora_B.weight",
      "base_model.model.model.layers.0.self_attn.v_proj.lora_magnitude_vector",
  };
  CHECK(keys == expected);
  CHECK(tensor_f32(scratch.path("out"), expected[5]) == tensors[4].values);
  CHECK(tensor_f32(scratch.path("out"), expected[0]) == tensors[0].values);
  // The exported folder opens with no notes about adapter names or prefixes.
  CHECK(open_adapter(scratch.path("out"))->notes().empty());
}

TEST_CASE("adapter export: the config keeps unknown fields and means the same") {
  ScratchDir scratch;
  const std::string src = scratch.path("src");
  nlohmann::ordered_json extra = {{"init_lora_weights", "gaussian"},
                                  {"inference_mode", false},
                                  {"runtime_config", {{"ephemeral_gpu_offload", false}}},
                                  {"my_tool_field", {{"b", 1.5}, {"a", "\u00e9"}}},
                                  {"lora_dropout", 0.05}};
  std::vector<FakeTensor> tensors = lora_pair("model.layers.0.self_attn.q_proj", 4, 8, 8, 1);
  write_adapter(src, config_text(extra), tensors);
  peft::export_adapter(*open_adapter(src), scratch.path("out"), {});
  const nlohmann::json written = read_json(scratch.path("out") + "/adapter_config.json");
  CHECK(written["init_lora_weights"] == true);
  CHECK(written["inference_mode"] == true);
  CHECK_FALSE(written.contains("runtime_config"));
  CHECK(written["my_tool_field"] == nlohmann::json{{"a", "\u00e9"}, {"b", 1.5}});
  CHECK(written["lora_dropout"] == 0.05);
  const std::string text = read_file(scratch.path("out") + "/adapter_config.json");
  CHECK(text.find("\"a\": \"\\u00e9\"") != std::string::npos);
  CHECK(text.find("\"lora_dropout\": 0.05,") != std::string::npos);
  CHECK(text.back() == '}');

  // false, "eva", "orthogonal" and "mica" become true as well; true stays true.
  for (const nlohmann::ordered_json& init : {nlohmann::ordered_json(false), nlohmann::ordered_json("eva"),
                                            nlohmann::ordered_json("orthogonal"), nlohmann::ordered_json("mica")}) {
    CAPTURE(init.dump());
    const std::string dir = scratch.path("init_" + std::to_string(std::hash<std::string>()(init.dump())));
    write_adapter(dir, config_text({{"init_lora_weights", init}}), tensors);
    peft::export_adapter(*open_adapter(dir), dir + "_out", {});
    CHECK(read_json(dir + "_out/adapter_config.json")["init_lora_weights"] == true);
  }
}

TEST_CASE("adapter export: the dtype option converts float tensors as torch does") {
  ScratchDir scratch;
  auto adapter = open_adapter(fixture_adapter("llama_lora"));
  for (peft::DType dtype : {peft::DType::BF16, peft::DType::F16, peft::DType::F32}) {
    CAPTURE(peft::dtype_name(dtype));
    const std::string out = scratch.path(std::string(peft::dtype_name(dtype)));
    peft::ExportOptions options;
    options.dtype = dtype;
    peft::export_adapter(*adapter, out, options);
    auto written = peft::Checkpoint::open(out + "/adapter_model.safetensors");
    REQUIRE(written->tensor_count() == adapter->checkpoint().tensor_count());
    for (size_t i = 0; i < written->tensor_count(); ++i) {
      const peft::TensorInfo& info = written->tensor(i);
      CHECK(info.dtype == dtype);
      auto source = adapter->checkpoint().find(info.name);
      REQUIRE(source);
      const std::vector<float> values = adapter->checkpoint().read_f32(*source);
      std::vector<uint8_t> expected(peft::converted_byte_size(dtype, values.size()));
      peft::convert(peft::DType::F32, values.data(), dtype, expected.data(), values.size());
      auto view = written->view(i);
      CHECK(std::vector<uint8_t>(view.begin(), view.end()) == expected);
    }
    // Converting to the dtype it already has changes nothing.
    if (dtype == peft::DType::F32)
      CHECK(read_file(out + "/adapter_model.safetensors") ==
            read_file(fixture_adapter("llama_lora") + "/adapter_model.safetensors"));
  }
  // A BF16 adapter converted to F32 holds the exact values.
  auto bf16 = open_adapter(fixture_adapter("llama_bf16_lora"));
  peft::ExportOptions to_f32;
  to_f32.dtype = peft::DType::F32;
  peft::export_adapter(*bf16, scratch.path("bf16_to_f32"), to_f32);
  auto written = open_adapter(scratch.path("bf16_to_f32"));
  for (size_t i = 0; i < written->checkpoint().tensor_count(); ++i) {
    const auto& info = written->checkpoint().tensor(i);
    auto source = bf16->checkpoint().find(info.name);
    REQUIRE(source);
    CHECK(info.dtype == peft::DType::F32);
    CHECK(written->checkpoint().read_f32(i) == bf16->checkpoint().read_f32(*source));
  }
}

TEST_CASE("adapter export: bad arguments fail before anything is written") {
  ScratchDir scratch;
  auto adapter = open_adapter(fixture_adapter("llama_lora"));
  peft::ExportOptions options;
  options.dtype = peft::DType::I32;
  CHECK(code_of([&] { peft::export_adapter(*adapter, scratch.path("x"), options); }) == PEFT_ERR_INVALID_ARGUMENT);
  CHECK_FALSE(fs::exists(scratch.path("x")));
  CHECK(code_of([&] { peft::export_adapter(*adapter, "", {}); }) == PEFT_ERR_INVALID_ARGUMENT);
  write_file(scratch.path("file"), "not a folder");
  CHECK(code_of([&] { peft::export_adapter(*adapter, scratch.path("file"), {}); }) == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(read_file(scratch.path("file")) == "not a folder");
}

namespace {
peft::testing::FileOp g_fail_op;
std::string g_fail_suffix;
int fail_matching(peft::testing::FileOp op, const std::string& target) {
  return op == g_fail_op && target.ends_with(g_fail_suffix) ? ENOSPC : 0;
}
}  // namespace

TEST_CASE("adapter export: a failed write leaves the folder as it was") {
  ScratchDir scratch;
  auto adapter = open_adapter(fixture_adapter("llama_lora"));
  const std::string out = scratch.path("out");
  fs::create_directories(out);
  write_file(out + "/adapter_model.safetensors", "old weights");
  write_file(out + "/adapter_config.json", "old config");
  const struct {
    peft::testing::FileOp op;
    const char* suffix;
  } faults[] = {
      {peft::testing::FileOp::create, "adapter_model.safetensors"},
      {peft::testing::FileOp::write, "adapter_model.safetensors"},
      {peft::testing::FileOp::create, "adapter_config.json"},
      {peft::testing::FileOp::write, "adapter_config.json"},
      {peft::testing::FileOp::fsync, "adapter_config.json"},
      {peft::testing::FileOp::rename, "adapter_model.safetensors"},
  };
  for (const auto& f : faults) {
    CAPTURE(f.suffix);
    g_fail_op = f.op;
    g_fail_suffix = f.suffix;
    peft::testing::fault_hook = &fail_matching;
    const int32_t code = code_of([&] { peft::export_adapter(*adapter, out, {}); });
    peft::testing::fault_hook = nullptr;
    CHECK(code == PEFT_ERR_IO);
    CHECK(read_file(out + "/adapter_model.safetensors") == "old weights");
    CHECK(read_file(out + "/adapter_config.json") == "old config");
    CHECK(writer_test::temporaries(out).empty());
  }
  peft::export_adapter(*adapter, out, {});
  CHECK(read_file(out + "/adapter_config.json") == read_file(fixture_adapter("llama_lora") + "/adapter_config.json"));
}

TEST_CASE("adapter export: exporting into the adapter's own folder is refused, the folder untouched") {
  // Rewriting the adapter in place (lossily, in bf16) replaced what the export reads: refused by
  // file identity, as every output that is an input (core/file_identity.hpp).
  ScratchDir scratch;
  const std::string dir = scratch.path("self");
  fs::create_directories(dir);
  for (const char* f : {"adapter_config.json", "adapter_model.safetensors"})
    fs::copy_file(fixture_adapter("llama_lora_second") + "/" + f, dir + "/" + f);
  const std::string before = read_file(dir + "/adapter_model.safetensors");
  auto adapter = open_adapter(dir);
  peft::ExportOptions options;
  options.dtype = peft::DType::BF16;
  CHECK(code_of([&] { peft::export_adapter(*adapter, dir, options); }) == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(read_file(dir + "/adapter_model.safetensors") == before);
}
