// The strict GGUF header reader (src/gguf/gguf_parser.cpp): valid v3 and v2 files with every value
// type, then one case per check of docs/gguf.md ("Validation") with its code, every truncation of
// a valid file, and the bounds on reads and allocations.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "gguf_test_support.hpp"
#include "peft_c.h"

using namespace gguf_test;

namespace {

constexpr uint32_t kF32 = 0, kF16 = 1, kQ8_0 = 8, kQ4_K = 12, kI8 = 24, kF64 = 28, kBF16 = 30;
constexpr uint32_t tU8 = 0, tI8 = 1, tU16 = 2, tI16 = 3, tU32 = 4, tI32 = 5, tF32 = 6, tBOOL = 7, tSTRING = 8,
                   tARRAY = 9, tU64 = 10, tI64 = 11, tF64 = 12;

std::string f32(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return u32(bits);
}
std::string f64(double d) {
  uint64_t bits;
  std::memcpy(&bits, &d, 8);
  return u64(bits);
}

// A file with one value of every type, arrays of numbers and of strings, an alignment of 64 and
// tensors of plain and block-quantized types (a scalar and a zero-size one among them).
Builder every_type(uint32_t version) {
  Builder b;
  b.version = version;
  b.alignment = 64;
  b.kv("general.alignment", tU32, u32(64))
      .kv("v.u8", tU8, "\xfe")
      .kv("v.i8", tI8, "\xfe")
      .kv("v.u16", tU16, std::string("\x34\x12", 2))
      .kv("v.i16", tI16, std::string("\xfe\xff", 2))
      .kv("v.u32", tU32, u32(4000000000u))
      .kv("v.i32", tI32, u32(static_cast<uint32_t>(-5)))
      .kv("v.f32", tF32, f32(1.5f))
      .kv("v.bool", tBOOL, std::string("\x01", 1))
      .kv_string("v.string", "h\xc3\xa9llo")
      .kv("v.u64", tU64, u64(UINT64_MAX))
      .kv("v.i64", tI64, u64(static_cast<uint64_t>(INT64_MIN)))
      .kv("v.f64", tF64, f64(-0.25))
      .kv("a.i32", tARRAY, u32(tI32) + u64(3) + u32(1) + u32(static_cast<uint32_t>(-2)) + u32(3))
      .kv("a.string", tARRAY, u32(tSTRING) + u64(3) + str("a") + str("") + str("\xff\xfe not utf-8"))
      .kv("a.empty", tARRAY, u32(tF32) + u64(0))
      .kv("a.bool", tARRAY, u32(tBOOL) + u64(2) + std::string("\x00\x01", 2));
  b.tensor("blk.0.w", {3, 2}, kF32)
      .tensor("blk.0.q", {64, 2}, kQ8_0)
      .tensor("scalar", {}, kF16)
      .tensor("empty", {4, 0}, kBF16)
      .tensor("k", {256, 1, 1, 2}, kQ4_K)
      .tensor("", {5}, kI8);
  return b;
}

template <class T>
T value_of(const peft::GgufHeader& h, const std::string& key) {
  for (const auto& kv : h.metadata) {
    if (kv.key == key) return std::get<T>(kv.value.data);
  }
  FAIL("no key " << key);
  return T{};
}

std::string message_of(const std::string& file, uint64_t max_header = 100'000'000) {
  std::string message;
  outcome(file, max_header, &message);
  return message;
}

}  // namespace

TEST_CASE("gguf parser: a v3 file with every value type and several tensor types") {
  const Builder b = every_type(3);
  const std::string file = b.build();
  const peft::GgufHeader h = parse(file);
  CHECK(h.version == 3);
  CHECK(h.alignment == 64);
  CHECK(h.data_start == (b.header().size() + 63) / 64 * 64);
  CHECK(h.data_start % 64 == 0);
  CHECK(h.data_size == b.data_size);
  CHECK(h.data_start + h.data_size == file.size());

  REQUIRE(h.metadata.size() == 17);
  CHECK(h.metadata[0].key == "general.alignment");  // file order
  CHECK(h.metadata[16].key == "a.bool");
  CHECK(value_of<uint64_t>(h, "general.alignment") == 64);
  CHECK(value_of<uint64_t>(h, "v.u8") == 254);
  CHECK(value_of<int64_t>(h, "v.i8") == -2);
  CHECK(value_of<uint64_t>(h, "v.u16") == 0x1234);
  CHECK(value_of<int64_t>(h, "v.i16") == -2);
  CHECK(value_of<uint64_t>(h, "v.u32") == 4000000000u);
  CHECK(value_of<int64_t>(h, "v.i32") == -5);
  CHECK(value_of<double>(h, "v.f32") == 1.5);
  CHECK(value_of<bool>(h, "v.bool"));
  CHECK(value_of<std::string>(h, "v.string") == "h\xc3\xa9llo");
  CHECK(value_of<uint64_t>(h, "v.u64") == UINT64_MAX);
  CHECK(value_of<int64_t>(h, "v.i64") == INT64_MIN);
  CHECK(value_of<double>(h, "v.f64") == -0.25);
  CHECK(h.metadata[13].value.type == peft::GgufValueType::ARRAY);
  const auto ints = value_of<peft::GgufArray>(h, "a.i32");
  CHECK(ints.element_type == peft::GgufValueType::I32);
  REQUIRE(ints.size() == 3);
  CHECK(ints.raw.size() == 12);  // the file's bytes
  CHECK(std::get<int64_t>(ints.at(1).data) == -2);
  CHECK(ints.at(1).type == peft::GgufValueType::I32);
  CHECK(std::get<int64_t>(ints.at(2).data) == 3);
  const auto strings = value_of<peft::GgufArray>(h, "a.string");
  CHECK(strings.element_type == peft::GgufValueType::STRING);
  REQUIRE(strings.size() == 3);
  CHECK(strings.string_at(0) == "a");
  CHECK(strings.string_at(1).empty());
  CHECK(strings.string_at(2) == "\xff\xfe not utf-8");  // values are bytes
  for (size_t k = 0; k < 3; ++k) CHECK(strings.string_at(k).data()[strings.string_at(k).size()] == '\0');
  CHECK(std::get<std::string>(strings.at(0).data) == "a");
  CHECK(strings.at(2).type == peft::GgufValueType::STRING);
  CHECK(value_of<peft::GgufArray>(h, "a.empty").empty());
  CHECK(value_of<peft::GgufArray>(h, "a.empty").element_type == peft::GgufValueType::F32);
  const auto bools = value_of<peft::GgufArray>(h, "a.bool");
  REQUIRE(bools.size() == 2);
  CHECK_FALSE(std::get<bool>(bools.at(0).data));
  CHECK(std::get<bool>(bools.at(1).data));

  REQUIRE(h.tensors.size() == 6);
  const peft::TensorInfo& w = h.tensors[0];
  CHECK(w.name == "blk.0.w");
  CHECK(w.shape == std::vector<uint64_t>{2, 3});  // ne reversed
  CHECK(w.dtype == peft::DType::F32);
  CHECK(w.ggml_type == 0);
  CHECK_FALSE(w.block_quantized);
  CHECK(w.begin == 0);
  CHECK(w.end == 24);
  const peft::TensorInfo& q = h.tensors[1];
  CHECK(q.shape == std::vector<uint64_t>{2, 64});
  CHECK(q.block_quantized);
  CHECK(q.dtype == peft::DType::U8);
  CHECK(q.ggml_type == 8);
  CHECK(q.begin == 64);  // 24 bytes padded to 64
  CHECK(q.nbytes() == 2 * 2 * 34);  // 2 rows of 2 blocks
  CHECK(h.tensors[2].shape.empty());
  CHECK(h.tensors[2].nbytes() == 2);
  CHECK(h.tensors[2].dtype == peft::DType::F16);
  CHECK(h.tensors[3].shape == std::vector<uint64_t>{0, 4});
  CHECK(h.tensors[3].nbytes() == 0);
  CHECK(h.tensors[3].dtype == peft::DType::BF16);
  CHECK(h.tensors[4].shape == std::vector<uint64_t>{2, 1, 1, 256});
  CHECK(h.tensors[4].nbytes() == 2 * 144);
  CHECK(h.tensors[5].name.empty());
  CHECK(h.tensors[5].dtype == peft::DType::I8);
  CHECK(h.tensors[5].end == h.data_size - 64 + 5);
}

TEST_CASE("gguf parser: version 2 reads as version 3 (this gguf.cpp reads both alike)") {
  const peft::GgufHeader v2 = parse(every_type(2).build());
  const peft::GgufHeader v3 = parse(every_type(3).build());
  CHECK(v2.version == 2);
  CHECK(v2.metadata.size() == v3.metadata.size());
  CHECK(v2.tensors.size() == v3.tensors.size());
  CHECK(v2.data_start == v3.data_start);
  CHECK(v2.data_size == v3.data_size);
}

TEST_CASE("gguf parser: defaults, an empty file header, alignment 1, no trailing padding") {
  Builder empty;
  const peft::GgufHeader e = parse(empty.build());
  CHECK(e.alignment == 32);
  CHECK(e.metadata.empty());
  CHECK(e.tensors.empty());
  CHECK(e.data_start == 32);
  CHECK(e.data_size == 0);
  // Without tensors the padding may be missing (llama.cpp reads none); data_start stays in the file.
  CHECK(parse(empty.header()).data_start == 24);

  Builder one;
  one.alignment = 1;
  one.kv_u32("general.alignment", 1).tensor("t", {3}, kI8).tensor("u", {1}, kI8);
  const peft::GgufHeader h = parse(one.build());
  CHECK(h.alignment == 1);
  CHECK(h.tensors[1].begin == 3);
  CHECK(h.data_size == 4);

  // The padding after the last tensor may be missing: every tensor's bytes are still in the file.
  Builder b;
  b.tensor("a", {3}, kF32);
  std::string file = b.build();
  CHECK(parse(file).data_size == 32);
  file.resize(file.size() - 20);
  CHECK(outcome(file) == "OK");
  file.pop_back();
  CHECK(outcome(file) == "METADATA_INCOMPLETE_BUFFER");
  // Bytes after the data section are allowed, as in llama.cpp and gguf-py.
  CHECK(outcome(b.build() + "trailing") == "OK");
}

TEST_CASE("gguf parser: the fixed part, magic and version") {
  for (size_t n : {0, 1, 4, 8, 23}) {
    CHECK(outcome(Builder().build().substr(0, n)) == "HEADER_TOO_SMALL");
  }
  CHECK(outcome(std::string(23, 'x')) == "HEADER_TOO_SMALL");
  Builder b;
  b.magic = "GGML";
  CHECK(outcome(b.build()) == "INVALID_HEADER");
  CHECK(message_of(b.build()).find("\"GGML\"") != std::string::npos);
  b.magic = std::string("\0\0\0\0", 4);
  CHECK(outcome(b.build()) == "INVALID_HEADER");

  for (uint32_t version : {0u, 1u, 4u, 0xFFFFFFFFu, 0x03000000u, 0x02000000u, 0x00010000u}) {
    CAPTURE(version);
    Builder v;
    v.version = version;
    CHECK(outcome(v.build()) == "UNSUPPORTED");
  }
  Builder be;
  be.version = 0x03000000u;
  CHECK(message_of(be.build()).find("big-endian") != std::string::npos);
  CHECK(message_of(be.build()).find("version 3") != std::string::npos);
  Builder v1;
  v1.version = 1;
  CHECK(message_of(v1.build()).find("version 1") != std::string::npos);
}

TEST_CASE("gguf parser: counts that cannot fit in the file are refused before anything is read for them") {
  for (uint64_t count : {uint64_t{1}, uint64_t{1000}, uint64_t{1} << 40, uint64_t{1} << 63, UINT64_MAX}) {
    CAPTURE(count);
    Builder kv;
    kv.kv_count = count;
    CHECK(outcome(kv.build()) == "INVALID_HEADER_LENGTH");
    Builder t;
    t.tensor_count = count;
    CHECK(outcome(t.build()) == "INVALID_HEADER_LENGTH");
  }
  // Counts that fit separately but not together.
  Builder both;
  both.kv_count = 2;
  both.tensor_count = 1;
  const std::string file = both.header() + std::string(2 * 14 + 24 - 1, '\0');
  CHECK(outcome(file) == "INVALID_HEADER_LENGTH");
  // One KV pair more than the file holds: read until the end.
  Builder more;
  more.kv_u32("a", 1).kv_u32("b", 2);
  more.kv_count = 3;
  CHECK(outcome(more.header() + std::string(14, 'z')) == "INVALID_HEADER_LENGTH");
}

TEST_CASE("gguf parser: keys") {
  CHECK(outcome(Builder().kv_u32("", 1).build()) == "INVALID_HEADER");
  CHECK(outcome(Builder().kv_u32("a\xff", 1).build()) == "INVALID_HEADER_UTF8");
  CHECK(outcome(Builder().kv_u32("\xed\xa0\x80", 1).build()) == "INVALID_HEADER_UTF8");  // a surrogate
  CHECK(outcome(Builder().kv_u32("\xc0\xaf", 1).build()) == "INVALID_HEADER_UTF8");      // overlong
  CHECK(outcome(Builder().kv_u32("caf\xc3\xa9", 1).build()) == "OK");
  const std::string dup = Builder().kv_u32("a", 1).kv_string("b", "x").kv_string("a", "y").build();
  CHECK(outcome(dup) == "INVALID_HEADER");
  CHECK(message_of(dup).find("duplicate key \"a\"") != std::string::npos);
  CHECK(message_of(dup).find("first at byte 24") != std::string::npos);
  // A key longer than the file.
  Builder b;
  b.kvs = u64(1000) + "abc";
  b.n_kv = 1;
  CHECK(outcome(b.header()) == "INVALID_HEADER_LENGTH");
  b.kvs = u64(UINT64_MAX) + std::string(20, 'k');
  CHECK(outcome(b.header()) == "INVALID_HEADER_LENGTH");
}

TEST_CASE("gguf parser: value types, arrays and strings") {
  for (uint32_t type : {13u, 99u, 0x80000000u, UINT32_MAX}) {
    CAPTURE(type);
    CHECK(outcome(Builder().kv("k", type, u64(0)).build()) == "INVALID_HEADER");
    CHECK(outcome(Builder().kv("k", tARRAY, u32(type) + u64(0)).build()) == "INVALID_HEADER");
  }
  // Nested arrays: gguf.cpp refuses them (gguf-py would read them).
  const std::string nested = Builder().kv("k", tARRAY, u32(tARRAY) + u64(1) + u32(tU8) + u64(1) + "x").build();
  CHECK(outcome(nested) == "INVALID_HEADER");
  CHECK(message_of(nested).find("nested") != std::string::npos);
  // An array count times its element size past the end of the file.
  CHECK(outcome(Builder().kv("k", tARRAY, u32(tU64) + u64(5) + u64(1)).build()) == "INVALID_HEADER_LENGTH");
  CHECK(outcome(Builder().kv("k", tARRAY, u32(tU64) + u64(uint64_t{1} << 61)).build()) == "INVALID_HEADER_LENGTH");
  CHECK(outcome(Builder().kv("k", tARRAY, u32(tSTRING) + u64(UINT64_MAX / 8 + 1)).build()) ==
        "INVALID_HEADER_LENGTH");
  CHECK(outcome(Builder().kv("k", tARRAY, u32(tSTRING) + u64(3) + str("a") + u64(1 << 20)).build()) ==
        "INVALID_HEADER_LENGTH");
  // A string value past the end of the file; a string value that is not UTF-8 is kept as bytes.
  CHECK(outcome(Builder().kv("k", tSTRING, u64(100) + "short").build()) == "INVALID_HEADER_LENGTH");
  CHECK(outcome(Builder().kv("k", tSTRING, str("\xc3")).build()) == "OK");
  // A scalar cut by the end of the file.
  Builder cut;
  cut.kv("k", tU64, "abc");
  CHECK(outcome(cut.header()) == "INVALID_HEADER_LENGTH");
  // A stored bool other than 0 and 1 is refused, naming the key (it would be written back as 1).
  CHECK(outcome(Builder().kv("k", tBOOL, "\x07").build()) == "INVALID_HEADER");
  CHECK(outcome(Builder().kv("k", tBOOL, "\x02").build()) == "INVALID_HEADER");
  CHECK(message_of(Builder().kv("flag", tBOOL, "\x02").build()).find("key \"flag\"") != std::string::npos);
  CHECK(message_of(Builder().kv("flag", tBOOL, "\x02").build()).find("is 2, not a bool (0 or 1)") !=
        std::string::npos);
  CHECK(outcome(Builder().kv("k", tBOOL, "\x01").build()) == "OK");
}

TEST_CASE("gguf parser: a bool array element other than 0 and 1 is refused") {
  const std::string file = Builder().kv("flags", tARRAY, u32(tBOOL) + u64(3) + std::string("\x00\x01\xff", 3)).build();
  CHECK(outcome(file) == "INVALID_HEADER");
  const std::string message = message_of(file);
  CHECK(message.find("key \"flags\"") != std::string::npos);
  CHECK(message.find("element 2 of the bool array") != std::string::npos);
  CHECK(message.find("is 255, not a bool") != std::string::npos);
}

// Arrays cost about their file bytes in memory (gguf_header.hpp, GgufArray): a fixed-size array
// holds exactly its file bytes; a string array holds each string's bytes, a NUL and an 8-byte start
// offset, so N empty strings (8 file bytes each) cost 9 bytes each (1.125x), and any string
// array at most 9/8 of its file bytes plus the spare capacity of two vectors. The bound checked
// here is 2x the file bytes of the array's elements.
TEST_CASE("gguf parser: arrays cost about their file bytes in memory") {
  constexpr uint64_t kBytes = 4 << 20;
  std::string bytes(kBytes, '\0');
  for (uint64_t i = 0; i < kBytes; ++i) bytes[i] = static_cast<char>(i * 7);
  const peft::GgufHeader h8 = parse(Builder().kv("k", tARRAY, u32(tU8) + u64(kBytes) + bytes).build());
  const auto& u8s = std::get<peft::GgufArray>(h8.metadata[0].value.data);
  REQUIRE(u8s.size() == kBytes);
  CHECK(u8s.raw.capacity() <= 2 * kBytes);
  CHECK(u8s.string_starts().capacity() == 0);
  CHECK(std::get<uint64_t>(u8s.at(kBytes - 1).data) == static_cast<uint8_t>((kBytes - 1) * 7));

  constexpr uint64_t kStrings = 1 << 19;  // 4 MiB of empty strings (their u64 lengths)
  std::string empties;
  for (uint64_t i = 0; i < kStrings; ++i) empties += u64(0);
  const peft::GgufHeader hs = parse(Builder().kv("k", tARRAY, u32(tSTRING) + u64(kStrings) + empties).build());
  const auto& strings = std::get<peft::GgufArray>(hs.metadata[0].value.data);
  REQUIRE(strings.size() == kStrings);
  const uint64_t held = strings.raw.capacity() + strings.string_starts().capacity() * sizeof(uint64_t);
  CHECK(held == kStrings * 9);  // one NUL and one offset each
  CHECK(held <= 2 * empties.size());
  CHECK(strings.string_at(kStrings - 1).empty());

  // BOOL elements are stored as the file's bytes, 0 or 1.
  const peft::GgufHeader hb = parse(Builder().kv("k", tARRAY, u32(tBOOL) + u64(3) + std::string("\x00\x01\x01", 3)).build());
  const auto& bools = std::get<peft::GgufArray>(hb.metadata[0].value.data);
  CHECK(bools.raw == std::vector<uint8_t>{0, 1, 1});
  CHECK(std::get<bool>(bools.at(1).data));
}

// The smallest key-value pairs (docs/gguf.md, "Memory"): one GgufKeyValue each, of a bounded size,
// and a reserved vector (no growth slack).
TEST_CASE("gguf parser: a key-value pair costs a bounded, reserved slot") {
  static_assert(sizeof(peft::GgufArray) <= 40);
  static_assert(sizeof(peft::GgufKeyValue) <= 88);
  Builder many;
  constexpr int kPairs = 5000;
  for (int i = 0; i < kPairs; ++i) many.kv("k" + std::to_string(i), tU8, std::string(1, '\0'));
  const peft::GgufHeader h = parse(many.build());
  REQUIRE(h.metadata.size() == kPairs);
  CHECK(h.metadata.capacity() == kPairs);
  // The duplicate check's table, grown many times, still finds a repeated key and where it was first.
  // Pair i of "k<i>" takes 8 + key + 4 + 1 bytes after the 24-byte fixed part.
  many.kv("k1234", tU8, std::string(1, '\0'));
  uint64_t first = 24;
  for (int i = 0; i < 1234; ++i) first += 13 + ("k" + std::to_string(i)).size();
  const std::string dup = many.build();
  CHECK(outcome(dup) == "INVALID_HEADER");
  CHECK(message_of(dup).find("duplicate key \"k1234\" (first at byte " + std::to_string(first) + ")") !=
        std::string::npos);
  Builder tensors;
  for (int i = 0; i < 300; ++i) tensors.tensor("t" + std::to_string(i), {1}, kF32);
  CHECK(outcome(tensors.build()) == "OK");
  tensors.tensor("t77", {1}, kF32);
  CHECK(message_of(tensors.build()).find("duplicate tensor name \"t77\"") != std::string::npos);
}

TEST_CASE("gguf parser: general.alignment") {
  CHECK(outcome(Builder().kv("general.alignment", tU64, u64(32)).build()) == "INVALID_HEADER");
  CHECK(outcome(Builder().kv("general.alignment", tI32, u32(32)).build()) == "INVALID_HEADER");
  CHECK(outcome(Builder().kv("general.alignment", tARRAY, u32(tU32) + u64(1) + u32(32)).build()) ==
        "INVALID_HEADER");
  CHECK(outcome(Builder().kv_string("general.alignment", "32").build()) == "INVALID_HEADER");
  for (uint32_t bad : {0u, 3u, 48u, 0xFFFFFFFFu}) {
    CAPTURE(bad);
    const std::string file = Builder().kv_u32("general.alignment", bad).build();
    CHECK(outcome(file) == "INVALID_HEADER");
    CHECK(message_of(file).find(std::to_string(bad)) != std::string::npos);
  }
  for (uint32_t good : {1u, 2u, 8u, 4096u, 0x80000000u}) {
    CAPTURE(good);
    Builder b;
    if (good <= 4096) b.alignment = good;
    b.kv_u32("general.alignment", good);
    if (good <= 4096) b.tensor("t", {3}, kF32);
    const peft::GgufHeader h = parse(b.build());
    CHECK(h.alignment == good);
    if (good <= 4096) CHECK(h.data_start % good == 0);
  }
  // The alignment KV is found wherever it is, and it shapes the expected offsets.
  Builder late;
  late.alignment = 16;
  late.kv_u32("x", 1).kv_u32("general.alignment", 16).tensor("a", {1}, kF32).tensor("b", {1}, kF32);
  CHECK(parse(late.build()).tensors[1].begin == 16);
}

TEST_CASE("gguf parser: tensor names") {
  CHECK(outcome(Builder().tensor(std::string(63, 'n'), {1}, kF32).build()) == "OK");
  const std::string long_name = Builder().tensor(std::string(64, 'n'), {1}, kF32).build();
  CHECK(outcome(long_name) == "INVALID_HEADER");
  CHECK(message_of(long_name).find("64 bytes") != std::string::npos);
  CHECK(outcome(Builder().tensor("w\xff", {1}, kF32).build()) == "INVALID_HEADER_UTF8");
  const std::string dup = Builder().tensor("w", {1}, kF32).tensor("v", {1}, kF32).tensor("w", {1}, kF32).build();
  CHECK(outcome(dup) == "INVALID_HEADER");
  CHECK(message_of(dup).find("duplicate tensor name \"w\"") != std::string::npos);
  Builder b;
  b.infos = u64(50) + "short";
  b.n_tensors = 1;
  CHECK(outcome(b.header() + std::string(19, '\0')) == "INVALID_HEADER_LENGTH");
}

TEST_CASE("gguf parser: dimensions and element counts") {
  CHECK(outcome(Builder().tensor("t", {1, 1, 1, 1, 1}, kF32).build()) == "INVALID_HEADER");
  Builder many;
  many.infos = str("t") + u32(UINT32_MAX) + std::string(100, '\0');
  many.n_tensors = 1;
  CHECK(outcome(many.build()) == "INVALID_HEADER");
  const std::string negative = Builder().tensor("t", {2, uint64_t{1} << 63}, kF32).build();
  CHECK(outcome(negative) == "VALIDATION_OVERFLOW");
  CHECK(message_of(negative).find("ne[1]") != std::string::npos);
  CHECK(outcome(Builder().tensor("t", {UINT64_MAX}, kF32).build()) == "VALIDATION_OVERFLOW");
  CHECK(outcome(Builder().tensor("t", {uint64_t{1} << 32, uint64_t{1} << 31}, kI8).build()) == "VALIDATION_OVERFLOW");
  // As gguf.cpp: the running product overflows even if a later dimension is 0...
  CHECK(outcome(Builder().tensor("t", {uint64_t{1} << 40, uint64_t{1} << 40, 0}, kI8).build()) ==
        "VALIDATION_OVERFLOW");
  // ...but a 0 first keeps it at 0.
  const peft::GgufHeader zero = parse(Builder().tensor("t", {0, uint64_t{1} << 40, uint64_t{1} << 40}, kI8).build());
  CHECK(zero.tensors[0].nbytes() == 0);
  // Bytes overflowing 64 bits while the element count fits int64.
  CHECK(outcome(Builder().tensor("t", {uint64_t{1} << 62}, kF64).build()) == "VALIDATION_OVERFLOW");
  // Dimensions cut by the end of the file.
  Builder cut;
  cut.infos = str("t") + u32(3) + u64(1) + u64(2);
  cut.n_tensors = 1;
  CHECK(outcome(cut.header() + std::string(12, '\0')) == "INVALID_HEADER_LENGTH");
}

TEST_CASE("gguf parser: ggml types and block sizes") {
  for (uint32_t type : {4u, 5u, 31u, 32u, 33u, 36u, 37u, 38u, 43u, 1000u, UINT32_MAX}) {
    CAPTURE(type);
    const std::string file = Builder().tensor("t", {32}, type).build();
    CHECK(outcome(file) == "INVALID_HEADER");
    CHECK(message_of(file).find(std::to_string(type)) != std::string::npos);
  }
  const std::string rows = Builder().tensor("t", {33, 2}, kQ8_0).build();
  CHECK(outcome(rows) == "TENSOR_INVALID_INFO");
  CHECK(message_of(rows).find("33") != std::string::npos);
  CHECK(outcome(Builder().tensor("t", {128}, kQ4_K).build()) == "TENSOR_INVALID_INFO");
  CHECK(outcome(Builder().tensor("t", {}, kQ8_0).build()) == "TENSOR_INVALID_INFO");  // ne[0] = 1
  CHECK(outcome(Builder().tensor("t", {0}, kQ8_0).build()) == "OK");
}

TEST_CASE("gguf parser: data offsets") {
  auto two = [](uint64_t second) { return Builder().tensor("a", {3}, kF32).tensor("b", {3}, kF32, second).build(); };
  CHECK(outcome(two(32)) == "OK");
  for (uint64_t bad : {0u, 12u, 16u, 31u, 33u, 64u, 96u}) {
    CAPTURE(bad);
    CHECK(outcome(two(bad)) == "INVALID_OFFSET");
  }
  CHECK(message_of(two(12)).find("alignment") != std::string::npos);
  CHECK(message_of(two(0)).find("overlap") != std::string::npos);
  CHECK(message_of(two(64)).find("gap of 32 bytes") != std::string::npos);
  CHECK(outcome(Builder().tensor("a", {3}, kF32, 32).build()) == "INVALID_OFFSET");
  CHECK(outcome(Builder().tensor("a", {3}, kF32, UINT64_MAX).build()) == "INVALID_OFFSET");
  // A zero-size tensor takes no room: the next one starts at the same offset.
  Builder z;
  z.tensor("z", {0}, kF32).tensor("a", {1}, kF32);
  CHECK(parse(z.build()).tensors[1].begin == 0);
  // Two tensors of 2^63 - 1 bytes each: the padded sizes overflow 64 bits.
  Builder huge;
  huge.tensor("a", {INT64_MAX}, kI8, 0).tensor("b", {INT64_MAX}, kI8, uint64_t{1} << 63);
  CHECK(outcome(huge.header() + std::string(64, '\0')) == "VALIDATION_OVERFLOW");
}

TEST_CASE("gguf parser: the data section must be in the file") {
  Builder b;
  b.tensor("a", {1000}, kF32);
  const std::string file = b.build();
  CHECK(outcome(file.substr(0, file.size() - 1)) == "METADATA_INCOMPLETE_BUFFER");
  CHECK(message_of(file.substr(0, file.size() - 1)).find("\"a\"") != std::string::npos);
  CHECK(outcome(b.header()) == "METADATA_INCOMPLETE_BUFFER");  // the padding before the data is missing
  // Zero-size tensors need the padding before the data section (gguf.cpp seeks to it), nothing more.
  Builder z;
  z.tensor("z", {0}, kF32);
  CHECK(outcome(z.build()) == "OK");
  CHECK(outcome(z.header()) == "METADATA_INCOMPLETE_BUFFER");
}

TEST_CASE("gguf parser: every truncation of a valid file fails with the code of where it is cut") {
  for (uint32_t version : {2u, 3u}) {
    const Builder b = every_type(version);
    const std::string file = b.build();
    const peft::GgufHeader h = parse(file);
    const uint64_t header_end = b.header().size();
    const uint64_t last_end = h.data_start + h.tensors.back().end;
    for (size_t length = 0; length < file.size(); ++length) {
      CAPTURE(length);
      const std::string prefix = file.substr(0, length);
      const char* expected = length < 24                ? "HEADER_TOO_SMALL"
                             : length < header_end      ? "INVALID_HEADER_LENGTH"
                             : length < last_end        ? "METADATA_INCOMPLETE_BUFFER"
                                                        : "OK";
      CHECK(outcome(prefix) == expected);
    }
  }
}

TEST_CASE("gguf parser: the header size limit") {
  const Builder b = every_type(3);
  const std::string file = b.build();
  const peft::GgufHeader h = parse(file);
  CHECK(outcome(file, h.data_start) == "OK");
  CHECK(outcome(file, h.data_start - 1) == "HEADER_TOO_LARGE");
  CHECK(outcome(file, b.header().size() - 1) == "HEADER_TOO_LARGE");
  CHECK(outcome(file, 100) == "HEADER_TOO_LARGE");
  CHECK(outcome(file, 0) == "HEADER_TOO_LARGE");
  // A long string, a long array and large counts are measured against the limit before they are read.
  const std::string big = Builder().kv_string("k", std::string(5000, 'x')).build();
  CHECK(outcome(big, 1000) == "HEADER_TOO_LARGE");
  const std::string array = Builder().kv("k", tARRAY, u32(tU32) + u64(1000) + std::string(4000, '\0')).build();
  CHECK(outcome(array, 1000) == "HEADER_TOO_LARGE");
  Builder counts;
  counts.kv_count = 100;
  CHECK(outcome(counts.header() + std::string(2000, '\0'), 1000) == "HEADER_TOO_LARGE");
  CHECK(message_of(big, 1000).find("1000") != std::string::npos);
}

TEST_CASE("gguf parser: messages name the file and the field, on one line") {
  const std::vector<std::string> files = {
      std::string(3, 'x'),
      Builder().kv_u32("", 1).build(),
      Builder().kv_u32("dup", 1).kv_u32("dup", 1).build(),
      Builder().kv("k\nv", 99, "").build(),
      Builder().tensor("t", {33}, kQ8_0).build(),
      Builder().tensor("t", {3}, kF32, 7).build(),
      Builder().tensor("t", {3}, kF32).header(),
  };
  for (const std::string& file : files) {
    const std::string message = message_of(file);
    CAPTURE(message);
    CHECK(message.rfind("test.gguf: ", 0) == 0);
    CHECK(message.find('\n') == std::string::npos);
  }
  const std::string m = message_of(Builder().kv_u32("a", 1).kv("bad.type", 42, "").build());
  CHECK(m.find("\"bad.type\"") != std::string::npos);
  CHECK(m.find("42") != std::string::npos);
  CHECK(m.find("at byte 41") != std::string::npos);  // the pair after "a": 24 + (8 + 1) + 4 + 4
}

TEST_CASE("gguf parser: reads are bounded chunks, never past the file, never the whole file") {
  Builder b;
  b.kv_string("big", std::string(300000, 's')).tensor("t", {100000}, kF32);
  const std::string file = b.build();
  uint64_t largest = 0;
  const peft::GgufHeader h = parse(file, 100'000'000, &largest);
  CHECK(largest <= 64 * 1024);
  CHECK(largest > 0);
  CHECK(h.data_start + h.data_size == file.size());
  // A count that cannot fit allocates nothing for it: the reader is asked for the prefix alone.
  Builder huge;
  huge.kv("k", tARRAY, u32(tU8) + u64(uint64_t{1} << 40));
  largest = 0;
  CHECK_THROWS(parse(huge.build(), 100'000'000, &largest));
  CHECK(largest <= huge.build().size());
}
