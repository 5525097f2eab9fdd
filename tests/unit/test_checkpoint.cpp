// Opening and reading checkpoints: single files (mmap, pread and memory), folders, sharded indexes
// and their path checks, error codes and messages, and every file of the real-world corpus.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "checkpoint_test_support.hpp"
#include "core/convert.hpp"
#include "core/error.hpp"
#include "checkpoint/checkpoint.hpp"
#include "peft_test_paths.h"

namespace fs = std::filesystem;
using namespace checkpoint_test;
using peft::Checkpoint;
using peft::DType;
using peft::OpenOptions;

namespace {

const OpenOptions kMmap{};
const OpenOptions kPread{100'000'000, true};

// Runs body and returns the peft::Error it throws (code 0 and empty message if it throws nothing).
template <class Body>
peft::Error error_of(Body&& body) {
  try {
    body();
  } catch (const peft::Error& e) {
    return e;
  }
  return peft::Error(0, "");
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::vector<std::string> names_of(const Checkpoint& ckpt) {
  std::vector<std::string> names;
  for (size_t i = 0; i < ckpt.tensor_count(); ++i) names.push_back(ckpt.tensor(i).name);
  return names;
}

// A sharded folder: shard "a.safetensors" holds x (1,2) and y (3); "b.safetensors" holds z (4,5,6).
void write_two_shards(const TempDir& dir) {
  write_file(dir / "a.safetensors", f32_file({{"y", {3}}, {"x", {1, 2}}}));
  write_file(dir / "b.safetensors", f32_file({{"z", {4, 5, 6}}}));
}

std::string index_json(const std::string& weight_map, const std::string& extra = "") {
  return "{" + extra + "\"weight_map\":{" + weight_map + "}}";
}

}  // namespace

// ---- single files ---------------------------------------------------------------------------------

TEST_CASE("checkpoint: a single file in mmap, pread and memory modes gives the same tensors") {
  TempDir dir;
  const std::string bytes = f32_file({{"b", {1, 2, 3}}, {"a", {4}}, {"empty", {}}});
  write_file(dir / "one.safetensors", bytes);
  std::vector<std::shared_ptr<const Checkpoint>> opened = {
      Checkpoint::open(dir / "one.safetensors", kMmap), Checkpoint::open(dir / "one.safetensors", kPread),
      Checkpoint::open_memory(bytes.data(), bytes.size())};
  for (const auto& ckpt : opened) {
    REQUIRE(ckpt->file_count() == 1);
    CHECK(names_of(*ckpt) == std::vector<std::string>{"b", "a", "empty"});  // data order
    CHECK(ckpt->find("a") == size_t{1});
    CHECK(!ckpt->find("c").has_value());
    CHECK(ckpt->tensor_file(2) == 0);
    CHECK(!ckpt->index_metadata_json().has_value());
    CHECK(!ckpt->file_metadata(0).has_value());
    CHECK(ckpt->read_f32(0) == std::vector<float>{1, 2, 3});
    CHECK(ckpt->read_f32(1) == std::vector<float>{4});
    CHECK(ckpt->read_f32(2).empty());
    const auto view = ckpt->view(0);
    REQUIRE(view.size() == 12);
    float first;
    std::memcpy(&first, view.data(), 4);
    CHECK(first == 1.0f);
    CHECK(ckpt->view(0).data() == view.data());  // cached in pread mode, the mapping otherwise
    const auto empty = ckpt->view(2);
    CHECK(empty.data() != nullptr);
    CHECK(empty.size() == 0);
    double as_f64[3];
    ckpt->read(0, DType::F64, as_f64, sizeof as_f64);
    CHECK(as_f64[2] == 3.0);
    uint16_t as_bf16[3];
    ckpt->read(0, DType::BF16, as_bf16, sizeof as_bf16);
    CHECK(as_bf16[0] == 0x3f80);
    ckpt->read(2, DType::F32, nullptr, 0);  // zero-size tensor: no buffer needed
  }
  CHECK(opened[0]->file_path(0) == dir / "one.safetensors");
  CHECK(opened[2]->file_path(0) == "<memory>");
}

TEST_CASE("checkpoint: read rejects a wrong buffer size, an unsupported conversion and a bad index") {
  const std::string bytes = f32_file({{"w", {1, 2}}});
  const auto ckpt = Checkpoint::open_memory(bytes.data(), bytes.size());
  float two[2];
  const auto wrong_size = error_of([&] { ckpt->read(0, DType::F32, two, 4); });
  CHECK(wrong_size.code() == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(contains(wrong_size.what(), "\"w\""));
  uint8_t small[2];
  CHECK(error_of([&] { ckpt->read(0, DType::U8, small, 2); }).code() == PEFT_ERR_UNSUPPORTED);
  CHECK(error_of([&] { ckpt->read(1, DType::F32, two, 8); }).code() == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(error_of([&] { ckpt->tensor(1); }).code() == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(error_of([&] { ckpt->view(7); }).code() == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(error_of([&] { ckpt->file_path(1); }).code() == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(error_of([&] { ckpt->file_metadata(1); }).code() == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(error_of([&] { ckpt->gguf_header(1); }).code() == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(ckpt->gguf_header(0) == nullptr);
}

TEST_CASE("checkpoint: large pread conversions are staged in chunks and match the mapped read") {
  TempDir dir;
  std::vector<float> values(3'000'000);  // 12 MB: more than one staging chunk
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) * 0.5f;
  write_file(dir / "big.safetensors", f32_file({{"big", values}}));
  std::vector<double> mapped(values.size()), pread(values.size());
  Checkpoint::open(dir / "big.safetensors", kMmap)->read(0, DType::F64, mapped.data(), mapped.size() * 8);
  Checkpoint::open(dir / "big.safetensors", kPread)->read(0, DType::F64, pread.data(), pread.size() * 8);
  CHECK(mapped == pread);
  CHECK(pread.back() == static_cast<double>(values.back()));
}

TEST_CASE("checkpoint: pread views are read once and shared between threads") {
  TempDir dir;
  std::vector<F32Tensor> tensors;
  for (int t = 0; t < 16; ++t) tensors.push_back({"t" + std::to_string(t), std::vector<float>(1000, float(t))});
  write_file(dir / "many.safetensors", f32_file(tensors));
  const auto ckpt = Checkpoint::open(dir / "many.safetensors", kPread);
  std::vector<std::vector<const uint8_t*>> seen(4, std::vector<const uint8_t*>(16));
  std::vector<std::thread> threads;
  for (int w = 0; w < 4; ++w)
    threads.emplace_back([&, w] {
      for (size_t i = 0; i < 16; ++i) seen[w][i] = ckpt->view(i).data();
    });
  for (auto& thread : threads) thread.join();
  for (int w = 1; w < 4; ++w) CHECK(seen[w] == seen[0]);
  for (size_t i = 0; i < 16; ++i) {
    float value;
    std::memcpy(&value, seen[0][i] + 4 * 999, 4);
    CHECK(value == float(i));
  }
}

TEST_CASE("checkpoint: metadata keeps {} apart from absent and is sorted by key") {
  const std::string with = safetensors_bytes(R"({"__metadata__":{"z":"1","a":"2"}})", "");
  const std::string empty = safetensors_bytes(R"({"__metadata__":{}})", "");
  const std::string none = safetensors_bytes("{}", "");
  const auto a = Checkpoint::open_memory(with.data(), with.size());
  REQUIRE(a->file_metadata(0).has_value());
  CHECK(*a->file_metadata(0) == peft::Metadata{{"a", "2"}, {"z", "1"}});
  const auto b = Checkpoint::open_memory(empty.data(), empty.size());
  CHECK(b->file_metadata(0).has_value());
  CHECK(b->file_metadata(0)->empty());
  const auto c = Checkpoint::open_memory(none.data(), none.size());
  CHECK(!c->file_metadata(0).has_value());
  CHECK(c->tensor_count() == 0);
}

TEST_CASE("checkpoint: format errors keep the parser's code and name the file") {
  TempDir dir;
  struct Case {
    std::string bytes;
    int32_t code;
  };
  const std::vector<Case> cases = {
      {"", PEFT_ERR_HEADER_TOO_SMALL},
      {std::string("\x02\0\0\0", 4), PEFT_ERR_HEADER_TOO_SMALL},
      {std::string("\x10\0\0\0\0\0\0\0{}", 10), PEFT_ERR_INVALID_HEADER_LENGTH},
      {std::string("\x01\xe1\xf5\x05\0\0\0\0", 8), PEFT_ERR_HEADER_TOO_LARGE},  // 100,000,001
      {safetensors_bytes("{", ""), PEFT_ERR_INVALID_HEADER},
      {safetensors_bytes("{}", "xx"), PEFT_ERR_METADATA_INCOMPLETE_BUFFER},
      {safetensors_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", "xxxx"),
       PEFT_ERR_TENSOR_INVALID_INFO},
  };
  for (const OpenOptions& options : {kMmap, kPread}) {
    for (size_t i = 0; i < cases.size(); ++i) {
      const std::string path = dir / ("bad" + std::to_string(i) + ".safetensors");
      write_file(path, cases[i].bytes);
      const auto err = error_of([&] { Checkpoint::open(path, options); });
      CAPTURE(i);
      CHECK(err.code() == cases[i].code);
      CHECK(std::string(err.what()).rfind(path + ": ", 0) == 0);
    }
  }
  const auto in_memory = error_of([&] { Checkpoint::open_memory("", 0); });
  CHECK(in_memory.code() == PEFT_ERR_HEADER_TOO_SMALL);
  CHECK(std::string(in_memory.what()).rfind("<memory>: ", 0) == 0);
}

TEST_CASE("checkpoint: the header cap is configurable") {
  const std::string bytes = safetensors_bytes(R"({"__metadata__":{"k":"a long enough value"}})", "");
  const OpenOptions tight{16, false};
  CHECK(error_of([&] { Checkpoint::open_memory(bytes.data(), bytes.size(), tight); }).code() ==
        PEFT_ERR_HEADER_TOO_LARGE);
  TempDir dir;
  write_file(dir / "m.safetensors", bytes);
  CHECK(error_of([&] { Checkpoint::open(dir / "m.safetensors", OpenOptions{16, true}); }).code() ==
        PEFT_ERR_HEADER_TOO_LARGE);
  CHECK(Checkpoint::open(dir / "m.safetensors", OpenOptions{bytes.size() - 8, true})->tensor_count() == 0);
}

TEST_CASE("checkpoint: a missing or unreadable path is an I/O error naming it and the reason") {
  TempDir dir;
  const auto missing = error_of([&] { Checkpoint::open(dir / "nope.safetensors"); });
  CHECK(missing.code() == PEFT_ERR_IO);
  CHECK(contains(missing.what(), dir / "nope.safetensors"));
  CHECK(contains(missing.what(), std::strerror(ENOENT)));
  if (::geteuid() != 0) {  // root reads anything
    write_file(dir / "locked.safetensors", f32_file({{"w", {1}}}));
    fs::permissions(dir / "locked.safetensors", fs::perms::none);
    const auto locked = error_of([&] { Checkpoint::open(dir / "locked.safetensors"); });
    CHECK(locked.code() == PEFT_ERR_IO);
    CHECK(contains(locked.what(), std::strerror(EACCES)));
  }
  CHECK(error_of([&] { Checkpoint::open("/dev/null"); }).code() == PEFT_ERR_IO);
}

// ---- fixtures made with the reference package -------------------------------------------------

namespace {

bool is_integer_dtype(DType d) {
  switch (d) {
    case DType::BOOL: case DType::U8: case DType::I8: case DType::I16: case DType::U16:
    case DType::I32: case DType::U32: case DType::I64: case DType::U64:
      return true;
    default:
      return false;
  }
}

// Element i of an integer tensor's raw bytes, as C converts it to float (one rounding).
float integer_as_f32(DType d, const uint8_t* p, size_t i) {
  auto load = [&](auto value) {
    std::memcpy(&value, p + i * sizeof value, sizeof value);
    return static_cast<float>(value);
  };
  switch (d) {
    case DType::BOOL: return p[i] != 0 ? 1.0f : 0.0f;
    case DType::U8: return load(uint8_t{});
    case DType::I8: return load(int8_t{});
    case DType::I16: return load(int16_t{});
    case DType::U16: return load(uint16_t{});
    case DType::I32: return load(int32_t{});
    case DType::U32: return load(uint32_t{});
    case DType::I64: return load(int64_t{});
    default: return load(uint64_t{});
  }
}

double json_f64(const nlohmann::json& value) {
  if (value.is_string()) {
    const std::string text = value.get<std::string>();
    if (text == "nan") return std::nan("");
    if (text == "inf") return HUGE_VAL;
    if (text == "-inf") return -HUGE_VAL;
    FAIL("unexpected value string " << text);
    return 0;
  }
  return value.get<double>();
}

bool same_value(double got, double want) {
  if (std::isnan(want)) return std::isnan(got);
  return got == want && std::signbit(got) == std::signbit(want);
}

// Compares tensor i of ckpt with one record of a fixture's JSON description.
void check_against_record(const Checkpoint& ckpt, size_t i, const nlohmann::json& record) {
  const auto& info = ckpt.tensor(i);
  CAPTURE(info.name);
  CHECK(info.name == record["name"].get<std::string>());
  CHECK(peft::dtype_name(info.dtype) == record["dtype"].get<std::string>());
  CHECK(info.shape == record["shape"].get<std::vector<uint64_t>>());
  CHECK(info.begin == record["data_offsets"][0].get<uint64_t>());
  CHECK(info.end == record["data_offsets"][1].get<uint64_t>());
  const auto bytes = ckpt.view(i);
  REQUIRE(bytes.size() == info.nbytes());
  CHECK(sha256_hex(bytes.data(), bytes.size()) == record["sha256"].get<std::string>());
  if (!record.contains("f64") || !peft::can_convert(info.dtype, DType::F64)) return;
  const auto& want = record["f64"];
  REQUIRE(want.size() == static_cast<size_t>(peft::element_count(info)));
  std::vector<double> as_f64(want.size());
  ckpt.read(i, DType::F64, as_f64.data(), as_f64.size() * sizeof(double));
  size_t wrong = 0;
  for (size_t e = 0; e < want.size(); ++e) wrong += !same_value(as_f64[e], json_f64(want[e]));
  CHECK(wrong == 0);
  if (!peft::can_convert(info.dtype, DType::F32)) return;
  const std::vector<float> as_f32 = ckpt.read_f32(i);
  wrong = 0;
  for (size_t e = 0; e < want.size(); ++e) {
    const float expected = is_integer_dtype(info.dtype) ? integer_as_f32(info.dtype, bytes.data(), e)
                                                        : static_cast<float>(json_f64(want[e]));
    wrong += !same_value(as_f32[e], expected);
  }
  CHECK(wrong == 0);
}

void check_against_description(const Checkpoint& ckpt, size_t file, const nlohmann::json& description) {
  const std::optional<peft::Metadata>& file_metadata = ckpt.file_metadata(file);
  const auto& metadata = description["metadata"];
  if (metadata.is_null()) {
    CHECK(!file_metadata.has_value());
  } else {
    REQUIRE(file_metadata.has_value());
    peft::Metadata want;
    for (const auto& [key, value] : metadata.items()) want.emplace_back(key, value.get<std::string>());
    std::sort(want.begin(), want.end());
    CHECK(*file_metadata == want);
  }
  const auto& records = description["tensors"];
  size_t first = 0, count = 0;
  while (first < ckpt.tensor_count() && ckpt.tensor_file(first) != file) ++first;
  while (first + count < ckpt.tensor_count() && ckpt.tensor_file(first + count) == file) ++count;
  REQUIRE(count == records.size());
  for (size_t j = 0; j < records.size(); ++j) check_against_record(ckpt, first + j, records[j]);
}

nlohmann::json read_json(const std::string& path) { return nlohmann::json::parse(read_file(path)); }

}  // namespace

TEST_CASE("checkpoint: every safetensors fixture reads as the reference package reads it") {
  const std::string dir = std::string(PEFT_TEST_DATA) + "/safetensors";
  REQUIRE(fs::is_directory(dir));
  size_t cases = 0;
  for (const auto& item : fs::directory_iterator(dir)) {
    if (item.path().extension() != ".safetensors") continue;
    const std::string path = item.path().string();
    auto description_path = item.path();
    description_path.replace_extension(".json");
    CAPTURE(path);
    REQUIRE(fs::exists(description_path));
    const auto description = read_json(description_path.string());
    const std::string bytes = read_file(path);
    for (const auto& ckpt : {Checkpoint::open(path, kMmap), Checkpoint::open(path, kPread),
                             Checkpoint::open_memory(bytes.data(), bytes.size())}) {
      REQUIRE(ckpt->file_count() == 1);
      check_against_description(*ckpt, 0, description);
    }
    ++cases;
  }
  CHECK(cases >= 5);
}

TEST_CASE("checkpoint: the folder fixtures (transformers and huggingface_hub shards, single file) read as saved") {
  for (const char* name : {"sharded", "sharded_hub", "single"}) {
    const std::string folder = std::string(PEFT_TEST_DATA) + "/safetensors/" + name;
    CAPTURE(folder);
    const auto description = read_json(folder + ".json");
    std::vector<std::string> files;
    for (const auto& [file, unused] : description["files"].items()) files.push_back(file);
    std::sort(files.begin(), files.end());
    for (const OpenOptions& options : {kMmap, kPread}) {
      const auto ckpt = Checkpoint::open(folder, options);
      REQUIRE(ckpt->file_count() == files.size());
      size_t total = 0;
      for (size_t k = 0; k < files.size(); ++k) {
        CHECK(ckpt->file_path(k) == folder + "/" + files[k]);
        check_against_description(*ckpt, k, description["files"][files[k]]);
        total += description["files"][files[k]]["tensors"].size();
      }
      CHECK(ckpt->tensor_count() == total);
      const auto& index = description["index"];
      if (index.is_null()) {
        CHECK(!ckpt->index_metadata_json().has_value());
        continue;
      }
      REQUIRE(ckpt->index_metadata_json().has_value());
      CHECK(nlohmann::json::parse(*ckpt->index_metadata_json()) == index["metadata"]);
      CHECK(index["weight_map"].size() == total);
      for (const auto& [tensor, shard] : index["weight_map"].items()) {
        const auto found = ckpt->find(tensor);
        REQUIRE(found.has_value());
        CHECK(ckpt->file_path(ckpt->tensor_file(*found)) == folder + "/" + shard.get<std::string>());
      }
    }
  }
}

TEST_CASE("checkpoint: every malformed fixture fails with its code, naming the file, in both modes") {
  const std::string dir = std::string(PEFT_TEST_DATA) + "/malformed";
  const auto expected = read_json(dir + "/expected.json");
  REQUIRE(expected.size() >= 30);
  for (const auto& [name, entry] : expected.items()) {
    const std::string path = dir + "/" + name;
    CAPTURE(path);
    const std::string want = entry["code"].get<std::string>();
    for (const OpenOptions& options : {kMmap, kPread}) {
      const auto err = error_of([&] { Checkpoint::open(path, options); });
      CHECK(std::string(peft::code_name(err.code())) == want);
      CHECK(std::string(err.what()).rfind(path + ": ", 0) == 0);
    }
    const std::string bytes = read_file(path);
    CHECK(std::string(peft::code_name(error_of([&] { Checkpoint::open_memory(bytes.data(), bytes.size()); }).code())) == want);
  }
}

// ---- folders --------------------------------------------------------------------------------------

TEST_CASE("checkpoint: a folder opens model.safetensors, or says what it looked for") {
  TempDir dir;
  const auto nothing = error_of([&] { Checkpoint::open(dir.path().string()); });
  CHECK(nothing.code() == PEFT_ERR_INVALID_CHECKPOINT);
  CHECK(contains(nothing.what(), "model.safetensors.index.json"));
  CHECK(contains(nothing.what(), "model.safetensors"));
  write_file(dir / "model.safetensors", f32_file({{"w", {7}}}));
  const auto ckpt = Checkpoint::open(dir.path().string() + "/");
  CHECK(ckpt->file_path(0) == dir / "model.safetensors");
  CHECK(ckpt->read_f32(0) == std::vector<float>{7});
}

TEST_CASE("checkpoint: a sharded folder is numbered shard by shard in sorted name order") {
  TempDir dir;
  write_two_shards(dir);
  // Listed out of order, with metadata whose key order must be kept.
  write_file(dir / "model.safetensors.index.json",
             index_json(R"("z":"b.safetensors","x":"a.safetensors","y":"a.safetensors")",
                        R"("metadata":{"total_size":24,"a":[1,"é"]},)"));
  for (const OpenOptions& options : {kMmap, kPread}) {
    const auto ckpt = Checkpoint::open(dir.path().string(), options);
    REQUIRE(ckpt->file_count() == 2);
    CHECK(ckpt->file_path(0) == dir / "a.safetensors");
    CHECK(ckpt->file_path(1) == dir / "b.safetensors");
    CHECK(names_of(*ckpt) == std::vector<std::string>{"y", "x", "z"});
    CHECK(ckpt->tensor_file(1) == 0);
    CHECK(ckpt->tensor_file(2) == 1);
    CHECK(ckpt->find("z") == size_t{2});
    CHECK(ckpt->read_f32(2) == std::vector<float>{4, 5, 6});
    CHECK(ckpt->index_metadata_json() == std::optional<std::string>(R"({"total_size":24,"a":[1,"é"]})"));
  }
}

TEST_CASE("checkpoint: a tensor in a shard but not in the weight_map is kept, as transformers loads it") {
  TempDir dir;
  write_two_shards(dir);
  write_file(dir / "model.safetensors.index.json", index_json(R"("x":"a.safetensors","z":"b.safetensors")"));
  const auto ckpt = Checkpoint::open(dir.path().string());
  CHECK(ckpt->tensor_count() == 3);
  CHECK(ckpt->find("y").has_value());
  CHECK(!ckpt->index_metadata_json().has_value());
}

TEST_CASE("checkpoint: index errors are INVALID_CHECKPOINT naming the tensor, shard or problem") {
  struct Case {
    std::string name;
    std::string index;
    std::string expected_in_message;
  };
  const std::string other = "{\"weight_map\":{}}";
  const std::vector<Case> cases = {
      {"not json", "{\"weight_map\":", "invalid JSON"},
      {"not an object", "[]", "not a JSON object"},
      {"no weight_map", "{\"metadata\":{}}", "weight_map"},
      {"weight_map not an object", "{\"weight_map\":[]}", "weight_map"},
      {"empty weight_map", "{\"weight_map\":{}}", "names no tensor"},
      {"non-string shard", index_json(R"("x":3)"), "\"x\""},
      {"metadata not an object", index_json(R"("x":"a.safetensors")", R"("metadata":[],)"), "metadata"},
      {"empty name", index_json(R"("x":"")"), "empty"},
      {"dot-dot", index_json(R"("x":"../a.safetensors")"), ".."},
      {"dot-dot inside", index_json(R"("x":"sub/../../a.safetensors")"), ".."},
      {"absolute", index_json(R"("x":"/etc/passwd")"), "absolute"},
      {"missing shard", index_json(R"("x":"c.safetensors")"), "c.safetensors"},
      {"tensor missing from its shard", index_json(R"("w":"a.safetensors")"), "\"w\""},
      {"tensor in another shard", index_json(R"("z":"a.safetensors")"), "\"z\""},
      {"deep json", "{\"weight_map\":{\"x\":\"a.safetensors\"},\"metadata\":{\"d\":" + std::string(300, '[') +
                        std::string(300, ']') + "}}",
       "nested deeper than 256 levels"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.name);
    TempDir dir;
    write_two_shards(dir);
    write_file(dir / "model.safetensors.index.json", c.index);
    const auto err = error_of([&] { Checkpoint::open(dir.path().string()); });
    CHECK(err.code() == PEFT_ERR_INVALID_CHECKPOINT);
    CHECK(contains(err.what(), c.expected_in_message));
  }
}

TEST_CASE("checkpoint: a tensor in two shards is rejected (transformers would let the later shard win)") {
  TempDir dir;
  write_file(dir / "a.safetensors", f32_file({{"x", {1}}}));
  write_file(dir / "b.safetensors", f32_file({{"x", {2}}, {"z", {3}}}));
  write_file(dir / "model.safetensors.index.json", index_json(R"("x":"a.safetensors","z":"b.safetensors")"));
  const auto err = error_of([&] { Checkpoint::open(dir.path().string()); });
  CHECK(err.code() == PEFT_ERR_INVALID_CHECKPOINT);
  CHECK(contains(err.what(), "\"x\""));
  CHECK(contains(err.what(), "b.safetensors"));
}

TEST_CASE("checkpoint: symbolic links may stay inside the folder but not lead out of it") {
  TempDir outside;
  write_file(outside / "secret.safetensors", f32_file({{"x", {1}}}));
  TempDir dir;
  write_file(dir / "real/a.safetensors", f32_file({{"x", {1}}}));
  fs::create_symlink("real/a.safetensors", dir / "inside.safetensors");
  fs::create_symlink(outside / "secret.safetensors", dir / "out.safetensors");
  fs::create_symlink(outside.path(), dir / "outdir");
  fs::create_symlink(dir / "nowhere.safetensors", dir / "dangling.safetensors");

  write_file(dir / "model.safetensors.index.json", index_json(R"("x":"inside.safetensors")"));
  CHECK(Checkpoint::open(dir.path().string())->file_path(0) == dir / "inside.safetensors");
  write_file(dir / "model.safetensors.index.json", index_json(R"("x":"real/a.safetensors")"));
  CHECK(Checkpoint::open(dir.path().string())->read_f32(0) == std::vector<float>{1});

  for (const char* name : {"out.safetensors", "outdir/secret.safetensors", "dangling.safetensors"}) {
    CAPTURE(name);
    write_file(dir / "model.safetensors.index.json", index_json("\"x\":\"" + std::string(name) + "\""));
    const auto err = error_of([&] { Checkpoint::open(dir.path().string()); });
    CHECK(err.code() == PEFT_ERR_INVALID_CHECKPOINT);
    CHECK(contains(err.what(), name));
  }
  // A sibling whose name starts with the folder's name is still outside it.
  const std::string sibling = dir.path().string() + "x";
  fs::create_directories(sibling);
  write_file(sibling + "/s.safetensors", f32_file({{"x", {1}}}));
  fs::create_symlink(sibling + "/s.safetensors", dir / "sib.safetensors");
  write_file(dir / "model.safetensors.index.json", index_json(R"("x":"sib.safetensors")"));
  CHECK(error_of([&] { Checkpoint::open(dir.path().string()); }).code() == PEFT_ERR_INVALID_CHECKPOINT);
  fs::remove_all(sibling);
}

TEST_CASE("checkpoint: a shard's format error names the shard") {
  TempDir dir;
  write_file(dir / "a.safetensors", safetensors_bytes("{}", "junk"));
  write_file(dir / "model.safetensors.index.json", index_json(R"("x":"a.safetensors")"));
  const auto err = error_of([&] { Checkpoint::open(dir.path().string()); });
  CHECK(err.code() == PEFT_ERR_METADATA_INCOMPLETE_BUFFER);
  CHECK(contains(err.what(), dir / "a.safetensors"));
}

// ---- the real-world corpus ------------------------------------------------------------------------

namespace {

struct CorpusEntry {
  std::string path;
  size_t tensors;
  std::vector<std::string> dtypes;
};

// Rows of MANIFEST.md's table: | folder | source | file | arch | r/alpha | dtypes | tensors | sha256 |
std::vector<CorpusEntry> corpus_manifest(const std::string& root) {
  std::vector<CorpusEntry> entries;
  std::istringstream lines(read_file(root + "/MANIFEST.md"));
  for (std::string line; std::getline(lines, line);) {
    std::vector<std::string> cells;
    std::istringstream row(line);
    for (std::string cell; std::getline(row, cell, '|');) {
      const size_t first = cell.find_first_not_of(' '), last = cell.find_last_not_of(' ');
      cells.push_back(first == std::string::npos ? "" : cell.substr(first, last - first + 1));
    }
    if (cells.size() < 9 || !cells[3].ends_with(".safetensors")) continue;
    CorpusEntry entry{root + "/" + cells[1] + "/" + cells[3], std::stoul(cells[7]), {}};
    std::istringstream dtypes(cells[6]);
    for (std::string d; std::getline(dtypes, d, ',');) entry.dtypes.push_back(d);
    entries.push_back(entry);
  }
  return entries;
}

}  // namespace

TEST_CASE("checkpoint: every file of the real corpus opens and every tensor reads, in both modes") {
  const std::string root = PEFT_CORPUS;
  if (!fs::exists(root + "/MANIFEST.md")) {
    MESSAGE("skipped: the real-world corpus is not at " << root);
    return;
  }
  const auto manifest = corpus_manifest(root);
  CHECK(manifest.size() >= 10);
  size_t files = 0, matched = 0;
  for (const auto& item : fs::recursive_directory_iterator(root)) {
    if (item.path().extension() != ".safetensors") continue;
    const std::string path = item.path().string();
    CAPTURE(path);
    ++files;
    const auto mapped = Checkpoint::open(path, kMmap);
    const auto pread = Checkpoint::open(path, kPread);
    REQUIRE(mapped->tensor_count() == pread->tensor_count());
    REQUIRE(mapped->tensor_count() > 0);
    std::vector<std::string> dtypes;
    for (size_t i = 0; i < mapped->tensor_count(); ++i) {
      const auto& info = mapped->tensor(i);
      CHECK(pread->tensor(i).name == info.name);
      CHECK(mapped->find(info.name) == i);
      const auto a = mapped->view(i), b = pread->view(i);
      REQUIRE(a.size() == info.nbytes());
      REQUIRE(b.size() == a.size());
      CHECK(std::memcmp(a.data(), b.data(), a.size()) == 0);
      const std::vector<float> from_map = mapped->read_f32(i), from_file = pread->read_f32(i);
      CHECK(std::memcmp(from_map.data(), from_file.data(), from_map.size() * 4) == 0);
      dtypes.push_back(std::string(peft::dtype_name(info.dtype)));
    }
    std::sort(dtypes.begin(), dtypes.end());
    dtypes.erase(std::unique(dtypes.begin(), dtypes.end()), dtypes.end());
    const auto listed = std::find_if(manifest.begin(), manifest.end(),
                                     [&](const CorpusEntry& e) { return fs::equivalent(e.path, path); });
    if (listed != manifest.end()) {
      ++matched;
      CHECK(mapped->tensor_count() == listed->tensors);
      auto expected = listed->dtypes;
      std::sort(expected.begin(), expected.end());
      CHECK(dtypes == expected);
    }
  }
  CHECK(files >= manifest.size());
  CHECK(matched == manifest.size());
  // A base model folder opens through its model.safetensors.
  const std::string folder = root + "/mozilla-ai__lm-buddy/tests/resources/models/tiny_gpt2";
  if (fs::exists(folder + "/model.safetensors")) CHECK(Checkpoint::open(folder)->tensor_count() > 0);
}
