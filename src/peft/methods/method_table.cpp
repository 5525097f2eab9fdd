// The rows of the method table (method_table.hpp): for each method its names, flags, and the
// small functions that hand its parameters to its arithmetic in peft_methods.hpp.
#include "peft/methods/method_table.hpp"

#include "core/error.hpp"
#include "core/text.hpp"
#include "peft/methods/method_fields.hpp"

namespace peft {
namespace {

using merge::MethodTensor;
using Shape = std::vector<int64_t>;

int64_t at(const Shape& s, size_t i) { return i < s.size() ? s[i] : 0; }

const MethodTensor& need(const MethodParams& p, const char* name) {
  const MethodTensor* t = p.get(name);
  if (t == nullptr) fail(PEFT_ERR_INTERNAL, "module " + peft::quoted(p.module) + " lost its " + name);
  return *t;
}

// ---- The out x in each method's parameters imply, as PEFT creates them (0: not implied) ----------

MethodFeatures loha_features(const ParamShapeOf& shape, const MethodSettings&) {
  return {at(shape("hada_w1_a"), 0), at(shape("hada_w1_b"), 1)};  // hada_w1_a [out, r], hada_w1_b [r, in]
}

// w1 [a, c] (or w1_a [a, r] @ w1_b [r, c]) kron w2 [b, d] (likewise): out = a b, in = c d.
MethodFeatures lokr_features(const ParamShapeOf& shape, const MethodSettings&) {
  const Shape w1 = shape("lokr_w1"), w2 = shape("lokr_w2");
  const int64_t a = w1.empty() ? at(shape("lokr_w1_a"), 0) : at(w1, 0);
  const int64_t c = w1.empty() ? at(shape("lokr_w1_b"), 1) : at(w1, 1);
  const int64_t b = w2.empty() ? at(shape("lokr_w2_a"), 0) : at(w2, 0);
  const int64_t d = w2.empty() ? at(shape("lokr_w2_b"), 1) : at(w2, 1);
  return {a * b, c * d};
}

MethodFeatures adalora_features(const ParamShapeOf& shape, const MethodSettings&) {
  return {at(shape("lora_B"), 0), at(shape("lora_A"), 1)};  // lora_B [out, r], lora_A [r, in]
}

MethodFeatures ia3_features(const ParamShapeOf& shape, const MethodSettings& s) {
  const Shape l = shape("ia3_l");  // (out, 1), or (1, in) for a feed-forward module
  return s.ia3_feedforward ? MethodFeatures{0, at(l, 1)} : MethodFeatures{at(l, 0), 0};
}

MethodFeatures miss_features(const ParamShapeOf& shape, const MethodSettings& s) {
  const Shape b = shape("miss_block");  // [r, out], [r, mini_r] or bat's [out / r, r, r]
  if (s.miss_bat) return {at(b, 0) * at(b, 1), 0};
  return {s.miss_mini_r > 0 ? 0 : at(b, 1), 0};
}

MethodFeatures no_features(const ParamShapeOf&, const MethodSettings&) { return {}; }

MethodFeatures vera_features(const ParamShapeOf& shape, const MethodSettings&) {
  return {at(shape("vera_lambda_b"), 0), 0};  // vera_A is sliced to any in
}

MethodFeatures oft_features(const ParamShapeOf& shape, const MethodSettings& s) {
  const Shape r = shape("oft_R");  // [blocks, b (b - 1) / 2]; one shared block says nothing of in
  int64_t b = 2;
  while (r.size() == 2 && b * (b - 1) / 2 < r[1]) ++b;
  if (s.oft.block_share || r.size() != 2 || b * (b - 1) / 2 != r[1]) return {};
  return {0, r[0] * b};
}

MethodFeatures boft_features(const ParamShapeOf& shape, const MethodSettings&) {
  const Shape r = shape("boft_R");  // [N, D, H, H]: in = D * H; boft_s [out, 1]
  return {at(shape("boft_s"), 0), at(r, 1) * at(r, 2)};
}

MethodFeatures hra_features(const ParamShapeOf& shape, const MethodSettings&) { return {0, at(shape("hra_u"), 0)}; }

// logits_A [r, in / L, nv], logits_B [out / L, r, nv] (or their top-k forms), bank [nv, L].
MethodFeatures vblora_features(const ParamShapeOf& shape, const MethodSettings&) {
  const Shape bank = shape("vblora_vector_bank");
  Shape a = shape("vblora_logits_A"), b = shape("vblora_logits_B");
  if (a.empty()) a = shape("vblora_logits_A_topk_indices");
  if (b.empty()) b = shape("vblora_logits_B_topk_indices");
  if (bank.size() != 2 || a.size() != 3 || b.size() != 3) return {};
  return {b[0] * bank[1], a[1] * bank[1]};
}

MethodFeatures c3a_features(const ParamShapeOf& shape, const MethodSettings&) {
  const Shape k = shape("c3a_kernel");  // [out / b, in / b, b]
  if (k.size() != 3) return {};
  return {k[0] * k[2], k[1] * k[2]};
}

// ---- Deltas: the parameters handed to the method's arithmetic ------------------------------------

std::vector<float> loha_delta(const MethodParams& p, double c, const merge::DeltaLayout& l, const float*) {
  if (p.get("hada_t1") != nullptr || p.get("hada_t2") != nullptr)  // the CP (effective conv2d) form
    return merge::loha_cp_delta(need(p, "hada_t1"), need(p, "hada_w1_a"), need(p, "hada_w1_b"), need(p, "hada_t2"),
                                need(p, "hada_w2_a"), need(p, "hada_w2_b"), c, l.out, l.in, p.module);
  return merge::loha_delta(need(p, "hada_w1_a"), need(p, "hada_w1_b"), need(p, "hada_w2_a"), need(p, "hada_w2_b"), c,
                           l.out, l.in, p.module);
}

std::vector<float> lokr_delta(const MethodParams& p, double c, const merge::DeltaLayout& l, const float*) {
  const merge::LokrFactors f{p.get("lokr_w1"), p.get("lokr_w1_a"), p.get("lokr_w1_b"), p.get("lokr_w2"),
                             p.get("lokr_w2_a"), p.get("lokr_w2_b"), p.get("lokr_t2")};
  return merge::lokr_delta(f, c, l.out, l.in, p.module);
}

std::vector<float> adalora_delta(const MethodParams& p, double c, const merge::DeltaLayout& l, const float*) {
  return merge::adalora_delta(need(p, "lora_A"), need(p, "lora_E"), need(p, "lora_B"), c, p.settings.ranknum, l.out,
                              l.in, p.module);
}

// VeRA / RandLoRA: the shared projections must be there.
void need_projections(const MethodParams& p, const std::string& a, const std::string& b, const char* method) {
  if (p.get(a) != nullptr && p.get(b) != nullptr) return;
  if (p.settings.projections_not_saved)
    fail(PEFT_ERR_UNSUPPORTED,
         "module " + peft::quoted(p.module) + ": the " + method + " adapter was saved without its shared " + a +
             " and " + b + " (save_projection is false); PEFT regenerates them from projection_prng_key with "
             "torch's generator, which this library does not reproduce. Re-save it with them: in PEFT, "
             "get_peft_model(base, its config with save_projection=True), load its tensors with "
             "load_state_dict({key + \".default\": tensor}, strict=False), then save_pretrained");
  fail(PEFT_ERR_INVALID_CHECKPOINT, "module " + peft::quoted(p.module) + ": the adapter has no " +
                                        peft::quoted("base_model." + a) + " / " + peft::quoted("base_model." + b) +
                                        " although save_projection is true");
}

std::vector<float> vera_delta(const MethodParams& p, double c, const merge::DeltaLayout& l, const float*) {
  need_projections(p, "vera_A", "vera_B", "VeRA");
  return merge::vera_delta(need(p, "vera_A"), need(p, "vera_B"), need(p, "vera_lambda_d"), need(p, "vera_lambda_b"), c,
                           l.out, l.in, p.module);
}

std::vector<float> randlora_delta(const MethodParams& p, double c, const merge::DeltaLayout& l, const float*) {
  need_projections(p, "randlora_A", "randlora_B", "RandLoRA");
  return merge::randlora_delta(need(p, "randlora_A"), need(p, "randlora_B"), need(p, "randlora_lambda"),
                               need(p, "randlora_gamma"), c, l.out, l.in, p.module);
}

std::vector<float> fourierft_delta(const MethodParams& p, double c, const merge::DeltaLayout& l, const float*) {
  return merge::fourierft_delta(need(p, "fourierft_spectrum"), p.settings.random_loc_seed, c, l.out, l.in, p.module);
}

bool miss_reads_weight(const MethodSettings& s) { return s.miss_bat; }

std::vector<float> miss_delta(const MethodParams& p, double c, const merge::DeltaLayout& l, const float* weight) {
  if (c != 1.0)
    fail(PEFT_ERR_UNSUPPORTED, "module " + peft::quoted(p.module) + ": MiSS has no scale (PEFT's set_scale keeps 1), "
                               "so it merges with weight 1 only, not " + std::to_string(c));
  return merge::miss_delta(need(p, "miss_block"), p.settings.miss_mini_r, p.settings.miss_bat, weight, l.out, l.in,
                           p.module);
}

std::vector<float> shira_delta(const MethodParams& p, double c, const merge::DeltaLayout& l, const float*) {
  return merge::shira_delta(need(p, "shira_weight"), need(p, "shira_indices"), c, l.out, l.in, p.module);
}

std::vector<float> vblora_delta(const MethodParams& p, double c, const merge::DeltaLayout& l, const float*) {
  const MethodTensor* bank = p.get("vblora_vector_bank");
  if (bank == nullptr)
    fail(PEFT_ERR_INVALID_CHECKPOINT, "module " + peft::quoted(p.module) + ": the VB-LoRA adapter has no " +
                                          peft::quoted("base_model.vblora_vector_bank") +
                                          " (the vector bank PEFT saves with every VB-LoRA adapter)");
  const merge::VbloraLogits a{p.get("vblora_logits_A"), p.get("vblora_logits_A_topk_indices"),
                              p.get("vblora_logits_A_topk_weights")};
  const merge::VbloraLogits b{p.get("vblora_logits_B"), p.get("vblora_logits_B_topk_indices"),
                              p.get("vblora_logits_B_topk_weights")};
  return merge::vblora_delta(*bank, a, b, p.settings.vblora_topk, c, l.out, l.in, p.module);
}

std::vector<float> c3a_delta(const MethodParams& p, double c, const merge::DeltaLayout& l, const float*) {
  if (l.transposed)
    fail(PEFT_ERR_UNSUPPORTED, "module " + peft::quoted(p.module) + ": C3A merges into torch.nn.Linear layers only "
                               "(PEFT's C3ALayer refuses GPT-2 Conv1D: \"Unsupported layer type\")");
  return merge::c3a_delta(need(p, "c3a_kernel"), c, l.out, l.in, p.module);
}

// ---- Rotations ----------------------------------------------------------------------------------

merge::InputTransform oft_transform(const MethodParams& p, const merge::DeltaLayout& l, bool inverse) {
  return merge::oft_transform(need(p, "oft_R"), p.settings.oft, l.in, inverse, p.module);
}
merge::InputTransform boft_transform(const MethodParams& p, const merge::DeltaLayout& l, bool inverse) {
  return merge::boft_transform(need(p, "boft_R"), need(p, "boft_s"), l.out, l.in, inverse, p.module);
}
merge::InputTransform hra_transform(const MethodParams& p, const merge::DeltaLayout& l, bool inverse) {
  return merge::hra_transform(need(p, "hra_u"), p.settings.hra_apply_gs, l.in, inverse, p.module);
}

// ---- Names ---------------------------------------------------------------------------------------

using Names = std::string_view[];
constexpr Names kLohaParams = {"hada_w1_a", "hada_w1_b", "hada_w2_a", "hada_w2_b", "hada_t1", "hada_t2"};
constexpr Names kLokrParams = {"lokr_w1", "lokr_w1_a", "lokr_w1_b", "lokr_w2", "lokr_w2_a", "lokr_w2_b", "lokr_t2"};
constexpr Names kAdaloraParams = {"lora_A", "lora_B", "lora_E"};
constexpr Names kIa3Params = {"ia3_l"};
constexpr Names kMissParams = {"miss_block"};
constexpr Names kShiraParams = {"shira_weight", "shira_indices"};
constexpr Names kVeraParams = {"vera_lambda_b", "vera_lambda_d", "vera_A", "vera_B"};
constexpr Names kVeraShared = {"vera_A", "vera_B"};
constexpr Names kRandloraParams = {"randlora_lambda", "randlora_gamma", "randlora_A", "randlora_B"};
constexpr Names kRandloraShared = {"randlora_A", "randlora_B"};
constexpr Names kFourierftParams = {"fourierft_spectrum"};
constexpr Names kOftParams = {"oft_R"};
constexpr Names kBoftParams = {"boft_R", "boft_s"};
constexpr Names kHraParams = {"hra_u"};
constexpr Names kVbloraParams = {"vblora_logits_A",
                                 "vblora_logits_B",
                                 "vblora_vector_bank",
                                 "vblora_logits_A_topk_indices",
                                 "vblora_logits_A_topk_weights",
                                 "vblora_logits_B_topk_indices",
                                 "vblora_logits_B_topk_weights"};
constexpr Names kVbloraShared = {"vblora_vector_bank"};
constexpr Names kC3aParams = {"c3a_kernel"};

constexpr const char* kConvertFirst =
    "convert it to a LoRA first: peftc adapter convert IN OUT --to lora --rank R (peft_adapter_convert_to_lora())";
constexpr const char* kConvertWithBase =
    "convert it to a LoRA first against its base: peftc adapter convert IN OUT --to lora --rank R --base BASE "
    "(peft_adapter_convert_to_lora())";
constexpr const char* kReplaces =
    "replaces whole tensors, which no LoRA holds: merge it into the base instead (peftc merge)";
constexpr const char* kLinearConv = "Linear and Conv layers";
constexpr const char* kLinearOnly = "torch.nn.Linear layers";

using E = MethodEffect;
using P = PeftMethod;
namespace F = method_fields;
constexpr std::span<const std::string_view> kNone{};

// One row per method, in the order of PeftMethod (method_row indexes by it).
const MethodRow kTable[] = {
    {P::lora, "LORA", kNone, nullptr, kNone, E::lora, true, nullptr, false, nullptr, nullptr, nullptr, nullptr, true,
     nullptr, nullptr, nullptr},
    {P::loha, "LOHA", kLohaParams, nullptr, kNone, E::delta, true, kLinearConv, true, loha_features, nullptr, loha_delta,
     nullptr, true, kConvertFirst, F::read_lycoris, F::resolve_loha},
    {P::lokr, "LOKR", kLokrParams, nullptr, kNone, E::delta, true, kLinearConv, true, lokr_features, nullptr, lokr_delta,
     nullptr, true, kConvertFirst, F::read_lycoris, F::resolve_lokr},
    {P::adalora, "ADALORA", kAdaloraParams, nullptr, kNone, E::delta, false, nullptr, false, adalora_features, nullptr,
     adalora_delta, nullptr, true, kConvertFirst, F::read_adalora, F::resolve_adalora},
    {P::ia3, "IA3", kIa3Params, nullptr, kNone, E::scale, false, nullptr, false, ia3_features, nullptr, nullptr, nullptr,
     false, kConvertWithBase, F::read_ia3, F::resolve_ia3},
    {P::miss, "MISS", kMissParams, nullptr, kNone, E::delta, false, kLinearOnly, false, miss_features, miss_reads_weight,
     miss_delta, nullptr, false, kConvertWithBase, F::read_miss, F::resolve_miss},
    {P::shira, "SHIRA", kShiraParams, nullptr, kNone, E::delta, false, kLinearOnly, false, no_features, nullptr,
     shira_delta, nullptr, false, kConvertWithBase, F::read_shira, F::resolve_shira},  // shira_indices only bound the layer
    {P::vera, "VERA", kVeraParams, nullptr, kVeraShared, E::delta, false, nullptr, false, vera_features, nullptr,
     vera_delta, nullptr, false, kConvertWithBase, F::read_vera, F::resolve_vera},
    {P::randlora, "RANDLORA", kRandloraParams, nullptr, kRandloraShared, E::delta, false, nullptr, false,
     no_features,  // min(out, in) only: checked by randlora_delta
     nullptr, randlora_delta, nullptr, false, kConvertWithBase, F::read_randlora, F::resolve_randlora},
    {P::fourierft, "FOURIERFT", kFourierftParams, nullptr, kNone, E::delta, false, nullptr, false,
     no_features,  // any size holding the spectrum: checked by fourierft_delta
     nullptr, fourierft_delta, nullptr, false, kConvertWithBase, F::read_fourierft, F::resolve_fourierft},
    {P::oft, "OFT", kOftParams, "weight", kNone, E::rotation, false, kLinearConv, false, oft_features, nullptr, nullptr,
     oft_transform, false, kConvertWithBase, F::read_oft, F::resolve_oft},
    {P::boft, "BOFT", kBoftParams, nullptr, kNone, E::rotation, false, kLinearConv, false, boft_features, nullptr,
     nullptr, boft_transform, false, kConvertWithBase, F::read_boft, F::resolve_boft},
    {P::hra, "HRA", kHraParams, nullptr, kNone, E::rotation, false, kLinearConv, false, hra_features, nullptr, nullptr,
     hra_transform, false, kConvertWithBase, F::read_hra, F::resolve_hra},
    {P::ln_tuning, "LN_TUNING", kNone, nullptr, kNone, E::replacement, false, nullptr, false, nullptr, nullptr, nullptr,
     nullptr, false, kReplaces, F::read_ln_tuning, nullptr},
    {P::trainable_tokens, "TRAINABLE_TOKENS", kNone, nullptr, kNone, E::replacement, false, nullptr, false, nullptr,
     nullptr, nullptr, nullptr, false, kReplaces, F::read_trainable_tokens, nullptr},
    {P::vblora, "VBLORA", kVbloraParams, nullptr, kVbloraShared, E::delta, false, nullptr, false, vblora_features,
     nullptr, vblora_delta, nullptr, true, kConvertWithBase, F::read_vblora, F::resolve_vblora},
    {P::c3a, "C3A", kC3aParams, nullptr, kNone, E::delta, false, kLinearOnly, false, c3a_features, nullptr, c3a_delta,
     nullptr, true, kConvertWithBase, F::read_c3a, F::resolve_c3a},
};

}  // namespace

const merge::MethodTensor* MethodParams::get(const std::string& name) const {
  auto it = tensors.find(name);
  return it == tensors.end() ? nullptr : &it->second;
}

std::span<const MethodRow> method_table() { return kTable; }

const MethodRow& method_row(PeftMethod method) {
  const auto i = static_cast<size_t>(method);
  if (i >= std::size(kTable) || kTable[i].method != method) fail(PEFT_ERR_INTERNAL, "the method table is out of order");
  return kTable[i];
}

const MethodRow* method_row_for_type(std::string_view peft_type) {
  for (const MethodRow& row : kTable)
    if (peft_type == row.peft_type) return &row;
  return nullptr;
}

bool row_has_param(const MethodRow& row, std::string_view param) {
  for (std::string_view p : row.params)
    if (p == param) return true;
  return false;
}

const MethodRow* method_row_for_param(std::string_view param) {
  for (const MethodRow& row : kTable)
    if (row_has_param(row, param)) return &row;
  return nullptr;
}

MethodEffect effect_of(PeftMethod method) { return method_row(method).effect; }

const char* peft_method_name(PeftMethod method) { return method_row(method).peft_type; }

}  // namespace peft
