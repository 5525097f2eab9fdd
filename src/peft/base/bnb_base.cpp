#include "peft/base/bnb_base.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string_view>

#include "core/error.hpp"
#include "core/json_parse.hpp"
#include "core/python_json.hpp"
#include "core/quant/bnb_int8.hpp"
#include "core/text.hpp"

namespace peft {
namespace {

std::vector<uint8_t> raw(const Checkpoint& c, size_t i) {
  std::vector<uint8_t> bytes(c.tensor(i).nbytes());
  c.read_bytes(i, 0, bytes.data(), bytes.size());
  return bytes;
}

std::vector<float> f32_of(const Checkpoint& c, size_t i, uint64_t count) {
  const TensorInfo& t = c.tensor(i);
  if (t.dtype != DType::F32 || t.nbytes() != count * 4)
    fail(PEFT_ERR_INVALID_CHECKPOINT, "bitsandbytes tensor " + peft::quoted(t.name) + " should hold " +
                                          std::to_string(count) + " F32 values");
  return c.read_f32(i);
}

// json.dumps(dict) with its default separators, as bitsandbytes' pack_dict_to_tensor writes it.
void dump(std::string& out, const nlohmann::ordered_json& v) {
  if (v.is_object()) {
    out += '{';
    bool first = true;
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (!first) out += ", ";
      first = false;
      append_python_string(out, it.key());
      out += ": ";
      dump(out, *it);
    }
    out += '}';
  } else if (v.is_array()) {
    out += '[';
    for (size_t i = 0; i < v.size(); ++i) {
      if (i) out += ", ";
      dump(out, v[i]);
    }
    out += ']';
  } else if (v.is_string()) {
    append_python_string(out, v.get<std::string>());
  } else if (v.is_number_float()) {
    out += python_float_repr(v.get<double>());
  } else {
    out += v.dump();  // integers, booleans, null
  }
}

uint64_t product(const std::vector<uint64_t>& shape) {
  uint64_t n = 1;
  for (uint64_t d : shape)
    if (__builtin_mul_overflow(n, d, &n)) fail(PEFT_ERR_VALIDATION_OVERFLOW, "bitsandbytes weight shape overflows");
  return n;
}

class Recogniser {
 public:
  explicit Recogniser(const Checkpoint& weights) : c_(weights) {}

  BnbBase run() {
    for (size_t i = 0; i < c_.tensor_count(); ++i) {
      const std::string& name = c_.tensor(i).name;
      for (const char* type : {"nf4", "fp4"}) {
        const std::string suffix = std::string(".quant_state.bitsandbytes__") + type;
        if (name.ends_with(suffix)) four_bit(name.substr(0, name.size() - suffix.size()), i, type);
      }
      if (name.ends_with(".SCB")) int8(name.substr(0, name.size() - 4), i);
    }
    return std::move(out_);
  }

 private:
  size_t need(const std::string& name, const std::string& what) const {
    auto i = c_.find(name);
    if (!i) fail(PEFT_ERR_INVALID_CHECKPOINT, "bitsandbytes " + what + " has no tensor " + peft::quoted(name));
    return *i;
  }

  void add(BnbWeight w) {
    for (size_t c : w.companions()) out_.owner[c] = w.weight;
    out_.weights[w.weight] = std::move(w);
  }

  void four_bit(const std::string& weight, size_t state_index, const std::string& type) {
    BnbWeight w;
    w.weight = need(weight, "weight " + peft::quoted(weight));
    w.quant_state = state_index;
    const std::vector<uint8_t> text = raw(c_, state_index);
    // Nesting bounded as every JSON the library reads, so that writing it back (dump) stays shallow.
    w.state = parse_json_ordered(std::string_view(reinterpret_cast<const char*>(text.data()), text.size()),
                                 PEFT_ERR_INVALID_CHECKPOINT, peft::quoted(c_.tensor(state_index).name));
    const std::string who = "bitsandbytes weight " + peft::quoted(weight);
    auto field = [&](const char* key) -> const nlohmann::ordered_json& {
      if (!w.state.is_object() || !w.state.contains(key))
        fail(PEFT_ERR_INVALID_CHECKPOINT, who + ": its quant_state has no " + peft::quoted(key));
      return w.state[key];
    };
    if (field("quant_type") != type)
      fail(PEFT_ERR_INVALID_CHECKPOINT, who + ": quant_state says " + field("quant_type").dump() + ", its name " + type);
    w.type = type == "nf4" ? bnb::FourBit::nf4 : bnb::FourBit::fp4;
    const auto& blocksize = field("blocksize");
    const auto& shape = field("shape");
    if (!blocksize.is_number_unsigned() || blocksize.get<uint64_t>() == 0 || !shape.is_array())
      fail(PEFT_ERR_INVALID_CHECKPOINT, who + ": quant_state has a bad blocksize or shape");
    w.blocksize = blocksize.get<uint64_t>();
    for (const auto& d : shape) {
      if (!d.is_number_unsigned()) fail(PEFT_ERR_INVALID_CHECKPOINT, who + ": quant_state has a bad shape");
      w.shape.push_back(d.get<uint64_t>());
    }
    const TensorInfo& packed = c_.tensor(w.weight);
    const uint64_t n = product(w.shape);
    if (packed.dtype != DType::U8)
      fail(PEFT_ERR_UNSUPPORTED, who + " is stored as " + std::string(dtype_name(packed.dtype)) +
                                     " (bnb_4bit_quant_storage); only uint8 storage is supported");
    if (packed.nbytes() != (n + 1) / 2)
      fail(PEFT_ERR_INVALID_CHECKPOINT, who + " holds " + std::to_string(packed.nbytes()) + " bytes, its shape " +
                                            shape_text(w.shape) + " needs " + std::to_string((n + 1) / 2));
    w.absmax = need(weight + ".absmax", who + "'s absmax");
    w.quant_map = need(weight + ".quant_map", who + "'s quant_map");
    w.nested = w.state.contains("nested_offset");
    const uint64_t blocks = bnb::block_count(n, w.blocksize);
    if (w.nested) {
      w.nested_absmax = need(weight + ".nested_absmax", who + "'s nested_absmax");
      w.nested_quant_map = need(weight + ".nested_quant_map", who + "'s nested_quant_map");
      const auto& nb = field("nested_blocksize");
      if (!nb.is_number_unsigned() || nb.get<uint64_t>() == 0 || !field("nested_offset").is_number())
        fail(PEFT_ERR_INVALID_CHECKPOINT, who + ": quant_state has a bad nested_blocksize or nested_offset");
      if (c_.tensor(*w.absmax).dtype != DType::U8 || c_.tensor(*w.absmax).nbytes() != blocks)
        fail(PEFT_ERR_INVALID_CHECKPOINT, who + ": its absmax should hold " + std::to_string(blocks) + " U8 values");
    } else if (c_.tensor(*w.absmax).dtype != DType::F32 || c_.tensor(*w.absmax).nbytes() != blocks * 4) {
      fail(PEFT_ERR_INVALID_CHECKPOINT, who + ": its absmax should hold " + std::to_string(blocks) + " F32 values");
    }
    add(std::move(w));
  }

  void int8(const std::string& module, size_t scb) {
    BnbWeight w;
    w.four_bit = false;
    w.weight = need(module + ".weight", "SCB " + peft::quoted(module + ".SCB"));
    w.scb = scb;
    w.weight_format = c_.find(module + ".weight_format");
    const TensorInfo& t = c_.tensor(w.weight);
    if (t.dtype != DType::I8 || t.shape.size() != 2)
      fail(PEFT_ERR_INVALID_CHECKPOINT, "bitsandbytes int8 weight " + peft::quoted(t.name) + " should be a 2-D I8 tensor");
    w.shape = t.shape;
    if (c_.tensor(scb).dtype != DType::F32 || c_.tensor(scb).nbytes() != t.shape[0] * 4)
      fail(PEFT_ERR_INVALID_CHECKPOINT, peft::quoted(c_.tensor(scb).name) + " should hold " +
                                            std::to_string(t.shape[0]) + " F32 values");
    add(std::move(w));
  }

  const Checkpoint& c_;
  BnbBase out_;
};

// The weight's absmax as bitsandbytes' dequantize_4bit uses it.
std::vector<float> absmax_of(const Checkpoint& c, const BnbWeight& w, uint64_t blocks) {
  if (!w.nested) return f32_of(c, *w.absmax, blocks);
  const uint64_t nested_blocksize = w.state["nested_blocksize"].get<uint64_t>();
  const std::vector<uint8_t> q = raw(c, *w.absmax);
  const std::vector<float> nested = f32_of(c, *w.nested_absmax, bnb::block_count(blocks, nested_blocksize));
  const std::vector<float> code = f32_of(c, *w.nested_quant_map, 256);
  std::vector<float> absmax(blocks);
  bnb::dequantize_blockwise(q.data(), nested.data(), code.data(), nested_blocksize, blocks, absmax.data());
  const auto offset = static_cast<float>(w.state["nested_offset"].get<double>());
  for (float& a : absmax) a += offset;
  return absmax;
}

}  // namespace

std::vector<size_t> BnbWeight::companions() const {
  std::vector<size_t> out;
  for (const auto& i : {absmax, quant_map, nested_absmax, nested_quant_map, quant_state, scb, weight_format})
    if (i) out.push_back(*i);
  return out;
}

std::optional<BnbBase> recognise_bnb_base(const nlohmann::json& config, const Checkpoint& weights,
                                          const std::string& dir) {
  if (!config.is_object() || !config.contains("quantization_config")) return std::nullopt;
  const nlohmann::json& q = config["quantization_config"];
  const std::string method = q.is_object() && q.contains("quant_method") && q["quant_method"].is_string()
                                 ? q["quant_method"].get<std::string>() : std::string("(none)");
  if (method != "bitsandbytes")
    fail(PEFT_ERR_UNSUPPORTED, "the base model " + peft::quoted(dir) + " is quantized with " +
                                   peft::quoted(method) + " (config.json quantization_config), which merges do not read");
  if (q.contains("bnb_4bit_quant_storage") && q["bnb_4bit_quant_storage"] != "uint8" &&
      q.value("load_in_4bit", false))
    fail(PEFT_ERR_UNSUPPORTED, "the base model " + peft::quoted(dir) + " stores its 4-bit weights as " +
                                   q["bnb_4bit_quant_storage"].dump() + "; only uint8 storage is supported");
  return Recogniser(weights).run();
}

std::vector<float> bnb_dequantize(const Checkpoint& c, const BnbWeight& w) {
  const uint64_t n = product(w.shape);
  std::vector<float> out(n);
  if (!w.four_bit) {
    const std::vector<uint8_t> q = raw(c, w.weight);
    const std::vector<float> scb = f32_of(c, *w.scb, w.shape[0]);
    bnb::dequantize_int8(reinterpret_cast<const int8_t*>(q.data()), scb.data(), w.shape[0], n / std::max<uint64_t>(1, w.shape[0]), out.data());
    return out;
  }
  const uint64_t blocks = bnb::block_count(n, w.blocksize);
  const std::vector<float> absmax = absmax_of(c, w, blocks);
  std::vector<float> code = f32_of(c, *w.quant_map, 16);
  bnb::cpu_dequantize_code(w.type, w.shape.empty() ? n : w.shape.back(), w.blocksize, code.data());
  const std::vector<uint8_t> packed = raw(c, w.weight);
  bnb::dequantize_4bit(packed.data(), absmax.data(), code.data(), w.blocksize, n, out.data());
  return out;
}

std::map<size_t, std::vector<uint8_t>> bnb_quantize(const Checkpoint& c, const BnbWeight& w,
                                                    const std::vector<float>& values) {
  std::map<size_t, std::vector<uint8_t>> out;
  auto as_bytes = [](const std::vector<float>& v) {
    std::vector<uint8_t> b(v.size() * 4);
    if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());  // an empty weight: no null memcpy
    return b;
  };
  const uint64_t n = values.size();
  const std::string who = "bitsandbytes weight " + peft::quoted(c.tensor(w.weight).name);
  if (!w.four_bit) {
    const uint64_t rows = w.shape[0], cols = n / std::max<uint64_t>(1, rows);
    std::vector<uint8_t> q(n);
    std::vector<float> scb(rows);
    bnb::quantize_int8(values.data(), rows, cols, reinterpret_cast<int8_t*>(q.data()), scb.data());
    out[w.weight] = std::move(q);
    out[*w.scb] = as_bytes(scb);
    if (w.weight_format) out[*w.weight_format] = raw(c, *w.weight_format);
    return out;
  }
  const std::vector<float> stored_code = f32_of(c, *w.quant_map, 16);
  const auto code = bnb::four_bit_code(w.type);
  if (std::memcmp(stored_code.data(), code.data(), 64) != 0)
    fail(PEFT_ERR_UNSUPPORTED, who + " has a quant_map that is not bitsandbytes' own table; it cannot be re-quantized "
                                   "(write it dequantized with an output dtype)");
  const uint64_t blocks = bnb::block_count(n, w.blocksize);
  std::vector<uint8_t> packed((n + 1) / 2);
  std::vector<float> absmax(blocks);
  bnb::quantize_4bit(values.data(), n, w.blocksize, w.type, packed.data(), absmax.data());
  out[w.weight] = std::move(packed);
  out[*w.quant_map] = raw(c, *w.quant_map);
  nlohmann::ordered_json state = w.state;
  if (w.nested) {
    const uint64_t nested_blocksize = w.state["nested_blocksize"].get<uint64_t>();
    const float offset = bnb::torch_mean_f32(absmax.data(), blocks);
    // Finite values whose absmax sum overflows f32 (values near 3e38) would be stored as nothing but
    // infinities; values already infinite or NaN (allow_nonfinite) are written as bitsandbytes would.
    if (!std::isfinite(offset) && std::all_of(values.begin(), values.end(), [](float v) { return std::isfinite(v); }))
      fail(PEFT_ERR_NON_FINITE, who + ": the mean of its absmax values (double quantization's offset) overflows f32");
    for (float& a : absmax) a -= offset;
    const std::vector<float> nested_code = f32_of(c, *w.nested_quant_map, 256);
    std::vector<uint8_t> q(blocks);
    std::vector<float> nested(bnb::block_count(blocks, nested_blocksize));
    bnb::quantize_blockwise(absmax.data(), blocks, nested_blocksize, nested_code.data(), q.data(), nested.data());
    out[*w.absmax] = std::move(q);
    out[*w.nested_absmax] = as_bytes(nested);
    out[*w.nested_quant_map] = raw(c, *w.nested_quant_map);
    state["nested_offset"] = static_cast<double>(offset);
  } else {
    out[*w.absmax] = as_bytes(absmax);
  }
  std::string text;
  dump(text, state);
  out[*w.quant_state] = std::vector<uint8_t>(text.begin(), text.end());
  return out;
}

}  // namespace peft
