// Split GGUF models (gguf/gguf_split): the part names, a model opened as one from any of its parts,
// every refusal of broken parts with its code and the part it names, and merges into a split base:
// the same parts (all or none) or one joined file, equal to the merge into the unsplit model.
// Against llama-gguf-split itself: tests/interop/test_gguf_split_model.py.
#include <doctest/doctest.h>

#include <cerrno>
#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.hpp"
#include "core/error.hpp"
#include "gguf/gguf_split.hpp"
#include "gguf/gguf_writer.hpp"
#include "peft/merge/gguf_merge.hpp"
#include "peft/merge/merge_inputs.hpp"
#include "test_checkpoint_merge_support.hpp"
#include "test_writer_support.hpp"

using namespace peft;

namespace {

namespace fs = std::filesystem;
constexpr uint32_t kF32 = 0;

GgufValue str(const std::string& s) { return {GgufValueType::STRING, s}; }
GgufValue u16(uint64_t v) { return {GgufValueType::U16, v}; }
GgufValue i32(int64_t v) { return {GgufValueType::I32, v}; }
GgufValue f32(double v) { return {GgufValueType::F32, v}; }

struct Tensor {
  std::string name;
  std::vector<uint64_t> shape;  // outermost first
  std::vector<float> values;
};

std::vector<float> ramp(size_t n, float start, float step) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = start + step * static_cast<float>(i % 5) - 0.01f * static_cast<float>(i);
  return v;
}

using Metadata = std::vector<std::pair<std::string, GgufValue>>;

void write_gguf(const std::string& path, const Metadata& metadata, const std::vector<Tensor>& tensors) {
  GgufWriter writer(path);
  for (const auto& [key, value] : metadata) writer.add_metadata(key, value);
  for (const Tensor& t : tensors) writer.add_tensor(t.name, kF32, t.shape);
  for (const Tensor& t : tensors) writer.write_tensor(t.name, t.values.data(), t.values.size() * sizeof(float));
  writer.finish();
}

// The model: one tensor per part, as llama-gguf-split --split-max-tensors 1 cuts it.
std::vector<Tensor> model_tensors() {
  return {{"token_embd.weight", {5, 3}, ramp(15, 0.5f, 0.1f)},
          {"blk.0.attn_v.weight", {4, 3}, ramp(12, -0.3f, 0.05f)},
          {"blk.0.ffn_down.weight", {3, 4}, ramp(12, 0.1f, -0.02f)}};
}

Metadata model_metadata() { return {{"general.architecture", str("llama")}, {"general.name", str("tiny")}}; }

// Part k's metadata as llama-gguf-split writes it: the model's in the first part only, then
// split.no, split.tensors.count, split.count.
Metadata part_metadata(uint32_t k, uint32_t count, int64_t total) {
  Metadata metadata = k == 0 ? model_metadata() : Metadata{};
  metadata.push_back({"split.no", u16(k)});
  metadata.push_back({"split.tensors.count", i32(total)});
  metadata.push_back({"split.count", u16(count)});
  return metadata;
}

struct SplitModel {
  writer_test::ScratchDir dir;
  std::string whole = dir.path("whole.gguf");
  std::string part(uint32_t k) const { return gguf_split_path(dir.path("model"), k, 3); }
  SplitModel() {
    write_gguf(whole, model_metadata(), model_tensors());
    for (uint32_t k = 0; k < 3; ++k) write_part(k, part_metadata(k, 3, 3), {model_tensors()[k]});
  }
  void write_part(uint32_t k, const Metadata& metadata, const std::vector<Tensor>& tensors) const {
    write_gguf(part(k), metadata, tensors);
  }
};

int32_t open_code(const std::string& path, std::string* message) {
  try {
    Checkpoint::open(path);
  } catch (const Error& e) {
    *message = e.what();
    return e.code();
  }
  return PEFT_OK;
}

// A GGUF LoRA on attn_v and ffn_down (parts 2 and 3).
std::string write_lora(const writer_test::ScratchDir& dir) {
  const std::string path = dir.path("lora.gguf");
  write_gguf(path,
             {{"general.architecture", str("llama")}, {"general.type", str("adapter")}, {"adapter.type", str("lora")},
              {"adapter.lora.alpha", f32(2.0)}},
             {{"blk.0.attn_v.weight.lora_a", {2, 3}, ramp(6, 0.3f, -0.05f)},
              {"blk.0.attn_v.weight.lora_b", {4, 2}, ramp(8, 0.05f, 0.02f)},
              {"blk.0.ffn_down.weight.lora_a", {2, 4}, ramp(8, -0.2f, 0.03f)},
              {"blk.0.ffn_down.weight.lora_b", {3, 2}, ramp(6, 0.1f, 0.07f)}});
  return path;
}

CheckpointMergeResult merge_lora(const std::string& base, const std::string& lora, const std::string& out, bool join = false) {
  CheckpointMergeOptions options;
  options.threads = 1;
  options.join_split = join;
  options.adapters = open_merge_inputs({{nullptr, lora, 1.0}}, base);
  return merge_into_gguf(base, out, options);
}

std::vector<std::string> keys(const GgufHeader& header) {
  std::vector<std::string> out;
  for (const GgufKeyValue& kv : header.metadata) out.push_back(kv.key);
  return out;
}

}  // namespace

TEST_CASE("split GGUF names: llama.cpp's -%05d-of-%05d.gguf, taken apart and put back") {
  CHECK(gguf_split_path("/m/model", 0, 3) == "/m/model-00001-of-00003.gguf");
  CHECK(gguf_split_path("x", 99999, 100000) == "x-100000-of-100000.gguf");
  const auto name = parse_gguf_split_name("/m/model-q4-00002-of-00003.gguf");
  REQUIRE(name);
  CHECK(name->prefix == "/m/model-q4");
  CHECK(name->index == 1);
  CHECK(name->count == 3);
  CHECK_FALSE(parse_gguf_split_name("/m/model.gguf"));
  CHECK_FALSE(parse_gguf_split_name("/m/model-00004-of-00003.gguf"));  // part past the count
  CHECK_FALSE(parse_gguf_split_name("/m/model-00000-of-00003.gguf"));  // parts count from 1
  CHECK_FALSE(parse_gguf_split_name("/m/model-1-of-3.gguf"));          // not as llama.cpp writes it
  CHECK_FALSE(parse_gguf_split_name("/m/-00001-of-00003.gguf"));       // no prefix
  CHECK_FALSE(parse_gguf_split_name("model-00001-of-00003.bin"));
  CHECK(gguf_split_output_prefix("/o/merged-00001-of-00003.gguf") == "/o/merged");
  CHECK(gguf_split_output_prefix("/o/merged.gguf") == "/o/merged");
  CHECK(gguf_split_output_prefix("/o/merged") == "/o/merged");
}

TEST_CASE("a split GGUF model opens as one model from any of its parts") {
  SplitModel m;
  for (uint32_t k = 0; k < 3; ++k) {
    const auto ckpt = Checkpoint::open(m.part(k));
    REQUIRE(ckpt->file_count() == 3);
    for (uint32_t p = 0; p < 3; ++p) CHECK(ckpt->file_path(p) == m.part(p));
    REQUIRE(ckpt->tensor_count() == 3);
    const std::vector<Tensor> tensors = model_tensors();
    for (size_t i = 0; i < tensors.size(); ++i) {
      CHECK(ckpt->tensor(i).name == tensors[i].name);
      CHECK(ckpt->tensor_file(i) == i);
      CHECK(ckpt->read_f32(i) == tensors[i].values);
    }
    CHECK(metadata_string(*ckpt->gguf_header(0), "general.name") == "tiny");
  }
  // A file whose split.count is 1, or 0 (a joined file), is a model of its own, whatever its name.
  writer_test::ScratchDir dir;
  for (const uint64_t count : {0, 1}) {
    const std::string path = dir.path("one-00001-of-00002.gguf");
    write_gguf(path, {{"split.no", u16(0)}, {"split.count", u16(count)}, {"split.tensors.count", i32(1)}},
               {model_tensors()[0]});
    CHECK(Checkpoint::open(path)->file_count() == 1);
  }
}

TEST_CASE("broken split GGUF models are refused, naming the part and the reason") {
  std::string message;
  SUBCASE("a missing part") {
    SplitModel m;
    fs::remove(m.part(1));
    for (const uint32_t k : {0u, 2u}) {
      CHECK(open_code(m.part(k), &message) == PEFT_ERR_INVALID_CHECKPOINT);
      CHECK(message.find(m.part(1) + ": part 2 of 3") != std::string::npos);
      CHECK(message.find("is missing") != std::string::npos);
    }
  }
  SUBCASE("a duplicated part (part 1 copied over part 2)") {
    SplitModel m;
    fs::copy_file(m.part(0), m.part(1), fs::copy_options::overwrite_existing);
    CHECK(open_code(m.part(0), &message) == PEFT_ERR_INVALID_CHECKPOINT);
    CHECK(message.find(m.part(1) + " (part 2 of 3): split.no is 0, not 1") != std::string::npos);
  }
  SUBCASE("parts that disagree on the count") {
    SplitModel m;
    m.write_part(2, part_metadata(2, 4, 3), {model_tensors()[2]});
    CHECK(open_code(m.part(0), &message) == PEFT_ERR_INVALID_CHECKPOINT);
    CHECK(message.find(m.part(2) + " (part 3 of 3): split.count is 4") != std::string::npos);
  }
  SUBCASE("a part that disagrees on the tensor total") {
    SplitModel m;
    m.write_part(1, part_metadata(1, 3, 5), {model_tensors()[1]});
    CHECK(open_code(m.part(0), &message) == PEFT_ERR_INVALID_CHECKPOINT);
    CHECK(message.find(m.part(1) + " (part 2 of 3): split.tensors.count is 5") != std::string::npos);
  }
  SUBCASE("parts holding another number of tensors than split.tensors.count") {
    SplitModel m;
    for (uint32_t k = 0; k < 3; ++k) m.write_part(k, part_metadata(k, 3, 4), {model_tensors()[k]});
    CHECK(open_code(m.part(1), &message) == PEFT_ERR_INVALID_CHECKPOINT);
    CHECK(message.find("split.tensors.count is 4, but the 3 parts hold 3 tensors") != std::string::npos);
  }
  SUBCASE("the same tensor in two parts") {
    SplitModel m;
    m.write_part(2, part_metadata(2, 3, 3), {model_tensors()[1]});
    CHECK(open_code(m.part(0), &message) == PEFT_ERR_INVALID_CHECKPOINT);
    CHECK(message.find("(part 3 of 3): tensor \"blk.0.attn_v.weight\" is also in part 2") != std::string::npos);
  }
  SUBCASE("a split key of another type than llama.cpp reads") {
    SplitModel m;
    m.write_part(1, {{"split.no", i32(1)}, {"split.tensors.count", i32(3)}, {"split.count", u16(3)}},
                 {model_tensors()[1]});
    CHECK(open_code(m.part(0), &message) == PEFT_ERR_INVALID_CHECKPOINT);
    CHECK(message.find("split.no is I32, not U16") != std::string::npos);
    m.write_part(1, {{"split.no", u16(1)}, {"split.count", {GgufValueType::U32, uint64_t{3}}}}, {model_tensors()[1]});
    CHECK(open_code(m.part(1), &message) == PEFT_ERR_INVALID_CHECKPOINT);
    CHECK(message.find(m.part(1) + ": split.count is U32, not U16") != std::string::npos);
  }
  SUBCASE("a split key missing") {
    SplitModel m;
    m.write_part(0, {{"split.no", u16(0)}, {"split.count", u16(3)}}, {model_tensors()[0]});
    CHECK(open_code(m.part(1), &message) == PEFT_ERR_INVALID_CHECKPOINT);
    CHECK(message.find("has no split.tensors.count") != std::string::npos);
    m.write_part(2, {{"split.count", u16(3)}}, {model_tensors()[2]});
    CHECK(open_code(m.part(2), &message) == PEFT_ERR_INVALID_CHECKPOINT);
    CHECK(message.find(m.part(2) + ": the part of a split model has no split.no") != std::string::npos);
  }
  SUBCASE("a part whose name does not match its keys") {
    SplitModel m;
    const std::string renamed = m.dir.path("renamed.gguf");
    fs::copy_file(m.part(1), renamed);
    CHECK(open_code(renamed, &message) == PEFT_ERR_INVALID_CHECKPOINT);
    CHECK(message.find("its name must end in \"-00002-of-00003.gguf\"") != std::string::npos);
  }
}

TEST_CASE("a merge into a split GGUF base writes the same parts, or one joined file") {
  SplitModel m;
  const std::string lora = write_lora(m.dir);
  const CheckpointMergeResult whole = merge_lora(m.whole, lora, m.dir.path("whole-merged.gguf"));
  CHECK(whole.merged == 2);

  // The same parts: tensors, metadata and order of each base part; the values of the unsplit merge.
  const CheckpointMergeResult split = merge_lora(m.part(1), lora, m.dir.path("out.gguf"));
  CHECK(split.merged == 2);
  CHECK(split.copied == 1);
  CHECK(split.files == std::vector<std::string>{"out-00001-of-00003.gguf", "out-00002-of-00003.gguf",
                                                "out-00003-of-00003.gguf"});
  const auto expected = Checkpoint::open(m.dir.path("whole-merged.gguf"));
  const auto base = Checkpoint::open(m.part(0));
  const auto out = Checkpoint::open(m.dir.path("out-00003-of-00003.gguf"));
  REQUIRE(out->file_count() == 3);
  for (size_t k = 0; k < 3; ++k) {
    CHECK(keys(*out->gguf_header(k)) == keys(*base->gguf_header(k)));
    CHECK(metadata_count(*out->gguf_header(k), "split.no") == k);
    CHECK(metadata_count(*out->gguf_header(k), "split.count") == 3);
    CHECK(metadata_count(*out->gguf_header(k), "split.tensors.count") == 3);
  }
  REQUIRE(out->tensor_count() == 3);
  for (size_t i = 0; i < 3; ++i) {
    CHECK(out->tensor(i).name == expected->tensor(i).name);
    CHECK(out->tensor_file(i) == i);
    CHECK(out->read_f32(i) == expected->read_f32(i));
  }
  // Out named as a part: the same prefix.
  CHECK(merge_lora(m.part(0), lora, m.dir.path("named-00001-of-00003.gguf")).files.front() == "named-00001-of-00003.gguf");

  // Joined: one file, the first part's metadata with split.count 0 moved last, as llama-gguf-split --merge.
  const CheckpointMergeResult joined = merge_lora(m.part(2), lora, m.dir.path("joined.gguf"), true);
  CHECK(joined.files == std::vector<std::string>{"joined.gguf"});
  const auto one = Checkpoint::open(m.dir.path("joined.gguf"));
  REQUIRE(one->file_count() == 1);
  CHECK(keys(*one->gguf_header(0)) ==
        std::vector<std::string>{"general.architecture", "general.name", "split.no", "split.tensors.count", "split.count"});
  CHECK(metadata_count(*one->gguf_header(0), "split.count") == 0);
  for (size_t i = 0; i < 3; ++i) CHECK(one->read_f32(i) == expected->read_f32(i));
}

TEST_CASE("a failed merge into a split GGUF base leaves no part and no temporary") {
  SplitModel m;
  const std::string lora = write_lora(m.dir);
  const std::vector<std::string> before = writer_test::entries(m.dir.path());
  SUBCASE("cancelled at the last tensor") {
    CheckpointMergeOptions options;
    options.threads = 1;
    options.adapters = open_merge_inputs({{nullptr, lora, 1.0}}, m.part(0));
    options.progress = [](uint64_t done, uint64_t total) { return done < total; };
    CHECK_THROWS_AS(merge_into_gguf(m.part(0), m.dir.path("out.gguf"), options), Error);
  }
  SUBCASE("the second part's rename fails after the first part was renamed") {
    const writer_test::HookScope hook(testing::FileOp::rename, EIO, 2);
    CHECK_THROWS_AS(merge_lora(m.part(0), lora, m.dir.path("out.gguf")), Error);
  }
  CHECK(writer_test::entries(m.dir.path()) == before);
}
