#include "core/no_fp_contract.hpp"  // first: add_scaled rounds the product and the sum as llama.cpp does

#include "peft/control/control_vector.hpp"

#include <cmath>
#include <cstring>
#include <string_view>

#include "checkpoint/checkpoint.hpp"
#include "core/convert.hpp"
#include "core/error.hpp"
#include "core/text.hpp"
#include "core/quant/ggml_types.hpp"
#include "gguf/gguf_header.hpp"
#include "gguf/gguf_writer.hpp"
#include "safetensors/writer.hpp"

namespace peft {
namespace {

constexpr std::string_view kArchitecture = "controlvector";
constexpr uint32_t kGgmlTypeF32 = 0;

std::string ggml_type_text(int32_t id) {
  const auto type = id >= 0 ? ggml_type(static_cast<uint32_t>(id)) : std::nullopt;
  return type ? std::string(type->name) : "number " + std::to_string(id);
}

// A canonical non-negative decimal number ("0", "12"; not "012", "+1", "1a"), at most 18 digits.
bool parse_layer_number(std::string_view text, int64_t& layer) {
  if (text.empty() || text.size() > 18 || (text.size() > 1 && text[0] == '0')) return false;
  int64_t value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    value = value * 10 + (c - '0');
  }
  layer = value;
  return true;
}

// The layer a safetensors tensor name steers: direction.N, model.layers.N, layers.N or N.
bool parse_safetensors_name(const std::string& name, int64_t& layer) {
  for (std::string_view prefix : {"direction.", "model.layers.", "layers."})
    if (name.size() > prefix.size() && name.compare(0, prefix.size(), prefix) == 0)
      return parse_layer_number(std::string_view(name).substr(prefix.size()), layer);
  return parse_layer_number(name, layer);
}

// n_embd of a direction tensor: its innermost dimension, every outer one being 1.
bool direction_length(const std::vector<uint64_t>& shape, uint64_t& n_embd) {
  if (shape.empty()) return false;
  for (size_t d = 0; d + 1 < shape.size(); ++d)
    if (shape[d] != 1) return false;
  n_embd = shape.back();
  return n_embd > 0;
}

void require_finite(const std::vector<float>& values, const std::string& what) {
  for (float v : values)
    if (!std::isfinite(v)) fail(PEFT_ERR_NON_FINITE, what + " holds an infinite or NaN value");
}

}  // namespace

bool parse_direction_name(const std::string& name, int64_t& layer) {
  constexpr std::string_view prefix = "direction.";
  return name.size() > prefix.size() && name.compare(0, prefix.size(), prefix) == 0 &&
         parse_layer_number(std::string_view(name).substr(prefix.size()), layer);
}

ControlVector read_control_vector(const std::string& path) {
  const auto checkpoint = Checkpoint::open(path);
  return read_control_vector(*checkpoint, path);
}

ControlVector read_control_vector(const Checkpoint& checkpoint, const std::string& path) {
  if (checkpoint.file_count() != 1)
    fail(PEFT_ERR_INVALID_CHECKPOINT, quoted(path) + " is a checkpoint of " + std::to_string(checkpoint.file_count()) +
                                          " files, not one control-vector file");
  const GgufHeader* gguf = checkpoint.gguf_header(0);
  ControlVector vector;
  if (gguf) {
    if (const auto architecture = metadata_string(*gguf, "general.architecture"); architecture && *architecture != kArchitecture)
      fail(PEFT_ERR_INVALID_CHECKPOINT, quoted(path) + " is a GGUF file of architecture " + quoted(*architecture) +
                                            ", not a control vector (\"controlvector\")");
    if (const auto hint = metadata_string(*gguf, "controlvector.model_hint")) vector.model_hint = *hint;
  } else if (const auto& metadata = checkpoint.file_metadata(0)) {
    for (const auto& [key, value] : *metadata)
      if (key == "model_hint") vector.model_hint = value;
  }
  if (checkpoint.tensor_count() == 0)
    fail(PEFT_ERR_INVALID_CHECKPOINT, quoted(path) + " holds no direction tensor, so it is no control vector");

  std::map<int64_t, std::string> names;  // layer -> the tensor that gave it, for the duplicate message
  for (size_t i = 0; i < checkpoint.tensor_count(); ++i) {
    const TensorInfo& info = checkpoint.tensor(i);
    const std::string what = quoted(path) + ": tensor " + quoted_name(info.name);
    int64_t layer = -1;
    if (gguf ? !parse_direction_name(info.name, layer) : !parse_safetensors_name(info.name, layer))
      fail(PEFT_ERR_INVALID_CHECKPOINT,
           what + " is not a control-vector direction (" +
               (gguf ? std::string("direction.N, N >= 1") : "direction.N, model.layers.N, layers.N or N") + ")");
    if (gguf && layer == 0)
      fail(PEFT_ERR_INVALID_CHECKPOINT, what + " is for layer 0, which llama.cpp never steers and refuses");
    if (const auto seen = names.find(layer); seen != names.end())
      fail(PEFT_ERR_INVALID_CHECKPOINT, what + " gives layer " + std::to_string(layer) + " again (after " +
                                            quoted_name(seen->second) + ")");
    names.emplace(layer, info.name);
    if (gguf ? info.ggml_type != static_cast<int32_t>(kGgmlTypeF32) : !is_float(info.dtype))
      fail(PEFT_ERR_INVALID_CHECKPOINT,
           what + " has type " + (gguf ? ggml_type_text(info.ggml_type) : std::string(dtype_name(info.dtype))) +
               (gguf ? "; llama.cpp reads F32 directions only" : "; a direction is a float tensor"));
    uint64_t n_embd = 0;
    if (!direction_length(info.shape, n_embd))
      fail(PEFT_ERR_INVALID_CHECKPOINT, what + " has shape " + shape_text(info.shape) + "; a direction is one vector");
    if (vector.n_embd == 0) {
      vector.n_embd = n_embd;
    } else if (n_embd != vector.n_embd) {
      fail(PEFT_ERR_INVALID_CHECKPOINT, what + " has " + std::to_string(n_embd) + " values where the other directions have " +
                                            std::to_string(vector.n_embd));
    }
    std::vector<float> values = checkpoint.read_f32(i);
    require_finite(values, what);
    vector.directions.emplace(layer, std::move(values));
  }
  return vector;
}

void set_direction(ControlVector& vector, int64_t layer, DType dtype, const void* data) {
  if (layer < 0) fail(PEFT_ERR_INVALID_ARGUMENT, "layer " + std::to_string(layer) + " is negative");
  if (!is_float(dtype) || !can_convert(dtype, DType::F32))
    fail(PEFT_ERR_UNSUPPORTED, "a direction of dtype " + std::string(dtype_name(dtype)) + " (F32, F16, BF16 or F64)");
  std::vector<float> values(vector.n_embd);
  convert(dtype, data, DType::F32, values.data(), vector.n_embd);
  require_finite(values, "the direction of layer " + std::to_string(layer));
  vector.directions[layer] = std::move(values);
}

void add_scaled(ControlVector& dst, const ControlVector& src, double strength) {
  if (src.n_embd != dst.n_embd)
    fail(PEFT_ERR_SHAPE_MISMATCH, "control vectors of " + std::to_string(src.n_embd) + " and " + std::to_string(dst.n_embd) +
                                      " values per layer cannot be added");
  const auto scale = static_cast<float>(strength);
  std::map<int64_t, std::vector<float>> sums = dst.directions;
  for (const auto& [layer, values] : src.directions) {
    std::vector<float>& sum = sums[layer];
    sum.resize(dst.n_embd, 0.0f);
    for (size_t j = 0; j < values.size(); ++j) {
      const float product = values[j] * scale;
      sum[j] += product;
    }
    require_finite(sum, "the sum of layer " + std::to_string(layer));
  }
  dst.directions = std::move(sums);
}

void write_control_vector_gguf(const ControlVector& vector, const std::string& path) {
  if (vector.directions.empty()) fail(PEFT_ERR_INVALID_ARGUMENT, "a control vector without directions is not written");
  if (vector.directions.count(0))
    fail(PEFT_ERR_INVALID_ARGUMENT, "the control vector has a direction for layer 0, which llama.cpp refuses; "
                                    "write it as safetensors or leave the layer out");
  GgufWriter writer(path);
  writer.add_metadata("general.architecture", GgufValue{GgufValueType::STRING, std::string(kArchitecture)});
  if (!vector.model_hint.empty())
    writer.add_metadata("controlvector.model_hint", GgufValue{GgufValueType::STRING, vector.model_hint});
  writer.add_metadata("controlvector.layer_count",
                      GgufValue{GgufValueType::U32, static_cast<uint64_t>(vector.directions.size())});
  for (const auto& [layer, values] : vector.directions)
    writer.add_tensor("direction." + std::to_string(layer), kGgmlTypeF32, {vector.n_embd});
  writer.start();
  for (const auto& [layer, values] : vector.directions)
    writer.write_tensor("direction." + std::to_string(layer), DType::F32, values.data(), values.size() * sizeof(float));
  writer.finish();
}

void write_control_vector_safetensors(const ControlVector& vector, const std::string& path) {
  if (vector.directions.empty()) fail(PEFT_ERR_INVALID_ARGUMENT, "a control vector without directions is not written");
  FileWriter writer(path);
  if (!vector.model_hint.empty()) writer.set_metadata("model_hint", vector.model_hint);
  for (const auto& [layer, values] : vector.directions)
    writer.add_tensor("direction." + std::to_string(layer), DType::F32, {vector.n_embd});
  writer.start();
  // The file holds the tensors in safetensors' order (by name: direction.10 before direction.2).
  for (size_t position = 0; position < writer.tensor_count(); ++position) {
    const std::string& name = writer.tensor_at(position).name;
    int64_t layer = -1;
    parse_direction_name(name, layer);
    const std::vector<float>& values = vector.directions.at(layer);
    writer.write_tensor(name, DType::F32, values.data(), values.size() * sizeof(float));
  }
  writer.finish();
}

}  // namespace peft
