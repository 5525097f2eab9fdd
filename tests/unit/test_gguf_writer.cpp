// The GGUF writer: its bytes for small cases against hand-computed layouts (the byte-for-byte
// comparison with gguf-py is tests/interop/test_gguf_writer.py), dtype conversions on the way,
// every refusal with its code, and atomicity under injected failures.
#include <doctest/doctest.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/atomic_file.hpp"
#include "core/convert.hpp"
#include "core/error.hpp"
#include "gguf/ggml_type.hpp"
#include "gguf/gguf_writer.hpp"
#include "test_error_support.hpp"
#include "test_writer_support.hpp"

using namespace peft;
using writer_test::HookScope;
using error_test::code_of;
using writer_test::ScratchDir;

namespace {

constexpr uint32_t kF32 = 0, kF16 = 1, kQ8_0 = 8, kI8 = 24, kF64 = 28, kBF16 = 30;

template <class T>
std::string le(T value) {
  std::string out(sizeof value, '\0');
  std::memcpy(out.data(), &value, sizeof value);
  return out;
}
std::string u32(uint32_t v) { return le(v); }
std::string u64(uint64_t v) { return le(v); }
std::string str(const std::string& s) { return u64(s.size()) + s; }
std::string zeros(size_t n) { return std::string(n, '\0'); }

// "GGUF", version 3, the counts.
std::string preamble(uint64_t tensors, uint64_t kvs) { return "GGUF" + u32(3) + u64(tensors) + u64(kvs); }

GgufValue uval(GgufValueType type, uint64_t v) { return {type, v}; }
GgufValue ival(GgufValueType type, int64_t v) { return {type, v}; }
GgufValue fval(GgufValueType type, double v) { return {type, v}; }
GgufValue sval(std::string v) { return {GgufValueType::STRING, std::move(v)}; }
GgufValue bval(bool v) { return {GgufValueType::BOOL, v}; }
GgufValue aval(GgufValueType element, std::vector<GgufValue> items) {
  GgufArray array;
  array.element_type = element;
  for (const GgufValue& item : items) peft::gguf_array_append(array, item);
  return {GgufValueType::ARRAY, std::move(array)};
}

// Writes every tensor of `writer` from `data` (one byte string per tensor, raw) and finishes.
void write_all(GgufWriter& writer, const std::vector<std::string>& data) {
  writer.start();
  for (size_t i = 0; i < writer.tensors().size(); ++i) {
    writer.write_tensor(writer.tensors()[i].name, data[i].data(), data[i].size());
  }
  writer.finish();
}

std::string bytes_of(const std::vector<float>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
}

}  // namespace

TEST_CASE("gguf writer: an empty file is the preamble padded to 32 bytes") {
  ScratchDir dir;
  GgufWriter writer(dir.path("empty.gguf"));
  CHECK(writer.data_start() == 32);
  CHECK(writer.data_size() == 0);
  CHECK(writer.file_size() == 32);
  writer.finish();
  CHECK(writer_test::read_file(dir.path("empty.gguf")) == preamble(0, 0) + zeros(8));
  CHECK(writer_test::temporaries(dir.path()).empty());
}

TEST_CASE("gguf writer: every metadata value type, in the order given") {
  ScratchDir dir;
  GgufWriter writer(dir.path("kv.gguf"));
  writer.add_metadata("u8", uval(GgufValueType::U8, 200));
  writer.add_metadata("i8", ival(GgufValueType::I8, -2));
  writer.add_metadata("u16", uval(GgufValueType::U16, 65535));
  writer.add_metadata("i16", ival(GgufValueType::I16, -300));
  writer.add_metadata("u32", uval(GgufValueType::U32, 4000000000u));
  writer.add_metadata("i32", ival(GgufValueType::I32, -5));
  writer.add_metadata("f32", fval(GgufValueType::F32, 0.1));  // rounded to the nearest float
  writer.add_metadata("bool", bval(true));
  writer.add_metadata("str", sval("héllo"));
  writer.add_metadata("u64", uval(GgufValueType::U64, UINT64_MAX));
  writer.add_metadata("i64", ival(GgufValueType::I64, INT64_MIN));
  writer.add_metadata("f64", fval(GgufValueType::F64, -2.5));
  writer.add_metadata("empty", sval(""));
  writer.add_metadata("no", bval(false));
  writer.finish();

  std::string expected = preamble(0, 14);
  expected += str("u8") + u32(0) + "\xC8";
  expected += str("i8") + u32(1) + "\xFE";
  expected += str("u16") + u32(2) + le<uint16_t>(65535);
  expected += str("i16") + u32(3) + le<int16_t>(-300);
  expected += str("u32") + u32(4) + u32(4000000000u);
  expected += str("i32") + u32(5) + le<int32_t>(-5);
  expected += str("f32") + u32(6) + le(0.1f);
  expected += str("bool") + u32(7) + "\x01";
  expected += str("str") + u32(8) + str("héllo");
  expected += str("u64") + u32(10) + u64(UINT64_MAX);
  expected += str("i64") + u32(11) + le<int64_t>(INT64_MIN);
  expected += str("f64") + u32(12) + le(-2.5);
  expected += str("empty") + u32(8) + u64(0);
  expected += str("no") + u32(7) + std::string(1, '\0');
  expected += zeros((32 - expected.size() % 32) % 32);
  CHECK(writer_test::read_file(dir.path("kv.gguf")) == expected);
}

TEST_CASE("gguf writer: arrays (element type, count, untyped items), nested and empty") {
  ScratchDir dir;
  GgufWriter writer(dir.path("arrays.gguf"));
  writer.add_metadata("tokens", aval(GgufValueType::STRING, {sval("a"), sval("bc")}));
  writer.add_metadata("scores", aval(GgufValueType::F32, {fval(GgufValueType::F32, 1.5), fval(GgufValueType::F32, -1)}));
  writer.add_metadata("nested", aval(GgufValueType::ARRAY, {aval(GgufValueType::U8, {uval(GgufValueType::U8, 7)}),
                                                            aval(GgufValueType::BOOL, {bval(true), bval(false)})}));
  writer.add_metadata("none", aval(GgufValueType::I32, {}));
  writer.finish();

  std::string expected = preamble(0, 4);
  expected += str("tokens") + u32(9) + u32(8) + u64(2) + str("a") + str("bc");
  expected += str("scores") + u32(9) + u32(6) + u64(2) + le(1.5f) + le(-1.0f);
  expected += str("nested") + u32(9) + u32(9) + u64(2) + u32(0) + u64(1) + "\x07" + u32(7) + u64(2) + "\x01" +
              std::string(1, '\0');
  expected += str("none") + u32(9) + u32(5) + u64(0);
  expected += zeros((32 - expected.size() % 32) % 32);
  CHECK(writer_test::read_file(dir.path("arrays.gguf")) == expected);
}

TEST_CASE("gguf writer: tensor infos (ne innermost first), offsets and padding after each tensor") {
  ScratchDir dir;
  GgufWriter writer(dir.path("t.gguf"));
  writer.add_metadata("general.architecture", sval("x"));
  writer.add_tensor("w", kF32, {2, 3});       // 24 bytes, padded to 32
  writer.add_tensor("empty", kF16, {0, 4});   // 0 bytes
  writer.add_tensor("scalar", kI8, {});       // 1 byte, n_dims 0
  writer.add_tensor("q", kQ8_0, {2, 32});     // two blocks of 34 bytes
  REQUIRE(writer.tensors().size() == 4);
  CHECK(writer.tensors()[0].begin == 0);
  CHECK(writer.tensors()[0].end == 24);
  CHECK(writer.tensors()[1].begin == 32);
  CHECK(writer.tensors()[1].end == 32);
  CHECK(writer.tensors()[2].begin == 32);
  CHECK(writer.tensors()[2].end == 33);
  CHECK(writer.tensors()[3].begin == 64);
  CHECK(writer.tensors()[3].end == 132);
  CHECK(writer.data_size() == 160);
  CHECK(writer.tensors()[0].dtype == DType::F32);
  CHECK(!writer.tensors()[0].block_quantized);
  CHECK(writer.tensors()[3].block_quantized);
  CHECK(writer.tensors()[3].ggml_type == static_cast<int32_t>(kQ8_0));

  std::string header = preamble(4, 1) + str("general.architecture") + u32(8) + str("x");
  header += str("w") + u32(2) + u64(3) + u64(2) + u32(kF32) + u64(0);
  header += str("empty") + u32(2) + u64(4) + u64(0) + u32(kF16) + u64(32);
  header += str("scalar") + u32(0) + u32(kI8) + u64(32);
  header += str("q") + u32(2) + u64(32) + u64(2) + u32(kQ8_0) + u64(64);
  header += zeros((32 - header.size() % 32) % 32);
  CHECK(writer.data_start() == header.size());
  const GgufHeader layout = writer.layout();
  CHECK(layout.version == 3);
  CHECK(layout.alignment == 32);
  CHECK(layout.data_start == header.size());
  CHECK(layout.data_size == 160);
  CHECK(layout.metadata.size() == 1);
  CHECK(layout.tensors.size() == 4);

  const std::string w(24, 'w'), s(1, 's'), q(68, 'q');
  write_all(writer, {w, "", s, q});
  const std::string expected = header + w + zeros(8) + s + zeros(31) + q + zeros(28);
  CHECK(writer_test::read_file(dir.path("t.gguf")) == expected);
  CHECK(expected.size() == layout.data_start + layout.data_size);
}

TEST_CASE("gguf writer: general.alignment sets the alignment of the header and of the data") {
  for (uint32_t alignment : {1u, 8u, 64u}) {
    CAPTURE(alignment);
    ScratchDir dir;
    GgufWriter writer(dir.path("a.gguf"));
    writer.add_tensor("a", kI8, {3});
    writer.add_tensor("b", kI8, {5});
    writer.add_metadata("general.alignment", uval(GgufValueType::U32, alignment));  // after the tensors
    CHECK(writer.alignment() == alignment);
    const uint64_t b_begin = (3 + alignment - 1) / alignment * alignment;
    CHECK(writer.tensors()[1].begin == b_begin);
    CHECK(writer.data_size() == (b_begin + 5 + alignment - 1) / alignment * alignment);

    std::string header = preamble(2, 1) + str("general.alignment") + u32(4) + u32(alignment);
    header += str("a") + u32(1) + u64(3) + u32(kI8) + u64(0);
    header += str("b") + u32(1) + u64(5) + u32(kI8) + u64(b_begin);
    header += zeros((alignment - header.size() % alignment) % alignment);
    write_all(writer, {"aaa", "bbbbb"});
    const std::string expected = header + "aaa" + zeros(b_begin - 3) + "bbbbb" +
                                 zeros((alignment - (b_begin + 5) % alignment) % alignment);
    CHECK(writer_test::read_file(dir.path("a.gguf")) == expected);
  }
}

TEST_CASE("gguf writer: tensor bytes streamed in chunks of any size") {
  ScratchDir dir;
  std::string data(100000, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7 + 3);
  GgufWriter writer(dir.path("chunks.gguf"));
  writer.add_tensor("t", kI8, {data.size()});
  writer.start();
  writer.begin_tensor("t");
  size_t done = 0;
  for (size_t step = 1; done < data.size(); step = step * 3 + 1) {
    const size_t n = std::min(step, data.size() - done);
    writer.write(data.data() + done, n);
    done += n;
  }
  writer.finish();
  const std::string file = writer_test::read_file(dir.path("chunks.gguf"));
  const uint64_t start = writer.data_start();
  REQUIRE(file.size() == start + writer.data_size());
  CHECK(file.substr(start, data.size()) == data);
}

TEST_CASE("gguf writer: plain types accept other dtypes, converted in chunks as convert() does") {
  // More elements than one conversion chunk (2^18) so that the loop runs more than once.
  const size_t n = (size_t{1} << 18) + 1000;
  std::vector<float> values(n);
  for (size_t i = 0; i < n; ++i) values[i] = std::sin(static_cast<float>(i)) * 1000.0f + 1e-3f * static_cast<float>(i);
  const std::string f32 = bytes_of(values);
  auto converted = [&](DType dst) {
    std::string out(converted_byte_size(dst, n), '\0');
    convert(DType::F32, values.data(), dst, out.data(), n);
    return out;
  };

  ScratchDir dir;
  GgufWriter writer(dir.path("conv.gguf"));
  writer.add_tensor("f16", kF16, {n});
  writer.add_tensor("bf16", kBF16, {2, n / 2});
  writer.add_tensor("f64", kF64, {n});
  writer.add_tensor("same", kF32, {n});
  writer.add_tensor("from_i32", kF32, {3});
  writer.start();
  writer.write_tensor("f16", DType::F32, f32.data(), f32.size());
  writer.begin_tensor("bf16", DType::F32);
  writer.write(f32.data(), 4 * 1000);  // chunks of whole elements
  writer.write(f32.data() + 4 * 1000, f32.size() - 4 * 1000);
  writer.write_tensor("f64", DType::F32, f32.data(), f32.size());
  writer.write_tensor("same", DType::F32, f32.data(), f32.size());
  const int32_t ints[3] = {-7, 0, 16777217};
  writer.write_tensor("from_i32", DType::I32, ints, sizeof ints);
  writer.finish();

  const std::string file = writer_test::read_file(dir.path("conv.gguf"));
  const uint64_t start = writer.data_start();
  auto data_of = [&](size_t i) {
    const TensorInfo& t = writer.tensors()[i];
    return file.substr(start + t.begin, t.nbytes());
  };
  CHECK(data_of(0) == converted(DType::F16));
  CHECK(data_of(1) == converted(DType::BF16));
  CHECK(data_of(2) == converted(DType::F64));
  CHECK(data_of(3) == f32);
  std::vector<float> from_ints(3);
  convert(DType::I32, ints, DType::F32, from_ints.data(), 3);
  CHECK(data_of(4) == bytes_of(from_ints));
}

TEST_CASE("gguf writer: conversions it refuses") {
  ScratchDir dir;
  GgufWriter writer(dir.path("refuse.gguf"));
  writer.add_tensor("q", kQ8_0, {32});
  writer.add_tensor("i8", kI8, {4});
  writer.add_tensor("f16", kF16, {4});
  writer.start();
  const float f[4] = {1, 2, 3, 4};
  // Block-quantized types take raw bytes only.
  CHECK(code_of([&] { writer.begin_tensor("q", DType::F32); }) == PEFT_ERR_UNSUPPORTED);
  CHECK(code_of([&] { writer.begin_tensor("q", DType::U8); }) == PEFT_ERR_UNSUPPORTED);
  CHECK(code_of([&] { writer.write_tensor("q", DType::F32, f, sizeof f); }) == PEFT_ERR_UNSUPPORTED);
  const std::string q(34, 'q');
  writer.write_tensor("q", q.data(), q.size());
  // convert() makes floats only.
  CHECK(code_of([&] { writer.begin_tensor("i8", DType::F32); }) == PEFT_ERR_UNSUPPORTED);
  writer.write_tensor("i8", DType::I8, "abcd", 4);  // its own dtype: a copy
  CHECK(code_of([&] { writer.begin_tensor("f16", DType::F4); }) == PEFT_ERR_UNSUPPORTED);
  CHECK(code_of([&] { writer.begin_tensor("f16", static_cast<DType>(99)); }) == PEFT_ERR_INVALID_ARGUMENT);
  writer.begin_tensor("f16", DType::F32);
  CHECK(code_of([&] { writer.write(f, 6); }) == PEFT_ERR_INVALID_ARGUMENT);  // partial elements
  writer.write(f, sizeof f);
  writer.finish();
  CHECK(writer.finished());
}

TEST_CASE("gguf writer: declare() copies a header's metadata and tensors (all or nothing)") {
  ScratchDir dir;
  GgufWriter first(dir.path("first.gguf"));
  first.add_metadata("general.alignment", uval(GgufValueType::U32, 16));
  first.add_metadata("list", aval(GgufValueType::STRING, {sval("x"), sval("y")}));
  first.add_tensor("a", kF32, {1, 5});
  first.add_tensor("b", kQ8_0, {64});
  const GgufHeader layout = first.layout();
  const std::vector<std::string> data{std::string(20, 'a'), std::string(68, 'b')};
  write_all(first, data);

  GgufWriter copy(dir.path("copy.gguf"));
  copy.declare(layout);
  CHECK(copy.alignment() == 16);
  CHECK(copy.data_start() == layout.data_start);
  write_all(copy, data);
  CHECK(writer_test::read_file(dir.path("copy.gguf")) == writer_test::read_file(dir.path("first.gguf")));

  GgufHeader bad = layout;
  bad.tensors[1].ggml_type = -1;  // a safetensors TensorInfo
  GgufWriter partial(dir.path("partial.gguf"));
  partial.add_metadata("kept", bval(true));
  CHECK(code_of([&] { partial.declare(bad); }) == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(partial.metadata().size() == 1);
  CHECK(partial.tensors().empty());
  CHECK(partial.alignment() == 32);
  bad.tensors[1].ggml_type = static_cast<int32_t>(kQ8_0);
  bad.metadata.push_back({"kept", bval(false)});  // duplicate of the writer's own key
  CHECK(code_of([&] { partial.declare(bad); }) == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(partial.metadata().size() == 1);
  CHECK(partial.alignment() == 32);
}

TEST_CASE("gguf writer: metadata refusals") {
  ScratchDir dir;
  GgufWriter writer(dir.path("m.gguf"));
  writer.add_metadata("k", bval(true));
  auto add = [&](std::string key, GgufValue value) {
    return code_of([&] { writer.add_metadata(std::move(key), std::move(value)); });
  };
  CHECK(add("k", bval(false)) == PEFT_ERR_INVALID_ARGUMENT);                            // duplicate
  CHECK(add("bad\xFF", bval(false)) == PEFT_ERR_INVALID_ARGUMENT);                      // not UTF-8
  CHECK(add("a", GgufValue{GgufValueType::U8, int64_t{1}}) == PEFT_ERR_INVALID_ARGUMENT);  // wrong alternative
  CHECK(add("a", GgufValue{GgufValueType::STRING, true}) == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(add("a", GgufValue{static_cast<GgufValueType>(13), uint64_t{0}}) == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(add("a", uval(GgufValueType::U8, 256)) == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(add("a", uval(GgufValueType::U16, 65536)) == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(add("a", uval(GgufValueType::U32, uint64_t{1} << 32)) == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(add("a", ival(GgufValueType::I8, -129)) == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(add("a", ival(GgufValueType::I16, 32768)) == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(add("a", ival(GgufValueType::I32, int64_t{INT32_MIN} - 1)) == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(add("a", fval(GgufValueType::F32, 1e39)) == PEFT_ERR_INVALID_ARGUMENT);  // finite, rounds to inf
  CHECK(add("a", fval(GgufValueType::F32, -0x1.ffffffp127)) == PEFT_ERR_INVALID_ARGUMENT);  // the tie: inf
  CHECK_THROWS_AS(aval(GgufValueType::U8, {uval(GgufValueType::U16, 1)}), peft::Error);  // item type
  CHECK_THROWS_AS(aval(GgufValueType::U8, {uval(GgufValueType::U8, 300)}), peft::Error);   // out of range
  GgufArray odd;  // storage that does not hold whole elements
  odd.element_type = GgufValueType::U16;
  odd.raw = {1, 2, 3};
  CHECK(add("a", GgufValue{GgufValueType::ARRAY, odd}) == PEFT_ERR_INVALID_ARGUMENT);
  GgufArray unterminated;  // a string without its NUL
  unterminated.element_type = GgufValueType::STRING;
  unterminated.raw = {'x'};
  unterminated.string_starts() = {0};
  GgufArray nested(GgufValueType::ARRAY);
  nested.arrays() = {unterminated};
  CHECK(add("a", GgufValue{GgufValueType::ARRAY, nested}) == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(add("a", aval(static_cast<GgufValueType>(20), {})) == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(add("general.alignment", ival(GgufValueType::I32, 32)) == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(add("general.alignment", uval(GgufValueType::U64, 32)) == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(add("general.alignment", uval(GgufValueType::U32, 0)) == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(add("general.alignment", uval(GgufValueType::U32, 48)) == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(writer.metadata().size() == 1);  // nothing refused was kept
  CHECK(writer.alignment() == 32);
  // Accepted edge values.
  CHECK(add("inf", fval(GgufValueType::F32, INFINITY)) == PEFT_OK);
  CHECK(add("nan", fval(GgufValueType::F32, NAN)) == PEFT_OK);
  CHECK(add("largest", fval(GgufValueType::F32, 0x1.fffffefffffffp127)) == PEFT_OK);  // rounds to FLT_MAX
  CHECK(add("bytes", sval("\xFF\xFE")) == PEFT_OK);  // STRING values are written as given
  CHECK(add("", bval(true)) == PEFT_OK);
}

TEST_CASE("gguf writer: tensor declaration refusals") {
  ScratchDir dir;
  GgufWriter writer(dir.path("t.gguf"));
  writer.add_tensor("t", kF32, {4});
  auto add = [&](std::string name, uint32_t type, std::vector<uint64_t> shape) {
    return code_of([&] { writer.add_tensor(std::move(name), type, std::move(shape)); });
  };
  CHECK(add("t", kF32, {4}) == PEFT_ERR_INVALID_ARGUMENT);        // duplicate
  CHECK(add("\xC0\xAF", kF32, {4}) == PEFT_ERR_INVALID_ARGUMENT);  // overlong, not UTF-8
  CHECK(add(std::string(64, 'n'), kF32, {4}) == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(add("u", 4, {4}) == PEFT_ERR_INVALID_ARGUMENT);  // removed Q4_2
  CHECK(add("u", 1000, {4}) == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(add("u", kF32, {1, 1, 1, 1, 1}) == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(add("u", kQ8_0, {2, 31}) == PEFT_ERR_INVALID_ARGUMENT);  // innermost not a multiple of 32
  CHECK(add("u", kQ8_0, {}) == PEFT_ERR_INVALID_ARGUMENT);      // a scalar is one element
  CHECK(add("u", kI8, {uint64_t{1} << 63}) == PEFT_ERR_VALIDATION_OVERFLOW);
  CHECK(add("u", kI8, {4, uint64_t{1} << 62}) == PEFT_ERR_VALIDATION_OVERFLOW);
  // A zero does not hide an overflow of the running product (as gguf.cpp counts).
  CHECK(add("u", kI8, {0, 4, uint64_t{1} << 62}) == PEFT_ERR_VALIDATION_OVERFLOW);
  CHECK(add("u", kF64, {uint64_t{1} << 61}) == PEFT_ERR_VALIDATION_OVERFLOW);  // 2^64 bytes
  CHECK(writer.tensors().size() == 1);
  CHECK(add(std::string(63, 'n'), kF32, {4}) == PEFT_OK);
  CHECK(add("zero", kI8, {uint64_t{1} << 62, 0, 4}) == PEFT_OK);

  // Offsets past 2^64: two tensors of almost 2^63 bytes each fit, the padding after the second does not.
  GgufWriter big(dir.path("big.gguf"));
  const uint64_t huge = (uint64_t{1} << 63) - 1;
  big.add_tensor("a", kI8, {huge});
  CHECK(code_of([&] { big.add_tensor("b", kI8, {huge}); }) == PEFT_ERR_VALIDATION_OVERFLOW);
  CHECK(big.tensors().size() == 1);
  // An alignment declared after the tensors that makes the offsets overflow is refused and undone.
  GgufWriter late(dir.path("late.gguf"));
  const uint64_t almost = (uint64_t{1} << 63) - 32;
  late.add_tensor("a", kI8, {almost});
  late.add_tensor("b", kI8, {almost});
  CHECK(code_of([&] { late.add_metadata("general.alignment", uval(GgufValueType::U32, 128)); }) ==
        PEFT_ERR_VALIDATION_OVERFLOW);
  CHECK(late.alignment() == 32);
  CHECK(late.metadata().empty());
  CHECK(late.tensors()[1].begin == almost);
  CHECK(late.data_size() == 2 * almost);
}

TEST_CASE("gguf writer: order and size refusals name the tensor") {
  ScratchDir dir;
  GgufWriter writer(dir.path("o.gguf"));
  writer.add_tensor("first", kI8, {4});
  writer.add_tensor("second", kI8, {2});
  std::string message;
  auto code_and_message = [&](const std::function<void()>& body) {
    try {
      body();
    } catch (const Error& e) {
      message = e.what();
      return e.code();
    }
    return PEFT_OK;
  };
  CHECK(code_and_message([&] { writer.begin_tensor("second"); }) == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(message.find("\"second\" is not next") != std::string::npos);
  CHECK(message.find("\"first\"") != std::string::npos);
  CHECK(code_and_message([&] { writer.begin_tensor("other"); }) == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(message.find("never declared") != std::string::npos);
  CHECK(code_of([&] { writer.write("x", 1); }) == PEFT_ERR_INVALID_ARGUMENT);  // nothing begun
  CHECK(code_and_message([&] { writer.write_tensor("first", "abc", 3); }) == PEFT_ERR_TENSOR_INVALID_INFO);
  CHECK(message.find("\"first\"") != std::string::npos);
  CHECK(code_of([&] { writer.add_tensor("late", kI8, {1}); }) == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(code_of([&] { writer.add_metadata("late", bval(true)); }) == PEFT_ERR_INVALID_ARGUMENT);
  writer.begin_tensor("first");
  writer.write("ab", 2);
  CHECK(code_and_message([&] { writer.write("cde", 3); }) == PEFT_ERR_INVALID_ARGUMENT);  // too many bytes
  CHECK(message.find("\"first\"") != std::string::npos);
  CHECK(code_of([&] { writer.write(nullptr, 1); }) == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(code_and_message([&] { writer.begin_tensor("second"); }) == PEFT_ERR_INVALID_ARGUMENT);  // first open
  CHECK(message.find("\"first\" is incomplete") != std::string::npos);
  CHECK(code_of([&] { writer.finish(); }) == PEFT_ERR_INVALID_ARGUMENT);
  writer.write("cd", 2);
  CHECK(writer.next_tensor() == 1);
  CHECK(code_and_message([&] { writer.finish(); }) == PEFT_ERR_INVALID_ARGUMENT);  // second missing
  CHECK(message.find("\"second\" was never written") != std::string::npos);
  CHECK(!writer.failed());  // refusals of calls change nothing
  writer.write_tensor("second", "ef", 2);
  CHECK(code_of([&] { writer.begin_tensor("third"); }) == PEFT_ERR_INVALID_ARGUMENT);  // all written
  writer.finish();
  CHECK(code_of([&] { writer.finish(); }) == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(code_of([&] { GgufWriter unnamed(""); }) == PEFT_ERR_INVALID_ARGUMENT);
  const std::string file = writer_test::read_file(dir.path("o.gguf"));
  CHECK(file.substr(writer.data_start()) == "abcd" + zeros(28) + "ef" + zeros(30));
}

TEST_CASE("gguf writer: nothing appears at the target until finish()") {
  ScratchDir dir;
  const std::string target = dir.path("out.gguf");
  writer_test::write_file(target, "old bytes");
  {
    GgufWriter writer(target);
    writer.add_tensor("t", kI8, {8});
    writer.start();
    writer.write_tensor("t", "12345678", 8);
    CHECK(writer_test::temporaries(dir.path()).size() == 1);
    CHECK(writer_test::read_file(target) == "old bytes");
  }  // destroyed without finish()
  CHECK(writer_test::read_file(target) == "old bytes");
  CHECK(writer_test::temporaries(dir.path()).empty());

  const std::string fresh = dir.path("fresh.gguf");
  {
    GgufWriter writer(fresh);
    writer.add_tensor("t", kI8, {8});
    writer.start();
    writer.begin_tensor("t");
    writer.write("1234", 4);
    writer.abort();
    CHECK(writer.failed());
    CHECK(code_of([&] { writer.write("5678", 4); }) == PEFT_ERR_INVALID_ARGUMENT);
    CHECK(code_of([&] { writer.finish(); }) == PEFT_ERR_INVALID_ARGUMENT);
  }
  CHECK(writer_test::entries(dir.path()) == std::vector<std::string>{"out.gguf"});
}

TEST_CASE("gguf writer: injected failures leave the target untouched and no temporary") {
  ScratchDir dir;
  const std::string target = dir.path("out.gguf");
  const std::string big(3u << 20, 'x');  // more than the 1 MiB output buffer: several writes
  struct Case {
    testing::FileOp op;
    int error;
    int countdown;
  };
  for (const Case& c : {Case{testing::FileOp::create, EACCES, 1}, Case{testing::FileOp::reserve, ENOSPC, 1},
                        Case{testing::FileOp::write, ENOSPC, 1}, Case{testing::FileOp::write, ENOSPC, 3},
                        Case{testing::FileOp::fsync, EIO, 1}, Case{testing::FileOp::rename, EXDEV, 1}}) {
    CAPTURE(static_cast<int>(c.op));
    CAPTURE(c.countdown);
    writer_test::write_file(target, "old bytes");
    GgufWriter writer(target);
    writer.add_metadata("general.architecture", sval("test"));
    writer.add_tensor("a", kI8, {big.size()});
    writer.add_tensor("b", kI8, {big.size()});
    int32_t code = PEFT_OK;
    {
      HookScope hook(c.op, c.error, c.countdown);
      code = code_of([&] { write_all(writer, {big, big}); });
    }
    CHECK(code == PEFT_ERR_IO);
    CHECK(writer.failed());
    CHECK(code_of([&] { writer.finish(); }) == PEFT_ERR_INVALID_ARGUMENT);
    CHECK(writer_test::read_file(target) == "old bytes");
    CHECK(writer_test::temporaries(dir.path()).empty());
  }
  // Without injection the same writes succeed.
  GgufWriter writer(target);
  writer.add_tensor("a", kI8, {big.size()});
  write_all(writer, {big});
  CHECK(writer_test::read_file(target).size() == writer.file_size());
}

TEST_CASE("gguf writer: a missing output folder fails start() with IO") {
  ScratchDir dir;
  GgufWriter writer(dir.path("no/such/folder/out.gguf"));
  CHECK(code_of([&] { writer.start(); }) == PEFT_ERR_IO);
  CHECK(writer.failed());
  CHECK(writer_test::entries(dir.path()).empty());
}
