// Control vectors (steering vectors): one direction of n_embd values per decoder layer, added to the
// layer's output (the residual stream after the layer), the way llama.cpp applies them
// (`llama_adapter_cvec::apply_to`, after each layer's residual add). Layer N is the 0-based index of
// the decoder layer whose output gets the direction, as in llama.cpp and repeng.
//
// Files:
// - llama.cpp's GGUF (architecture `controlvector`, written by repeng and llama.cpp's
//   cvector-generator): one F32 tensor `direction.N` per layer (N >= 1: llama.cpp never steers layer
//   0 and refuses `direction.0`), with `controlvector.model_hint` and `controlvector.layer_count`.
// - safetensors: one 1-D tensor per layer named `direction.N` (the GGUF names), `model.layers.N` or
//   `layers.N` (the module whose output it steers), or `N` (a {layer: vector} dict saved as is); any
//   float dtype; `model_hint` in the metadata.
// Both readers check what llama.cpp's loader (common_control_vector_load) checks and a little more:
// every tensor a direction with a canonical layer number, each layer once, every direction 1-D (outer
// dimensions of 1 allowed, as ggml_n_dims ignores them) with the same n_embd, F32 in GGUF, every value
// finite, at least one direction.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/dtype.hpp"

namespace peft {

class Checkpoint;

struct ControlVector {
  uint64_t n_embd = 0;
  std::string model_hint;                          // "" when the file names none
  std::map<int64_t, std::vector<float>> directions;  // layer -> n_embd values, layers ascending
};

// The control vector a single safetensors or GGUF file holds. PEFT_ERR_IO / the format's errors for
// a file that does not open; PEFT_ERR_INVALID_CHECKPOINT naming the tensor or key for a file that is
// not a control vector; PEFT_ERR_NON_FINITE naming the tensor for an infinite or NaN value.
ControlVector read_control_vector(const std::string& path);
ControlVector read_control_vector(const Checkpoint& checkpoint, const std::string& path);

// Whether a tensor name is `direction.N` and so a GGUF control vector's; the layer in `layer`.
bool parse_direction_name(const std::string& name, int64_t& layer);

// Sets one layer's direction from `n_embd` elements of `dtype` (F32, F16, BF16 or F64), replacing
// what the layer had. INVALID_ARGUMENT for a negative layer; NON_FINITE for an infinite or NaN value.
void set_direction(ControlVector& vector, int64_t layer, DType dtype, const void* data);

// dst += strength * src, layer by layer, in f32 as llama.cpp's loader combines several vectors
// (each element src * float(strength), then added; a layer dst lacks starts at zero).
// SHAPE_MISMATCH when the n_embd differ; NON_FINITE naming the layer when a sum is not finite.
void add_scaled(ControlVector& dst, const ControlVector& src, double strength);

// Writes the vector atomically. GGUF: llama.cpp's layout as gguf-py writes it (general.architecture
// `controlvector`, then `controlvector.model_hint` when set and `controlvector.layer_count`, then
// `direction.N` F32 in ascending N); INVALID_ARGUMENT for a direction of layer 0, which llama.cpp
// refuses. safetensors: `direction.N` F32 tensors, `model_hint` in the metadata when set.
// INVALID_ARGUMENT for a vector without directions.
void write_control_vector_gguf(const ControlVector& vector, const std::string& path);
void write_control_vector_safetensors(const ControlVector& vector, const std::string& path);

}  // namespace peft
