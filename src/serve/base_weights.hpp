// The host's base weights as the registry sees them for DoRA in unmerged apply (peft_c.h,
// peft_registry_set_base_weight()): borrowed buffers by layer, and each DoRA layer's per-output
// scale magnitude / ||W + scaling B A||, computed once per loaded adapter version and layer from
// the base weight (peft::merge::dora_weight_norm, the norm of the DoRA merge) and kept until the
// host says its weights changed.
//
// PEFT's DoRA forward (peft/tuners/lora/dora.py, DoraLinearLayer.forward, eval mode) adds to the
// base layer's output `result`:
//
//   (s - 1) * (result - bias) + s * (x A^T B^T) * scaling,   s = magnitude / ||W + scaling B A||
//
// with the norm taken per output feature (over a row of a Linear weight [out, in], a column of a
// GPT-2 Conv1D weight [in, out]). So apply needs s and the base layer's bias; both are here.
//
// Thread safety: every method may be called from many threads at once. The buffers are read only
// while a scale is computed (the first apply of a DoRA layer after a load, a set or a change).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/dtype.hpp"
#include "peft/arch/translator.hpp"
#include "serve/loaded_adapter.hpp"

namespace peft::serve {

// One DoRA layer's factors for apply: scale [out] = magnitude / weight norm (f32, as PEFT's
// mag_norm_scale) and the base layer's bias [out] as f32 (empty when the layer has none).
struct DoraScale {
  std::vector<float> scale;
  std::vector<float> bias;
};

class BaseWeights {
 public:
  // One base weight buffer for `name` (a weight or layer name, read through `translator` as the
  // registry's layer names are), borrowed: it must stay valid while scales may be computed from
  // it. shape has 2 dimensions ([out, in] for Linear, [in, out] for GPT-2 Conv1D); bias (may be
  // null) has bias_elements elements. Giving a layer again replaces its buffers. Every cached
  // scale is dropped. INVALID_ARGUMENT for a null pointer; UNSUPPORTED for a dtype other than
  // F32/BF16/F16; SHAPE_MISMATCH for another number of dimensions, a zero dimension or a bias of
  // fewer than 1 element; UNRESOLVED_KEY from the translator.
  void set(std::string_view name, const void* data, DType dtype, std::span<const int64_t> shape, const void* bias,
           DType bias_dtype, int64_t bias_elements, const Translator* translator);

  // The host changed the contents of its buffers: every scale is computed again at its next use.
  void changed();

  // The DoRA scale of `layer` (a layer of `loaded` with a magnitude), computed on first use.
  // `adapter` names the adapter in messages. NOT_FOUND when no base weight was given for the
  // layer; SHAPE_MISMATCH when the weight or its bias does not fit the layer; UNSUPPORTED for a
  // DoRA layer with lora_bias (PEFT refuses that combination).
  std::shared_ptr<const DoraScale> scale(const std::shared_ptr<const LoadedAdapter>& loaded, const LoadedLayer& layer,
                                         const std::string& adapter);

 private:
  struct Weight {
    std::string name;
    const void* data = nullptr;
    DType dtype = DType::F32;
    std::vector<int64_t> shape;
    const void* bias = nullptr;
    DType bias_dtype = DType::F32;
    int64_t bias_elements = 0;
  };
  struct Cached {
    std::weak_ptr<const LoadedAdapter> owner;  // the version the scale was computed for
    std::shared_ptr<const DoraScale> scale;
  };

  std::mutex mutex_;
  std::unordered_map<std::string, std::shared_ptr<const Weight>> by_module_;  // every module path a weight stands for
  std::map<std::pair<const LoadedAdapter*, const LoadedLayer*>, Cached> cache_;
};

}  // namespace peft::serve
