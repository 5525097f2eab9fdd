// libFuzzer target over the readers of quantized bases: bitsandbytes' quantization state
// (peft/base/bnb_base.hpp: recognise_bnb_base, bnb_dequantize, and bnb_quantize's write-back) and
// FP8 block scales (core/quant/fp8_block.hpp with merge/base_quantization.hpp's weight_block_size).
//
// Input: byte 0 chooses the part (bit 0: 0 bitsandbytes, 1 FP8); bytes 1-7 are that part's controls;
// the rest is text, cut at NUL bytes into fields.
//
// bitsandbytes: "STATE\0CONFIG\0POOL". The harness writes an in-memory safetensors file holding a
// 4-bit weight "m.weight" whose quant_state tensor holds STATE, with its companions sized as STATE's
// shape, blocksize and nested_blocksize ask (so that the reader gets past its size checks), then
// opens it with Checkpoint::open_memory. Controls: byte 1 flags (below), byte 2 a size perturbation
// (low 3 bits: which tensor, high 5 bits: elements added - 16), byte 3 an int8 weight's rows (low
// nibble) and columns (high nibble). Tensor data comes from POOL, cycled. CONFIG replaces the default
// config.json when flag 0x20 is set.
//
// FP8: "CONFIG\0POOL". Byte 1: dimensions - 2 (0-2) in bits 0-1, bit 2: block sizes from CONFIG
// (recognise_base_quantization) instead of bytes 6-7; bytes 2-5 the dimensions (the last two are rows
// and columns); bytes 6-7 the block rows and columns (255: 2^64 - 1). The weight's e4m3 bytes and
// scales come from POOL; it is dequantized and quantized again.
//
// Every failure must be a peft::Error with a code the readers document; results must have the sizes
// the layout says. Anything else (a crash, a sanitizer report, another exception escaping, a large
// allocation) is a finding.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.hpp"
#include "core/error.hpp"
#include "core/json_parse.hpp"
#include "core/quant/bnb_4bit.hpp"
#include "core/quant/fp8_block.hpp"
#include "peft/base/bnb_base.hpp"
#include "peft/merge/base_quantization.hpp"

namespace {

void require(bool condition) {
  if (!condition) __builtin_trap();
}

// Flags of byte 1 (bitsandbytes).
constexpr uint8_t kFp4 = 0x01;            // the state tensor is named "...bitsandbytes__fp4" (else nf4)
constexpr uint8_t kNestedTensors = 0x02;  // write nested_absmax and nested_quant_map
constexpr uint8_t kRealQuantMap = 0x04;   // quant_map holds bitsandbytes' own table (else POOL)
constexpr uint8_t kFlipAbsmax = 0x08;     // absmax in the other dtype than the state asks for
constexpr uint8_t kInt8 = 0x10;           // also an int8 weight "q.weight" with "q.SCB"
constexpr uint8_t kConfig = 0x20;         // config.json from CONFIG
constexpr uint8_t kNoAbsmax = 0x40;       // no absmax tensor

constexpr uint64_t kMaxElements = 1 << 16;

std::vector<std::string_view> fields(std::string_view text, size_t count) {
  std::vector<std::string_view> out;
  while (out.size() + 1 < count) {
    const size_t at = text.find('\0');
    if (at == std::string_view::npos) break;
    out.push_back(text.substr(0, at));
    text.remove_prefix(at + 1);
  }
  out.push_back(text);
  out.resize(count);
  return out;
}

// Bytes cycled from the pool (a fixed pattern when it is empty).
struct Pool {
  std::string_view bytes;
  size_t at = 0;
  uint8_t next() {
    if (bytes.empty()) return static_cast<uint8_t>(at++ * 37 + 11);
    return static_cast<uint8_t>(bytes[at++ % bytes.size()]);
  }
  std::vector<uint8_t> take(uint64_t n) {
    std::vector<uint8_t> out(n);
    for (uint8_t& b : out) b = next();
    return out;
  }
};

// An in-memory safetensors file.
struct FileBuilder {
  std::string header = "{";
  std::vector<uint8_t> data;
  void add(const std::string& name, const char* dtype, const std::vector<uint64_t>& shape,
           const std::vector<uint8_t>& bytes) {
    std::string dims;
    for (uint64_t d : shape) dims += (dims.empty() ? "" : ",") + std::to_string(d);
    header += std::string(header.size() > 1 ? "," : "") + "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":[" +
              dims + "],\"data_offsets\":[" + std::to_string(data.size()) + "," +
              std::to_string(data.size() + bytes.size()) + "]}";
    data.insert(data.end(), bytes.begin(), bytes.end());
  }
  std::shared_ptr<const peft::Checkpoint> open() {
    header += "}";
    header.append((8 - header.size() % 8) % 8, ' ');
    std::vector<uint8_t> file(8);
    const uint64_t length = header.size();
    std::memcpy(file.data(), &length, 8);
    file.insert(file.end(), header.begin(), header.end());
    file.insert(file.end(), data.begin(), data.end());
    return peft::Checkpoint::open_memory(file.data(), file.size());  // well formed by construction
  }
};

std::vector<uint8_t> f32_bytes(const float* values, size_t count) {
  std::vector<uint8_t> out(count * 4);
  std::memcpy(out.data(), values, out.size());
  return out;
}

uint64_t blocks_of(uint64_t n, uint64_t block) { return n == 0 ? 0 : (n - 1) / block + 1; }

// What the state asks for, as far as the harness can tell (defaults where it cannot).
struct Sizes {
  uint64_t n = 64, blocksize = 64, nested_blocksize = 256;
  bool nested = false;
};

Sizes sizes_of(std::string_view state_text) {
  Sizes s;
  nlohmann::ordered_json state;
  try {
    state = peft::parse_json_ordered(state_text, PEFT_ERR_INVALID_CHECKPOINT, "state");
  } catch (const peft::Error&) {
    return s;
  }
  if (!state.is_object()) return s;
  s.nested = state.contains("nested_offset");
  if (state.contains("blocksize") && state["blocksize"].is_number_unsigned() && state["blocksize"].get<uint64_t>() > 0)
    s.blocksize = state["blocksize"].get<uint64_t>();
  if (state.contains("nested_blocksize") && state["nested_blocksize"].is_number_unsigned() &&
      state["nested_blocksize"].get<uint64_t>() > 0)
    s.nested_blocksize = state["nested_blocksize"].get<uint64_t>();
  if (state.contains("shape") && state["shape"].is_array()) {
    uint64_t n = 1;
    for (const auto& d : state["shape"]) {
      const uint64_t v = d.is_number_unsigned() ? d.get<uint64_t>() : 0;
      if (__builtin_mul_overflow(n, v, &n)) n = kMaxElements + 1;
    }
    s.n = std::min(n, kMaxElements + 1);
  }
  return s;
}

bool bnb_code(int32_t code) {
  return code == PEFT_ERR_INVALID_CHECKPOINT || code == PEFT_ERR_UNSUPPORTED || code == PEFT_ERR_VALIDATION_OVERFLOW ||
         code == PEFT_ERR_NON_FINITE;
}

void check_weight(const peft::Checkpoint& c, const peft::BnbWeight& w) {
  uint64_t n = 1;
  for (uint64_t d : w.shape) n *= d;  // recognise_bnb_base has checked it
  const std::vector<float> values = peft::bnb_dequantize(c, w);
  require(values.size() == n);
  const std::map<size_t, std::vector<uint8_t>> parts = peft::bnb_quantize(c, w, values);
  require(parts.contains(w.weight));
  const std::vector<size_t> companions = w.companions();
  for (const auto& [index, bytes] : parts) {
    require(index == w.weight || std::ranges::find(companions, index) != companions.end());
    if (index != w.quant_state) {
      require(bytes.size() == c.tensor(index).nbytes());  // written back in place
      continue;
    }
    // The rewritten state reads back as the same state, nested_offset apart (which is infinite or NaN,
    // as Python's json writes it, when the values are: the merge's allow_nonfinite).
    if (!std::ranges::all_of(values, [](float v) { return std::isfinite(v); })) continue;
    nlohmann::ordered_json again = peft::parse_json_ordered(
        std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()), PEFT_ERR_INTERNAL, "written state");
    nlohmann::ordered_json before = w.state;
    if (w.nested) {
      require(again.contains("nested_offset") && again["nested_offset"].is_number());
      again.erase("nested_offset");
      before.erase("nested_offset");
    }
    require(again == before);
  }
}

void run_bnb(const uint8_t* control, std::string_view text) {
  const uint8_t flags = control[1];
  const auto part = fields(text, 3);
  const std::string_view state_text = part[0];
  Pool pool{part[2]};
  const Sizes s = sizes_of(state_text);
  const bool tiny = s.n <= kMaxElements;
  const uint64_t n = tiny ? s.n : 1;
  const uint64_t blocks = blocks_of(n, s.blocksize);
  // Elements of: packed, absmax, quant_map, nested_absmax, nested_quant_map, SCB; one perturbed.
  uint64_t count[6] = {(n + 1) / 2, blocks, 16, blocks_of(blocks, s.nested_blocksize), 256, control[3] & 0x0Fu};
  const unsigned which = control[2] & 0x07;
  const int delta = (control[2] >> 3) - 16;
  if (which < 6 && delta != 0) count[which] = static_cast<uint64_t>(std::max<int64_t>(0, static_cast<int64_t>(count[which]) + delta));

  FileBuilder file;
  file.add("m.weight", "U8", {count[0], 1}, pool.take(count[0]));
  const bool absmax_u8 = s.nested != ((flags & kFlipAbsmax) != 0);
  if (!(flags & kNoAbsmax)) {
    if (absmax_u8)
      file.add("m.weight.absmax", "U8", {count[1]}, pool.take(count[1]));
    else
      file.add("m.weight.absmax", "F32", {count[1]}, pool.take(count[1] * 4));
  }
  const peft::bnb::FourBit type = (flags & kFp4) ? peft::bnb::FourBit::fp4 : peft::bnb::FourBit::nf4;
  if (flags & kRealQuantMap) {
    const auto code = peft::bnb::four_bit_code(type);
    std::vector<uint8_t> bytes = f32_bytes(code.data(), code.size());
    bytes.resize(count[2] * 4);
    file.add("m.weight.quant_map", "F32", {count[2]}, bytes);
  } else {
    file.add("m.weight.quant_map", "F32", {count[2]}, pool.take(count[2] * 4));
  }
  if (flags & kNestedTensors) {
    file.add("m.weight.nested_absmax", "F32", {count[3]}, pool.take(count[3] * 4));
    file.add("m.weight.nested_quant_map", "F32", {count[4]}, pool.take(count[4] * 4));
  }
  const std::vector<uint8_t> state(state_text.begin(), state_text.end());
  file.add(std::string("m.weight.quant_state.bitsandbytes__") + ((flags & kFp4) ? "fp4" : "nf4"), "U8",
           {state.size()}, state);
  if (flags & kInt8) {
    const uint64_t rows = control[3] & 0x0F, cols = control[3] >> 4;
    file.add("q.weight", "I8", {rows, cols}, pool.take(rows * cols));
    file.add("q.SCB", "F32", {count[5]}, pool.take(count[5] * 4));
    file.add("q.weight_format", "U8", {1}, {0});
  }
  const std::shared_ptr<const peft::Checkpoint> c = file.open();

  nlohmann::json config = {{"quantization_config", {{"quant_method", "bitsandbytes"}, {"load_in_4bit", true}}}};
  if (flags & kConfig) {
    try {
      config = peft::parse_json(part[1], PEFT_ERR_INVALID_CONFIG, "config.json");
    } catch (const peft::Error& e) {
      return;
    }
  }
  try {
    const std::optional<peft::BnbBase> base = peft::recognise_bnb_base(config, *c, "fuzz");
    if (!base) return;
    for (const auto& [index, w] : base->weights) {
      require(index == w.weight);
      for (size_t companion : w.companions()) require(base->owner.at(companion) == index);
      try {
        check_weight(*c, w);
      } catch (const peft::Error& e) {
        require(bnb_code(e.code()));
      }
    }
  } catch (const peft::Error& e) {
    require(bnb_code(e.code()));
  }
}

void run_fp8(const uint8_t* control, std::string_view text) {
  const auto part = fields(text, 2);
  Pool pool{part[1]};
  const size_t dims = 2 + (control[1] & 0x03) % 3;
  std::vector<uint64_t> shape;
  for (size_t d = 0; d < dims; ++d) shape.push_back(control[2 + (4 - dims) + d] % (d + 2 < dims ? 4 : 64));
  const auto block = [](uint8_t b) { return b == 255 ? UINT64_MAX : uint64_t{b} + 1; };
  uint64_t block_rows = block(control[6]), block_cols = block(control[7]);
  if (control[1] & 0x04) {
    try {
      const nlohmann::json config = peft::parse_json(part[0], PEFT_ERR_INVALID_CONFIG, "config.json");
      const peft::BaseQuantization q = peft::recognise_base_quantization(config, "fuzz");
      if (q.method != peft::BaseQuantMethod::fp8_block) return;
      require(q.block_rows > 0 && q.block_cols > 0);
      block_rows = q.block_rows;
      block_cols = q.block_cols;
    } catch (const peft::Error& e) {
      require(e.code() == PEFT_ERR_INVALID_CONFIG || e.code() == PEFT_ERR_INVALID_CHECKPOINT ||
              e.code() == PEFT_ERR_UNSUPPORTED);
      return;
    }
  }
  const peft::Fp8BlockLayout layout = peft::fp8_block_layout(shape, block_rows, block_cols);
  const std::vector<uint64_t> scale_shape = peft::fp8_scale_shape(shape, layout);
  uint64_t scales = 1;
  for (uint64_t d : scale_shape) scales *= d;
  require(scale_shape.size() == shape.size() && layout.scales() == scales);
  const uint64_t n = layout.elements();
  require(scales <= n);
  const std::vector<uint8_t> q = pool.take(n);
  std::vector<float> scale_inv(scales);
  const std::vector<uint8_t> scale_bytes = pool.take(scales * 4);
  if (scales != 0) std::memcpy(scale_inv.data(), scale_bytes.data(), scale_bytes.size());
  std::vector<float> w(n);
  peft::fp8_block_dequantize(layout, q.data(), scale_inv.data(), w.data());
  std::vector<uint8_t> q2(n);
  std::vector<float> scale_inv2(scales);
  try {
    peft::fp8_block_quantize(layout, w.data(), q2.data(), scale_inv2.data(), "fuzz");
  } catch (const peft::Error& e) {
    require(e.code() == PEFT_ERR_NON_FINITE);
    require(std::ranges::any_of(w, [](float v) { return !std::isfinite(v); }));
    return;
  }
  for (float s : scale_inv2) require(std::isfinite(s) && s > 0.0f);
  // Quantized again, the weight dequantizes to finite values (a block whose largest value is near
  // FLT_MAX may round past it, as it does in transformers).
  std::vector<float> w2(n);
  peft::fp8_block_dequantize(layout, q2.data(), scale_inv2.data(), w2.data());
  for (uint64_t i = 0; i < n; ++i) require(std::isfinite(w2[i]) || std::fabs(w[i]) > 1e38f);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 8) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data) + 8, size - 8);
  if (data[0] & 1)
    run_fp8(data, text);
  else
    run_bnb(data, text);
  return 0;
}
