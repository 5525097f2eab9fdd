// The writer's bytes against the reference's published vectors (safetensors tensor.rs tests and
// bindings/python/tests/test_simple.py), and its refusals.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "core/error.hpp"
#include "safetensors/header_writer.hpp"
#include "safetensors/serde_string.hpp"
#include "safetensors/writer.hpp"
#include "test_writer_support.hpp"

using namespace peft;
using writer_test::le64;
using writer_test::ScratchDir;

namespace {

struct Decl {
  std::string name;
  DType dtype;
  std::vector<uint64_t> shape;
};

// Writes zero-filled tensors in the writer's order and returns the file's bytes.
std::string write_zeros(const std::vector<Decl>& decls, const WriterMetadata& metadata = std::nullopt) {
  ScratchDir dir;
  FileWriter writer(dir.path("out.safetensors"));
  for (const Decl& d : decls) writer.add_tensor(d.name, d.dtype, d.shape);
  if (metadata) {
    writer.set_metadata_present(true);
    for (const auto& [k, v] : *metadata) writer.set_metadata(k, v);
  }
  writer.start();
  for (size_t p = 0; p < writer.tensor_count(); ++p) {
    const TensorDecl& t = writer.tensor_at(p);
    std::vector<uint8_t> zeros(t.nbytes);
    writer.write_tensor(t.name, t.dtype, zeros.data(), zeros.size());
  }
  writer.finish();
  return writer_test::read_file(dir.path("out.safetensors"));
}

int32_t error_code_of(const std::function<void()>& body) {
  try {
    body();
  } catch (const Error& e) {
    return e.code();
  }
  return PEFT_OK;
}

}  // namespace

TEST_CASE("writer format: one I32 tensor matches the reference's vector") {
  const std::string json = R"({"test":{"dtype":"I32","shape":[2,2],"data_offsets":[0,16]}})";
  CHECK(json.size() == 60);
  const std::string expected = le64(64) + json + "    " + std::string(16, '\0');
  CHECK(write_zeros({{"test", DType::I32, {2, 2}}}) == expected);
}

TEST_CASE("writer format: wider dtypes first, then padding to 8") {
  const std::string json =
      R"({"test1":{"dtype":"I32","shape":[2,2],"data_offsets":[0,16]},"test2":{"dtype":"F16","shape":[2,2],"data_offsets":[16,24]}})";
  CHECK(json.size() == 122);
  const std::string expected = le64(128) + json + std::string(6, ' ') + std::string(24, '\0');
  // Declared in the other order: the writer sorts.
  CHECK(write_zeros({{"test2", DType::F16, {2, 2}}, {"test1", DType::I32, {2, 2}}}) == expected);
}

TEST_CASE("writer format: metadata comes first") {
  const std::string json =
      R"({"__metadata__":{"framework":"pt"},"test1":{"dtype":"I32","shape":[2,2],"data_offsets":[0,16]}})";
  CHECK(json.size() == 95);
  const std::string expected = le64(96) + json + " " + std::string(16, '\0');
  CHECK(write_zeros({{"test1", DType::I32, {2, 2}}}, std::map<std::string, std::string>{{"framework", "pt"}}) ==
        expected);
}

TEST_CASE("writer format: empty files, with and without metadata") {
  CHECK(write_zeros({}) == le64(8) + "{}" + std::string(6, ' '));
  const std::string json = R"({"__metadata__":{"framework":"pt"}})";
  CHECK(write_zeros({}, std::map<std::string, std::string>{{"framework", "pt"}}) == le64(40) + json + "     ");
  // Present but empty metadata is its own file (and valid JSON, unlike the reference's edge case).
  CHECK(write_zeros({}, std::map<std::string, std::string>{}) == le64(24) + R"({"__metadata__":{}})" + "     ");
}

TEST_CASE("writer format: scalars, zero-size tensors and F4") {
  CHECK(write_zeros({{"s", DType::F32, {}}}) ==
        le64(56) + R"({"s":{"dtype":"F32","shape":[],"data_offsets":[0,4]}})" + "   " + std::string(4, '\0'));
  const std::string f4 = write_zeros({{"a", DType::F4, {1, 2}}});
  CHECK(f4.substr(0, 8) == le64(56));
  CHECK(f4.substr(8, 56) == std::string(R"({"a":{"dtype":"F4","shape":[1,2],"data_offsets":[0,1]}})") + " ");
  CHECK(f4.size() == 8 + 56 + 1);
  const std::string zero = write_zeros({{"z", DType::F16, {2, 0}}, {"y", DType::F16, {0}}});
  CHECK(zero.find(R"("y":{"dtype":"F16","shape":[0],"data_offsets":[0,0]},"z":{"dtype":"F16","shape":[2,0],"data_offsets":[0,0]})") !=
        std::string::npos);
}

TEST_CASE("writer format: metadata keys sorted by bytes, strings escaped as serde_json does") {
  const std::string bytes = write_zeros({{"q\"\\\x01\x1f\x7f/\xc3\xa9\xf0\x9f\x98\x80\b\t\n\f\r", DType::U8, {1}}},
                                        std::map<std::string, std::string>{{"b", "2"}, {"a", "1"}, {"\xc3\xa9", "x"}, {"Z", "z"}});
  CHECK(bytes.find(R"({"__metadata__":{"Z":"z","a":"1","b":"2","é":"x"},)") == 8);
  CHECK(bytes.find("\"q\\\"\\\\\\u0001\\u001f\x7f/\xc3\xa9\xf0\x9f\x98\x80\\b\\t\\n\\f\\r\":") != std::string::npos);
}

TEST_CASE("writer format: serde string escaping") {
  std::string out;
  json::append_serde_string(out, std::string("a\0b\x1b\"", 5));
  CHECK(out == "\"a\\u0000b\\u001b\\\"\"");
}

TEST_CASE("writer format: refusals") {
  ScratchDir dir;
  FileWriter writer(dir.path("x.safetensors"));
  CHECK(error_code_of([&] { writer.add_tensor("__metadata__", DType::F32, {1}); }) == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(error_code_of([&] { writer.add_tensor("bad\xff", DType::F32, {1}); }) == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(error_code_of([&] { writer.add_tensor("surrogate\xed\xa0\x80", DType::F32, {1}); }) ==
        PEFT_ERR_INVALID_ARGUMENT);
  CHECK(error_code_of([&] { writer.add_tensor("odd", DType::F4, {3}); }) == PEFT_ERR_MISALIGNED_SLICE);
  CHECK(error_code_of([&] { writer.add_tensor("f6", DType::F6_E2M3, {2}); }) == PEFT_ERR_MISALIGNED_SLICE);
  CHECK(error_code_of([&] { writer.add_tensor("huge", DType::F32, {2, 9223372036854775807ull}); }) ==
        PEFT_ERR_VALIDATION_OVERFLOW);
  CHECK(error_code_of([&] { writer.add_tensor("huge", DType::U8, {2, 18446744073709551614ull}); }) ==
        PEFT_ERR_VALIDATION_OVERFLOW);
  CHECK(error_code_of([&] { writer.set_metadata("k", "\xc0\x80"); }) == PEFT_ERR_INVALID_ARGUMENT);
  writer.add_tensor("a", DType::F32, {1});
  CHECK(error_code_of([&] { writer.add_tensor("a", DType::F16, {1}); }) == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(writer.tensor_count() == 1);  // the refused declarations changed nothing
  // Offsets that overflow 64 bits across tensors.
  FileWriter big(dir.path("big.safetensors"));
  for (int i = 0; i < 16; ++i) big.add_tensor("t" + std::to_string(i), DType::U8, {1ull << 60});
  CHECK(error_code_of([&] { big.start(); }) == PEFT_ERR_VALIDATION_OVERFLOW);
  CHECK(writer_test::entries(dir.path()).empty());
}

TEST_CASE("writer format: the header cap is the reference's 100,000,000 bytes") {
  std::vector<TensorDecl> decls{make_tensor_decl("t", DType::U8, {1})};
  // Exactly at the cap is fine, one more byte is not (tested on a small cap, then on the real one).
  const FileLayout small = plan_file(decls, {0}, std::nullopt, "f", 56);
  CHECK(small.prefix.size() == 64);
  CHECK(error_code_of([&] { plan_file(decls, {0}, std::nullopt, "f", 55); }) == PEFT_ERR_HEADER_TOO_LARGE);
  std::map<std::string, std::string> md{{"k", std::string(kMaxHeaderSize, 'x')}};
  CHECK(error_code_of([&] { plan_file(decls, {0}, md, "f"); }) == PEFT_ERR_HEADER_TOO_LARGE);
  ScratchDir dir;
  FileWriter writer(dir.path("x.safetensors"));
  writer.set_metadata("k", std::string(kMaxHeaderSize, 'x'));
  CHECK(error_code_of([&] { writer.start(); }) == PEFT_ERR_HEADER_TOO_LARGE);
  CHECK_FALSE(writer.started());
  CHECK(writer_test::entries(dir.path()).empty());
}
