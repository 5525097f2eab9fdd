// What a method's row reads in adapter_config.json and how it resolves each of its modules: the
// interfaces of the two row functions the adapter loader calls (MethodRow::read_config and
// MethodRow::resolve, method_table.hpp), and the method's settings they produce. Each method's own
// functions are in method_fields.cpp; the loader (adapter/adapter_config, adapter/adapter) reads
// LoRA's fields and implements ModuleResolution.
//
// Thread safety: plain values, and readers over a document the caller keeps alive.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "peft/methods/peft_methods.hpp"

namespace peft {

// target_modules / exclude_modules (and IA3's feedforward_modules): absent, a list of names, a
// Python regex, or "all-linear".
struct ModuleSelector {
  enum class Kind { none, list, regex, all_linear };
  Kind kind = Kind::none;
  std::vector<std::string> names;  // Kind::list, in file order
  std::string pattern;             // Kind::regex and Kind::all_linear, as written
};

// The settings of one module that its method's arithmetic reads beside the tensors. A method's
// read_config sets the adapter-wide values; its resolve copies them per module and adds the
// module's own (AdaLoRA's ranknum, IA3's feed-forward side).
struct MethodSettings {
  double ranknum = 0;                 // AdaLoRA: init_r
  bool ia3_feedforward = false;       // IA3: ia3_l scales the input features
  bool miss_bat = false;              // MiSS: the "bat" form (its delta reads the weight)
  int64_t miss_mini_r = 0;            // MiSS: mini_r of the "mini" form, 0 otherwise
  merge::OftSettings oft;             // OFT
  bool hra_apply_gs = false;          // HRA: apply_GS
  bool projections_not_saved = false; // VeRA / RandLoRA: save_projection was false
  int64_t random_loc_seed = 0;        // FourierFT
  int64_t vblora_topk = 2;            // VB-LoRA: topk
};

// The fields of adapter_config.json that belong to one method (what its read_config found), beside
// LoRA's, which every method's config shares in LoRA's names (LoraConfig).
struct MethodConfig {
  MethodSettings settings;  // adapter-wide: each module starts from these
  // LoHa / LoKr / HRA / FourierFT read r and alpha through rank_pattern and alpha_pattern (their own
  // names renamed to LoRA's); AdaLoRA's rank_pattern holds a mask of kept ranks per module.
  std::vector<std::pair<std::string, std::vector<bool>>> adalora_rank_masks;
  ModuleSelector feedforward_modules;  // IA3
  // VeRA / RandLoRA: save_projection (false: settings.projections_not_saved) and the seed PEFT
  // regenerates the projections from.
  int64_t projection_prng_key = 0;
  double fourierft_scaling = 150.0;  // FourierFT: scaling
  bool vblora_save_only_topk = false;  // VB-LoRA: the logits saved as _topk_indices / _topk_weights
};

// Reads fields of a config document with PEFT's checks: the wrong JSON type or a value PEFT refuses
// is PEFT_ERR_INVALID_CONFIG naming the field, a feature this library lacks PEFT_ERR_UNSUPPORTED
// naming it. `source` names the file in messages.
class FieldReader {
 public:
  using Json = nlohmann::ordered_json;
  FieldReader(const Json& doc, const std::string& source) : doc_(doc), source_(source) {}

  [[noreturn]] void invalid(const std::string& field, const std::string& what) const;
  [[noreturn]] void wrong_type(const std::string& field, const std::string& expected) const;
  [[noreturn]] void unsupported(const std::string& field, const std::string& what) const;

  // The field's value, or nullptr when absent or null.
  const Json* get(const char* field) const;
  bool present_non_null(const char* field) const { return get(field) != nullptr; }
  std::optional<std::string> optional_string(const char* field) const;
  bool boolean(const char* field, bool fallback) const;
  double number(const char* field, double fallback) const;
  std::vector<std::string> string_list(const char* field, const Json& v) const;
  // An integer of a list or map in `field`; one beyond 2^63 - 1 is refused (Python's are unbounded,
  // this library's are 64 bits), never wrapped around.
  int64_t integer(const std::string& field, const Json& item, const char* expected) const;
  std::vector<int64_t> int_list(const std::string& field, const Json& v) const;
  ModuleSelector selector(const char* field) const;

 private:
  const Json& doc_;
  const std::string& source_;
};

// A method's config as LoRA's reader reads it: `doc` as written, `view` the copy being edited (the
// method's names for r and alpha renamed to LoRA's, its defaults written, LoRA fields it lacks
// removed), then read by the common reader.
struct ConfigView {
  const nlohmann::ordered_json& doc;
  nlohmann::ordered_json& view;
  // view[to] = doc[from], or no `to` when the document has no `from`.
  void rename(const char* from, const char* to);
  void erase(const char* field) { view.erase(field); }
  // Writes `value` unless the view has the field (the method's own default for a LoRA field).
  void default_to(const char* field, const nlohmann::ordered_json& value);
  // "<method>_only" bias (OFT, BOFT, HRA, VB-LoRA, C3A) read as LoRA's "lora_only".
  void own_bias(const char* peft_type);
};

// One module of a method other than LoRA, as its row resolves it: the module's parameters, the
// adapter-wide fields, and the rank, alpha, scale and settings the row sets. The adapter loader
// implements the parameter lookups, rank_pattern / alpha_pattern matching and the two ways of
// reporting a problem; it has already said whether target_modules selects the module.
class ModuleResolution {
 public:
  ModuleResolution(std::string module, const char* peft_type, int64_t r, double lora_alpha, const MethodConfig& fields)
      : module(std::move(module)), peft_type(peft_type), r(r), lora_alpha(lora_alpha), fields(fields),
        settings(fields.settings) {}
  virtual ~ModuleResolution() = default;

  const std::string module;  // "model.layers.0.self_attn.q_proj"
  const char* const peft_type;
  const int64_t r;           // the config's r (in LoRA's name)
  const double lora_alpha;   // the config's lora_alpha (in LoRA's name)
  const MethodConfig& fields;

  // What the row sets; the loader copies them into the module.
  int64_t rank = 0;
  double alpha = 0;
  double scaling = 0;
  std::optional<std::string> rank_key;   // the rank_pattern key that applied
  std::optional<std::string> alpha_key;  // the alpha_pattern key that applied
  MethodSettings settings;

  virtual bool has(std::string_view param) const = 0;
  // The parameter's shape (it exists: `has`).
  virtual std::vector<uint64_t> shape(std::string_view param) const = 0;
  // rank and rank_key (alpha and alpha_key) as r and rank_pattern (lora_alpha and alpha_pattern)
  // give them for this module.
  virtual void rank_from_patterns() = 0;
  virtual void alpha_from_patterns() = 0;
  // Whether a module path a config names, with or without PEFT's "base_model.model." prefix, is
  // this module (AdaLoRA's rank_pattern keys).
  virtual bool is_this_module(std::string_view path) const = 0;
  // A module whose tensors do not fit together (PEFT_ERR_INVALID_CHECKPOINT) and a config field the
  // tensors contradict (PEFT_ERR_INVALID_CONFIG); the loader collects both and fails after all.
  virtual void broken(const std::string& what) = 0;
  virtual void config_problem(const std::string& field, const std::string& what) = 0;

  // Whether every one of `params` is there; each missing one is reported as broken.
  bool need(std::initializer_list<const char*> params);
  // The parameter's size along `axis`, 0 beyond its dimensions.
  int64_t dim(std::string_view param, size_t axis) const;
  // Reports `actual` against `rank` (naming rank_pattern's key when one applied, else r).
  void check_rank(int64_t actual);
  // "module \"name\"", for messages.
  std::string who() const;
};

}  // namespace peft
