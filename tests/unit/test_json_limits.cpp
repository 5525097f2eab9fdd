// Every JSON input is bounded and linear, and small files are read only when they are regular files
// (issue 13): nesting 100,000 and 1,000,000 deep is a coded error for each JSON the library reads
// (no stack overflow), objects keep file order with Python's rule for repeated keys, a 200k-entry
// index and a 300k-key adapter config open in linear time, and a FIFO, a folder or a device given as
// a config is PEFT_ERR_IO at once instead of a hang.
#include <doctest/doctest.h>
#include <sys/stat.h>

#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "checkpoint_test_support.hpp"
#include "core/error.hpp"
#include "core/json_parse.hpp"
#include "core/text_file.hpp"
#include "peft/adapter/adapter_config.hpp"
#include "peft/base/base_model.hpp"
#include "peft/arch/arch_table.hpp"
#include "checkpoint/checkpoint.hpp"
#include "checkpoint/checkpoint_layout.hpp"
#include "checkpoint/sharded_writer.hpp"

namespace {

using checkpoint_test::TempDir;
using checkpoint_test::write_file;

std::string nested_arrays(size_t depth) { return std::string(depth, '[') + std::string(depth, ']'); }
std::string nested_objects(size_t depth) {
  std::string text;
  text.reserve(depth * 6 + 1);
  for (size_t i = 0; i < depth; ++i) text += "{\"a\":";
  text += "1";
  return text + std::string(depth, '}');
}

// The code of the peft::Error `run` throws (0 when it throws none), and its message.
std::pair<int32_t, std::string> error_of(const std::function<void()>& run) {
  try {
    run();
  } catch (const peft::Error& e) {
    return {e.code(), e.what()};
  }
  return {0, ""};
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

const std::string kLoraConfig = R"({"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj"]})";

}  // namespace

TEST_CASE("json limits: nesting up to 256 parses, deeper is the caller's code, in both forms") {
  CHECK(peft::parse_json(nested_arrays(peft::kMaxJsonDepth), 99, "t").is_array());
  CHECK(peft::parse_json_ordered(nested_objects(peft::kMaxJsonDepth), 99, "t").is_object());
  for (size_t depth : {peft::kMaxJsonDepth + 1, size_t{100000}, size_t{1000000}}) {
    CAPTURE(depth);
    for (const std::string& text : {nested_arrays(depth), nested_objects(depth)}) {
      const auto [code, message] = error_of([&] { peft::parse_json(text, PEFT_ERR_INVALID_CONFIG, "src"); });
      CHECK(code == PEFT_ERR_INVALID_CONFIG);
      CHECK(contains(message, "src: JSON nested deeper than 256 levels"));
      const auto [ordered_code, ordered_message] =
          error_of([&] { peft::parse_json_ordered(text, PEFT_ERR_INVALID_CHECKPOINT, "src"); });
      CHECK(ordered_code == PEFT_ERR_INVALID_CHECKPOINT);
      CHECK(contains(ordered_message, "nested deeper than 256 levels"));
    }
  }
  // Brackets inside strings are text, not nesting.
  CHECK(peft::parse_json("{\"k\": \"" + std::string(1000, '[') + "\"}", 99, "t").is_object());
}

TEST_CASE("json limits: invalid JSON is the caller's code; ordered objects keep file order, Python's rule for repeats") {
  for (const char* bad : {"", "{", "{\"a\":1,}", "[1 2]", "{\"a\":1} x", "\"\xff\""}) {
    CAPTURE(bad);
    const auto [code, message] = error_of([&] { peft::parse_json_ordered(bad, PEFT_ERR_INVALID_ARGUMENT, "src"); });
    CHECK(code == PEFT_ERR_INVALID_ARGUMENT);
    CHECK(contains(message, "src: invalid JSON ("));
  }
  // json.loads('{"b":1,"a":{"y":1,"x":2,"y":3},"b":[4]}') == {"b": [4], "a": {"y": 3, "x": 2}}
  const auto doc = peft::parse_json_ordered(R"({"b":1,"a":{"y":1,"x":2,"y":3},"b":[4]})", 99, "t");
  CHECK(doc.dump() == R"({"b":[4],"a":{"y":3,"x":2}})");
  CHECK(peft::parse_json(R"({"b":1,"a":2,"b":3})", 99, "t").dump() == R"({"a":2,"b":3})");
  CHECK(peft::parse_json_ordered(R"([1,-2,3.5,"s",true,null,{},[]])", 99, "t").dump() ==
        R"([1,-2,3.5,"s",true,null,{},[]])");
}

TEST_CASE("json limits: every JSON input refuses deep nesting with its own code") {
  for (size_t depth : {size_t{100000}, size_t{1000000}}) {
    CAPTURE(depth);
    const std::string deep = nested_arrays(depth);
    TempDir dir;

    // adapter_config.json (from text, as register_memory passes it, and from a folder's file)
    CHECK(error_of([&] { peft::LoraConfig::parse(R"({"peft_type":"LORA","x":)" + deep + "}", "c"); }).first ==
          PEFT_ERR_INVALID_CONFIG);
    write_file(dir / "adapter_config.json", R"({"peft_type":"LORA","x":)" + deep + "}");
    CHECK(error_of([&] { peft::LoraConfig::from_file(dir / "adapter_config.json"); }).first ==
          PEFT_ERR_INVALID_CONFIG);

    // model.safetensors.index.json
    CHECK(error_of([&] { peft::parse_shard_index(R"({"weight_map":{},"metadata":)" + deep + "}", "i"); }).first ==
          PEFT_ERR_INVALID_CHECKPOINT);
    write_file(dir / "model.safetensors.index.json", R"({"weight_map":{},"metadata":)" + deep + "}");
    CHECK(error_of([&] { peft::Checkpoint::open(dir.path().string()); }).first == PEFT_ERR_INVALID_CHECKPOINT);

    // the base model's config.json
    write_file(dir / "config.json", R"({"model_type":"llama","x":)" + nested_objects(depth) + "}");
    const auto [base_code, base_message] = error_of([&] { peft::BaseModel::open(dir.path().string(), {}); });
    CHECK(base_code == PEFT_ERR_INVALID_CONFIG);
    CHECK(contains(base_message, "config.json: JSON nested deeper"));

    // translation tables
    CHECK(error_of([&] { peft::ArchTable::parse(R"({"_x":)" + deep + "}", "t"); }).first == PEFT_ERR_INVALID_CONFIG);

    // index metadata handed to a sharded writer
    peft::ShardedWriter writer((dir / "out"), 0);
    CHECK(error_of([&] { writer.set_index_metadata_json(R"({"x":)" + deep + "}"); }).first ==
          PEFT_ERR_INVALID_ARGUMENT);
  }
}

// No timing assertion: quadratic parsing (the old ordered_json) took minutes here; linear takes ~1 s.
TEST_CASE("json limits: a 200k-entry shard index and a 300k-key adapter config open in linear time") {
  constexpr size_t kTensors = 200000;
  TempDir dir;
  std::vector<checkpoint_test::F32Tensor> first, second;
  std::string weight_map;
  for (size_t i = 0; i < kTensors; ++i) {
    const std::string name = "model.layers." + std::to_string(i) + ".w";
    const bool in_first = i < kTensors / 2;
    (in_first ? first : second).push_back({name, {static_cast<float>(i)}});
    weight_map += (i ? ",\"" : "\"") + name + "\":\"" + (in_first ? "a" : "b") + ".safetensors\"";
  }
  write_file(dir / "a.safetensors", checkpoint_test::f32_file(first));
  write_file(dir / "b.safetensors", checkpoint_test::f32_file(second));
  write_file(dir / "model.safetensors.index.json", "{\"metadata\":{\"total_size\":800000},\"weight_map\":{" +
                                                       weight_map + "}}");
  const auto ckpt = peft::Checkpoint::open(dir.path().string());
  CHECK(ckpt->tensor_count() == kTensors);
  CHECK(ckpt->find("model.layers.199999.w").has_value());
  CHECK(*ckpt->index_metadata_json() == R"({"total_size":800000})");
  const peft::ShardIndex index = peft::read_shard_index(dir / "model.safetensors.index.json");
  CHECK(index.weight_map.size() == kTensors);
  CHECK(index.weight_map.back().first == "model.layers.199999.w");  // file order
  CHECK(index.shards == std::vector<std::string>{"a.safetensors", "b.safetensors"});

  constexpr size_t kKeys = 300000;
  std::string config = kLoraConfig.substr(0, kLoraConfig.size() - 1);
  for (size_t i = 0; i < kKeys; ++i) config += ", \"extra_" + std::to_string(i) + "\": " + std::to_string(i);
  config += ", \"r\": 8}";  // repeated: the last value, in the first position
  const peft::LoraConfig c = peft::LoraConfig::parse(config, "big");
  CHECK(c.r == 8);
  CHECK(c.document.size() == 4 + kKeys);
  CHECK(std::next(c.document.begin()).key() == "r");
  CHECK(c.document.back() == kKeys - 1);
}

TEST_CASE("text files: only regular files are read; a FIFO, a folder or a device is PEFT_ERR_IO at once") {
  TempDir dir;
  write_file(dir / "ok.json", "{}");
  CHECK(peft::read_text_file(dir / "ok.json", 2) == "{}");
  CHECK(error_of([&] { peft::read_text_file(dir / "ok.json", 1); }).first == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(error_of([&] { peft::read_text_file(dir / "missing.json", 100); }).first == PEFT_ERR_IO);

  REQUIRE(::mkfifo((dir / "fifo.json").c_str(), 0600) == 0);
  for (const std::string& path : {dir / "fifo.json", dir.path().string(), std::string("/dev/zero")}) {
    CAPTURE(path);
    const auto [code, message] = error_of([&] { peft::read_text_file(path, 1 << 20); });
    CHECK(code == PEFT_ERR_IO);
    CHECK(contains(message, "not a regular file"));
  }

  // The callers: an adapter config, a base model config and a translation table that are FIFOs.
  CHECK(error_of([&] { peft::LoraConfig::from_file(dir / "fifo.json"); }).first == PEFT_ERR_IO);
  CHECK(error_of([&] { peft::ArchTable::from_file(dir / "fifo.json"); }).first == PEFT_ERR_IO);
}
