// llama_cvec_driver MODEL.gguf TOKENS CVEC STRENGTH [CVEC STRENGTH ...]: llama.cpp's own control-vector
// path, as `llama-cli --control-vector-scaled CVEC STRENGTH` takes it: common_control_vector_load reads
// and sums the files, llama_set_adapter_cvec applies them to layers 1 .. n_layer of the model (the
// defaults of common_init_from_params), and the comma-separated TOKENS are decoded once. Prints one
// JSON line: {"n_embd": N, "data": [what the loader read, layer 1 first], "logits": [[...] per token],
// "plain_logits": [[...] per token, without the control vector]}. Without control vectors
// (MODEL.gguf TOKENS) it prints {"plain_logits": ...} alone: a GGUF model's own logits
// (test_gguf_tied.py).
// Exits 2 when the model does not load, 3 when the control vectors do not (llama.cpp's log says why).
// For test_control_vector.py; built from the llama.cpp reference build (tests/interop/CMakeLists.txt).
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <common.h>
#include <llama.h>

#include "llama_driver.hpp"

namespace {

std::vector<llama_token> parse_tokens(const std::string& text) {
  std::vector<llama_token> tokens;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = text.find(',', start);
    tokens.push_back(static_cast<llama_token>(std::stoi(text.substr(start, comma - start))));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return tokens;
}

// The logits of every token, one decode of the whole sequence from an empty cache.
std::vector<std::vector<float>> decode(llama_context* ctx, const llama_model* model, std::vector<llama_token> tokens) {
  llama_memory_clear(llama_get_memory(ctx), true);
  llama_batch batch = llama_batch_init(static_cast<int32_t>(tokens.size()), 0, 1);
  for (size_t i = 0; i < tokens.size(); ++i) {
    batch.token[i] = tokens[i];
    batch.pos[i] = static_cast<llama_pos>(i);
    batch.n_seq_id[i] = 1;
    batch.seq_id[i][0] = 0;
    batch.logits[i] = 1;
  }
  batch.n_tokens = static_cast<int32_t>(tokens.size());
  if (llama_decode(ctx, batch) != 0) {
    std::fprintf(stderr, "llama_decode failed\n");
    std::exit(4);
  }
  const int32_t n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
  std::vector<std::vector<float>> out;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const float* row = llama_get_logits_ith(ctx, static_cast<int32_t>(i));
    out.emplace_back(row, row + n_vocab);
  }
  llama_batch_free(batch);
  return out;
}

void print_rows(const char* key, const std::vector<std::vector<float>>& rows) {
  std::printf(", \"%s\": [", key);
  for (size_t i = 0; i < rows.size(); ++i) {
    std::printf("%s[", i ? ", " : "");
    for (size_t j = 0; j < rows[i].size(); ++j) std::printf("%s%.9g", j ? ", " : "", rows[i][j]);
    std::printf("]");
  }
  std::printf("]");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3 || (argc - 3) % 2 != 0) {
    std::fprintf(stderr, "usage: %s MODEL.gguf TOKENS [CVEC STRENGTH ...]\n", argv[0]);
    return 1;
  }
  llama_model* model = llama_driver::load_model(argv[1]);
  if (model == nullptr) return 2;
  std::vector<common_control_vector_load_info> infos;
  for (int i = 3; i + 1 < argc; i += 2) infos.push_back({std::strtof(argv[i + 1], nullptr), argv[i]});
  const common_control_vector_data cvec = infos.empty() ? common_control_vector_data{} : common_control_vector_load(infos);
  if (!infos.empty() && cvec.n_embd == -1) {
    std::fprintf(stderr, "llama.cpp did not load the control vectors\n");
    return 3;
  }
  const std::vector<llama_token> tokens = parse_tokens(argv[2]);
  llama_context_params params = llama_context_default_params();
  params.n_ctx = 64;
  params.n_batch = params.n_ubatch = 64;
  params.n_threads = params.n_threads_batch = 1;
  // An f32 cache and no flash attention (which rounds Q to f16 on the CPU), to compare with an f32 forward.
  params.type_k = params.type_v = GGML_TYPE_F32;
  params.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  llama_context* ctx = llama_init_from_model(model, params);
  const auto plain = decode(ctx, model, tokens);
  int status = 0;
  if (infos.empty()) {
    std::printf("{\"n_embd\": %d", llama_model_n_embd(model));
  } else if (llama_set_adapter_cvec(ctx, cvec.data.data(), cvec.data.size(), cvec.n_embd, 1, llama_model_n_layer(model)) != 0) {
    std::fprintf(stderr, "llama_set_adapter_cvec refused the control vectors\n");
    status = 3;
  } else {
    const auto steered = decode(ctx, model, tokens);
    std::printf("{\"n_embd\": %d, \"data\": [", cvec.n_embd);
    for (size_t i = 0; i < cvec.data.size(); ++i) std::printf("%s%.9g", i ? ", " : "", cvec.data[i]);
    std::printf("]");
    print_rows("logits", steered);
  }
  if (status == 0) {
    print_rows("plain_logits", plain);
    std::printf("}\n");
  }
  llama_free(ctx);
  llama_model_free(model);
  llama_backend_free();
  return status;
}
