// Checking each adapter module against the base model's weights (base_validation.hpp).
#include "peft/base/base_validation.hpp"

#include "peft/base/expert_base.hpp"

#include <filesystem>
#include <set>

#include "core/error.hpp"
#include "core/json_parse.hpp"
#include "core/text.hpp"
#include "core/text_file.hpp"
#include "checkpoint/checkpoint_layout.hpp"

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
    base_name_ = base_.is_tied_output(m_.name, table_) ? m_.name + ".weight" : base_weight.name;
    const Shape& w = base_.weight_shape(*weight);
    for (AdapterTensor& t : m_.tensors)
      if (t.role != TensorRole::lora_b_bias && is_lora_role(t.role)) t.base_tensor = base_name_;
    if (method_row(m_.method).effect != MethodEffect::lora) {
      method_layer(w);
    } else if (m_.kind == LayerKind::embedding) {
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

  // The features a non-LoRA method's parameters imply (0: not implied), as PEFT creates them: the
  // row's derivation, over the module's parameters and the shared ones ("base_model.<name>").
  std::pair<uint64_t, uint64_t> method_features() const {
    const MethodRow& row = method_row(m_.method);
    if (row.features == nullptr) return {0, 0};
    const ParamShapeOf shape_of = [&](std::string_view p) -> std::vector<int64_t> {
      const AdapterTensor* t = m_.find_param(p);
      std::optional<size_t> index;
      if (t != nullptr) index = t->index;
      for (std::string_view shared : row.shared)
        if (t == nullptr && shared == p) index = adapter_.find("base_model." + std::string(p));
      std::vector<int64_t> shape;
      if (index)
        for (uint64_t d : adapter_.tensor(*index).shape) shape.push_back(static_cast<int64_t>(d));
      return shape;
    };
    const MethodFeatures f = row.features(shape_of, m_.settings);
    return {static_cast<uint64_t>(f.out), static_cast<uint64_t>(f.in)};
  }

  // LoHa / LoKr on an nn.Conv2d weight [out, c, kh, kw]: the output channels and flattened input
  // width (c * kh * kw) their parameters imply, and the kernel of a 4-D factor (CP core or a whole
  // lokr_w2 [b, d, kh, kw]), which must be the base's.
  void conv2d_method(const Shape& w) {
    auto dims = [&](const char* p) -> Shape {
      const AdapterTensor* t = m_.find_param(p);
      return t ? adapter_.tensor(t->index).shape : Shape{};
    };
    auto at = [](const Shape& s, size_t i) -> uint64_t { return i < s.size() ? s[i] : 0; };
    uint64_t out = 0, in = 0;
    Shape core;  // the 4-D factor whose kernel is checked
    if (m_.method == PeftMethod::loha) {
      const Shape t1 = dims("hada_t1");
      const Shape a = dims("hada_w1_a"), b = dims("hada_w1_b");
      if (!t1.empty()) {  // hada_w1_a [r, out], hada_w1_b [r, c], hada_t1 [r, r, kh, kw]
        out = at(a, 1);
        in = at(b, 1) * at(t1, 2) * at(t1, 3);
        core = t1;
      } else {  // hada_w1_a [out, r], hada_w1_b [r, c * kh * kw]
        out = at(a, 0);
        in = at(b, 1);
      }
    } else {
      const Shape w1 = dims("lokr_w1"), w2 = dims("lokr_w2"), t2 = dims("lokr_t2");
      const uint64_t a = w1.empty() ? at(dims("lokr_w1_a"), 0) : at(w1, 0);
      const uint64_t c = w1.empty() ? at(dims("lokr_w1_b"), 1) : at(w1, 1);
      uint64_t b = 0, d = 0;
      if (!w2.empty()) {  // [b, d, kh, kw] (or 2-D [b, d * kh * kw])
        b = at(w2, 0);
        d = 1;
        for (size_t i = 1; i < w2.size(); ++i) d *= w2[i];
        if (w2.size() == 4) core = w2;
      } else if (!t2.empty()) {  // lokr_w2_a [r, b], lokr_w2_b [r, d], lokr_t2 [r, r, kh, kw]
        b = at(dims("lokr_w2_a"), 1);
        d = at(dims("lokr_w2_b"), 1) * at(t2, 2) * at(t2, 3);
        core = t2;
      } else {  // lokr_w2_a [b, r], lokr_w2_b [r, d * kh * kw]
        b = at(dims("lokr_w2_a"), 0);
        d = at(dims("lokr_w2_b"), 1);
      }
      out = a * b;
      in = c * d;
    }
    const bool kernel_ok = core.empty() || (core.size() == 4 && core[2] == w[2] && core[3] == w[3]);
    if (w[0] != out || w[1] * w[2] * w[3] != in || !kernel_ok) {
      const std::string method = peft_method_name(m_.method);
      mismatch(method + " parameters for " + std::to_string(out) + " output channels and " + std::to_string(in) +
               " inputs x kernel elements" + (core.empty() ? "" : " (kernel " + shape_text(core) + ")") +
               " do not fit the Conv2d weight " + peft::quoted(base_name_) + " " + shape_text(w));
      return;
    }
    m_.kind = LayerKind::conv2d;
  }

  void method_layer(const Shape& w) {
    const MethodRow& row = method_row(m_.method);
    if (w.size() == 4 && row.conv2d) {
      conv2d_method(w);
      return;
    }
    if (m_.find_param("hada_t1") || m_.find_param("hada_t2") || m_.find_param("lokr_t2")) {
      mismatch(std::string(peft_method_name(m_.method)) + " holds the CP (effective conv2d) form, which needs a Conv2d weight; " +
               peft::quoted(base_name_) + " is " + shape_text(w));
      return;
    }
    const auto [out, in] = method_features();
    auto fits = [&](uint64_t rows, uint64_t cols) {
      return w.size() == 2 && (rows == 0 || w[0] == rows) && (cols == 0 || w[1] == cols);
    };
    const bool fits_linear = fits(out, in), fits_conv1d = fits(in, out);
    const std::string method = peft_method_name(m_.method);
    if (!fits_linear && !fits_conv1d) {
      mismatch(method + " parameters for " + std::to_string(out) + " output and " + std::to_string(in) +
               " input features (0: any) do not fit " + peft::quoted(base_name_) + " " + shape_text(w) +
               " (Linear [out, in] or GPT-2 Conv1D [in, out]" +
               (row.conv2d ? std::string(", or a 4-D Conv2d") : std::string("; convolutions are not supported")) +
               ")");
      return;
    }
    bool conv1d = fits_conv1d && !fits_linear;
    if (fits_conv1d && fits_linear && table_) {
      const ModuleRule* rule = table_->rule_for_module(m_.name);
      conv1d = rule && rule->kind == ModuleKind::conv1d;
    }
    if (conv1d && row.conv1d_refusal != nullptr) {
      mismatch(method + " on the GPT-2 Conv1D layer " + peft::quoted(base_name_) + ": PEFT implements " + method +
               " for " + row.conv1d_refusal + " only");
      return;
    }
    m_.kind = conv1d ? LayerKind::conv1d : LayerKind::linear;
    // IA3 on a non-feed-forward layer scales the bias too; the bias is the module's.
    if (row.effect == MethodEffect::scale && !m_.settings.ia3_feedforward)
      if (auto b = base_.find(m_.name, "bias", table_)) m_.ia3_bias = base_.weights->tensor(*b).name;
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
    t.base_tensor = param == "weight" && base.is_tied_output(m.name, table) ? m.name + ".weight" : info.name;
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
  const std::string name = base.is_tied_output(m.name, table) ? m.name + ".weight" : info.name;
  for (AdapterTensor& tensor : m.tensors)
    if (tensor.role == TensorRole::trainable_tokens_delta) tensor.base_tensor = name;
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
    if (m.expert) {  // a stacked expert parameter (target_parameters)
      expert_slots(m, adapter_weights, base, table, result.unresolved, result.mismatched);
      continue;
    }
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
