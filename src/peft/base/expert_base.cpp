#include "peft/base/expert_base.hpp"

#include "core/error.hpp"
#include "core/text.hpp"

namespace peft {
namespace {

std::optional<size_t> find_name(const BaseModel& base, const std::string& name, const ArchTable* table) {
  const size_t dot = name.rfind('.');
  return base.find(std::string_view(name).substr(0, dot), std::string_view(name).substr(dot + 1), table);
}

}  // namespace

ExpertFactorShape expert_factor_shape(const AdapterModule& m, const Checkpoint& adapter_weights) {
  const auto& a = adapter_weights.tensor(m.find(TensorRole::lora_a)->index).shape;
  const auto& b = adapter_weights.tensor(m.find(TensorRole::lora_b)->index).shape;
  return {m.expert->num_experts, m.rank, static_cast<int64_t>(a.at(1)), static_cast<int64_t>(b.at(0))};
}

ExpertFactors::ExpertFactors(const AdapterModule& m, const Checkpoint& adapter_weights)
    : shape_(expert_factor_shape(m, adapter_weights)),
      a_(adapter_weights.read_f32(m.find(TensorRole::lora_a)->index)),
      b_(adapter_weights.read_f32(m.find(TensorRole::lora_b)->index)) {}

std::vector<float> ExpertFactors::b(int64_t e, int64_t row_begin, int64_t rows, int64_t row_stride) const {
  const int64_t r = shape_.rank, E = shape_.experts;
  std::vector<float> out(static_cast<size_t>(rows * r));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t k = 0; k < r; ++k)
      out[static_cast<size_t>(i * r + k)] = b_[static_cast<size_t>((row_begin + i * row_stride) * r * E + k * E + e)];
  return out;
}

std::vector<ExpertPart> per_expert_parts(const AdapterModule& m, const ExpertFactorShape& f) {
  const ExpertTarget& x = *m.expert;
  const int64_t parts = static_cast<int64_t>(x.per_expert.size());
  if (parts == 0 || f.out % parts != 0) return {};
  const int64_t rows = f.out / parts;
  std::vector<ExpertPart> out;
  for (int64_t e = 0; e < f.experts; ++e) {
    for (int64_t j = 0; j < parts; ++j)
      out.push_back({x.checkpoint_module + "." + std::to_string(e) + "." + x.per_expert[static_cast<size_t>(j)], e,
                     x.interleaved ? j : j * rows, rows, x.interleaved ? parts : 1});
  }
  return out;
}

std::string saved_module_name(const AdapterModule& m) {
  if (!m.expert || m.expert->per_expert.empty()) return m.name;
  const std::string& first = m.expert->per_expert.front();
  return m.expert->checkpoint_module + ".0." + first.substr(0, first.rfind('.'));
}

std::vector<ExpertSlot> expert_slots(const AdapterModule& m, const Checkpoint& adapter_weights, const BaseModel& base,
                                     const ArchTable* table, std::vector<std::string>& unresolved,
                                     std::vector<std::string>& mismatched) {
  const ExpertTarget& x = *m.expert;
  const std::string who = "module " + peft::quoted(m.name) + " (parameter " + peft::quoted(x.module + "." + x.param) + ")";
  if (x.num_experts <= 0) {
    mismatched.push_back(who + ": lora_A's rows are not a multiple of the rank");
    return {};
  }
  const ExpertFactorShape f = expert_factor_shape(m, adapter_weights);
  const uint64_t E = static_cast<uint64_t>(f.experts), in = static_cast<uint64_t>(f.in), out = static_cast<uint64_t>(f.out);
  auto fused = find_name(base, x.checkpoint_module + "." + x.param, table);
  if (!fused) fused = find_name(base, x.module + "." + x.param, table);
  if (fused) {
    const TensorInfo& w = base.weights->tensor(*fused);
    const std::vector<uint64_t> want = x.transposed ? std::vector<uint64_t>{E, in, out} : std::vector<uint64_t>{E, out, in};
    if (w.shape != want) {
      mismatched.push_back(who + ": lora_A " + shape_text(adapter_weights.tensor(m.find(TensorRole::lora_a)->index).shape) +
                           " and lora_B " + shape_text(adapter_weights.tensor(m.find(TensorRole::lora_b)->index).shape) +
                           " of rank " + std::to_string(f.rank) + " make " + shape_text(want) + ", the base tensor " +
                           peft::quoted(w.name) + " is " + shape_text(w.shape));
      return {};
    }
    return {ExpertSlot{*fused, -1, 0, f.out}};
  }
  const std::string saved_first = x.checkpoint_module + ".0." + (x.per_expert.empty() ? x.param : x.per_expert.front());
  if (x.per_expert.empty() || !find_name(base, saved_first, table)) {
    unresolved.push_back(who + ": the base has neither the fused tensor " +
                         peft::quoted(x.checkpoint_module + "." + x.param) +
                         (x.per_expert.empty() ? std::string() : " nor per-expert tensors like " + peft::quoted(saved_first)));
    return {};
  }
  const int64_t parts = static_cast<int64_t>(x.per_expert.size());
  const std::vector<ExpertPart> expert_parts = per_expert_parts(m, f);
  if (expert_parts.empty()) {
    mismatched.push_back(who + ": lora_B's " + std::to_string(f.out) + " rows do not split into " +
                         std::to_string(parts) + " equal parts");
    return {};
  }
  std::vector<ExpertSlot> slots;
  for (const ExpertPart& part : expert_parts) {
    auto index = find_name(base, part.tensor, table);
    if (!index) {
      unresolved.push_back(who + ": the base has no tensor " + peft::quoted(part.tensor) + " for expert " +
                           std::to_string(part.expert) + " of " + std::to_string(f.experts));
      return {};
    }
    const TensorInfo& w = base.weights->tensor(*index);
    const std::vector<uint64_t> want{static_cast<uint64_t>(part.rows), in};
    if (w.shape != want) {
      mismatched.push_back(who + ": expert " + std::to_string(part.expert) + "'s delta part is " + shape_text(want) +
                           ", the base tensor " + peft::quoted(w.name) + " is " + shape_text(w.shape));
      return {};
    }
    slots.push_back({*index, part.expert, part.row_begin, part.rows, part.row_stride});
  }
  const std::string beyond = x.checkpoint_module + "." + std::to_string(f.experts) + "." + x.per_expert.front();
  if (find_name(base, beyond, table)) {
    mismatched.push_back(who + ": the adapter has " + std::to_string(f.experts) + " experts, the base more (" +
                         peft::quoted(beyond) + ")");
    return {};
  }
  return slots;
}

}  // namespace peft
