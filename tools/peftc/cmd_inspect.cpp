// peftc inspect PATH [--json]: the tensors and metadata of a safetensors or GGUF file, or a checkpoint
// folder; for a control vector (a GGUF file of architecture `controlvector`, or a safetensors file of
// `direction.N` tensors) also its layers and each direction's norm.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "command.hpp"
#include "gguf_metadata.hpp"
#include "arguments.hpp"
#include "json_text.hpp"

namespace peftc {
namespace {

constexpr const char* kUsage = "inspect PATH [--json]";

std::string base_name(const std::string& path) {
  size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// How a tensor's element type is shown: its dtype, or for a block-quantized GGUF tensor its ggml type.
std::string type_text(const peft_checkpoint* ckpt, size_t i) {
  const int32_t dtype = peft_checkpoint_tensor_dtype(ckpt, i);
  return dtype >= 0 ? peft_dtype_name(dtype) : ggml_type_text(peft_checkpoint_tensor_ggml_type(ckpt, i));
}

// A safetensors file's metadata (a GGUF file's is printed by print_gguf_metadata_json).
std::string file_metadata_json(const peft_checkpoint* ckpt, size_t file) {
  if (!peft_checkpoint_has_metadata(ckpt, file)) return "null";
  std::string out = "{";
  size_t count = peft_checkpoint_metadata_count(ckpt, file);
  for (size_t j = 0; j < count; ++j) {
    if (j) out += ",";
    out += json_string(peft_checkpoint_metadata_key(ckpt, file, j)) + ":" +
           json_string(peft_checkpoint_metadata_value(ckpt, file, j));
  }
  return out + "}";
}

// Whether a one-file checkpoint is a control vector: a GGUF file of architecture `controlvector`, or a
// safetensors file whose every tensor is `direction.N`.
bool is_control_vector(const peft_checkpoint* ckpt) {
  if (peft_checkpoint_file_count(ckpt) != 1 || peft_checkpoint_tensor_count(ckpt) == 0) return false;
  if (peft_checkpoint_file_format(ckpt, 0) == PEFT_FORMAT_GGUF) {
    size_t kv = 0;
    const char* data = nullptr;
    size_t length = 0;
    if (peft_error* err = peft_checkpoint_gguf_kv_find(ckpt, 0, "general.architecture", &kv)) {
      peft_error_free(err);
      return false;
    }
    if (peft_error* err = peft_checkpoint_gguf_kv_string(ckpt, 0, kv, 0, &data, &length)) {
      peft_error_free(err);
      return false;
    }
    return std::string(data, length) == "controlvector";
  }
  for (size_t i = 0; i < peft_checkpoint_tensor_count(ckpt); ++i)
    if (std::string(peft_checkpoint_tensor_name(ckpt, i)).rfind("direction.", 0) != 0) return false;
  return true;
}

double direction_norm(const peft_control_vector* vector, int64_t layer) {
  const float* values = peft_control_vector_direction(vector, layer);
  double sum = 0;
  for (uint64_t j = 0; j < peft_control_vector_n_embd(vector); ++j) sum += double(values[j]) * values[j];
  return std::sqrt(sum);
}

// The control vector's section: ',"control_vector":{...}' for JSON, lines of text otherwise.
std::string control_vector_text(const peft_control_vector* vector, bool json) {
  const size_t layers = peft_control_vector_layer_count(vector);
  std::string out;
  if (json) {
    out = ",\"control_vector\":{\"n_embd\":" + std::to_string(peft_control_vector_n_embd(vector)) +
          ",\"model_hint\":" + json_string(peft_control_vector_model_hint(vector)) + ",\"layers\":[";
    for (size_t i = 0; i < layers; ++i) {
      const int64_t layer = peft_control_vector_layer(vector, i);
      out += std::string(i ? "," : "") + "{\"layer\":" + std::to_string(layer) + ",\"norm\":" +
             json_number(direction_norm(vector, layer)) + "}";
    }
    return out + "]}";
  }
  char line[160];
  std::snprintf(line, sizeof line, "control vector: %zu layer(s) of %llu values, model hint \"%s\"\n", layers,
                static_cast<unsigned long long>(peft_control_vector_n_embd(vector)), peft_control_vector_model_hint(vector));
  out = line;
  for (size_t i = 0; i < layers; ++i) {
    const int64_t layer = peft_control_vector_layer(vector, i);
    std::snprintf(line, sizeof line, "  layer %lld: norm %.6g\n", static_cast<long long>(layer), direction_norm(vector, layer));
    out += line;
  }
  return out;
}

void print_json(const peft_checkpoint* ckpt, bool is_folder, const std::string& control) {
  std::string out = "{";
  if (peft_checkpoint_file_format(ckpt, 0) == PEFT_FORMAT_GGUF)
    out += "\"format\":\"gguf\",\"version\":" + std::to_string(peft_checkpoint_gguf_version(ckpt, 0)) + ",";
  out += "\"tensors\":[";
  size_t count = peft_checkpoint_tensor_count(ckpt);
  for (size_t i = 0; i < count; ++i) {
    uint64_t begin = 0, end = 0;
    peft_error_free(peft_checkpoint_tensor_offsets(ckpt, i, &begin, &end));
    uint64_t offsets[2] = {begin, end};
    if (i) out += ",";
    out += "{\"name\":" + json_string(peft_checkpoint_tensor_name(ckpt, i),
                                       peft_checkpoint_tensor_name_length(ckpt, i)) +
           ",\"dtype\":" + json_string(type_text(ckpt, i)) +
           ",\"shape\":" + json_uint_array(peft_checkpoint_tensor_shape(ckpt, i),
                                           peft_checkpoint_tensor_ndim(ckpt, i)) +
           ",\"data_offsets\":" + json_uint_array(offsets, 2);
    if (is_folder) {
      size_t file = peft_checkpoint_tensor_file(ckpt, i);
      out += ",\"file\":" + json_string(base_name(peft_checkpoint_file_path(ckpt, file)));
    }
    if (const int32_t ggml_type = peft_checkpoint_tensor_ggml_type(ckpt, i); ggml_type >= 0)
      out += ",\"ggml_type\":" + json_string(ggml_type_text(ggml_type));
    out += "}";
  }
  out += "],\"metadata\":";
  if (is_folder) {
    const char* index_metadata = peft_checkpoint_index_metadata_json(ckpt);
    // A folder holding a single model.safetensors has no index: show that file's metadata.
    out += index_metadata ? std::string(index_metadata) : file_metadata_json(ckpt, 0);
  } else if (peft_checkpoint_file_format(ckpt, 0) == PEFT_FORMAT_GGUF) {
    std::fputs(out.c_str(), stdout);
    out.clear();
    print_gguf_metadata_json(ckpt, 0, stdout);
  } else {
    out += file_metadata_json(ckpt, 0);
  }
  out += control + "}\n";
  std::fputs(out.c_str(), stdout);
}

std::string shape_text(const peft_checkpoint* ckpt, size_t i) {
  std::string out = "[";
  const uint64_t* shape = peft_checkpoint_tensor_shape(ckpt, i);
  size_t ndim = peft_checkpoint_tensor_ndim(ckpt, i);
  for (size_t d = 0; d < ndim; ++d) out += (d ? ", " : "") + std::to_string(shape[d]);
  return out + "]";
}

void print_text(const peft_checkpoint* ckpt) {
  size_t files = peft_checkpoint_file_count(ckpt);
  size_t count = peft_checkpoint_tensor_count(ckpt);
  uint64_t total = 0;
  for (size_t i = 0; i < count; ++i) {
    uint64_t begin = 0, end = 0;
    peft_error_free(peft_checkpoint_tensor_offsets(ckpt, i, &begin, &end));
    total += end - begin;
  }
  std::printf("%zu tensor(s), %llu bytes of data, in %zu file(s)\n", count,
              static_cast<unsigned long long>(total), files);
  for (size_t k = 0; k < files; ++k) {
    std::printf("file %s\n", peft_checkpoint_file_path(ckpt, k));
    if (peft_checkpoint_file_format(ckpt, k) == PEFT_FORMAT_GGUF) {
      std::printf("  GGUF version %u, %zu metadata entries\n", peft_checkpoint_gguf_version(ckpt, k),
                  peft_checkpoint_gguf_kv_count(ckpt, k));
      print_gguf_metadata_text(ckpt, k, 8, stdout);
      continue;
    }
    size_t entries = peft_checkpoint_metadata_count(ckpt, k);
    if (!peft_checkpoint_has_metadata(ckpt, k)) std::printf("  metadata: none\n");
    for (size_t j = 0; j < entries; ++j) {
      std::printf("  metadata %s = %s\n", peft_checkpoint_metadata_key(ckpt, k, j),
                  peft_checkpoint_metadata_value(ckpt, k, j));
    }
  }
  for (size_t i = 0; i < count; ++i) {
    uint64_t begin = 0, end = 0;
    peft_error_free(peft_checkpoint_tensor_offsets(ckpt, i, &begin, &end));
    std::printf("%-60s %-12s %-20s [%llu, %llu)\n", peft_checkpoint_tensor_name(ckpt, i),
                type_text(ckpt, i).c_str(), shape_text(ckpt, i).c_str(),
                static_cast<unsigned long long>(begin), static_cast<unsigned long long>(end));
  }
}

int run_inspect(const std::vector<std::string>& args) {
  std::string path;
  bool json = false;
  for (const std::string& arg : args) {
    if (arg == "--json") {
      json = true;
    } else if (!arg.empty() && arg[0] == '-') {
      return usage_error("unknown option " + arg, kUsage);
    } else if (path.empty()) {
      path = arg;
    } else {
      return usage_error("more than one PATH given", kUsage);
    }
  }
  if (path.empty()) return usage_error("PATH is missing", kUsage);

  peft_checkpoint* ckpt = nullptr;
  if (peft_error* err = peft_checkpoint_open(path.c_str(), nullptr, &ckpt)) return report(err);
  Owned<peft_checkpoint, peft_checkpoint_free> owned;
  owned.p = ckpt;
  std::error_code ignored;
  bool is_folder = std::filesystem::is_directory(path, ignored);
  std::string control;
  if (!is_folder && is_control_vector(ckpt)) {
    Owned<peft_control_vector, peft_control_vector_free> vector;
    if (peft_error* err = peft_control_vector_open(path.c_str(), &vector.p)) return report(err);
    control = control_vector_text(vector.p, json);
  }
  if (json) {
    print_json(ckpt, is_folder, control);
  } else {
    print_text(ckpt);
    std::fputs(control.c_str(), stdout);
  }
  return kExitOk;
}

const bool registered = register_command({"inspect", kUsage, run_inspect});

}  // namespace
}  // namespace peftc
