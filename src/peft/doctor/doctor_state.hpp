// What the adapter doctor knows about one adapter while it works (adapter_doctor.hpp): the files it
// opened, each tensor of the adapter and what it made of it (Entry), the modules as the fix will
// name them (Group), the problems found so far, each module's line of the report, and the config
// entries and module renames --fix writes. The doctor's jobs (doctor_scan, doctor_config,
// doctor_checks, doctor_report, doctor_fix) each read and fill one DoctorState; this header holds
// no work of its own beyond recording a problem and two readings of a key the jobs share.
//
// One DoctorState per diagnosis; not shared between threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "peft/adapter/adapter_config.hpp"
#include "peft/adapter/adapter_module.hpp"
#include "peft/base/base_model.hpp"
#include "peft/adapter/module_matcher.hpp"
#include "peft/arch/arch_table.hpp"
#include "peft/arch/key_grammar.hpp"
#include "peft/doctor/key_renames.hpp"
#include "peft/methods/method_table.hpp"
#include "checkpoint/checkpoint.hpp"

namespace peft::doctor {

using Shape = std::vector<uint64_t>;

// One tensor of the adapter file and what the doctor made of it.
struct Entry {
  size_t index = 0;
  std::string key;
  bool understood = false;  // module and suffix are known
  bool had_prefix = false;
  bool kohya = false;
  KeyRewrite::Role kohya_role = KeyRewrite::Role::lora_tensor;
  bool suffix_variant = false;
  std::string module;  // as written (without "base_model.model.")
  std::string suffix;  // PEFT's role suffix (after an embedding-role fix)
  TensorRole role = TensorRole::full;
  std::string final_key;  // the key --fix writes; "" when the tensor is dropped into the config
  bool kohya_alpha_or_scale() const { return kohya && kohya_role != KeyRewrite::Role::lora_tensor; }
};

// One module as the fix will name it.
struct Group {
  std::string written;       // the module path as written
  std::string name;          // after the rename (== written when none)
  bool resolved = true;      // name is known (with a base: found in the base)
  std::vector<size_t> entries;
  std::optional<size_t> base_index;  // the base tensor the module applies to
};

struct Problem {
  std::string kind;
  std::vector<std::string> keys;
  std::vector<std::string> modules;
  std::string message;
  bool fixable = false;
};

// One module's line of the report.
struct ModuleReport {
  const Group* group = nullptr;
  LayerKind kind = LayerKind::full;
  std::string dtype;
  bool complete = true;
  std::optional<int64_t> rank;
  std::optional<double> alpha, scaling;
  std::optional<std::string> dora;
  std::optional<std::string> method;  // "LORA", "LOHA", ..., or "LYCORIS_LOHA" / "LYCORIS_LOKR"
};

// An adapter that changes either side of a base's tied embeddings: which case it is in and what a
// checkpoint merge does under each tied embeddings policy (doctor_checks).
struct TiedReport {
  std::string input;   // the stored input embedding tensor ("model.embed_tokens.weight")
  std::string output;  // the output embedding module ("lm_head")
  bool output_stored = false;
  std::string config_key;  // "tie_word_embeddings"
  // "output_only", "input_only", "both", "ensure_weight_tying", "trainable_tokens", "modules_to_save"
  std::string kind;
  bool tokens = false;               // trainable tokens among the changes
  std::vector<std::string> modules;  // the adapter's modules on either side
  std::string untie, shared;         // what the merge does under each policy
};

struct DoctorState {
  std::string dir, base_dir;  // dir: the snapshot folder once a hub model id is resolved
  bool missing_config = false;
  LoraConfig config;  // the folder's own, or the one made from the tensors (doctor_config)
  std::shared_ptr<const Checkpoint> weights;
  std::optional<BaseModel> base;
  std::shared_ptr<const ArchTable> table;
  std::string family;
  std::vector<Entry> entries;
  std::vector<Group> groups;
  std::optional<ModuleMatcher> matcher;
  std::vector<Problem> problems;
  std::vector<ModuleReport> reports;
  std::vector<std::tuple<std::string, std::string, double>> config_changes;  // field, key, value
  std::map<std::string, std::string> module_renamed;                          // written -> name
  std::map<std::string, std::string> renamed_origin;
  std::vector<std::pair<std::string, std::string>> underscored;  // base module, underscore-joined
  std::optional<TiedReport> tied;  // the base ties its embeddings and the adapter changes them

  void problem(std::string kind, std::vector<std::string> keys, std::vector<std::string> modules,
               std::string message, bool fixable) {
    problems.push_back({std::move(kind), std::move(keys), std::move(modules), std::move(message), fixable});
  }

  std::vector<std::string> keys_of(const Group& g) const {
    std::vector<std::string> keys;
    for (size_t i : g.entries) keys.push_back(entries[i].key);
    return keys;
  }

  const Shape& shape_of(const Entry& e) const { return weights->tensor(e.index).shape; }
};

// A method parameter saved with a key tail (OFT's oft_R: <module>.oft_R[.default].weight), or null.
inline const char* key_tail_of(const std::string& suffix) {
  const MethodRow* row = method_row_for_param(suffix);
  return row != nullptr ? row->key_tail : nullptr;
}

// The suffix as PEFT saves it: OFT's rotation is the weight of its oft_R submodule.
inline std::string saved_suffix(const std::string& suffix) {
  const char* tail = key_tail_of(suffix);
  return tail != nullptr ? suffix + "." + tail : suffix;
}

// A rank is a dimension PEFT can hold: a positive integer below 2^63.
inline bool valid_rank(uint64_t dim) {
  return dim > 0 && dim <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
}

}  // namespace peft::doctor
