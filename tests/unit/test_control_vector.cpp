// Control vectors (peft/control): llama.cpp's GGUF and safetensors files read and written, what the
// readers refuse, llama.cpp's combining arithmetic, and a buffer apply that is taken out exactly.
// The byte-for-byte equality with gguf-py and Python safetensors, and llama.cpp's own reading, are
// in tests/interop/test_control_vector.py.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "checkpoint_test_support.hpp"
#include "core/bf16.hpp"
#include "core/f16.hpp"
#include "gguf/gguf_writer.hpp"
#include "peft/control/control_apply.hpp"
#include "peft/control/control_vector.hpp"
#include "safetensors/writer.hpp"
#include "test_error_support.hpp"

using checkpoint_test::TempDir;
using error_test::code_of;
using peft::ControlVector;
using peft::DType;

namespace {

ControlVector sample(uint64_t n_embd = 5) {
  ControlVector v;
  v.n_embd = n_embd;
  v.model_hint = "llama";
  for (int64_t layer : {1, 2, 10}) {
    std::vector<float> d(n_embd);
    for (uint64_t j = 0; j < n_embd; ++j) d[j] = 0.25f * static_cast<float>(layer) - 0.125f * static_cast<float>(j);
    v.directions[layer] = d;
  }
  return v;
}

// A GGUF file of the given tensors (name, ggml type, shape) with F32 zeros or raw bytes of the size.
void write_gguf(const std::string& path, const std::string& architecture,
                const std::vector<std::tuple<std::string, uint32_t, std::vector<uint64_t>>>& tensors) {
  peft::GgufWriter writer(path);
  if (!architecture.empty())
    writer.add_metadata("general.architecture", peft::GgufValue{peft::GgufValueType::STRING, architecture});
  for (const auto& [name, type, shape] : tensors) writer.add_tensor(name, type, shape);
  writer.start();
  for (const peft::TensorInfo& info : writer.tensors()) {
    std::vector<uint8_t> zeros(info.nbytes());
    writer.write_tensor(info.name, zeros.data(), zeros.size());
  }
  writer.finish();
}

int32_t read_code(const std::string& path, std::string* message = nullptr) {
  try {
    peft::read_control_vector(path);
  } catch (const peft::Error& e) {
    if (message) *message = e.what();
    return e.code();
  }
  return PEFT_OK;
}

}  // namespace

TEST_CASE("control vector: GGUF and safetensors round trips keep every value and the hint") {
  TempDir dir;
  const ControlVector v = sample();
  peft::write_control_vector_gguf(v, dir / "v.gguf");
  peft::write_control_vector_safetensors(v, dir / "v.safetensors");
  for (const std::string name : {"v.gguf", "v.safetensors"}) {
    const ControlVector back = peft::read_control_vector(dir / name);
    CHECK(back.n_embd == v.n_embd);
    CHECK(back.model_hint == "llama");
    CHECK(back.directions == v.directions);
  }
}

TEST_CASE("control vector: safetensors names and dtypes people save steering vectors with") {
  TempDir dir;
  peft::FileWriter writer(dir / "s.safetensors");
  const std::vector<uint16_t> half = {peft::f32_to_bf16(1.5f), peft::f32_to_bf16(-2.0f)};
  const std::vector<double> wide = {0.5, 0.25};
  const std::vector<float> flat = {3.0f, 4.0f};
  writer.add_tensor("model.layers.4", DType::BF16, {1, 2});
  writer.add_tensor("layers.0", DType::F64, {2});
  writer.add_tensor("7", DType::F32, {2});
  writer.start();
  for (size_t i = 0; i < writer.tensor_count(); ++i) {
    const std::string& name = writer.tensor_at(i).name;
    if (name == "model.layers.4") writer.write_tensor(name, DType::BF16, half.data(), 4);
    if (name == "layers.0") writer.write_tensor(name, DType::F64, wide.data(), 16);
    if (name == "7") writer.write_tensor(name, DType::F32, flat.data(), 8);
  }
  writer.finish();
  const ControlVector v = peft::read_control_vector(dir / "s.safetensors");
  CHECK(v.n_embd == 2);
  CHECK(v.model_hint.empty());
  CHECK(v.directions.at(4) == std::vector<float>{1.5f, -2.0f});
  CHECK(v.directions.at(0) == std::vector<float>{0.5f, 0.25f});
  CHECK(v.directions.at(7) == std::vector<float>{3.0f, 4.0f});
  // Layer 0 cannot go to llama.cpp's format, and the message says why.
  try {
    peft::write_control_vector_gguf(v, dir / "out.gguf");
    FAIL("written");
  } catch (const peft::Error& e) {
    CHECK(e.code() == PEFT_ERR_INVALID_ARGUMENT);
    CHECK(std::string(e.what()).find("layer 0") != std::string::npos);
  }
  CHECK_FALSE(std::filesystem::exists(dir / "out.gguf"));
}

TEST_CASE("control vector: the GGUF reader refuses what llama.cpp refuses, and a little more") {
  TempDir dir;
  constexpr uint32_t F32 = 0, F16 = 1;
  struct Case {
    const char* what;
    std::string architecture;
    std::vector<std::tuple<std::string, uint32_t, std::vector<uint64_t>>> tensors;
    int32_t code;
  };
  const std::vector<Case> cases = {
      {"layer 0", "controlvector", {{"direction.0", F32, {4}}}, PEFT_ERR_INVALID_CHECKPOINT},
      {"F16", "controlvector", {{"direction.1", F16, {4}}}, PEFT_ERR_INVALID_CHECKPOINT},
      {"2-D", "controlvector", {{"direction.1", F32, {2, 4}}}, PEFT_ERR_INVALID_CHECKPOINT},
      {"lengths differ", "controlvector", {{"direction.1", F32, {4}}, {"direction.2", F32, {5}}}, PEFT_ERR_INVALID_CHECKPOINT},
      {"other name", "controlvector", {{"blk.0.attn_q.weight", F32, {4}}}, PEFT_ERR_INVALID_CHECKPOINT},
      {"non-canonical number", "controlvector", {{"direction.01", F32, {4}}}, PEFT_ERR_INVALID_CHECKPOINT},
      {"trailing junk", "controlvector", {{"direction.1a", F32, {4}}}, PEFT_ERR_INVALID_CHECKPOINT},
      {"a model", "llama", {{"direction.1", F32, {4}}}, PEFT_ERR_INVALID_CHECKPOINT},
      {"no tensors", "controlvector", {}, PEFT_ERR_INVALID_CHECKPOINT},
      {"outer dimension of 1", "controlvector", {{"direction.3", F32, {1, 4}}}, PEFT_OK},
      {"no architecture", "", {{"direction.3", F32, {4}}}, PEFT_OK},
  };
  for (const Case& c : cases) {
    CAPTURE(c.what);
    const std::string path = dir / (std::string(c.what) + ".gguf");
    write_gguf(path, c.architecture, c.tensors);
    std::string message;
    CHECK(read_code(path, &message) == c.code);
    if (c.code != PEFT_OK) CHECK(message.find(path) != std::string::npos);
  }
}

TEST_CASE("control vector: non-finite values, duplicate layers and wrong dtypes are refused") {
  TempDir dir;
  {
    peft::FileWriter writer(dir / "nan.safetensors");
    const float values[2] = {1.0f, std::numeric_limits<float>::quiet_NaN()};
    writer.add_tensor("direction.1", DType::F32, {2});
    writer.write_tensor("direction.1", DType::F32, values, sizeof values);
    writer.finish();
  }
  CHECK(read_code(dir / "nan.safetensors") == PEFT_ERR_NON_FINITE);
  {
    peft::FileWriter writer(dir / "twice.safetensors");
    const float values[2] = {1.0f, 2.0f};
    writer.add_tensor("direction.1", DType::F32, {2});
    writer.add_tensor("layers.1", DType::F32, {2});
    writer.start();
    for (size_t i = 0; i < writer.tensor_count(); ++i) writer.write_tensor(writer.tensor_at(i).name, DType::F32, values, 8);
    writer.finish();
  }
  CHECK(read_code(dir / "twice.safetensors") == PEFT_ERR_INVALID_CHECKPOINT);
  {
    peft::FileWriter writer(dir / "int.safetensors");
    const int32_t values[2] = {1, 2};
    writer.add_tensor("direction.1", DType::I32, {2});
    writer.write_tensor("direction.1", DType::I32, values, sizeof values);
    writer.finish();
  }
  CHECK(read_code(dir / "int.safetensors") == PEFT_ERR_INVALID_CHECKPOINT);
  CHECK(read_code(dir / "missing.gguf") == PEFT_ERR_IO);

  ControlVector v = sample(2);
  const float bad[2] = {1.0f, std::numeric_limits<float>::infinity()};
  CHECK(code_of([&] { peft::set_direction(v, 3, DType::F32, bad); }) == PEFT_ERR_NON_FINITE);
  CHECK(v.directions.count(3) == 0);
  const float good[2] = {1.0f, 2.0f};
  CHECK(code_of([&] { peft::set_direction(v, -1, DType::F32, good); }) == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(code_of([&] { peft::write_control_vector_gguf(ControlVector{4, "", {}}, dir / "empty.gguf"); }) ==
        PEFT_ERR_INVALID_ARGUMENT);
}

TEST_CASE("control vector: add_scaled is llama.cpp's f32 arithmetic, and refuses other sizes") {
  ControlVector dst = sample();
  const ControlVector before = dst;
  ControlVector src = sample();
  src.directions.erase(1);
  src.directions[5] = std::vector<float>(5, 0.1f);
  const double strength = 0.3;  // (float)0.3 differs from 0.3: the product uses the float
  peft::add_scaled(dst, src, strength);
  const auto s = static_cast<float>(strength);
  CHECK(dst.directions.at(1) == before.directions.at(1));
  for (int64_t layer : {2, 10, 5}) {
    const std::vector<float> base = before.directions.count(layer) ? before.directions.at(layer) : std::vector<float>(5, 0.0f);
    for (size_t j = 0; j < 5; ++j) {
      volatile float product = src.directions.at(layer)[j] * s;
      CHECK(dst.directions.at(layer)[j] == base[j] + product);
    }
  }
  ControlVector other = sample(4);
  CHECK(code_of([&] { peft::add_scaled(dst, other, 1.0); }) == PEFT_ERR_SHAPE_MISMATCH);
  ControlVector big = sample(5);
  big.directions.at(2)[0] = 3e38f;
  CHECK(code_of([&] { peft::add_scaled(big, big, 1.0); }) == PEFT_ERR_NON_FINITE);
  CHECK(big.directions.at(2)[0] == 3e38f);  // unchanged on failure
}

TEST_CASE("control vector: apply adds x + d * strength rounded once, and removal restores every byte") {
  const ControlVector v = sample(5);
  const double strength = -1.7;
  const auto s = static_cast<float>(strength);
  for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
    CAPTURE(peft::dtype_name(dtype));
    const size_t width = dtype == DType::F32 ? 4 : 2;
    const uint64_t rows = 3;
    std::vector<uint8_t> buffer(rows * 5 * width);
    for (size_t i = 0; i < rows * 5; ++i) {
      const float x = 0.37f * static_cast<float>(i) - 2.0f;
      if (dtype == DType::F32) std::memcpy(&buffer[i * 4], &x, 4);
      const uint16_t h = dtype == DType::BF16 ? peft::f32_to_bf16(x) : peft::f32_to_f16(x);
      if (dtype != DType::F32) std::memcpy(&buffer[i * 2], &h, 2);
    }
    const std::vector<uint8_t> original = buffer;
    auto record = peft::apply_control_vector(v, 2, strength, buffer.data(), dtype, rows, true);
    REQUIRE(record);
    for (size_t i = 0; i < rows * 5; ++i) {
      float x = 0, y = 0;
      uint16_t h = 0;
      if (dtype == DType::F32) {
        std::memcpy(&x, &original[i * 4], 4);
        std::memcpy(&y, &buffer[i * 4], 4);
        volatile float product = v.directions.at(2)[i % 5] * s;
        CHECK(y == x + product);
      } else {
        std::memcpy(&h, &original[i * 2], 2);
        x = dtype == DType::BF16 ? peft::bf16_to_f32(h) : peft::f16_to_f32(h);
        volatile float product = v.directions.at(2)[i % 5] * s;
        const float sum = x + product;
        std::memcpy(&h, &buffer[i * 2], 2);
        CHECK(h == (dtype == DType::BF16 ? peft::f32_to_bf16(sum) : peft::f32_to_f16(sum)));
      }
    }
    CHECK(buffer != original);
    // A changed buffer is not restored; the right one is, byte for byte, and only once.
    std::vector<uint8_t> touched = buffer;
    touched[0] ^= 1;
    CHECK(code_of([&] { record->remove(touched.data()); }) == PEFT_ERR_INVALID_ARGUMENT);
    record->remove(buffer.data());
    CHECK(buffer == original);
    CHECK_FALSE(record->active());
    CHECK(code_of([&] { record->remove(buffer.data()); }) == PEFT_ERR_INVALID_ARGUMENT);
  }
}

TEST_CASE("control vector: apply leaves layers without a direction alone and refuses bad buffers") {
  const ControlVector v = sample(2);
  std::vector<float> buffer = {1.0f, 2.0f};
  auto record = peft::apply_control_vector(v, 7, 1.0, buffer.data(), DType::F32, 1, true);
  CHECK(buffer == std::vector<float>{1.0f, 2.0f});
  record->remove(buffer.data());
  CHECK(peft::apply_control_vector(v, 1, 1.0, buffer.data(), DType::F32, 1, false) == nullptr);
  CHECK(buffer != std::vector<float>{1.0f, 2.0f});
  std::vector<double> wide(2);
  CHECK(code_of([&] { peft::apply_control_vector(v, 1, 1.0, wide.data(), DType::F64, 1, false); }) == PEFT_ERR_UNSUPPORTED);
  CHECK(code_of([&] { peft::apply_control_vector(v, 1, 1.0, buffer.data(), DType::F32, 0, false); }) ==
        PEFT_ERR_INVALID_ARGUMENT);
  CHECK(code_of([&] { peft::apply_control_vector(v, 1, 1.0, buffer.data(), DType::F32, UINT64_MAX / 2, false); }) ==
        PEFT_ERR_VALIDATION_OVERFLOW);
  // A value that would overflow f16 is refused and the buffer kept.
  std::vector<uint16_t> half = {peft::f32_to_f16(65000.0f), peft::f32_to_f16(1.0f)};
  const std::vector<uint16_t> kept = half;
  CHECK(code_of([&] { peft::apply_control_vector(v, 10 - 9, 4000.0, half.data(), DType::F16, 1, false); }) ==
        PEFT_ERR_NON_FINITE);
  CHECK(half == kept);
}
