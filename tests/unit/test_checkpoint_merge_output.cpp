// The merge pipeline's output folder: dtypes and config.json, shard layouts, the other files,
// replacing an older checkpoint, cancellation and progress.
#include <doctest/doctest.h>

#include <algorithm>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "checkpoint/checkpoint_layout.hpp"
#include "checkpoint/sharded_writer.hpp"
#include "test_checkpoint_merge_support.hpp"

using namespace merge_pipeline_test;

namespace {

std::set<std::string> names_in(const std::string& folder) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(folder)) names.insert(e.path().filename().string());
  return names;
}

void write_text(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

// A copy of a fixture model folder, its weights split into shards of at most `max_shard` bytes.
void make_sharded_copy(const std::string& from, const std::string& to, uint64_t max_shard) {
  auto ckpt = peft::Checkpoint::open(from);
  peft::ShardedWriter writer(to, max_shard);
  for (size_t i = 0; i < ckpt->tensor_count(); ++i)
    writer.add_tensor(ckpt->tensor(i).name, ckpt->tensor(i).dtype, ckpt->tensor(i).shape);
  writer.set_index_metadata_json(R"({"total_parameters": 6736})");
  writer.start();
  for (size_t p = 0; p < writer.tensor_count(); ++p)
    writer.write_from_checkpoint(writer.tensor_at(p).name, *ckpt, writer.declaration_at(p));
  writer.finish();
  for (const char* f : {"config.json", "generation_config.json"})
    if (fs::exists(from + "/" + f)) fs::copy_file(from + "/" + f, to + "/" + f);
}

}  // namespace

TEST_CASE("merge pipeline: an output dtype converts float tensors and config.json says so") {
  if (!fixtures_present()) return;
  Scratch dir;
  merge(model("llama"), dir.path("f32"), {{adapter_dir("llama_lora"), 1.0}});
  peft::CheckpointMergeOptions options;
  options.dtype = peft::DType::BF16;
  merge(model("llama"), dir.path("bf16"), {{adapter_dir("llama_lora"), 1.0}}, options);
  auto f32 = peft::Checkpoint::open(dir.path("f32"));
  auto bf16 = peft::Checkpoint::open(dir.path("bf16"));
  REQUIRE(bf16->tensor_count() == f32->tensor_count());
  for (size_t i = 0; i < f32->tensor_count(); ++i) {
    const auto& t = bf16->tensor(i);
    CAPTURE(t.name);
    CHECK(t.dtype == peft::DType::BF16);
    // Computed in f32, rounded once to bf16: exactly the f32 merge converted.
    const auto from = raw(*f32, t.name);
    std::vector<uint8_t> converted(from.size() / 2);
    peft::convert(peft::DType::F32, from.data(), peft::DType::BF16, converted.data(), from.size() / 4);
    CHECK(raw(*bf16, t.name) == converted);
  }
  auto config = nlohmann::json::parse(read_file(dir.path("bf16/config.json")));
  auto original = nlohmann::json::parse(read_file(model("llama") + "/config.json"));
  CHECK(config["dtype"] == "bfloat16");
  config["dtype"] = original["dtype"];
  CHECK(config == original);

  // A bf16 base to f32: merged in f32 from the exact upcast.
  options.dtype = peft::DType::F32;
  merge(model("llama_bf16"), dir.path("up"), {{adapter_dir("llama_bf16_lora"), 1.0}}, options);
  auto up = peft::Checkpoint::open(dir.path("up"));
  auto base = peft::Checkpoint::open(model("llama_bf16"));
  for (size_t i = 0; i < up->tensor_count(); ++i) CHECK(up->tensor(i).dtype == peft::DType::F32);
  CHECK(values(*up, "model.norm.weight") == values(*base, "model.norm.weight"));
  CHECK(nlohmann::json::parse(read_file(dir.path("up/config.json")))["dtype"] == "float32");
}

TEST_CASE("merge pipeline: a size limit reshards like save_pretrained") {
  if (!fixtures_present()) return;
  Scratch dir;
  peft::CheckpointMergeOptions options;
  options.max_shard_size = 8000;
  const auto result = merge(model("llama"), dir.path("out"), {{adapter_dir("llama_lora"), 1.0}}, options);
  const auto index = nlohmann::json::parse(read_file(dir.path("out/model.safetensors.index.json")));
  auto out = peft::Checkpoint::open(dir.path("out"));
  CHECK(out->file_count() > 2);
  CHECK(index["weight_map"].size() == out->tensor_count());
  CHECK(index["metadata"]["total_size"] == result.bytes);
  for (size_t k = 0; k < out->file_count(); ++k)
    CHECK(fs::path(out->file_path(k)).filename() == peft::shard_file_name(k, out->file_count()));
  CHECK(result.files.back() == "generation_config.json");
}

TEST_CASE("merge pipeline: a sharded base keeps its shards, names and index metadata") {
  if (!fixtures_present()) return;
  Scratch dir;
  const std::string base = dir.path("base");
  make_sharded_copy(model("llama"), base, 9000);
  // Shard names of the base's own choosing are kept as they are.
  std::string index_text = read_file(base + "/model.safetensors.index.json");
  auto in = peft::Checkpoint::open(base);
  for (size_t k = 0; k < in->file_count(); ++k) {
    const std::string old_name = fs::path(in->file_path(k)).filename().string();
    const std::string new_name = "part-" + std::string(1, static_cast<char>('a' + k)) + ".safetensors";
    fs::rename(base + "/" + old_name, base + "/" + new_name);
    for (size_t at; (at = index_text.find(old_name)) != std::string::npos;) index_text.replace(at, old_name.size(), new_name);
  }
  write_text(base + "/model.safetensors.index.json", index_text);
  in = peft::Checkpoint::open(base);
  REQUIRE(in->file_count() >= 3);

  merge(base, dir.path("out"), {{adapter_dir("llama_lora"), 1.0}});
  auto out = peft::Checkpoint::open(dir.path("out"));
  REQUIRE(out->file_count() == in->file_count());
  for (size_t i = 0; i < in->tensor_count(); ++i) {
    CHECK(out->tensor(i).name == in->tensor(i).name);
    CHECK(fs::path(out->file_path(out->tensor_file(i))).filename() == fs::path(in->file_path(in->tensor_file(i))).filename());
  }
  const auto index = nlohmann::json::parse(read_file(dir.path("out/model.safetensors.index.json")));
  CHECK(index["metadata"]["total_parameters"] == 6736);
  CHECK(index == nlohmann::json::parse(read_file(base + "/model.safetensors.index.json")));
}

TEST_CASE("merge pipeline: the base folder's small files are copied, weights and subfolders are not") {
  if (!fixtures_present()) return;
  Scratch dir;
  const std::string base = dir.path("base");
  fs::create_directories(base);
  for (const char* f : {"config.json", "generation_config.json", "model.safetensors"})
    fs::copy_file(model("llama") + "/" + f, base + "/" + f);
  write_text(base + "/tokenizer.json", "{\"version\": \"1.0\"}");
  write_text(base + "/README.md", "# a model\n");
  write_text(base + "/pytorch_model.bin", "not copied");
  write_text(base + "/adapter_config.json", "{}");
  write_text(base + "/sub/notes.txt", "not copied");
  merge(base, dir.path("out"), {{adapter_dir("llama_lora"), 1.0}});
  CHECK(names_in(dir.path("out")) == std::set<std::string>{"README.md", "config.json", "generation_config.json",
                                                             "model.safetensors", "tokenizer.json"});
  CHECK(read_file(dir.path("out/tokenizer.json")) == read_file(base + "/tokenizer.json"));
}

TEST_CASE("merge pipeline: an older checkpoint in the output folder is replaced only on success") {
  if (!fixtures_present()) return;
  Scratch dir;
  const std::string out = dir.path("out");
  make_sharded_copy(model("llama"), out, 9000);
  write_text(out + "/notes.txt", "mine");
  const auto before = names_in(out);
  const std::string old_index = read_file(out + "/model.safetensors.index.json");

  // A failing merge (an adapter of another architecture) leaves every file as it was.
  peft::CheckpointMergeOptions bad;
  bad.adapters.push_back({open_adapter(adapter_dir("gpt2_lora")), 1.0});
  CHECK_THROWS_AS(peft::merge_checkpoint(model("llama"), out, bad), peft::Error);
  CHECK(names_in(out) == before);
  CHECK(read_file(out + "/model.safetensors.index.json") == old_index);

  merge(model("llama"), out, {{adapter_dir("llama_lora"), 1.0}});
  CHECK(names_in(out) ==
        std::set<std::string>{"config.json", "generation_config.json", "model.safetensors", "notes.txt"});
  CHECK(read_file(out + "/notes.txt") == "mine");
}

TEST_CASE("merge pipeline: progress runs from 0 to the total, and cancelling leaves nothing") {
  if (!fixtures_present()) return;
  Scratch dir;
  std::vector<std::pair<uint64_t, uint64_t>> calls;
  peft::CheckpointMergeOptions options;
  options.progress = [&](uint64_t done, uint64_t total) {
    calls.emplace_back(done, total);
    return true;
  };
  const auto result = merge(model("llama"), dir.path("out"), {{adapter_dir("llama_lora"), 1.0}}, options);
  REQUIRE(calls.size() >= 22);
  CHECK(calls.front().first == 0);
  CHECK(calls.back().first == result.bytes);
  for (size_t i = 1; i < calls.size(); ++i) {
    CHECK(calls[i].first >= calls[i - 1].first);
    CHECK(calls[i].second == result.bytes);
  }

  for (unsigned threads : {1u, 0u}) {
    for (size_t stop_after : {size_t{1}, size_t{5}, size_t{15}}) {
      size_t count = 0;
      options.threads = threads;
      options.progress = [&](uint64_t, uint64_t) { return ++count < stop_after; };
      try {
        merge(model("llama"), dir.path("cancelled"), {{adapter_dir("llama_dora"), 1.0}}, options);
        FAIL("the merge was not cancelled");
      } catch (const peft::Error& e) {
        CHECK(e.code() == PEFT_ERR_CANCELLED);
      }
      CHECK_FALSE(fs::exists(dir.path("cancelled")));
      // Into an existing folder: nothing of the merge stays behind.
      fs::create_directories(dir.path("existing"));
      write_text(dir.path("existing/keep.txt"), "x");
      count = 0;
      CHECK_THROWS_AS(merge(model("llama"), dir.path("existing"), {{adapter_dir("llama_lora"), 1.0}}, options),
                      peft::Error);
      CHECK(names_in(dir.path("existing")) == std::set<std::string>{"keep.txt"});
    }
  }
}

TEST_CASE("merge pipeline: the output folder cannot be the base folder") {
  if (!fixtures_present()) return;
  try {
    merge(model("llama"), model("llama") + "/", {{adapter_dir("llama_lora"), 1.0}});
    FAIL("merging into the base folder was accepted");
  } catch (const peft::Error& e) {
    CHECK(e.code() == PEFT_ERR_INVALID_ARGUMENT);
  }
}
