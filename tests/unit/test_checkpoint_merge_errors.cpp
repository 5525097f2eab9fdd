// The merge pipeline's checks before writing (unresolved tensors, conflicts, dtypes) and tied
// embeddings.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "safetensors/writer.hpp"
#include "test_checkpoint_merge_support.hpp"

using namespace merge_pipeline_test;

namespace {

int32_t merge_error(const std::string& base, const std::string& out, const std::vector<peft::MergeInput>& inputs,
                    std::string* message = nullptr, std::optional<peft::DType> dtype = std::nullopt) {
  peft::CheckpointMergeOptions options;
  options.adapters = inputs;
  options.dtype = dtype;
  try {
    peft::merge_checkpoint(base, out, options);
  } catch (const peft::Error& e) {
    if (message) *message = e.what();
    return e.code();
  }
  return PEFT_OK;
}

// Writes a copy of `from`'s tensors (and config files) into `to`, every float tensor as `dtype`.
void convert_model(const std::string& from, const std::string& to, peft::DType dtype) {
  fs::create_directories(to);
  auto ckpt = peft::Checkpoint::open(from);
  peft::FileWriter writer(to + "/model.safetensors");
  writer.set_metadata("format", "pt");
  for (size_t i = 0; i < ckpt->tensor_count(); ++i) writer.add_tensor(ckpt->tensor(i).name, dtype, ckpt->tensor(i).shape);
  writer.start();
  for (size_t p = 0; p < writer.tensor_count(); ++p)
    writer.write_from_checkpoint(writer.tensor_at(p).name, *ckpt, writer.declaration_at(p));
  writer.finish();
  fs::copy_file(from + "/config.json", to + "/config.json");
}

// gemma_lora plus modules_to_save=["embed_tokens"] with a trained embedding copy.
std::vector<float> make_embedding_adapter(const std::string& dir) {
  fs::create_directories(dir);
  auto config = nlohmann::json::parse(read_file(adapter_dir("gemma_lora") + "/adapter_config.json"));
  config["modules_to_save"] = {"embed_tokens"};
  std::ofstream(dir + "/adapter_config.json") << config.dump(2);
  auto lora = peft::Checkpoint::open(adapter_dir("gemma_lora") + "/adapter_model.safetensors");
  std::vector<float> embedding(64 * 16);
  for (size_t i = 0; i < embedding.size(); ++i) embedding[i] = static_cast<float>(i % 37) / 8.0f - 2.0f;
  peft::FileWriter writer(dir + "/adapter_model.safetensors");
  for (size_t i = 0; i < lora->tensor_count(); ++i)
    writer.add_tensor(lora->tensor(i).name, lora->tensor(i).dtype, lora->tensor(i).shape);
  const std::string key = "base_model.model.model.embed_tokens.weight";
  writer.add_tensor(key, peft::DType::F32, {64, 16});
  writer.start();
  for (size_t p = 0; p < writer.tensor_count(); ++p) {
    const std::string& name = writer.tensor_at(p).name;
    if (name == key)
      writer.write_tensor(name, peft::DType::F32, embedding.data(), embedding.size() * 4);
    else
      writer.write_from_checkpoint(name, *lora, *lora->find(name));
  }
  writer.finish();
  return embedding;
}

}  // namespace

TEST_CASE("merge pipeline: tensors the base lacks are listed for every adapter, before anything is written") {
  if (!fixtures_present()) return;
  Scratch dir;
  std::string message;
  const int32_t code = merge_error(model("llama"), dir.path("out"),
                                   {{open_adapter(adapter_dir("gpt2_lora")), 1.0},
                                    {open_adapter(adapter_dir("llama_lora")), 1.0},
                                    {open_adapter(adapter_dir("bert_seqcls_lora")), 1.0}},
                                   &message);
  CHECK(code == PEFT_ERR_UNRESOLVED_KEY);
  CHECK(message.find("gpt2_lora") != std::string::npos);
  CHECK(message.find("transformer.h.0.attn.c_attn") != std::string::npos);
  CHECK(message.find("bert_seqcls_lora") != std::string::npos);
  CHECK(message.find("classifier.weight") != std::string::npos);
  CHECK(message.find("llama_lora\"") == std::string::npos);
  CHECK_FALSE(fs::exists(dir.path("out")));
}

TEST_CASE("merge pipeline: conflicting adapters are refused") {
  if (!fixtures_present()) return;
  Scratch dir;
  std::string message;
  auto bert = open_adapter(adapter_dir("bert_seqcls_lora"));
  CHECK(merge_error(model("bert"), dir.path("out"), {{bert, 1.0}, {bert, 0.5}}, &message) ==
        PEFT_ERR_INVALID_ARGUMENT);
  CHECK(message.find("\"classifier.weight\" is replaced by both") != std::string::npos);
  CHECK(message.find("\"classifier.bias\" is replaced by both") != std::string::npos);

  auto tokens = open_adapter(adapter_dir("llama_trainable_tokens"));
  CHECK(merge_error(model("llama"), dir.path("out"), {{tokens, 1.0}, {tokens, 1.0}}, &message) ==
        PEFT_ERR_INVALID_ARGUMENT);
  CHECK(message.find("trainable token row 5") != std::string::npos);

  CHECK(merge_error(model("llama"), dir.path("out"), {}) == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(merge_error(model("llama"), dir.path("out"), {{open_adapter(adapter_dir("llama_lora")), NAN}}) ==
        PEFT_ERR_INVALID_ARGUMENT);
  CHECK_FALSE(fs::exists(dir.path("out")));
  // The same adapter twice is no conflict: its LoRA terms simply add up.
  auto lora = open_adapter(adapter_dir("llama_lora"));
  CHECK(merge_error(model("llama"), dir.path("out"), {{lora, 0.5}, {lora, 0.5}}) == PEFT_OK);
}

TEST_CASE("merge pipeline: weights kept in a dtype the merge cannot round to are refused up front") {
  if (!fixtures_present()) return;
  Scratch dir;
  convert_model(model("llama"), dir.path("f64"), peft::DType::F64);
  std::string message;
  auto lora = open_adapter(adapter_dir("llama_lora"));
  CHECK(merge_error(dir.path("f64"), dir.path("out"), {{lora, 1.0}}, &message) == PEFT_ERR_UNSUPPORTED);
  CHECK(message.find("model.layers.0.self_attn.q_proj.weight") != std::string::npos);
  CHECK_FALSE(fs::exists(dir.path("out")));
  // With an output dtype it works, and equals merging the f32 model.
  CHECK(merge_error(dir.path("f64"), dir.path("out"), {{lora, 1.0}}, nullptr, peft::DType::F32) == PEFT_OK);
  merge(model("llama"), dir.path("ref"), {{adapter_dir("llama_lora"), 1.0}});
  CHECK(read_file(dir.path("out/model.safetensors")) == read_file(dir.path("ref/model.safetensors")));
}

TEST_CASE("merge pipeline: replacing a tied input embedding unties it and adds the output embedding") {
  if (!fixtures_present()) return;
  Scratch dir;
  const std::vector<float> trained = make_embedding_adapter(dir.path("adapter"));
  const auto result = merge(model("gemma"), dir.path("out"), {{dir.path("adapter"), 1.0}});
  CHECK(result.untied_embeddings);
  CHECK(result.added == 1);
  CHECK(result.replaced == 1);
  auto base = peft::Checkpoint::open(model("gemma"));
  auto out = peft::Checkpoint::open(dir.path("out"));
  CHECK(out->tensor_count() == base->tensor_count() + 1);
  CHECK(values(*out, "lm_head.weight") == values(*base, "model.embed_tokens.weight"));
  CHECK(values(*out, "model.embed_tokens.weight") == std::vector<double>(trained.begin(), trained.end()));
  const auto config = nlohmann::json::parse(read_file(dir.path("out/config.json")));
  CHECK(config["tie_word_embeddings"] == false);

  // LoRA alone keeps the tie: PEFT merges it in place into the shared parameter.
  const auto plain = merge(model("gemma"), dir.path("plain"), {{adapter_dir("gemma_lora"), 1.0}});
  CHECK_FALSE(plain.untied_embeddings);
  CHECK(read_file(dir.path("plain/config.json")) == read_file(model("gemma") + "/config.json"));
}

TEST_CASE("merge pipeline: a composite config's text_config ties the embeddings when its top level does not say") {
  if (!fixtures_present()) return;
  Scratch dir;
  // The gemma fixture as Gemma3ForConditionalGeneration's config.json holds it: the key in text_config.
  fs::create_directories(dir.path("base"));
  fs::copy_file(model("gemma") + "/model.safetensors", dir.path("base/model.safetensors"));
  auto config = nlohmann::json::parse(read_file(model("gemma") + "/config.json"));
  config.erase("tie_word_embeddings");
  config["text_config"] = {{"model_type", "gemma3_text"}, {"tie_word_embeddings", true}};
  std::ofstream(dir.path("base/config.json")) << config.dump(2);
  make_embedding_adapter(dir.path("adapter"));
  const auto result = merge(dir.path("base"), dir.path("out"), {{dir.path("adapter"), 1.0}});
  CHECK(result.untied_embeddings);
  CHECK(result.added == 1);
  const auto written = nlohmann::json::parse(read_file(dir.path("out/config.json")));
  CHECK(written["tie_word_embeddings"] == false);
  CHECK(written["text_config"]["tie_word_embeddings"] == false);
  // text_config false: not tied, nothing added.
  config["text_config"]["tie_word_embeddings"] = false;
  std::ofstream(dir.path("base/config.json")) << config.dump(2);
  const auto untied = merge(dir.path("base"), dir.path("out2"), {{dir.path("adapter"), 1.0}});
  CHECK_FALSE(untied.untied_embeddings);
  CHECK(untied.added == 0);
}
