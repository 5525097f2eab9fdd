#include "peft/adapter/gguf_lora_file.hpp"

#include <cmath>
#include <cstdint>
#include <map>
#include <string_view>
#include <utility>
#include <variant>

#include "core/error.hpp"
#include "core/quant/q8_0.hpp"
#include "core/text.hpp"
#include "gguf/ggml_type.hpp"

namespace peft {
namespace {

constexpr std::string_view kA = ".lora_a";
constexpr std::string_view kB = ".lora_b";
constexpr int32_t kGgmlQ8_0 = 8;

std::string found(const std::optional<std::string>& value) {
  return value ? peft::quoted(*value) : std::string("absent");
}

}  // namespace

std::shared_ptr<const GgufLoraFile> open_gguf_lora(const std::string& path) {
  return open_gguf_lora(Checkpoint::open(path), path);
}

std::shared_ptr<const GgufLoraFile> open_gguf_lora(std::shared_ptr<const Checkpoint> file, const std::string& path) {
  auto lora = std::make_shared<GgufLoraFile>();
  lora->path = path;
  lora->file = std::move(file);
  const GgufHeader* header = lora->file->gguf_header(0);
  if (header == nullptr || lora->file->file_count() != 1)
    fail(PEFT_ERR_INVALID_ARGUMENT, peft::quoted(path) + " is not a GGUF file");
  const auto type = metadata_string(*header, "general.type");
  if (type != "adapter")
    fail(PEFT_ERR_INVALID_ARGUMENT, peft::quoted(path) + " is not a GGUF adapter (general.type is " + found(type) +
                                        ", not \"adapter\"; a GGUF model file is a base, not an adapter)");
  const auto adapter_type = metadata_string(*header, "adapter.type");
  if (adapter_type != "lora")
    fail(PEFT_ERR_UNSUPPORTED, peft::quoted(path) + ": adapter.type is " + found(adapter_type) +
                                   "; only \"lora\" GGUF adapters are read");
  const auto architecture = metadata_string(*header, "general.architecture");
  if (!architecture) fail(PEFT_ERR_INVALID_CHECKPOINT, peft::quoted(path) + " has no string general.architecture");
  lora->architecture = *architecture;
  if (const GgufValue* value = find_metadata(*header, "adapter.lora.alpha")) {
    const auto* number = std::get_if<double>(&value->data);
    if (number == nullptr) fail(PEFT_ERR_INVALID_CHECKPOINT, peft::quoted(path) + ": adapter.lora.alpha is not a float");
    lora->alpha = static_cast<float>(*number);
    if (!std::isfinite(lora->alpha))  // else an import writes "lora_alpha": NaN, which no reader takes
      fail(PEFT_ERR_INVALID_CHECKPOINT, peft::quoted(path) + ": adapter.lora.alpha is not finite");
  }
  if (const GgufValue* value = find_metadata(*header, "adapter.alora.invocation_tokens")) {
    const auto* tokens = std::get_if<GgufArray>(&value->data);
    if (tokens == nullptr || tokens->element_type != GgufValueType::U32)
      fail(PEFT_ERR_INVALID_CHECKPOINT, peft::quoted(path) + ": adapter.alora.invocation_tokens is not an array of "
                                        "UINT32 token ids, as llama.cpp requires");
    for (size_t i = 0; i < tokens->size(); ++i) {
      const uint64_t token = std::get<uint64_t>(tokens->at(i).data);
      if (token > static_cast<uint64_t>(INT32_MAX))
        fail(PEFT_ERR_INVALID_CHECKPOINT, peft::quoted(path) + ": adapter.alora.invocation_tokens holds " +
                                              std::to_string(token) + ", not a token id (llama.cpp's are below 2^31)");
      lora->alora_invocation_tokens.push_back(static_cast<uint32_t>(token));
    }
  }
  std::map<std::string, GgufLoraPair> pairs;
  for (size_t i = 0; i < lora->file->tensor_count(); ++i) {
    const std::string& name = lora->file->tensor(i).name;
    const bool is_a = name.ends_with(kA), is_b = name.ends_with(kB);
    if (!is_a && !is_b) {
      lora->others.push_back(name);
      continue;
    }
    GgufLoraPair& pair = pairs[name.substr(0, name.size() - kA.size())];
    (is_a ? pair.a : pair.b) = i;
  }
  for (auto& [target, pair] : pairs) {
    pair.target = target;
    lora->pairs.push_back(std::move(pair));
  }
  return lora;
}

bool gguf_lora_factor_readable(const TensorInfo& info) {
  return info.ggml_type == kGgmlQ8_0 ||
         (!info.block_quantized && (info.dtype == DType::F32 || info.dtype == DType::F16 || info.dtype == DType::BF16));
}

std::vector<float> read_gguf_lora_factor(const Checkpoint& file, size_t index) {
  const TensorInfo& info = file.tensor(index);
  if (!gguf_lora_factor_readable(info)) {
    const auto type = ggml_type(static_cast<uint32_t>(info.ggml_type));
    fail(PEFT_ERR_UNSUPPORTED, "LoRA factor " + peft::quoted(info.name) + " is " +
                                   std::string(type ? type->name : "of an unknown type") +
                                   "; factors are read from F32, F16, BF16 and Q8_0");
  }
  if (info.ggml_type != kGgmlQ8_0) return file.read_f32(index);
  uint64_t elements = 1;
  for (uint64_t d : info.shape) elements *= d;
  std::vector<uint8_t> bytes(static_cast<size_t>(info.nbytes()));
  file.read_bytes(index, 0, bytes.data(), bytes.size());
  std::vector<float> out(static_cast<size_t>(elements));
  dequantize_q8_0(bytes.data(), elements, out.data());
  return out;
}

}  // namespace peft
