// Buffer merges through an adapter: finding the module by HF or native name, and merging into and
// removing from a host's weight, bit for bit with kept rows.
#include <doctest/doctest.h>

#include <functional>
#include <thread>

#include "core/error.hpp"
#include "peft/buffer_merge/layer_module.hpp"
#include "test_checkpoint_merge_support.hpp"

using namespace merge_pipeline_test;

namespace {

struct HostWeight {
  std::vector<uint8_t> bytes;
  std::vector<int64_t> shape;
  peft::DType dtype;
  peft::merge::WeightView view(int64_t rows, int64_t cols) { return {bytes.data(), dtype, rows, cols}; }
};

HostWeight host_weight(const std::string& base, const std::string& name, peft::DType dtype) {
  auto ckpt = peft::Checkpoint::open(base);
  const size_t i = *ckpt->find(name);
  HostWeight w;
  w.dtype = dtype;
  uint64_t n = 1;
  for (uint64_t d : ckpt->tensor(i).shape) {
    w.shape.push_back(static_cast<int64_t>(d));
    n *= d;
  }
  w.bytes.resize(peft::converted_byte_size(dtype, n));
  ckpt->read(i, dtype, w.bytes.data(), w.bytes.size());
  return w;
}

int32_t error_code(const std::function<void()>& body) {
  try {
    body();
  } catch (const peft::Error& e) {
    return e.code();
  }
  return PEFT_OK;
}

}  // namespace

TEST_CASE("merge pipeline: a buffer merge equals the checkpoint merge and comes off bit for bit") {
  if (!fixtures_present()) return;
  Scratch dir;
  merge(model("llama"), dir.path("out"), {{adapter_dir("llama_lora"), 0.75}});
  auto merged = peft::Checkpoint::open(dir.path("out"));
  auto adapter = open_adapter(adapter_dir("llama_lora"));
  for (const char* name : {"model.layers.0.self_attn.q_proj", "model.layers.1.mlp.down_proj.weight",
                           "base_model.model.model.layers.0.self_attn.k_proj"}) {
    for (peft::DType dtype : {peft::DType::F32, peft::DType::BF16, peft::DType::F16}) {
      const std::string label = std::string(name) + " " + std::string(peft::dtype_name(dtype));
      CAPTURE(label);
      const peft::AdapterModule& m = peft::find_lora_module(*adapter, name, nullptr);
      HostWeight w = host_weight(model("llama"), m.name + ".weight", dtype);
      const std::vector<uint8_t> original = w.bytes;
      peft::BufferMergeModule im = peft::buffer_merge_module(adapter, m, w.shape);
      peft::BufferMergeOptions options;
      options.weight = 0.75;
      options.keep_original_rows = true;
      auto record = peft::BufferMerge::apply(w.view(im.layout.rows(), im.layout.cols()), nullptr, im, options);
      CHECK(w.bytes != original);
      if (dtype == peft::DType::F32) CHECK(w.bytes == raw(*merged, m.name + ".weight"));
      record.remove(w.view(im.layout.rows(), im.layout.cols()), nullptr);
      CHECK(w.bytes == original);
    }
  }
}

TEST_CASE("merge pipeline: buffer merges address modules by native name, Conv1D by shape, DoRA exactly") {
  if (!fixtures_present()) return;
  auto adapter = open_adapter(adapter_dir("llama_lora"));
  const peft::Translator llama = peft::Translator::for_family("llama");
  CHECK(peft::find_lora_module(*adapter, "transformer/layer_0/attention/query", &llama).name ==
        "model.layers.0.self_attn.q_proj");
  CHECK(peft::find_lora_module(*adapter, "transformer/layer_1/mlp/down/weight", &llama).name ==
        "model.layers.1.mlp.down_proj");
  CHECK(error_code([&] { peft::find_lora_module(*adapter, "no/such/thing", &llama); }) == PEFT_ERR_UNRESOLVED_KEY);
  CHECK(error_code([&] { peft::find_lora_module(*adapter, "model.layers.7.self_attn.q_proj", nullptr); }) ==
        PEFT_ERR_NOT_FOUND);
  auto bert = open_adapter(adapter_dir("bert_seqcls_lora"));
  {
    // A modules_to_save copy is a replacement: merged by overwriting the weight (and bias) with the
    // adapter's values, only at weight 1, and removed to the original bytes.
    const peft::AdapterModule& classifier = peft::find_lora_module(*bert, "classifier", nullptr);
    CHECK(classifier.kind == peft::LayerKind::full);
    const peft::AdapterTensor* cw = classifier.find_suffix("weight");
    const peft::AdapterTensor* cb = classifier.find_suffix("bias");
    REQUIRE(cw != nullptr);
    const auto& dims = bert->checkpoint().tensor(cw->index).shape;
    REQUIRE(dims.size() == 2);
    const std::vector<int64_t> shape{static_cast<int64_t>(dims[0]), static_cast<int64_t>(dims[1])};
    std::vector<float> w(static_cast<size_t>(shape[0] * shape[1]), 0.25f), bias(static_cast<size_t>(shape[0]), 0.5f);
    const std::vector<float> w0 = w, bias0 = bias;
    const peft::merge::WeightView wv{w.data(), peft::DType::F32, shape[0], shape[1]};
    const peft::merge::WeightView bv{bias.data(), peft::DType::F32, 1, shape[0]};
    const peft::BufferMergeModule rm = peft::buffer_merge_module(bert, classifier, shape);
    CHECK(error_code([&] { peft::BufferMerge::apply(wv, cb ? &bv : nullptr, rm, {.weight = 0.5}); }) ==
          PEFT_ERR_UNSUPPORTED);
    CHECK(w == w0);
    peft::BufferMerge record = peft::BufferMerge::apply(wv, cb ? &bv : nullptr, rm);
    CHECK(w == bert->checkpoint().read_f32(cw->index));
    if (cb) CHECK(bias == bert->checkpoint().read_f32(cb->index));
    record.remove(wv, cb ? &bv : nullptr);
    CHECK(w == w0);
    CHECK(bias == bias0);
    const std::vector<int64_t> wrong{shape[0] + 1, shape[1]};
    CHECK(error_code([&] { peft::buffer_merge_module(bert, classifier, wrong); }) == PEFT_ERR_SHAPE_MISMATCH);
  }
  const peft::AdapterModule& q = peft::find_lora_module(*adapter, "model.layers.0.self_attn.q_proj", nullptr);
  const std::vector<int64_t> wrong{16, 17};
  CHECK(error_code([&] { peft::buffer_merge_module(adapter, q, wrong); }) == PEFT_ERR_SHAPE_MISMATCH);

  // GPT-2's c_attn: [in, out] storage is recognised from the buffer's shape.
  auto gpt2 = open_adapter(adapter_dir("gpt2_lora"));
  const peft::AdapterModule& c_attn = peft::find_lora_module(*gpt2, "transformer.h.0.attn.c_attn", nullptr);
  HostWeight w = host_weight(model("gpt2"), "transformer.h.0.attn.c_attn.weight", peft::DType::BF16);
  peft::BufferMergeModule im = peft::buffer_merge_module(gpt2, c_attn, w.shape);
  CHECK(im.layout.transposed);
  const auto original = w.bytes;
  auto record = peft::BufferMerge::apply(w.view(im.layout.rows(), im.layout.cols()), nullptr, im, {1.0, true, 0});
  record.remove(w.view(im.layout.rows(), im.layout.cols()), nullptr);
  CHECK(w.bytes == original);

  auto dora = open_adapter(adapter_dir("llama_dora"));
  const peft::AdapterModule& v = peft::find_lora_module(*dora, "model.layers.1.self_attn.v_proj", nullptr);
  HostWeight dw = host_weight(model("llama"), "model.layers.1.self_attn.v_proj.weight", peft::DType::F16);
  peft::BufferMergeModule dim = peft::buffer_merge_module(dora, v, dw.shape);
  CHECK(dim.magnitude != nullptr);
  const auto dora_original = dw.bytes;
  auto dora_record = peft::BufferMerge::apply(dw.view(dim.layout.rows(), dim.layout.cols()), nullptr, dim,
                                              {1.0, true, 1});
  CHECK(dw.bytes != dora_original);
  dora_record.remove(dw.view(dim.layout.rows(), dim.layout.cols()), nullptr);
  CHECK(dw.bytes == dora_original);
}

TEST_CASE("merge pipeline: buffer merges of one adapter run concurrently on different buffers") {
  if (!fixtures_present()) return;
  auto adapter = open_adapter(adapter_dir("llama_lora"));
  const std::vector<std::string> names = {"model.layers.0.self_attn.q_proj", "model.layers.0.mlp.up_proj",
                                          "model.layers.1.mlp.down_proj", "model.layers.1.self_attn.o_proj"};
  std::vector<HostWeight> weights, expected;
  for (const std::string& name : names) {
    weights.push_back(host_weight(model("llama"), name + ".weight", peft::DType::BF16));
    // What a merge on its own gives.
    HostWeight w = weights.back();
    const peft::AdapterModule& m = peft::find_lora_module(*adapter, name, nullptr);
    peft::BufferMergeModule im = peft::buffer_merge_module(adapter, m, w.shape);
    peft::BufferMerge::apply(w.view(im.layout.rows(), im.layout.cols()), nullptr, im, {0.5, false, 1});
    expected.push_back(std::move(w));
  }
  const std::vector<HostWeight> originals = weights;
  std::vector<int> ok(names.size(), 0);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < names.size(); ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 20; ++round) {
        const peft::AdapterModule& m = peft::find_lora_module(*adapter, names[t], nullptr);
        peft::BufferMergeModule im = peft::buffer_merge_module(adapter, m, weights[t].shape);
        auto view = weights[t].view(im.layout.rows(), im.layout.cols());
        auto record = peft::BufferMerge::apply(view, nullptr, im, {0.5, true, 2});
        const bool merged_right = weights[t].bytes == expected[t].bytes;
        record.remove(view, nullptr);
        if (merged_right && weights[t].bytes == originals[t].bytes) ++ok[t];
      }
    });
  }
  for (auto& th : threads) th.join();
  for (size_t t = 0; t < names.size(); ++t) CHECK(ok[t] == 20);
}
