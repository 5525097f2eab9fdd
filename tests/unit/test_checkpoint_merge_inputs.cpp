// What a merge refuses to take from its inputs: side files linked out of the base folder, a
// missing or unusable config.json, and values that make no sense (a LoRA scale beyond the float
// range, merged weights that are infinite, a rank beyond 64 bits).
#include <doctest/doctest.h>

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/bf16.hpp"
#include "core/error.hpp"
#include "core/f16.hpp"
#include "peft/merge/merge_compute.hpp"
#include "test_checkpoint_merge_support.hpp"

using namespace merge_pipeline_test;

namespace {

int32_t merge_code(const std::string& base, const std::string& adapter, const std::string& out,
                   peft::CheckpointMergeOptions options = {}, std::string* message = nullptr) {
  try {
    merge(base, out, {{adapter, 1.0}}, std::move(options));
  } catch (const peft::Error& e) {
    if (message) *message = e.what();
    return e.code();
  }
  return PEFT_OK;
}

// A copy of the llama fixture model in `dir` (weights, config.json, generation_config.json).
void copy_llama(const std::string& dir) {
  fs::create_directories(dir);
  for (const char* name : {"model.safetensors", "config.json", "generation_config.json"})
    fs::copy_file(model("llama") + "/" + name, dir + "/" + name);
}

// llama_lora with adapter_config.json changed by `edit` (given as raw JSON text to keep big numbers).
void write_adapter(const std::string& dir, const std::string& key, const std::string& raw_value) {
  fs::create_directories(dir);
  fs::copy_file(adapter_dir("llama_lora") + "/adapter_model.safetensors", dir + "/adapter_model.safetensors");
  auto config = nlohmann::json::parse(read_file(adapter_dir("llama_lora") + "/adapter_config.json"));
  config[key] = "@@";
  std::string text = config.dump(2);
  text.replace(text.find("\"@@\""), 4, raw_value);
  std::ofstream(dir + "/adapter_config.json") << text;
}

}  // namespace

TEST_CASE("merge inputs: side files linked out of the base folder are refused, links inside it are copied") {
  if (!fixtures_present()) return;
  Scratch s;
  const std::string base = s.path("base"), out = s.path("out");
  copy_llama(base);
  std::ofstream(s.path("secret.txt")) << "not part of the model";
  fs::create_directories(base + "/real");
  std::ofstream(base + "/real/tokenizer.json") << "{\"inside\": true}";
  fs::create_symlink("real/tokenizer.json", base + "/tokenizer.json");
  CHECK(merge_code(base, adapter_dir("llama_lora"), out) == PEFT_OK);
  CHECK(read_file(out + "/tokenizer.json") == "{\"inside\": true}");
  CHECK_FALSE(fs::is_symlink(out + "/tokenizer.json"));

  for (const char* name : {"tokenizer_config.json", "config.json"}) {
    CAPTURE(name);
    Scratch t;
    const std::string b = t.path("base"), o = t.path("out");
    copy_llama(b);
    fs::remove(b + "/" + std::string(name));
    fs::create_symlink(s.path("secret.txt"), b + "/" + std::string(name));
    std::string message;
    CHECK(merge_code(b, adapter_dir("llama_lora"), o, {}, &message) == PEFT_ERR_INVALID_CHECKPOINT);
    CHECK(message.find(name) != std::string::npos);
    CHECK(message.find("outside") != std::string::npos);
    CHECK_FALSE(fs::exists(o));
  }
  {  // A dangling link is refused too.
    Scratch t;
    const std::string b = t.path("base"), o = t.path("out");
    copy_llama(b);
    fs::create_symlink(b + "/nowhere.json", b + "/special_tokens_map.json");
    CHECK(merge_code(b, adapter_dir("llama_lora"), o) == PEFT_ERR_INVALID_CHECKPOINT);
  }
}

TEST_CASE("merge inputs: a hub cache snapshot's links to its repository's blobs are followed, others refused") {
  if (!fixtures_present()) return;
  Scratch s;
  const std::string repo = s.path("models--org--llama");
  const std::string snapshot = repo + "/snapshots/0123abcd";
  fs::create_directories(snapshot);
  fs::create_directories(repo + "/blobs");
  fs::copy_file(model("llama") + "/model.safetensors", snapshot + "/model.safetensors");
  fs::copy_file(model("llama") + "/config.json", repo + "/blobs/c0ffee");
  fs::create_symlink("../../blobs/c0ffee", snapshot + "/config.json");
  std::ofstream(repo + "/blobs/70ce") << "{\"tokenizer\": 1}";
  fs::create_symlink("../../blobs/70ce", snapshot + "/tokenizer.json");
  CHECK(merge_code(snapshot, adapter_dir("llama_lora"), s.path("out")) == PEFT_OK);
  CHECK(read_file(s.path("out/config.json")) == read_file(model("llama") + "/config.json"));
  CHECK(read_file(s.path("out/tokenizer.json")) == "{\"tokenizer\": 1}");

  // A link leaving the repository folder (into another repository of the cache) is refused.
  const std::string other = s.path("models--org--other/blobs");
  fs::create_directories(other);
  std::ofstream(other + "/beef") << "{}";
  fs::create_symlink("../../../models--org--other/blobs/beef", snapshot + "/vocab.json");
  std::string message;
  CHECK(merge_code(snapshot, adapter_dir("llama_lora"), s.path("out2"), {}, &message) == PEFT_ERR_INVALID_CHECKPOINT);
  CHECK(message.find("vocab.json") != std::string::npos);
  CHECK(message.find("hub cache repository folder") != std::string::npos);
}

TEST_CASE("merge inputs: a missing, FIFO or folder config.json fails the merge unless no config is required") {
  if (!fixtures_present()) return;
  struct Case {
    const char* what;
    int32_t code;
  };
  for (const Case& c : {Case{"missing", PEFT_ERR_NOT_FOUND}, Case{"fifo", PEFT_ERR_INVALID_CHECKPOINT},
                        Case{"folder", PEFT_ERR_INVALID_CHECKPOINT}}) {
    CAPTURE(c.what);
    Scratch s;
    const std::string base = s.path("base"), out = s.path("out");
    copy_llama(base);
    fs::remove(base + "/config.json");
    if (std::string(c.what) == "fifo") REQUIRE(::mkfifo((base + "/config.json").c_str(), 0644) == 0);
    if (std::string(c.what) == "folder") fs::create_directory(base + "/config.json");
    std::string message;
    CHECK(merge_code(base, adapter_dir("llama_lora"), out, {}, &message) == c.code);
    CHECK(message.find("config.json") != std::string::npos);
    CHECK_FALSE(fs::exists(out));
    peft::CheckpointMergeOptions options;
    options.require_config = false;
    CHECK(merge_code(base, adapter_dir("llama_lora"), out, options) == PEFT_OK);
    CHECK(fs::exists(out + "/model.safetensors"));
    CHECK_FALSE(fs::exists(out + "/config.json"));
  }
}

TEST_CASE("merge inputs: a LoRA scale beyond the float range and non-finite merged weights are refused") {
  if (!fixtures_present()) return;
  Scratch s;
  const std::string base = model("llama");
  {  // lora_alpha 1e308: the scale itself is no float.
    write_adapter(s.path("huge"), "lora_alpha", "1e308");
    std::string message;
    CHECK(merge_code(base, s.path("huge"), s.path("out1"), {}, &message) == PEFT_ERR_NON_FINITE);
    CHECK(message.find("lora_alpha") != std::string::npos);
    CHECK(message.find("2.5e+307") != std::string::npos);  // 1e308 / r = 4
    CHECK_FALSE(fs::exists(s.path("out1")));
  }
  {  // lora_alpha 4e12: a float scale, but merged weights overflow f16.
    write_adapter(s.path("big"), "lora_alpha", "4e12");
    peft::CheckpointMergeOptions options;
    options.dtype = peft::DType::F16;
    std::string message;
    CHECK(merge_code(base, s.path("big"), s.path("out2"), options, &message) == PEFT_ERR_NON_FINITE);
    CHECK(message.find("merged tensor \"model.layers.") != std::string::npos);
    CHECK(message.find("F16") != std::string::npos);
    CHECK_FALSE(fs::exists(s.path("out2")));
    options.allow_nonfinite = true;
    CHECK(merge_code(base, s.path("big"), s.path("out2"), options) == PEFT_OK);
    auto merged = peft::Checkpoint::open(s.path("out2"));
    bool any_infinite = false;
    for (size_t i = 0; i < merged->tensor_count() && !any_infinite; ++i)
      for (double v : values(*merged, merged->tensor(i).name)) any_infinite = any_infinite || std::isinf(v);
    CHECK(any_infinite);
    // The same adapter into f32 stays finite and merges.
    options = {};
    CHECK(merge_code(base, s.path("big"), s.path("out3"), options) == PEFT_OK);
  }
}

TEST_CASE("merge inputs: the finiteness checks name the first bad element, in every working dtype") {
  // check_finite scans blocks of 4096 elements: bad elements at the edges of a block, alone and
  // after an earlier one, in a tensor whose length is no multiple of the block.
  const uint64_t n = 3 * 4096 + 5;
  struct Case {
    peft::DType work, out;
    std::function<void(uint8_t*, uint64_t, bool)> put;  // element i: a bad value, or an ordinary one
  };
  const auto f32 = [](float bad) {
    return [bad](uint8_t* data, uint64_t i, bool is_bad) {
      const float v = is_bad ? bad : 1.5f;
      std::memcpy(data + 4 * i, &v, 4);
    };
  };
  const auto bits16 = [](uint16_t bad, uint16_t ordinary) {
    return [=](uint8_t* data, uint64_t i, bool is_bad) {
      const uint16_t v = is_bad ? bad : ordinary;
      std::memcpy(data + 2 * i, &v, 2);
    };
  };
  const std::vector<Case> cases = {
      {peft::DType::BF16, peft::DType::BF16, bits16(0xFF80, peft::f32_to_bf16(1.5f))},  // -inf
      {peft::DType::F16, peft::DType::F16, bits16(0x7E00, peft::f32_to_f16(1.5f))},     // NaN
      {peft::DType::F32, peft::DType::F32, f32(INFINITY)},
      {peft::DType::F32, peft::DType::BF16, f32(3.4e38f)},  // finite in f32, an infinity in bf16
      {peft::DType::F32, peft::DType::F16, f32(70000.0f)},  // beyond f16's 65504
      {peft::DType::F64, peft::DType::F64,
       [](uint8_t* data, uint64_t i, bool is_bad) {
         const double v = is_bad ? NAN : 1.5;
         std::memcpy(data + 8 * i, &v, 8);
       }},
  };
  for (const Case& c : cases) {
    const uint64_t width = peft::dtype_bits(c.work) / 8;
    for (const std::vector<uint64_t>& bad : std::vector<std::vector<uint64_t>>{
             {}, {0}, {4095}, {4096}, {8191, 9000}, {n - 1}, {5000, 4097}}) {
      peft::PlannedTensor p;
      p.name = "w";
      p.work_dtype = c.work;
      p.out_dtype = c.out;
      peft::TensorBuffer buffer;
      buffer.reserve(n * width, "the test");
      for (uint64_t i = 0; i < n; ++i) c.put(buffer.data(), i, false);
      for (uint64_t i : bad) c.put(buffer.data(), i, true);
      std::string message;
      int32_t code = PEFT_OK;
      try {
        peft::check_finite(p, buffer);
      } catch (const peft::Error& e) {
        code = e.code();
        message = e.what();
      }
      CAPTURE(peft::dtype_name(c.work));
      CAPTURE(peft::dtype_name(c.out));
      if (bad.empty()) {
        CHECK(code == PEFT_OK);
      } else {
        CHECK(code == PEFT_ERR_NON_FINITE);
        const uint64_t first = *std::min_element(bad.begin(), bad.end());
        CHECK(message.find("(element " + std::to_string(first) + ")") != std::string::npos);
      }
    }
  }
  // The check before a quantizer (f32 values): the same scan, in pieces of 1 Mi values on one or
  // more threads (the first bad value of all, whichever piece is done first).
  constexpr uint64_t Mi = uint64_t{1} << 20;
  const std::vector<std::pair<uint64_t, std::vector<uint64_t>>> scans = {
      {n, {}}, {n, {0}}, {n, {4096}}, {n, {n - 1}}, {n, {9000, 4095}},
      {3 * Mi + 5, {}}, {3 * Mi + 5, {3 * Mi + 4}}, {3 * Mi + 5, {2 * Mi + 7, Mi + 9, 3 * Mi}}, {3 * Mi + 5, {Mi - 1, Mi}}};
  for (const unsigned threads : {1u, 2u, 3u}) {
    for (const auto& scan : scans) {
      const uint64_t count = scan.first;
      const std::vector<uint64_t>& bad = scan.second;
      CAPTURE(threads);
      CAPTURE(count);
      std::vector<float> values(count, 1.5f);
      for (uint64_t i : bad) values[i] = i % 2 ? NAN : -INFINITY;
      std::string message;
      try {
        peft::require_finite_values("w", values.data(), values.size(), threads);
      } catch (const peft::Error& e) {
        CHECK(e.code() == PEFT_ERR_NON_FINITE);
        message = e.what();
      }
      if (bad.empty()) {
        CHECK(message.empty());
      } else {
        const uint64_t first = *std::min_element(bad.begin(), bad.end());
        CHECK(message.find("(element " + std::to_string(first) + ")") != std::string::npos);
      }
    }
  }
}

TEST_CASE("merge inputs: a rank beyond 64 bits is refused as written") {
  if (!fixtures_present()) return;
  Scratch s;
  write_adapter(s.path("a"), "r", "9223372036854775808");
  std::string message;
  CHECK(merge_code(model("llama"), s.path("a"), s.path("out"), {}, &message) == PEFT_ERR_INVALID_CONFIG);
  CHECK(message.find("9223372036854775808") != std::string::npos);
  CHECK(message.find("-9223372036854775808") == std::string::npos);
}
