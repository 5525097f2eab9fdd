// Writing a plain LoRA adapter whose factors are truncated SVDs of weight changes dW, one module
// at a time: what extraction from a fine-tuned checkpoint (lora_extract.hpp) and conversion of an
// adapter to LoRA (lora_convert.hpp) share.
//
// Per module, PEFT's convert_to_lora rule (peft/kernels/truncated_svd.hpp): dW [out, in] = U S V^T
// gives B = U S and A = V^T; for a GPT-2 Conv1D module, whose dW is stored [in, out], the SVD of
// the stored matrix gives B' = U S, A' = V^T and the factors are A = B'^T, B = A'^T, as PEFT does.
// Modules run in parallel (one task per module: its dW is made, factored and dropped, so memory
// holds one dW per thread plus the factors). The config is the one convert_to_lora writes: with a
// fixed rank r, r = lora_alpha = r and target_modules the modules (a module converted exactly at
// another rank also in rank_pattern and alpha_pattern); with an energy fraction, r = lora_alpha = 1
// and every module's rank in rank_pattern and alpha_pattern (scaling 1 either way).
// Factors are F32 unless a dtype is given.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.hpp"
#include "peft/kernels/truncated_svd.hpp"

namespace peft {

struct LowRankOptions {
  merge::RankChoice choice;  // a rank, or an energy fraction; neither is INVALID_ARGUMENT
  merge::SvdMethod method = merge::SvdMethod::exact;
  unsigned threads = 0;                // 0 = one per hardware thread
  std::optional<DType> dtype;          // the factors' dtype: F32 (default), BF16 or F16
  std::vector<std::string> modules;    // extraction only: target_modules names (PEFT matching); empty = default
  std::string base_dir;                // conversion only: the base model (multiplicative methods); "" = none
};

// One converted module: its rank and ||dW - B A||_F / ||dW||_F.
struct LowRankModule {
  std::string name;
  int64_t rank = 0;
  double relative_error = 0.0;
};

// A module to factor: its name, whether it is a Conv1D (dW stored [in, out]), and how to make its dW
// (called on a worker thread; returns nullopt when the module has no change and is to be left out).
struct DeltaSource {
  std::string name;
  bool conv1d = false;
  std::function<std::optional<std::vector<float>>(int64_t& rows, int64_t& cols)> make;
  // Set (instead of make) for a module whose factors are known exactly, as PEFT's convert_to_lora
  // takes MiSS: fills lora_A [rank, in] and lora_B [out, rank] (Linear order) and returns the rank,
  // which the rank or energy asked for does not change; the reported error is 0.
  std::function<int64_t(std::vector<float>& a, std::vector<float>& b)> exact;
  // Set when the adapter written has lora_bias (the config's "lora_bias" true): the module's
  // lora_B.bias, out values (at scaling 1). Modules without it get zeros then.
  std::function<std::vector<float>()> bias;
};

// INVALID_ARGUMENT unless exactly one of a rank >= 1 or an energy in (0, 1] is set, or for a dtype
// other than F32/BF16/F16.
void check_lowrank_options(const LowRankOptions& options);

// Factors every source and writes the adapter folder; `config` holds the fields other than r,
// lora_alpha, rank_pattern, alpha_pattern, fan_in_fan_out and target_modules, which this fills in
// (with "lora_bias" true in `config`, every module also gets a lora_B.bias: its source's, or zeros)
// (`target_modules` given in `config` as a list is extended with the module names; a string is
// kept and every module goes into the patterns). Returns the report, in the order of `sources`
// (modules left out omitted). INVALID_ARGUMENT when no module is left; the errors of
// truncated_svd and write_adapter_folder.
std::vector<LowRankModule> write_lowrank_adapter(const std::vector<DeltaSource>& sources, nlohmann::ordered_json config,
                                                 const std::string& out_dir, const LowRankOptions& options);

}  // namespace peft
