// Serving benchmark (issue 7): four transformer blocks of LLaMA-7B shapes (hidden 4096, MLP 11008;
// q/k/v/o 4096x4096, gate/up 11008x4096, down 4096x11008) with synthetic weights and synthetic
// adapters on all seven linear layers of each block, through the public C API:
//   1. registration time per adapter (config + safetensors header, no tensor reads);
//   2. first-use load time (acquire of an adapter not in memory, from the page cache) and the time
//      of an acquire that finds it loaded;
//   3. swap time of merged adapters in host-owned bf16 weights (none -> A, A -> B, B -> none, and an
//      adapter on the attention layers only; exact and arithmetic restoration) against a full reload
//      of the base weights from a safetensors file in the page cache, and against the compute bound:
//      the merge kernels' own rate on one cached block of rows, times the threads a swap uses;
//   4. the cost of unmerged LoRA (peft_lora_apply) beside the base matmul alone (cblas_sgemm, f32),
//      for batches of 1, 16 and 256 rows and ranks 8, 16 and 64, per layer shape.
// Results are best-of-N wall times; the machine's other load makes single runs noisy.
//
// Usage: bench_serve [repetitions] [registry|apply|swap]   (default: 5, every part)
#include <cblas.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "peft/kernels/merge_kernels.hpp"  // the swap's bound: the merge kernels timed alone
#include "peft/methods/lora_engine.hpp"
#include "peft_c.h"

namespace {

namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;

constexpr int kBlocks = 4;
constexpr int64_t kHidden = 4096;
constexpr int64_t kMlp = 11008;

struct Layer {
  std::string module;  // HuggingFace module path
  int64_t out, in;
};

std::vector<Layer> model_layers() {
  std::vector<Layer> layers;
  for (int b = 0; b < kBlocks; ++b) {
    const std::string p = "model.layers." + std::to_string(b) + ".";
    for (const char* m : {"q_proj", "k_proj", "v_proj", "o_proj"})
      layers.push_back({p + "self_attn." + m, kHidden, kHidden});
    layers.push_back({p + "mlp.gate_proj", kMlp, kHidden});
    layers.push_back({p + "mlp.up_proj", kMlp, kHidden});
    layers.push_back({p + "mlp.down_proj", kHidden, kMlp});
  }
  return layers;
}

void check(peft_error* err, const char* what) {
  if (err == nullptr) return;
  std::fprintf(stderr, "bench_serve: %s: %s (%s)\n", what, peft_error_message(err),
               peft_error_code_name(peft_error_code(err)));
  std::exit(1);
}

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

double best_of(int reps, const std::function<void()>& fn) {
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = clock_type::now();
    fn();
    best = std::min(best, seconds_since(t0));
  }
  return best;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

double peak_rss_mb() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;
}

// bf16 bits of a float (round to nearest even), for synthetic data.
uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

// Fills with small pseudo-random bf16 values quickly (a multiplicative hash per element).
void fill_bf16(uint16_t* p, size_t n, uint32_t seed, float scale) {
  for (size_t i = 0; i < n; ++i) {
    const uint32_t h = (static_cast<uint32_t>(i) + seed * 0x9E3779B9u) * 2654435761u;
    p[i] = to_bf16((static_cast<float>(h >> 8) / 16777216.0f - 0.5f) * scale);
  }
}

// The JSON list of the layers' module names (the last part of each path), each once.
std::string target_modules(const std::vector<Layer>& layers) {
  std::vector<std::string> names;
  for (const Layer& l : layers) {
    const std::string name = l.module.substr(l.module.rfind('.') + 1);
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  }
  std::string list;
  for (const std::string& n : names) list += (list.empty() ? "\"" : ", \"") + n + "\"";
  return list;
}

// Writes a PEFT adapter folder: rank `rank`, alpha 2 * rank, bf16 factors on every layer given.
void write_adapter(const fs::path& dir, const std::vector<Layer>& layers, int64_t rank, uint32_t seed) {
  fs::create_directories(dir);
  std::ofstream(dir / "adapter_config.json")
      << "{\"peft_type\": \"LORA\", \"task_type\": \"CAUSAL_LM\", \"r\": " << rank
      << ", \"lora_alpha\": " << 2 * rank << ", \"target_modules\": [" << target_modules(layers)
      << "], \"base_model_name_or_path\": \"synthetic-llama-7b-4-blocks\"}\n";
  peft_writer* w = nullptr;
  check(peft_writer_new((dir / "adapter_model.safetensors").c_str(), &w), "writer");
  for (const Layer& l : layers) {
    const uint64_t a[2] = {static_cast<uint64_t>(rank), static_cast<uint64_t>(l.in)};
    const uint64_t b[2] = {static_cast<uint64_t>(l.out), static_cast<uint64_t>(rank)};
    check(peft_writer_add_tensor(w, ("base_model.model." + l.module + ".lora_A.weight").c_str(), PEFT_DTYPE_BF16, a, 2),
          "add");
    check(peft_writer_add_tensor(w, ("base_model.model." + l.module + ".lora_B.weight").c_str(), PEFT_DTYPE_BF16, b, 2),
          "add");
  }
  check(peft_writer_start(w), "start");
  std::vector<uint16_t> buffer;
  for (size_t i = 0; i < peft_writer_tensor_count(w); ++i) {
    const std::string name = peft_writer_tensor_name(w, i);
    const Layer* layer = nullptr;
    for (const Layer& l : layers)
      if (name.rfind("base_model.model." + l.module + ".", 0) == 0) layer = &l;
    const bool is_a = name.find("lora_A") != std::string::npos;
    buffer.resize(static_cast<size_t>(rank * (is_a ? layer->in : layer->out)));
    fill_bf16(buffer.data(), buffer.size(), seed * 131 + static_cast<uint32_t>(i), is_a ? 0.05f : 0.02f);
    check(peft_writer_write_tensor(w, nullptr, PEFT_DTYPE_BF16, buffer.data(), buffer.size() * 2), "write");
  }
  check(peft_writer_finish(w), "finish");
  peft_writer_free(w);
}

peft_registry_stats registry_stats(const peft_registry* registry) {
  peft_registry_stats s{};
  s.size = sizeof s;
  check(peft_registry_get_stats(registry, &s), "stats");
  return s;
}

void bench_registry(const fs::path& root, const std::vector<Layer>& layers, int count) {
  std::printf("\n## registration and first-use load: %d adapters, rank 16, 28 layers each, bf16 storage\n", count);
  for (int i = 0; i < count; ++i) write_adapter(root / ("reg" + std::to_string(i)), layers, 16, 100 + i);
  peft_registry* registry = nullptr;
  check(peft_registry_new(PEFT_DTYPE_BF16, uint64_t{4} << 30, nullptr, &registry), "registry");
  std::vector<double> reg, load, hit;
  for (int i = 0; i < count; ++i) {
    const std::string name = "reg" + std::to_string(i);
    const auto t0 = clock_type::now();
    check(peft_registry_register(registry, name.c_str(), (root / name).c_str(), nullptr), "register");
    reg.push_back(seconds_since(t0));
  }
  const uint64_t loads_before = registry_stats(registry).loads;
  uint64_t bytes = 0;
  for (int i = 0; i < count; ++i) {
    const std::string name = "reg" + std::to_string(i);
    peft_lease* lease = nullptr;
    auto t0 = clock_type::now();
    check(peft_registry_acquire(registry, name.c_str(), &lease), "acquire");
    load.push_back(seconds_since(t0));
    bytes = peft_lease_bytes(lease);
    peft_lease_free(lease);
    t0 = clock_type::now();
    check(peft_registry_acquire(registry, name.c_str(), &lease), "acquire");
    hit.push_back(seconds_since(t0));
    peft_lease_free(lease);
  }
  const peft_registry_stats s = registry_stats(registry);
  std::printf("  register (median of %d)        %8.3f ms   (tensor loads during registration: %llu)\n", count,
              median(reg) * 1e3, static_cast<unsigned long long>(loads_before));
  std::printf("  first acquire, loads %5.1f MB  %8.3f ms\n", static_cast<double>(bytes) / 1e6, median(load) * 1e3);
  std::printf("  acquire of a loaded adapter    %8.3f us\n", median(hit) * 1e6);
  std::printf("  loads %llu, hits %llu, loaded %.1f MB\n", static_cast<unsigned long long>(s.loads),
              static_cast<unsigned long long>(s.hits), static_cast<double>(s.loaded_bytes) / 1e6);
  peft_registry_free(registry);
}

// Seconds per weight element of the merge kernels alone, one thread: lowrank's delta for one block
// of rows of a layer with `cols` columns (the block a swap's worker takes, in cache) and
// add_rounded of it into bf16 rows, best of 5 runs of enough blocks to take about 50 ms.
double kernel_seconds_per_weight(int64_t cols, int64_t rank) {
  namespace pk = peft::merge::kernels;
  const pk::Table& k = pk::active();
  const int64_t rows = peft::merge::detail::block_rows_for(cols, rank);
  std::vector<float> L(static_cast<size_t>(rows * rank)), R(static_cast<size_t>(rank * cols));
  std::vector<float> delta(static_cast<size_t>(rows * cols));
  std::vector<uint16_t> w(static_cast<size_t>(rows * cols));
  for (size_t i = 0; i < L.size(); ++i) L[i] = 0.01f * static_cast<float>(i % 7);
  for (size_t i = 0; i < R.size(); ++i) R[i] = 0.01f * static_cast<float>(i % 5);
  fill_bf16(w.data(), w.size(), 11, 0.04f);
  const int repeat = static_cast<int>(std::max<int64_t>(1, (int64_t{100} << 20) / (rows * cols)));
  const double seconds = best_of(5, [&] {
    for (int n = 0; n < repeat; ++n) {
      k.lowrank(L.data(), R.data(), rows, cols, rank, 1e-6f, false, delta.data());
      for (int64_t r = 0; r < rows; ++r) k.add_rounded(pk::Storage::bf16, w.data() + r * cols, w.data() + r * cols, delta.data() + r * cols, cols);
    }
  });
  return seconds / (static_cast<double>(repeat) * static_cast<double>(rows * cols));
}

void bench_swap(const fs::path& root, const std::vector<Layer>& layers, int reps) {
  std::printf("\n## hot-swap in host bf16 weights (4 blocks, 28 layers) against a full reload\n");
  std::vector<std::vector<uint16_t>> weights;
  uint64_t total = 0;
  for (size_t i = 0; i < layers.size(); ++i) {
    weights.emplace_back(static_cast<size_t>(layers[i].out * layers[i].in));
    fill_bf16(weights.back().data(), weights.back().size(), 7 + static_cast<uint32_t>(i), 0.04f);
    total += weights.back().size() * 2;
  }
  const fs::path base = root / "base.safetensors";
  {
    peft_writer* w = nullptr;
    check(peft_writer_new(base.c_str(), &w), "writer");
    for (const Layer& l : layers) {
      const uint64_t shape[2] = {static_cast<uint64_t>(l.out), static_cast<uint64_t>(l.in)};
      check(peft_writer_add_tensor(w, (l.module + ".weight").c_str(), PEFT_DTYPE_BF16, shape, 2), "add");
    }
    check(peft_writer_start(w), "start");
    for (size_t k = 0; k < peft_writer_tensor_count(w); ++k) {  // in the writer's order
      const std::string name = peft_writer_tensor_name(w, k);
      for (size_t i = 0; i < layers.size(); ++i)
        if (name == layers[i].module + ".weight")
          check(peft_writer_write_tensor(w, nullptr, PEFT_DTYPE_BF16, weights[i].data(), weights[i].size() * 2),
                "write");
    }
    check(peft_writer_finish(w), "finish");
    peft_writer_free(w);
  }
  const double reload = best_of(reps, [&] {
    peft_checkpoint* ckpt = nullptr;
    check(peft_checkpoint_open(base.c_str(), nullptr, &ckpt), "open");
    for (size_t i = 0; i < layers.size(); ++i) {
      size_t index = 0;
      check(peft_checkpoint_find(ckpt, (layers[i].module + ".weight").c_str(), &index), "find");
      check(peft_checkpoint_tensor_read(ckpt, index, PEFT_DTYPE_BF16, weights[i].data(), weights[i].size() * 2), "read");
    }
    peft_checkpoint_free(ckpt);
  });
  std::printf("  full reload of %.2f GB of base weights (page cache): %8.1f ms\n", static_cast<double>(total) / 1e9,
              reload * 1e3);

  std::vector<Layer> attention;
  for (const Layer& l : layers)
    if (l.module.find("self_attn") != std::string::npos) attention.push_back(l);
  write_adapter(root / "swapA", layers, 16, 1);
  write_adapter(root / "swapB", layers, 16, 2);
  write_adapter(root / "swapAttn", attention, 16, 3);
  peft_registry* registry = nullptr;
  check(peft_registry_new(PEFT_DTYPE_BF16, uint64_t{1} << 30, nullptr, &registry), "registry");
  peft_lease *a = nullptr, *b = nullptr, *attn = nullptr;
  for (auto [name, lease] : {std::pair<const char*, peft_lease**>{"A", &a}, {"B", &b}, {"Attn", &attn}}) {
    check(peft_registry_register(registry, name, (root / ("swap" + std::string(name))).c_str(), nullptr), "register");
    check(peft_registry_acquire(registry, name, lease), "acquire");
  }

  // The bound: the merge kernels' own rate on one thread, each layer's work at that rate, spread
  // over every core (what a swap uses).
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  const double per_weight_hidden = kernel_seconds_per_weight(kHidden, 16), per_weight_mlp = kernel_seconds_per_weight(kMlp, 16);
  auto kernel_bound = [&](const std::vector<Layer>& set) {
    double seconds = 0;
    for (const Layer& l : set)
      seconds += static_cast<double>(l.out * l.in) * (l.in == kHidden ? per_weight_hidden : per_weight_mlp);
    return seconds / threads;
  };
  const double bound = kernel_bound(layers), bound_attention = kernel_bound(attention);
  std::printf("  merge kernels alone (lowrank + add_rounded, rank 16, one block of rows in cache, 1 thread): "
              "%.3f ns per weight at 4096 columns, %.3f at 11008\n",
              per_weight_hidden * 1e9, per_weight_mlp * 1e9);
  std::printf("  swap bound = that rate x %u threads: %.1f ms for the 28 layers, %.1f ms for the 16 attention layers "
              "(%.0f%% of the weights)\n",
              threads, bound * 1e3, bound_attention * 1e3, 100.0 * bound_attention / bound);

  for (int exact : {1, 0}) {
    peft_host_model* host = nullptr;
    check(peft_host_model_new(&host), "host");
    check(peft_host_model_set_exact(host, exact), "exact");
    for (size_t i = 0; i < layers.size(); ++i) {
      const uint64_t shape[2] = {static_cast<uint64_t>(layers[i].out), static_cast<uint64_t>(layers[i].in)};
      check(peft_host_model_add_weight(host, layers[i].module.c_str(), weights[i].data(), PEFT_DTYPE_BF16, shape, 2,
                                       nullptr, 0, 0),
            "add_weight");
    }
    std::vector<double> in, ab, out, attn_in;
    uint64_t saved = 0;
    auto swap = [&](peft_lease* to, const char* what, std::vector<double>& times) {
      peft_swap_stats st{};
      st.size = sizeof st;
      const auto t0 = clock_type::now();
      check(peft_host_model_swap(host, to, 1.0, &st), what);
      times.push_back(seconds_since(t0));
      saved = std::max(saved, st.saved_bytes);
    };
    std::vector<double> ignored;
    for (int r = 0; r < reps; ++r) {
      swap(a, "swap none->A", in);
      swap(b, "swap A->B", ab);
      swap(nullptr, "swap B->none", out);
      swap(attn, "swap none->Attn", attn_in);
      swap(nullptr, "swap Attn->none", ignored);
    }
    // A -> B does the kernels' work once in exact mode (B merged into the kept originals) and
    // twice in arithmetic mode (A subtracted, then B added).
    const double ab_bound = exact ? bound : 2 * bound;
    std::printf("  %s restoration: none->A %7.1f ms, A->B %7.1f ms, B->none %7.1f ms (median of %d); "
                "A->B = %.2f x a full reload; original weights kept %.2f GB\n",
                exact ? "exact     " : "arithmetic", median(in) * 1e3, median(ab) * 1e3, median(out) * 1e3, reps,
                median(ab) / reload, static_cast<double>(saved) / 1e9);
    std::printf("    against the bound: none->A %.2fx, A->B %.2fx (bound %.1f ms), attention layers only: none->Attn "
                "%.1f ms = %.2fx its bound, %.0f%% of none->A (target: 1.2x)\n",
                median(in) / bound, median(ab) / ab_bound, ab_bound * 1e3, median(attn_in) * 1e3,
                median(attn_in) / bound_attention, 100.0 * median(attn_in) / median(in));
    peft_host_model_free(host);
  }
  peft_lease_free(a);
  peft_lease_free(b);
  peft_lease_free(attn);
  peft_registry_free(registry);
}

// Bytes per second one thread reads from memory: the sum of a 512 MiB buffer, best of 3.
double read_bandwidth() {
  std::vector<float> data(size_t{128} << 20, 1.0f);
  volatile float sink = 0;
  const double seconds = best_of(3, [&] {
    float sums[16] = {};
    for (size_t i = 0; i < data.size(); i += 16)
      for (int l = 0; l < 16; ++l) sums[l] += data[i + static_cast<size_t>(l)];
    sink = sink + sums[0];
  });
  return static_cast<double>(data.size() * sizeof(float)) / seconds;
}

// Reads 64 MiB (twice the L3 of the benchmark machine), so that what a call reads next comes from memory.
void evict_caches() {
  static std::vector<unsigned char> buffer(size_t{64} << 20, 1);
  volatile unsigned sink = 0;
  unsigned sum = 0;
  for (size_t i = 0; i < buffer.size(); i += 64) sum += buffer[i];
  sink = sink + sum;
}

void bench_apply(const fs::path& root, const std::vector<Layer>& layers, int reps) {
  std::printf("\n## unmerged LoRA (peft_lora_apply, f32 activations, bf16 factors) against the base matmul alone "
              "(cblas_sgemm, f32 weight)\n");
  const double bandwidth = read_bandwidth();
  std::printf("  memory read bandwidth, one thread: %.1f GB/s. At batch 1, \"cold\" is a call after 64 MiB of other\n"
              "  reads (its factors come from memory), \"bound\" the bytes it must move (bf16 A and B, f32 x, y read\n"
              "  and written) at that bandwidth.\n",
              bandwidth / 1e9);
  std::printf("  %-16s %6s %5s %12s %12s %9s %10s %10s %7s\n", "layer", "batch", "rank", "base ms", "apply ms", "overhead",
              "cold ms", "bound ms", "ratio");
  const int64_t ranks[] = {8, 16, 64};
  peft_registry* registry = nullptr;
  check(peft_registry_new(PEFT_DTYPE_BF16, uint64_t{1} << 30, nullptr, &registry), "registry");
  std::vector<peft_lease*> leases;
  for (int64_t rank : ranks) {
    const std::string name = "apply_r" + std::to_string(rank);
    write_adapter(root / name, layers, rank, static_cast<uint32_t>(rank));
    check(peft_registry_register(registry, name.c_str(), (root / name).c_str(), nullptr), "register");
    leases.emplace_back();
    check(peft_registry_acquire(registry, name.c_str(), &leases.back()), "acquire");
  }
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  // One layer of each shape: attention (4096x4096), MLP up (11008x4096), MLP down (4096x11008).
  const size_t layer_indices[] = {0, 5, 6};
  const int64_t batches[] = {1, 16, 256};
  // The base products first: OpenBLAS's threads keep spinning for a while after a product (about
  // 0.1 s), which would take a core from the applies timed right after it.
  double base_times[3][3];
  for (size_t li = 0; li < 3; ++li) {
    const Layer& l = layers[layer_indices[li]];
    std::vector<float> w(static_cast<size_t>(l.out * l.in));
    for (auto& v : w) v = normal(rng) * 0.02f;
    for (size_t bi = 0; bi < 3; ++bi) {
      const int64_t batch = batches[bi];
      std::vector<float> x(static_cast<size_t>(batch * l.in)), y(static_cast<size_t>(batch * l.out));
      for (auto& v : x) v = normal(rng);
      base_times[li][bi] = best_of(reps, [&] {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(batch), static_cast<int>(l.out),
                    static_cast<int>(l.in), 1.0f, x.data(), static_cast<int>(l.in), w.data(), static_cast<int>(l.in),
                    0.0f, y.data(), static_cast<int>(l.out));
      });
    }
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  for (size_t li = 0; li < 3; ++li) {
    const Layer& l = layers[layer_indices[li]];
    for (size_t bi = 0; bi < 3; ++bi) {
      const int64_t batch = batches[bi];
      const double base = base_times[li][bi];
      std::vector<float> x(static_cast<size_t>(batch * l.in)), y(static_cast<size_t>(batch * l.out));
      for (auto& v : x) v = normal(rng);
      for (size_t r = 0; r < leases.size(); ++r) {
        const double apply = best_of(reps, [&] {
          check(peft_lora_apply(l.module.c_str(), &leases[r], 1, nullptr, x.data(), PEFT_DTYPE_F32,
                                static_cast<uint64_t>(batch), static_cast<uint64_t>(l.in), y.data(), PEFT_DTYPE_F32,
                                static_cast<uint64_t>(l.out)),
                "apply");
        });
        std::printf("  %-16s %6lld %5lld %12.3f %12.3f %8.1f%%", l.module.substr(15).c_str(),
                    static_cast<long long>(batch), static_cast<long long>(ranks[r]), base * 1e3, apply * 1e3,
                    100.0 * apply / base);
        if (batch == 1) {
          double cold = 1e30;
          for (int rep = 0; rep < reps; ++rep) {
            evict_caches();
            const auto start = clock_type::now();
            check(peft_lora_apply(l.module.c_str(), &leases[r], 1, nullptr, x.data(), PEFT_DTYPE_F32, 1,
                                  static_cast<uint64_t>(l.in), y.data(), PEFT_DTYPE_F32, static_cast<uint64_t>(l.out)),
                  "apply");
            cold = std::min(cold, std::chrono::duration<double>(clock_type::now() - start).count());
          }
          const double bytes = 2.0 * static_cast<double>(ranks[r] * (l.in + l.out)) + 4.0 * static_cast<double>(l.in) +
                               8.0 * static_cast<double>(l.out);
          const double bound = bytes / bandwidth;
          std::printf(" %10.3f %10.3f %6.2fx", cold * 1e3, bound * 1e3, cold / bound);
        }
        std::printf("\n");
      }
      if (batch > 1) {  // a mixed batch: rows cycling over the three adapters
        std::vector<int32_t> rows(static_cast<size_t>(batch));
        for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<int32_t>(i % leases.size());
        const double apply = best_of(reps, [&] {
          check(peft_lora_apply(l.module.c_str(), leases.data(), leases.size(), rows.data(), x.data(), PEFT_DTYPE_F32,
                                static_cast<uint64_t>(batch), static_cast<uint64_t>(l.in), y.data(), PEFT_DTYPE_F32,
                                static_cast<uint64_t>(l.out)),
                "apply mixed");
        });
        std::printf("  %-16s %6lld %5s %12.3f %12.3f %8.1f%%\n", l.module.substr(15).c_str(),
                    static_cast<long long>(batch), "mixed", base * 1e3, apply * 1e3, 100.0 * apply / base);
      }
    }
  }
  for (peft_lease* lease : leases) peft_lease_free(lease);
  peft_registry_free(registry);
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::max(1, std::atoi(argv[1])) : 5;
  char tmpl[] = "/tmp/peft_bench_serve_XXXXXX";
  if (mkdtemp(tmpl) == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  const fs::path root = tmpl;
  const std::vector<Layer> layers = model_layers();
  std::printf("serving benchmark: %d LLaMA-7B blocks (%zu linear layers), best/median of %d, peft_c %s\n", kBlocks,
              layers.size(), reps, peft_version());
  const std::string only = argc > 2 ? argv[2] : "";  // "registry", "apply" or "swap": that part alone
  if (only.empty() || only == "registry") bench_registry(root, layers, 16);
  if (only.empty() || only == "apply") bench_apply(root, layers, reps);
  if (only.empty() || only == "swap") bench_swap(root, layers, reps);
  std::printf("\npeak RSS %.0f MB\n", peak_rss_mb());
  fs::remove_all(root);
  return 0;
}
