// Checking each adapter module against the base model's weights (base_validation.hpp).
#include "peft/adapter/base_validation.hpp"

#include <filesystem>
#include <set>

#include "core/error.hpp"
#include "core/json_parse.hpp"
#include "core/text.hpp"
#include "core/text_file.hpp"
#include "safetensors/checkpoint_layout.hpp"

namespace peft {
namespace {

namespace fs = std::filesystem;
using Shape = std::vector<uint64_t>;

// Checks one LoRA module against its base weight; appends problems to `result`.
class ModuleChecker {
 public:
  ModuleChecker(AdapterModule& module, const Checkpoint& adapter, const BaseModel& base, const ArchTable* table,
                ValidationResult& result)
      : m_(module), adapter_(adapter), base_(base), table_(table), result_(result) {}

  void run() {
    auto weight = base_.find(m_.name, "weight", table_);
    if (!weight) {
      result_.unresolved.push_back("module " + peft::quoted(m_.name) + ": the base has no tensor " +
                                   peft::quoted(m_.name + ".weight"));
      return;
    }
    const TensorInfo& base_weight = base_.weights->tensor(*weight);
    base_name_ = base_weight.name;
    const Shape& w = base_.weight_shape(*weight);
    for (AdapterTensor& t : m_.tensors)
      if (t.role != TensorRole::lora_b_bias && is_lora_role(t.role)) t.base_tensor = base_name_;
    if (m_.kind == LayerKind::embedding) {
      embedding(w);
    } else if (m_.kind == LayerKind::conv2d) {
      conv2d(w);
    } else {
      linear_or_conv1d(w);
    }
    bias();
  }

 private:
  const Shape& shape(TensorRole role) const { return adapter_.tensor(m_.find(role)->index).shape; }
  void mismatch(const std::string& what) {
    result_.mismatched.push_back("module " + peft::quoted(m_.name) + ": " + what);
  }
  void magnitude(const Shape& expected) {
    if (const AdapterTensor* t = m_.find(TensorRole::lora_magnitude)) {
      const Shape& got = adapter_.tensor(t->index).shape;
      if (got != expected)
        mismatch("lora_magnitude_vector is " + shape_text(got) + ", the base needs " + shape_text(expected));
    }
  }

  void linear_or_conv1d(const Shape& w) {
    const Shape& a = shape(TensorRole::lora_a);
    const Shape& b = shape(TensorRole::lora_b);
    uint64_t in = a[1], out = b[0];
    bool fits_linear = w == Shape{out, in};
    bool fits_conv1d = w == Shape{in, out};
    if (!fits_linear && !fits_conv1d) {
      mismatch("lora_A " + shape_text(a) + " and lora_B " + shape_text(b) + " need a base weight " +
               shape_text(Shape{out, in}) + " (Linear) or " + shape_text(Shape{in, out}) + " (Conv1D); " +
               peft::quoted(base_name_) + " is " + shape_text(w));
      return;
    }
    bool conv1d = fits_conv1d && !fits_linear;
    if (fits_conv1d && fits_linear && table_) {  // square: the architecture decides
      const ModuleRule* rule = table_->rule_for_module(m_.name);
      conv1d = rule && rule->kind == ModuleKind::conv1d;
    }
    m_.kind = conv1d ? LayerKind::conv1d : LayerKind::linear;
    magnitude({out});
  }

  void embedding(const Shape& w) {
    const Shape& a = shape(TensorRole::lora_embedding_a);
    const Shape& b = shape(TensorRole::lora_embedding_b);
    if (w != Shape{a[1], b[0]})
      mismatch("lora_embedding_A " + shape_text(a) + " and lora_embedding_B " + shape_text(b) +
               " need a base embedding " + shape_text(Shape{a[1], b[0]}) + "; " + peft::quoted(base_name_) + " is " +
               shape_text(w));
    else
      magnitude({b[0]});
  }

  void conv2d(const Shape& w) {
    const Shape& a = shape(TensorRole::lora_a);
    const Shape& b = shape(TensorRole::lora_b);
    bool ok = w.size() == 4 && b.size() == 4 && w[0] == b[0] && w[1] == a[1] && w[2] == a[2] && w[3] == a[3] &&
              b[2] == 1 && b[3] == 1;
    if (!ok)
      mismatch("lora_A " + shape_text(a) + " and lora_B " + shape_text(b) + " do not fit the Conv2d weight " +
               peft::quoted(base_name_) + " " + shape_text(w) + " (grouped convolutions are not supported)");
    else
      magnitude({1, w[0], 1, 1});
  }

  void bias() {
    const AdapterTensor* t = m_.find(TensorRole::lora_b_bias);
    if (!t) return;
    auto base_bias = base_.find(m_.name, "bias", table_);
    if (!base_bias) {
      result_.unresolved.push_back("module " + peft::quoted(m_.name) + ": lora_B.bias needs a base bias " +
                                   peft::quoted(m_.name + ".bias") + ", which the base does not have");
      return;
    }
    const TensorInfo& info = base_.weights->tensor(*base_bias);
    for (AdapterTensor& tensor : m_.tensors)
      if (tensor.role == TensorRole::lora_b_bias) tensor.base_tensor = info.name;
    const Shape& got = adapter_.tensor(t->index).shape;
    if (got != info.shape)
      mismatch("lora_B.bias is " + shape_text(got) + ", the base bias is " + shape_text(info.shape));
  }

  AdapterModule& m_;
  const Checkpoint& adapter_;
  const BaseModel& base_;
  const ArchTable* table_;
  ValidationResult& result_;
  std::string base_name_;
};

void check_full_tensors(AdapterModule& m, const Checkpoint& adapter, const BaseModel& base, const ArchTable* table,
                        ValidationResult& result) {
  for (AdapterTensor& t : m.tensors) {
    if (t.role != TensorRole::full) continue;
    const std::string param = suffix_parameter(t.suffix);
    auto index = base.find(m.name, param, table);
    if (!index) {
      result.unresolved.push_back("tensor " + peft::quoted(t.key) + ": the base has no tensor " +
                                  peft::quoted(m.name + "." + param) + " for it to replace");
      continue;
    }
    const TensorInfo& info = base.weights->tensor(*index);
    t.base_tensor = info.name;
    const Shape& got = adapter.tensor(t.index).shape;
    if (got != info.shape)
      result.mismatched.push_back("tensor " + peft::quoted(t.key) + " is " + shape_text(got) + ", but the base's " +
                                  peft::quoted(info.name) + " it replaces is " + shape_text(info.shape));
  }
}

void check_trainable_tokens(AdapterModule& m, const Checkpoint& adapter, const BaseModel& base,
                            const ArchTable* table, ValidationResult& result) {
  const AdapterTensor* t = m.find(TensorRole::trainable_tokens_delta);
  auto index = base.find(m.name, "weight", table);
  if (!index) {
    result.unresolved.push_back("tensor " + peft::quoted(t->key) + ": the base has no embedding " +
                                peft::quoted(m.name + ".weight"));
    return;
  }
  const TensorInfo& info = base.weights->tensor(*index);
  for (AdapterTensor& tensor : m.tensors)
    if (tensor.role == TensorRole::trainable_tokens_delta) tensor.base_tensor = info.name;
  const Shape& got = adapter.tensor(t->index).shape;
  if (info.shape.size() != 2 || got.size() != 2 || got[1] != info.shape[1]) {
    result.mismatched.push_back("tensor " + peft::quoted(t->key) + " is " + shape_text(got) +
                                ", which does not fit the embedding " + peft::quoted(info.name) + " " +
                                shape_text(info.shape));
    return;
  }
  for (int64_t token : m.token_indices)
    if (token < 0 || static_cast<uint64_t>(token) >= info.shape[0])
      result.mismatched.push_back("module " + peft::quoted(m.name) + ": trainable token index " +
                                  std::to_string(token) + " is outside the embedding's " +
                                  std::to_string(info.shape[0]) + " rows");
}

}  // namespace

ValidationResult check_against_base(std::vector<AdapterModule>& modules, const Checkpoint& adapter_weights,
                                    const LoraConfig& config, const BaseModel& base, const ArchTable* table) {
  ValidationResult result;
  size_t conv1d_count = 0;
  for (AdapterModule& m : modules) {
    if (m.is_lora()) {
      ModuleChecker(m, adapter_weights, base, table, result).run();
      if (m.kind == LayerKind::conv1d) ++conv1d_count;
    } else if (m.kind == LayerKind::trainable_tokens) {
      check_trainable_tokens(m, adapter_weights, base, table, result);
    }
    check_full_tensors(m, adapter_weights, base, table, result);
  }
  size_t lora_count = 0;
  for (const AdapterModule& m : modules) lora_count += m.is_lora() ? 1 : 0;
  if (lora_count > 0 && conv1d_count == lora_count && !config.fan_in_fan_out)
    result.notes.push_back("fan_in_fan_out is false, but every adapted layer is a Conv1D (weights stored [in, out]) "
                           "in the base; the layout was taken from the base, as PEFT does");
  if (conv1d_count == 0 && lora_count > 0 && config.fan_in_fan_out)
    result.notes.push_back("fan_in_fan_out is true, but no adapted layer is a Conv1D in the base; the layout "
                           "was taken from the base, as PEFT does");
  return result;
}

void throw_if_failed(const ValidationResult& result, const std::string& adapter_dir, const std::string& base_dir) {
  if (result.ok()) return;
  size_t count = result.unresolved.size() + result.mismatched.size();
  std::string message = "adapter " + peft::quoted(adapter_dir) + " does not fit base model " + peft::quoted(base_dir) +
                        " (" + std::to_string(count) + (count == 1 ? " problem" : " problems") + "): ";
  bool first = true;
  for (const std::string& p : result.unresolved) {
    message += (first ? "" : "; ") + std::string("unresolved: ") + p;
    first = false;
  }
  for (const std::string& p : result.mismatched) {
    message += (first ? "" : "; ") + std::string("shape mismatch: ") + p;
    first = false;
  }
  fail(result.unresolved.empty() ? PEFT_ERR_SHAPE_MISMATCH : PEFT_ERR_UNRESOLVED_KEY, message);
}

}  // namespace peft
