// Checkpoint folders: huggingface_hub's split rule, shard names, the index text, and the cleanup
// of an older layout.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "checkpoint/checkpoint.hpp"
#include "checkpoint/checkpoint_layout.hpp"
#include "checkpoint/sharded_writer.hpp"
#include "test_writer_support.hpp"

using namespace peft;
using writer_test::ScratchDir;

namespace {

using Shards = std::vector<std::vector<size_t>>;

void write_all(TensorWriter& writer) {
  writer.start();
  for (size_t p = 0; p < writer.tensor_count(); ++p) {
    const TensorDecl& t = writer.tensor_at(p);
    std::vector<uint8_t> bytes(t.nbytes, static_cast<uint8_t>(writer.declaration_at(p) + 1));
    writer.write_tensor(t.name, t.dtype, bytes.data(), bytes.size());
  }
  writer.finish();
}

}  // namespace

TEST_CASE("writer sharded: huggingface_hub's greedy split") {
  // The docstring's example: limit 10, sizes [6,6,2,6,2,2] -> [6], [6+2], [6+2+2].
  CHECK(split_into_shards({6, 6, 2, 6, 2, 2}, 10) == Shards{{0}, {1, 2}, {3, 4, 5}});
  // A tensor over the limit gets its own shard, appended before the shard being filled.
  CHECK(split_into_shards({2, 11, 3, 12, 6}, 10) == Shards{{1}, {3}, {0, 2}, {4}});
  CHECK(split_into_shards({10, 10}, 10) == Shards{{0}, {1}});
  CHECK(split_into_shards({0, 0, 10, 0}, 10) == Shards{{0, 1, 2, 3}});
  CHECK(split_into_shards({}, 10).empty());
  // Forced breaks keep a layout, with or without a limit.
  CHECK(split_into_shards({1, 1, 1, 1}, UINT64_MAX, {2}) == Shards{{0, 1}, {2, 3}});
  CHECK(split_into_shards({1, 1, 1, 1}, 2, {0, 1}) == Shards{{0}, {1, 2}, {3}});
  CHECK(shard_file_name(0, 1) == "model.safetensors");
  CHECK(shard_file_name(1, 3) == "model-00002-of-00003.safetensors");
}

TEST_CASE("writer sharded: files, index and read-back") {
  ScratchDir dir;
  const std::string folder = dir.path("ckpt");  // created by the writer
  ShardedWriter writer(folder, 100);
  writer.add_tensor("z.weight", DType::F32, {10});       // 40
  writer.add_tensor("a.weight", DType::F32, {10});       // 40
  writer.add_tensor("emb\xc3\xa9", DType::F16, {100});   // 200: own shard
  writer.add_tensor("m.bias", DType::BF16, {20});        // 40 -> new shard (40+40+40 > 100)
  writer.set_index_metadata_json(R"({"total_parameters": 170, "total_size": 1})");
  write_all(writer);
  CHECK(writer.shard_names() == std::vector<std::string>{"model-00001-of-00003.safetensors",
                                                          "model-00002-of-00003.safetensors",
                                                          "model-00003-of-00003.safetensors"});
  CHECK(writer_test::entries(folder) ==
        std::vector<std::string>{"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                                 "model-00003-of-00003.safetensors", "model.safetensors.index.json"});
  const std::string index = writer_test::read_file(folder + "/model.safetensors.index.json");
  const std::string expected =
      "{\n"
      "  \"metadata\": {\n"
      "    \"total_parameters\": 170,\n"
      "    \"total_size\": 320\n"
      "  },\n"
      "  \"weight_map\": {\n"
      "    \"a.weight\": \"model-00002-of-00003.safetensors\",\n"
      "    \"emb\\u00e9\": \"model-00001-of-00003.safetensors\",\n"
      "    \"m.bias\": \"model-00003-of-00003.safetensors\",\n"
      "    \"z.weight\": \"model-00002-of-00003.safetensors\"\n"
      "  }\n"
      "}\n";
  CHECK(index == expected);
  auto ck = Checkpoint::open(folder);
  CHECK(ck->tensor_count() == 4);
  CHECK(ck->file_count() == 3);
  for (size_t k = 0; k < ck->file_count(); ++k) {
    REQUIRE(ck->file_metadata(k).has_value());
    CHECK(*ck->file_metadata(k) == Metadata{{"format", "pt"}});
  }
  const auto bytes = ck->view(*ck->find("m.bias"));
  CHECK(bytes.size() == 40);
  CHECK(bytes[0] == 4);
}

TEST_CASE("writer sharded: a new layout replaces an older one") {
  ScratchDir dir;
  const std::string folder = dir.path();
  writer_test::write_file(folder + "/model-00001-of-00005.safetensors", "stale");
  writer_test::write_file(folder + "/model-00005-of-00005.safetensors", "stale");
  writer_test::write_file(folder + "/model.safetensors", "stale");
  writer_test::write_file(folder + "/config.json", "{}");
  writer_test::write_file(folder + "/pytorch_model-00001-of-00002.bin", "other");
  {
    ShardedWriter writer(folder, 8);
    writer.add_tensor("a", DType::F64, {});
    writer.add_tensor("b", DType::F64, {});
    write_all(writer);
  }
  CHECK(writer_test::entries(folder) ==
        std::vector<std::string>{"config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                                 "model.safetensors.index.json", "pytorch_model-00001-of-00002.bin"});
  {  // Back to one file: the index and the shards go.
    ShardedWriter writer(folder, 0);
    writer.add_tensor("a", DType::F64, {});
    writer.add_tensor("b", DType::F64, {});
    write_all(writer);
  }
  CHECK(writer_test::entries(folder) ==
        std::vector<std::string>{"config.json", "model.safetensors", "pytorch_model-00001-of-00002.bin"});
  auto ck = Checkpoint::open(folder);
  CHECK(ck->tensor_count() == 2);
}

TEST_CASE("writer sharded: metadata of shards, refusals") {
  ScratchDir dir;
  ShardedWriter writer(dir.path(), 0);
  CHECK_THROWS_AS(writer.set_index_metadata_json("[1]"), Error);
  CHECK_THROWS_AS(writer.set_index_metadata_json("{"), Error);
  writer.set_metadata_present(false);
  writer.set_metadata("k", "v");
  writer.add_tensor("t", DType::U8, {1});
  write_all(writer);
  CHECK_THROWS_AS(writer.break_shard(), Error);
  auto ck = Checkpoint::open(dir.path());
  CHECK(*ck->file_metadata(0) == Metadata{{"k", "v"}});
}

TEST_CASE("writer sharded: a failed start creates no folder") {
  ScratchDir dir;
  const std::string folder = dir.path("never/created");
  ShardedWriter writer(folder, 0);
  writer.set_metadata("big", std::string(kMaxHeaderSize, 'x'));
  writer.add_tensor("t", DType::U8, {1});
  try {
    writer.start();
    FAIL("start should fail");
  } catch (const Error& e) {
    CHECK(e.code() == PEFT_ERR_HEADER_TOO_LARGE);
  }
  CHECK_FALSE(std::filesystem::exists(dir.path("never")));
  CHECK_FALSE(writer.started());
}
