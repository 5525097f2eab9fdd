// Streaming semantics: the writer's order, chunks, callbacks, conversion, checkpoint sources, and
// the errors that change nothing versus those that discard the output.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "core/atomic_file.hpp"
#include "core/convert.hpp"
#include "core/error.hpp"
#include "core/file_map.hpp"
#include "checkpoint/checkpoint.hpp"
#include "safetensors/writer.hpp"
#include "test_writer_support.hpp"

using namespace peft;
using writer_test::ScratchDir;

namespace {

int32_t error_code_of(const std::function<void()>& body, std::string* message = nullptr) {
  try {
    body();
  } catch (const Error& e) {
    if (message) *message = e.what();
    return e.code();
  }
  return PEFT_OK;
}

std::vector<float> iota_f32(size_t n, float start = 0.5f) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = start + static_cast<float>(i) * 0.25f;
  return v;
}

std::vector<uint8_t> bytes_of(std::span<const uint8_t> s) { return {s.begin(), s.end()}; }

}  // namespace

TEST_CASE("writer stream: order, chunks and read-back") {
  ScratchDir dir;
  const std::string path = dir.path("m.safetensors");
  FileWriter w(path);
  w.add_tensor("b.weight", DType::F32, {3, 5});
  w.add_tensor("a.bias", DType::F16, {4});
  w.add_tensor("c", DType::I64, {});
  w.add_tensor("a.weight", DType::F32, {2});
  w.start();
  REQUIRE(w.tensor_count() == 4);
  // I64 first, then the F32s by name, then F16.
  CHECK(w.tensor_at(0).name == "c");
  CHECK(w.tensor_at(1).name == "a.weight");
  CHECK(w.tensor_at(2).name == "b.weight");
  CHECK(w.tensor_at(3).name == "a.bias");
  CHECK(w.declaration_at(0) == 2);
  CHECK(w.declaration_at(3) == 1);

  std::string message;
  // Out of order: refused, nothing changes.
  CHECK(error_code_of([&] { w.begin_tensor("b.weight", DType::F32); }, &message) == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(message.find("\"c\"") != std::string::npos);
  CHECK(error_code_of([&] { w.begin_tensor("nope", DType::F32); }) == PEFT_ERR_INVALID_ARGUMENT);
  const int64_t c = -7;
  w.write_tensor("c", DType::I64, &c, 8);
  // Wrong whole size: TENSOR_INVALID_INFO as in the reference.
  const std::vector<float> aw{1.f, 2.f};
  CHECK(error_code_of([&] { w.write_tensor("a.weight", DType::F32, aw.data(), 4); }) == PEFT_ERR_TENSOR_INVALID_INFO);
  w.write_tensor("a.weight", DType::F32, aw.data(), 8);
  // b.weight in uneven chunks; too many bytes is refused and changes nothing.
  const std::vector<float> bw = iota_f32(15);
  const auto* raw = reinterpret_cast<const uint8_t*>(bw.data());
  w.begin_tensor("b.weight", DType::F32);
  w.write(raw, 7);
  CHECK(error_code_of([&] { w.write(raw + 7, 60 - 7 + 1); }, &message) == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(message.find("b.weight") != std::string::npos);
  // Finishing or beginning another tensor while b.weight is incomplete names it.
  CHECK(error_code_of([&] { w.finish(); }, &message) == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(message.find("b.weight") != std::string::npos);
  CHECK(error_code_of([&] { w.begin_tensor("a.bias", DType::F16); }) == PEFT_ERR_INVALID_ARGUMENT);
  w.write(raw + 7, 30);
  w.write(raw + 37, 23);
  // a.bias converted from f32 while writing.
  const std::vector<float> ab{1.0f, -2.5f, 65504.0f, 1e-8f};
  CHECK(error_code_of([&] { w.finish(); }, &message) == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(message.find("a.bias") != std::string::npos);
  w.begin_tensor("a.bias", DType::F32);
  CHECK(error_code_of([&] { w.write(ab.data(), 6); }) == PEFT_ERR_INVALID_ARGUMENT);  // half an element
  w.write(ab.data(), 16);
  CHECK(writer_test::temporaries(dir.path()).size() == 1);
  CHECK_FALSE(std::filesystem::exists(path));  // nothing at the target before finish
  w.finish();
  CHECK(writer_test::temporaries(dir.path()).empty());

  auto ck = Checkpoint::open(path);
  REQUIRE(ck->tensor_count() == 4);
  const auto read_bytes = [&](const char* name) { return bytes_of(ck->view(*ck->find(name))); };
  CHECK(read_bytes("c") == std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(&c), reinterpret_cast<const uint8_t*>(&c) + 8));
  CHECK(read_bytes("b.weight") == std::vector<uint8_t>(raw, raw + 60));
  std::vector<uint8_t> expected_f16(8);
  convert(DType::F32, ab.data(), DType::F16, expected_f16.data(), 4);
  CHECK(read_bytes("a.bias") == expected_f16);
  CHECK_FALSE(ck->file_metadata(0).has_value());
}

TEST_CASE("writer stream: callbacks fill bounded chunks, conversion included") {
  ScratchDir dir;
  const std::string path = dir.path("cb.safetensors");
  // 3M f32 elements converted to bf16: 12 MB of source in chunks of at most 4 MiB.
  const size_t n = 3u << 20;
  const std::vector<float> src = iota_f32(n, -1000.0f);
  FileWriter w(path);
  w.add_tensor("big", DType::BF16, {n});
  w.add_tensor("empty", DType::F32, {0, 3});
  bool called = false;
  w.write_from("empty", DType::F32, [&](uint64_t, void*, uint64_t) { return called = true; });
  CHECK_FALSE(called);
  std::vector<uint64_t> offsets;
  uint64_t largest = 0;
  w.write_from("big", DType::F32, [&](uint64_t offset, void* dst, uint64_t nbytes) {
    offsets.push_back(offset);
    largest = std::max(largest, nbytes);
    CHECK(nbytes % 4 == 0);
    std::memcpy(dst, reinterpret_cast<const uint8_t*>(src.data()) + offset, nbytes);
    return true;
  });
  CHECK(largest <= kStreamChunkBytes);
  CHECK(offsets.size() == 3);
  CHECK(offsets.front() == 0);
  w.finish();
  auto ck = Checkpoint::open(path);
  std::vector<uint8_t> expected(n * 2);
  convert(DType::F32, src.data(), DType::BF16, expected.data(), n);
  CHECK(bytes_of(ck->view(*ck->find("big"))) == expected);
}

TEST_CASE("writer stream: rewriting from a checkpoint, with and without conversion") {
  ScratchDir dir;
  const std::string src_path = dir.path("src.safetensors");
  const std::vector<float> a = iota_f32(1000);
  const std::vector<int32_t> ids{1, 2, 3};
  {
    FileWriter w(src_path);
    w.add_tensor("a", DType::F32, {10, 100});
    w.add_tensor("ids", DType::I32, {3});
    w.set_metadata("format", "pt");
    w.write_tensor("a", DType::F32, a.data(), 4000);
    w.write_tensor("ids", DType::I32, ids.data(), 12);
    w.finish();
  }
  auto src = Checkpoint::open(src_path);
  // Same dtypes: byte-identical copy.
  const std::string copy_path = dir.path("copy.safetensors");
  {
    FileWriter w(copy_path);
    w.set_metadata("format", "pt");
    for (size_t i = 0; i < src->tensor_count(); ++i) {
      const TensorInfo& t = src->tensor(i);
      w.add_tensor(t.name, t.dtype, t.shape);
    }
    w.start();
    for (size_t p = 0; p < w.tensor_count(); ++p) {
      const std::string& name = w.tensor_at(p).name;
      w.write_from_checkpoint(name, *src, *src->find(name));
    }
    w.finish();
  }
  CHECK(writer_test::read_file(copy_path) == writer_test::read_file(src_path));
  // To bf16 (floats and integers both convert); a shape mismatch or a bad index is refused first.
  const std::string half_path = dir.path("half.safetensors");
  FileWriter w(half_path);
  w.add_tensor("a", DType::BF16, {10, 100});
  w.add_tensor("ids", DType::BF16, {3});
  w.add_tensor("wrong", DType::F32, {1000});
  w.start();
  CHECK(w.tensor_at(0).name == "wrong");
  CHECK(error_code_of([&] { w.write_from_checkpoint("wrong", *src, *src->find("a")); }) == PEFT_ERR_SHAPE_MISMATCH);
  CHECK(error_code_of([&] { w.write_from_checkpoint("wrong", *src, 99); }) == PEFT_ERR_INVALID_ARGUMENT);
  w.write_tensor("wrong", DType::F32, a.data(), 4000);
  w.write_from_checkpoint("a", *src, *src->find("a"));
  w.write_from_checkpoint("ids", *src, *src->find("ids"));  // I32 -> BF16 converts
  w.finish();
  auto half = Checkpoint::open(half_path);
  std::vector<uint8_t> expected(2000);
  convert(DType::F32, a.data(), DType::BF16, expected.data(), 1000);
  CHECK(bytes_of(half->view(*half->find("a"))) == expected);
}

TEST_CASE("writer stream: a cancelling callback discards the output and keeps the old file") {
  ScratchDir dir;
  const std::string path = dir.path("keep.safetensors");
  writer_test::write_file(path, "old content");
  FileWriter w(path);
  w.add_tensor("t", DType::U8, {10u << 20});
  int calls = 0;
  std::string message;
  CHECK(error_code_of([&] {
          w.write_from("t", DType::U8, [&](uint64_t, void* dst, uint64_t nbytes) {
            std::memset(dst, 1, nbytes);
            return ++calls < 2;
          });
        }, &message) == PEFT_ERR_CANCELLED);
  CHECK(message.find("\"t\"") != std::string::npos);
  CHECK(calls == 2);
  CHECK(w.failed());
  CHECK(writer_test::read_file(path) == "old content");
  CHECK(writer_test::temporaries(dir.path()).empty());
  // A failed writer refuses everything afterwards.
  CHECK(error_code_of([&] { w.finish(); }) == PEFT_ERR_INVALID_ARGUMENT);
}

TEST_CASE("writer stream: an exception from a callback discards the output too") {
  ScratchDir dir;
  FileWriter w(dir.path("x.safetensors"));
  w.add_tensor("t", DType::U8, {100});
  CHECK_THROWS_AS(w.write_from("t", DType::U8, [&](uint64_t, void*, uint64_t) -> bool { throw std::runtime_error("boom"); }),
                  std::runtime_error);
  CHECK(w.failed());
  CHECK(writer_test::entries(dir.path()).empty());
}

TEST_CASE("writer stream: an unfinished writer leaves nothing behind") {
  ScratchDir dir;
  {
    FileWriter w(dir.path("x.safetensors"));
    w.add_tensor("t", DType::U8, {100});
    w.begin_tensor("t", DType::U8);
    const std::vector<uint8_t> half(50, 3);
    w.write(half.data(), half.size());
    CHECK(writer_test::temporaries(dir.path()).size() == 1);
  }
  CHECK(writer_test::entries(dir.path()).empty());
}

TEST_CASE("writer stream: unsupported conversions and finished writers") {
  ScratchDir dir;
  FileWriter w(dir.path("x.safetensors"));
  w.add_tensor("t", DType::I32, {2});
  CHECK(error_code_of([&] { w.begin_tensor("t", DType::F32); }) == PEFT_ERR_UNSUPPORTED);
  const int32_t v[2] = {1, 2};
  w.write_tensor("t", DType::I32, v, 8);
  CHECK(error_code_of([&] { w.add_tensor("u", DType::I32, {2}); }) == PEFT_ERR_INVALID_ARGUMENT);
  w.finish();
  CHECK(w.finished());
  CHECK(error_code_of([&] { w.finish(); }) == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(std::filesystem::exists(dir.path("x.safetensors")));
}

TEST_CASE("writer stream: the output file's mode follows the umask") {
  ScratchDir dir;
  const mode_t old = ::umask(027);
  {
    FileWriter w(dir.path("m.safetensors"));
    w.finish();
  }
  ::umask(old);
  struct stat st {};
  REQUIRE(::stat(dir.path("m.safetensors").c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0640);
}

TEST_CASE("atomic file: a file larger than the writeback spans, written in uneven pieces, reads back whole") {
  // AtomicFile paces writeback every 32 MiB (sync_file_range, then the span before is dropped from
  // the page cache): 100 MiB + 3 bytes in pieces that straddle the spans' ends must come back as written.
  ScratchDir dir;
  const std::string path = dir.path("large.bin");
  const size_t total = (size_t{100} << 20) + 3;
  std::vector<uint8_t> bytes(total);
  for (size_t i = 0; i < total; ++i) bytes[i] = static_cast<uint8_t>((i * 2654435761u) >> 13);
  {
    AtomicFile file(path);
    const size_t piece = (size_t{7} << 20) + 1;
    for (size_t at = 0; at < total; at += piece) file.write(bytes.data() + at, std::min(piece, total - at));
    CHECK(file.bytes_written() == total);
    file.commit();
  }
  const std::string back = writer_test::read_file(path);
  REQUIRE(back.size() == total);
  CHECK(std::memcmp(back.data(), bytes.data(), total) == 0);

  // Reading ahead is a hint: any range, even past the end, changes nothing and never fails.
  ReadOnlyFile file = ReadOnlyFile::open(path);
  file.will_need(0, UINT64_MAX);
  file.will_need(total - 1, 1000);
  file.will_need(total + 10, 5);
  std::vector<uint8_t> tail(1000);
  file.read_exact(total - 1000, tail.data(), tail.size());
  CHECK(std::memcmp(tail.data(), bytes.data() + total - 1000, tail.size()) == 0);
}
