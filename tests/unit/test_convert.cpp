// Dtype conversion against tables made with torch (tests/fixtures/dtype/, see the fixture
// generator): every bf16/f16/f8 bit pattern and torch's results on sampled f32, f64 and i64
// values, bit for bit (a NaN only has to come back as a NaN). Every kernel set the CPU can run is
// checked, not only the one convert() picks.
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/bf16.hpp"
#include "core/convert.hpp"
#include "core/convert_kernels.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"
#include "core/f16.hpp"
#include "core/f8.hpp"
#include "peft_c.h"
#include "peft_test_paths.h"

namespace {

using peft::DType;
using Bytes = std::vector<unsigned char>;

// A committed fixture; a missing one fails the test (the tables are part of the repository).
Bytes fixture(const std::string& name) {
  const std::string path = std::string(PEFT_TEST_DATA) + "/dtype/" + name;
  std::ifstream in(path, std::ios::binary);
  INFO("fixture ", path);
  REQUIRE_MESSAGE(in.good(), "missing fixture " << path << " (written by the fixture generator)");
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

template <class T>
std::vector<T> values_of(const Bytes& bytes) {
  REQUIRE(bytes.size() % sizeof(T) == 0);
  std::vector<T> out(bytes.size() / sizeof(T));
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

template <class T>
Bytes bytes_of(const std::vector<T>& values) {
  Bytes out(values.size() * sizeof(T));
  std::memcpy(out.data(), values.data(), out.size());
  return out;
}

bool is_nan_bits(DType d, uint64_t b) {
  switch (d) {
    case DType::F64: return (b & 0x7FFFFFFFFFFFFFFFull) > 0x7FF0000000000000ull;
    case DType::F32: return (b & 0x7FFFFFFFu) > 0x7F800000u;
    case DType::BF16: return (b & 0x7FFFu) > 0x7F80u;
    case DType::F16: return (b & 0x7FFFu) > 0x7C00u;
    default: return false;
  }
}

uint64_t element(const Bytes& bytes, size_t size, size_t i) {
  uint64_t v = 0;
  std::memcpy(&v, bytes.data() + i * size, size);
  return v;
}

// Bit-for-bit comparison of two arrays of dtype d, except that an expected NaN accepts any NaN.
// Reports the first few differences and checks that there are none.
void check_same(DType d, const Bytes& expected, const Bytes& actual, const std::string& what) {
  const size_t size = peft::dtype_bits(d) / 8;
  REQUIRE(expected.size() == actual.size());
  size_t mismatches = 0;
  std::string first;
  for (size_t i = 0; i < expected.size() / size; ++i) {
    const uint64_t e = element(expected, size, i);
    const uint64_t a = element(actual, size, i);
    if (e == a || (is_nan_bits(d, e) && is_nan_bits(d, a))) continue;
    if (++mismatches <= 5) first += " [" + std::to_string(i) + "] want " + std::to_string(e) + " got " + std::to_string(a);
  }
  INFO(what, ": ", mismatches, " mismatches;", first);
  CHECK(mismatches == 0);
}

Bytes run_convert(DType src, const Bytes& in, DType dst) {
  const size_t count = in.size() * 8 / peft::dtype_bits(src);
  Bytes out(count * peft::dtype_bits(dst) / 8);
  peft::convert(src, in.data(), dst, out.data(), count);
  return out;
}

// Every kernel set this CPU runs, so the portable code is tested on x86 machines too.
std::vector<const peft::convert_kernels::Kernels*> kernel_sets() {
  std::vector<const peft::convert_kernels::Kernels*> sets{&peft::convert_kernels::portable()};
  if (peft::convert_kernels::x86_avx2() != nullptr) sets.push_back(peft::convert_kernels::x86_avx2());
  return sets;
}

using KernelMember = peft::convert_kernels::Kernel peft::convert_kernels::Kernels::*;

Bytes run_kernel(const peft::convert_kernels::Kernels& k, KernelMember member, const Bytes& in, size_t in_size,
                 size_t out_size) {
  const size_t n = in.size() / in_size;
  Bytes out(n * out_size);
  (k.*member)(in.data(), out.data(), n);
  return out;
}

Bytes all_16_bit_patterns() {
  std::vector<uint16_t> patterns(65536);
  for (uint32_t i = 0; i < 65536; ++i) patterns[i] = uint16_t(i);
  return bytes_of(patterns);
}

Bytes all_8_bit_patterns() {
  Bytes patterns(256);
  for (uint32_t i = 0; i < 256; ++i) patterns[i] = uint8_t(i);
  return patterns;
}

// f64 bits of each f32 in a table, for the widening to F64.
Bytes widen_f32_table(const Bytes& f32_bits) {
  std::vector<double> wide;
  for (float f : values_of<float>(f32_bits)) wide.push_back(static_cast<double>(f));
  return bytes_of(wide);
}

template <class Scalar>
Bytes map_scalar_16(const Bytes& in, Scalar scalar) {
  std::vector<uint32_t> out;
  for (uint16_t h : values_of<uint16_t>(in)) out.push_back(std::bit_cast<uint32_t>(scalar(h)));
  return bytes_of(out);
}

void check_16_to_f32(DType src, const char* table, float (*scalar)(uint16_t), KernelMember member) {
  const Bytes expected = fixture(table);
  REQUIRE(expected.size() == 65536 * 4);
  const Bytes patterns = all_16_bit_patterns();
  check_same(DType::F32, expected, map_scalar_16(patterns, scalar), "scalar");
  check_same(DType::F32, expected, run_convert(src, patterns, DType::F32), "convert()");
  check_same(DType::F64, widen_f32_table(expected), run_convert(src, patterns, DType::F64), "convert() to F64");
  for (const auto* k : kernel_sets()) check_same(DType::F32, expected, run_kernel(*k, member, patterns, 2, 4), k->name);
}

}  // namespace

TEST_CASE("dtype names: each name and only it gives its dtype") {
  for (int32_t d = 0; d < int32_t(peft::kDTypeCount); ++d) {
    const auto dtype = static_cast<DType>(d);
    const std::string name(peft::dtype_name(dtype));
    CAPTURE(name);
    CHECK(peft::dtype_from_name(name) == dtype);
    CHECK_FALSE(peft::dtype_from_name(name + std::string(1, '\0')).has_value());  // a zero byte after it
    CHECK_FALSE(peft::dtype_from_name(name.substr(0, name.size() - 1)).has_value());
    std::string changed = name;
    changed.back() = char(changed.back() + 1);
    CHECK(peft::dtype_from_name(changed) != dtype);
  }
  for (const char* other : {"", "f32", "F32 ", "FLOAT32", "F8_E4M3FNUZ_", "F8_E4M3FNUY"})
    CHECK_FALSE(peft::dtype_from_name(other).has_value());
}

TEST_CASE("convert: bf16 to f32 matches torch for all 65536 patterns") {
  check_16_to_f32(DType::BF16, "bf16_to_f32.bin", peft::bf16_to_f32, &peft::convert_kernels::Kernels::bf16_to_f32);
}

TEST_CASE("convert: f16 to f32 matches torch for all 65536 patterns") {
  check_16_to_f32(DType::F16, "f16_to_f32.bin", peft::f16_to_f32, &peft::convert_kernels::Kernels::f16_to_f32);
}

TEST_CASE("convert: f8 to f32 matches torch for all 256 patterns of each format") {
  const std::pair<DType, const char*> formats[] = {
      {DType::F8_E4M3, "f8_e4m3_to_f32.bin"},         {DType::F8_E5M2, "f8_e5m2_to_f32.bin"},
      {DType::F8_E8M0, "f8_e8m0_to_f32.bin"},         {DType::F8_E4M3FNUZ, "f8_e4m3fnuz_to_f32.bin"},
      {DType::F8_E5M2FNUZ, "f8_e5m2fnuz_to_f32.bin"},
  };
  const Bytes patterns = all_8_bit_patterns();
  for (const auto& [dtype, table] : formats) {
    const std::string table_file = table;  // a copy: clang 14 cannot capture a structured binding
    CAPTURE(table_file);
    const Bytes expected = fixture(table);
    REQUIRE(expected.size() == 256 * 4);
    std::vector<uint32_t> scalar;
    for (unsigned char b : patterns) scalar.push_back(std::bit_cast<uint32_t>(peft::f8_to_f32(dtype, b)));
    check_same(DType::F32, expected, bytes_of(scalar), "f8_to_f32");
    check_same(DType::F32, expected, run_convert(dtype, patterns, DType::F32), "convert()");
    check_same(DType::F64, widen_f32_table(expected), run_convert(dtype, patterns, DType::F64), "convert() to F64");
    // Into the 16-bit types: exact to f32, then one rounding.
    std::vector<uint16_t> bf16, f16;
    for (float f : values_of<float>(expected)) {
      bf16.push_back(peft::f32_to_bf16(f));
      f16.push_back(peft::f32_to_f16(f));
    }
    check_same(DType::BF16, bytes_of(bf16), run_convert(dtype, patterns, DType::BF16), "convert() to BF16");
    check_same(DType::F16, bytes_of(f16), run_convert(dtype, patterns, DType::F16), "convert() to F16");
  }
}

TEST_CASE("convert: f32 to bf16 and f16 match torch on sampled values") {
  const Bytes samples = fixture("f32_samples.bin");
  const std::pair<DType, const char*> targets[] = {{DType::BF16, "f32_to_bf16.bin"}, {DType::F16, "f32_to_f16.bin"}};
  for (const auto& [dst, table] : targets) {
    const std::string table_file = table;  // a copy: clang 14 cannot capture a structured binding
    CAPTURE(table_file);
    const Bytes expected = fixture(table);
    REQUIRE(expected.size() * 2 == samples.size());
    std::vector<uint16_t> scalar;
    for (float f : values_of<float>(samples)) scalar.push_back(dst == DType::BF16 ? peft::f32_to_bf16(f) : peft::f32_to_f16(f));
    check_same(dst, expected, bytes_of(scalar), "scalar");
    check_same(dst, expected, run_convert(DType::F32, samples, dst), "convert()");
    const KernelMember member = dst == DType::BF16 ? &peft::convert_kernels::Kernels::f32_to_bf16
                                                   : &peft::convert_kernels::Kernels::f32_to_f16;
    for (const auto* k : kernel_sets()) check_same(dst, expected, run_kernel(*k, member, samples, 4, 2), k->name);
  }
}

TEST_CASE("convert: f64 to f32, bf16 and f16 match torch on sampled values") {
  const Bytes samples = fixture("f64_samples.bin");
  const size_t n = samples.size() / 8;
  const Bytes to_f32 = fixture("f64_to_f32.bin");
  const Bytes to_bf16 = fixture("f64_to_bf16.bin");
  const Bytes to_f16 = fixture("f64_to_f16.bin");
  REQUIRE(to_f32.size() == n * 4);
  REQUIRE(to_bf16.size() == n * 2);
  REQUIRE(to_f16.size() == n * 2);
  check_same(DType::F32, to_f32, run_convert(DType::F64, samples, DType::F32), "convert() to F32");
  check_same(DType::BF16, to_bf16, run_convert(DType::F64, samples, DType::BF16), "convert() to BF16");
  check_same(DType::F16, to_f16, run_convert(DType::F64, samples, DType::F16), "convert() to F16");
  std::vector<uint16_t> bf16, f16;
  for (double d : values_of<double>(samples)) {
    bf16.push_back(peft::f64_to_bf16(d));
    f16.push_back(peft::f64_to_f16(d));
  }
  check_same(DType::BF16, to_bf16, bytes_of(bf16), "f64_to_bf16");
  check_same(DType::F16, to_f16, bytes_of(f16), "f64_to_f16");
  check_same(DType::F64, samples, run_convert(DType::F64, samples, DType::F64), "F64 copy");
}

TEST_CASE("convert: i64 to f64, f32, bf16 and f16 match torch on sampled values") {
  const Bytes samples = fixture("i64_samples.bin");
  const std::pair<DType, const char*> targets[] = {{DType::F64, "i64_to_f64.bin"},
                                                   {DType::F32, "i64_to_f32.bin"},
                                                   {DType::BF16, "i64_to_bf16.bin"},
                                                   {DType::F16, "i64_to_f16.bin"}};
  for (const auto& [dst, table] : targets) {
    const std::string table_file = table;  // a copy: clang 14 cannot capture a structured binding
    CAPTURE(table_file);
    const Bytes expected = fixture(table);
    REQUIRE(expected.size() * 64 == samples.size() * peft::dtype_bits(dst));
    check_same(dst, expected, run_convert(DType::I64, samples, dst), "convert()");
  }
}

TEST_CASE("convert: wide integers and f64 round twice into 16-bit types, as torch does") {
  // Values found with torch 2.x: each lies just above a 16-bit midpoint and rounds to that
  // midpoint in float32 first, so torch's result is the even neighbour, not the nearest one.
  auto one = [](DType src, auto value, DType dst) {
    Bytes in(sizeof(value));
    std::memcpy(in.data(), &value, sizeof(value));
    return element(run_convert(src, in, dst), peft::dtype_bits(dst) / 8, 0);
  };
  CHECK(one(DType::I64, int64_t((1ll << 32) + (1ll << 23) + 1), DType::BF16) == 0x4F80);
  CHECK(one(DType::I32, int32_t((1 << 30) + (1 << 22) + 1), DType::BF16) == 0x4E80);
  CHECK(one(DType::U32, uint32_t((1u << 31) + (1u << 23) + 1), DType::BF16) == 0x4F00);
  CHECK(one(DType::U64, uint64_t((1ull << 63) + (1ull << 54) + 1), DType::BF16) == 0x5F00);
  CHECK(one(DType::U64, UINT64_MAX, DType::F32) == 0x5F800000);
  CHECK(one(DType::U64, uint64_t(70000), DType::F16) == 0x7C00);
  CHECK(one(DType::F64, 1.00390625 + 0x1p-40, DType::BF16) == 0x3F80);
  CHECK(one(DType::F64, 1 + 0x1p-11 + 0x1p-40, DType::F16) == 0x3C00);
  CHECK(one(DType::BOOL, uint8_t(2), DType::F32) == 0x3F800000);  // torch reads any nonzero byte as true
  // The correctly rounded variants round once.
  CHECK(peft::f64_to_bf16_correctly_rounded(1.00390625 + 0x1p-40) == 0x3F81);
  CHECK(peft::f64_to_f16_correctly_rounded(1 + 0x1p-11 + 0x1p-40) == 0x3C01);
}

TEST_CASE("convert: correctly rounded f64 variants pick the nearest value, ties to even") {
  const auto doubles = values_of<double>(fixture("f64_samples.bin"));
  size_t wrong = 0;
  for (double d : doubles) {
    if (!std::isfinite(d) || std::fabs(d) > 6.0e4) continue;
    const uint16_t bf = peft::f64_to_bf16_correctly_rounded(d);
    const uint16_t h = peft::f64_to_f16_correctly_rounded(d);
    // The neighbours one ulp either side must not be nearer (or as near and even).
    auto check = [&](uint16_t r, float (*decode)(uint16_t)) {
      const long double err = std::fabs(static_cast<long double>(decode(r)) - d);
      for (int step : {-1, 1}) {
        const uint16_t other = uint16_t(r + step);
        if (((other ^ r) & 0x8000) != 0) continue;
        const long double other_err = std::fabs(static_cast<long double>(decode(other)) - d);
        if (other_err < err || (other_err == err && (other & 1) == 0)) ++wrong;
      }
    };
    check(bf, peft::bf16_to_f32);
    check(h, peft::f16_to_f32);
  }
  CHECK(wrong == 0);
}

TEST_CASE("convert: NaNs come out quiet and 16-bit round trips are exact") {
  const Bytes patterns = all_16_bit_patterns();
  for (DType d : {DType::BF16, DType::F16}) {
    CAPTURE(peft::dtype_name(d));
    const Bytes wide = run_convert(d, patterns, DType::F32);
    size_t loud = 0;
    for (uint32_t f : values_of<uint32_t>(wide)) loud += is_nan_bits(DType::F32, f) && (f & 0x00400000u) == 0;
    CHECK(loud == 0);
    // Back to the 16-bit type: identity, except that a signalling NaN comes back quiet.
    std::vector<uint16_t> expected;
    const uint16_t quiet_bit = d == DType::BF16 ? 0x0040 : 0x0200;
    for (uint32_t i = 0; i < 65536; ++i) expected.push_back(is_nan_bits(d, i) ? uint16_t(i | quiet_bit) : uint16_t(i));
    const Bytes back = run_convert(DType::F32, wide, d);
    CHECK(back == bytes_of(expected));
    for (const auto* k : kernel_sets()) {
      CAPTURE(k->name);
      const KernelMember narrow = d == DType::BF16 ? &peft::convert_kernels::Kernels::f32_to_bf16
                                                   : &peft::convert_kernels::Kernels::f32_to_f16;
      CHECK(run_kernel(*k, narrow, wide, 4, 2) == bytes_of(expected));
    }
  }
}

TEST_CASE("convert: bf16 and f16 into each other round once from the exact value") {
  const Bytes patterns = all_16_bit_patterns();
  std::vector<uint16_t> bf16_to_f16, f16_to_bf16;
  for (uint32_t i = 0; i < 65536; ++i) {
    bf16_to_f16.push_back(peft::f32_to_f16(peft::bf16_to_f32(uint16_t(i))));
    f16_to_bf16.push_back(peft::f32_to_bf16(peft::f16_to_f32(uint16_t(i))));
  }
  check_same(DType::F16, bytes_of(bf16_to_f16), run_convert(DType::BF16, patterns, DType::F16), "BF16 to F16");
  check_same(DType::BF16, bytes_of(f16_to_bf16), run_convert(DType::F16, patterns, DType::BF16), "F16 to BF16");
}

namespace {

const DType kAll[] = {
    DType::BOOL,        DType::F4,          DType::F6_E2M3, DType::F6_E3M2, DType::U8,   DType::I8,
    DType::F8_E5M2,     DType::F8_E4M3,     DType::F8_E8M0, DType::F8_E4M3FNUZ, DType::F8_E5M2FNUZ,
    DType::I16,         DType::U16,         DType::F16,     DType::BF16,    DType::I32,  DType::U32,
    DType::F32,         DType::C64,         DType::F64,     DType::I64,     DType::U64,
};

// What the documentation promises, written out independently of convert.cpp.
bool documented_pair(DType src, DType dst) {
  if (src == dst) return true;
  const bool wide_target = dst == DType::F64 || dst == DType::F32 || dst == DType::F16 || dst == DType::BF16;
  const bool sub_byte_or_complex = src == DType::F4 || src == DType::F6_E2M3 || src == DType::F6_E3M2 || src == DType::C64;
  return wide_target && !sub_byte_or_complex;
}

// Encodes small positive values (powers of two: representable in every source dtype, E8M0 too).
Bytes encode(DType d, const std::vector<double>& values) {
  Bytes out;
  auto put = [&out](auto v) {
    const auto* p = reinterpret_cast<const unsigned char*>(&v);
    out.insert(out.end(), p, p + sizeof(v));
  };
  for (double v : values) {
    switch (d) {
      case DType::F64: put(v); break;
      case DType::F32: put(float(v)); break;
      case DType::F16: put(peft::f32_to_f16(float(v))); break;
      case DType::BF16: put(peft::f32_to_bf16(float(v))); break;
      case DType::BOOL: put(uint8_t(v != 0)); break;
      case DType::U8: put(uint8_t(v)); break;
      case DType::I8: put(int8_t(v)); break;
      case DType::I16: put(int16_t(v)); break;
      case DType::U16: put(uint16_t(v)); break;
      case DType::I32: put(int32_t(v)); break;
      case DType::U32: put(uint32_t(v)); break;
      case DType::I64: put(int64_t(v)); break;
      case DType::U64: put(uint64_t(v)); break;
      default: {
        REQUIRE(peft::is_f8(d));
        int found = -1;
        for (int b = 0; b < 256 && found < 0; ++b) {
          if (peft::f8_to_f32(d, uint8_t(b)) == float(v)) found = b;
        }
        REQUIRE(found >= 0);
        put(uint8_t(found));
      }
    }
  }
  return out;
}

double decode(DType d, const Bytes& bytes, size_t i) {
  const uint64_t bits = element(bytes, peft::dtype_bits(d) / 8, i);
  switch (d) {
    case DType::F64: return std::bit_cast<double>(bits);
    case DType::F32: return std::bit_cast<float>(uint32_t(bits));
    case DType::F16: return peft::f16_to_f32(uint16_t(bits));
    default: return peft::bf16_to_f32(uint16_t(bits));
  }
}

Bytes random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  Bytes out(n);
  for (auto& b : out) b = uint8_t(rng());
  return out;
}

}  // namespace

TEST_CASE("convert: every dtype pair is supported or rejected as documented") {
  for (DType src : kAll) {
    for (DType dst : kAll) {
      const std::string pair = std::string(peft::dtype_name(src)) + " -> " + std::string(peft::dtype_name(dst));
      CAPTURE(pair);
      REQUIRE(peft::can_convert(src, dst) == documented_pair(src, dst));
      if (!documented_pair(src, dst)) {
        Bytes in(64), out(64);
        try {
          peft::convert(src, in.data(), dst, out.data(), 4);
          FAIL("no error");
        } catch (const peft::Error& e) {
          CHECK(e.code() == PEFT_ERR_UNSUPPORTED);
          CHECK(std::string(e.what()) ==
                "cannot convert " + std::string(peft::dtype_name(src)) + " to " + std::string(peft::dtype_name(dst)));
        }
        continue;
      }
      if (src == dst) {
        // A copy of whole bytes, sub-byte dtypes included (8 elements fill whole bytes for all).
        const Bytes in = random_bytes(8 * peft::dtype_bits(src) / 8, 7);
        CHECK(run_convert(src, in, dst) == in);
        continue;
      }
      const std::vector<double> values =
          src == DType::BOOL ? std::vector<double>{1, 0, 1, 1, 0} : std::vector<double>{1, 2, 4, 8, 64};
      const Bytes out = run_convert(src, encode(src, values), dst);
      for (size_t i = 0; i < values.size(); ++i) CHECK(decode(dst, out, i) == values[i]);
    }
  }
}

TEST_CASE("convert: sub-byte copies need whole bytes") {
  Bytes in(16), out(16);
  CHECK_NOTHROW(peft::convert(DType::F4, in.data(), DType::F4, out.data(), 6));
  CHECK_NOTHROW(peft::convert(DType::F6_E2M3, in.data(), DType::F6_E2M3, out.data(), 4));
  for (auto [dtype, count] : {std::pair{DType::F4, 3}, std::pair{DType::F6_E3M2, 2}, std::pair{DType::F6_E2M3, 5}}) {
    try {
      peft::convert(dtype, in.data(), dtype, out.data(), uint64_t(count));
      FAIL("no error");
    } catch (const peft::Error& e) {
      CHECK(e.code() == PEFT_ERR_INVALID_ARGUMENT);
    }
  }
  CHECK(peft::converted_byte_size(DType::F6_E2M3, 8) == 6);
  CHECK_THROWS_AS(peft::converted_byte_size(DType::F64, UINT64_MAX / 32), peft::Error);
}

TEST_CASE("convert: count 0 does nothing, even with null buffers") {
  for (DType src : kAll) {
    for (DType dst : kAll) {
      if (peft::can_convert(src, dst)) {
        CHECK_NOTHROW(peft::convert(src, nullptr, dst, nullptr, 0));
      } else {
        CHECK_THROWS_AS(peft::convert(src, nullptr, dst, nullptr, 0), peft::Error);
      }
    }
  }
}

TEST_CASE("convert: unaligned source and destination give the same bytes") {
  // 67 elements: several 16-element vector steps and a scalar tail.
  constexpr size_t n = 67;
  for (DType src : kAll) {
    for (DType dst : kAll) {
      if (!peft::can_convert(src, dst)) continue;
      CAPTURE(std::string(peft::dtype_name(src)) + " -> " + std::string(peft::dtype_name(dst)));
      const size_t count = peft::dtype_bits(src) < 8 ? 64 : n;  // sub-byte copies need whole bytes
      const Bytes in = random_bytes(count * peft::dtype_bits(src) / 8, uint32_t(src) * 31 + uint32_t(dst));
      const Bytes aligned = run_convert(src, in, dst);
      for (size_t src_offset = 0; src_offset < 4; ++src_offset) {
        for (size_t dst_offset = 0; dst_offset < 4; ++dst_offset) {
          Bytes in_buffer(in.size() + 8), out_buffer(aligned.size() + 8, 0xAB);
          std::memcpy(in_buffer.data() + src_offset, in.data(), in.size());
          peft::convert(src, in_buffer.data() + src_offset, dst, out_buffer.data() + dst_offset, count);
          CHECK(Bytes(out_buffer.begin() + dst_offset, out_buffer.begin() + dst_offset + aligned.size()) == aligned);
          CHECK(out_buffer[dst_offset + aligned.size()] == 0xAB);  // nothing written past the end
        }
      }
    }
  }
}

TEST_CASE("convert: large buffers (streaming stores) match the portable kernels") {
  // Above kStreamingThresholdBytes of output, at an aligned, a 4-byte and a 1-byte offset.
  const size_t n = (peft::convert_kernels::kStreamingThresholdBytes / 2) + 37;
  const Bytes halves = random_bytes(n * 2, 11);
  const auto& portable = peft::convert_kernels::portable();
  const Bytes bf16_wide = run_kernel(portable, &peft::convert_kernels::Kernels::bf16_to_f32, halves, 2, 4);
  const Bytes f16_wide = run_kernel(portable, &peft::convert_kernels::Kernels::f16_to_f32, halves, 2, 4);
  const Bytes bf16_narrow = run_kernel(portable, &peft::convert_kernels::Kernels::f32_to_bf16, bf16_wide, 4, 2);
  const Bytes f16_narrow = run_kernel(portable, &peft::convert_kernels::Kernels::f32_to_f16, f16_wide, 4, 2);
  for (size_t offset : {0, 4, 1}) {
    CAPTURE(offset);
    Bytes out(n * 4 + 64);
    unsigned char* dst = out.data() + (32 - reinterpret_cast<uintptr_t>(out.data()) % 32) + offset;
    auto check = [&](DType src, const Bytes& in, DType to, const Bytes& expected) {
      peft::convert(src, in.data(), to, dst, in.size() * 8 / peft::dtype_bits(src));
      CHECK(std::memcmp(dst, expected.data(), expected.size()) == 0);
    };
    check(DType::BF16, halves, DType::F32, bf16_wide);
    check(DType::F16, halves, DType::F32, f16_wide);
    check(DType::F32, bf16_wide, DType::BF16, bf16_narrow);
    check(DType::F32, f16_wide, DType::F16, f16_narrow);
  }
}

TEST_CASE("convert: overlapping buffers are rejected") {
  Bytes buffer(64);
  try {
    peft::convert(DType::BF16, buffer.data(), DType::F32, buffer.data() + 8, 8);
    FAIL("no error");
  } catch (const peft::Error& e) {
    CHECK(e.code() == PEFT_ERR_INVALID_ARGUMENT);
  }
  CHECK_THROWS_AS(peft::convert(DType::U8, buffer.data(), DType::U8, buffer.data(), 4), peft::Error);
  CHECK_NOTHROW(peft::convert(DType::BF16, buffer.data(), DType::F32, buffer.data() + 16, 4));  // adjacent
}

TEST_CASE("convert: peft_convert error codes") {
  auto code = [](peft_error* err) {
    const int32_t c = peft_error_code(err);
    peft_error_free(err);
    return c;
  };
  Bytes in(64), out(64);
  const uint16_t one_bf16 = 0x3F80;
  std::memcpy(in.data(), &one_bf16, 2);
  CHECK(peft_convert(PEFT_DTYPE_BF16, in.data(), PEFT_DTYPE_F32, out.data(), 1) == nullptr);
  float value = 0;
  std::memcpy(&value, out.data(), 4);
  CHECK(value == 1.0f);
  CHECK(code(peft_convert(-1, in.data(), PEFT_DTYPE_F32, out.data(), 1)) == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(code(peft_convert(PEFT_DTYPE_BF16, in.data(), PEFT_DTYPE_COUNT, out.data(), 1)) == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(code(peft_convert(PEFT_DTYPE_BF16, nullptr, PEFT_DTYPE_F32, out.data(), 1)) == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(code(peft_convert(PEFT_DTYPE_BF16, in.data(), PEFT_DTYPE_F32, nullptr, 1)) == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(peft_convert(PEFT_DTYPE_BF16, nullptr, PEFT_DTYPE_F32, nullptr, 0) == nullptr);
  CHECK(code(peft_convert(PEFT_DTYPE_F32, in.data(), PEFT_DTYPE_I32, out.data(), 1)) == PEFT_ERR_UNSUPPORTED);
  CHECK(code(peft_convert(PEFT_DTYPE_C64, in.data(), PEFT_DTYPE_F64, out.data(), 1)) == PEFT_ERR_UNSUPPORTED);
  CHECK(code(peft_convert(PEFT_DTYPE_F32, nullptr, PEFT_DTYPE_I32, nullptr, 0)) == PEFT_ERR_UNSUPPORTED);
  CHECK(code(peft_convert(PEFT_DTYPE_F4, in.data(), PEFT_DTYPE_F4, out.data(), 3)) == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(code(peft_convert(PEFT_DTYPE_F32, in.data(), PEFT_DTYPE_F32, in.data() + 4, 4)) == PEFT_ERR_INVALID_ARGUMENT);
  peft_error* err = peft_convert(PEFT_DTYPE_BF16, in.data(), PEFT_DTYPE_U8, out.data(), 1);
  REQUIRE(err != nullptr);
  CHECK(std::string(peft_error_message(err)) == "cannot convert BF16 to U8");
  peft_error_free(err);
}
