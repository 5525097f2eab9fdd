// Write throughput and peak memory of the streaming writer on a ~1 GB checkpoint, through the public
// C API. Each phase runs in a child process so that its peak RSS (ru_maxrss) is its own:
//   generate  write the checkpoint from a callback (F32, 1 GiB: a 256 MiB embedding + 48 x 16 MiB)
//   copy      rewrite it tensor by tensor from the opened checkpoint (no conversion)
//   to_bf16   rewrite it converting F32 -> BF16 on the way
//   reshard   rewrite it as a checkpoint folder of 200 MB shards
//   baseline  a child that only opens the checkpoint (the library's own footprint)
// Prints one JSON line per phase: seconds, MB/s of output, peak RSS and peak RSS / largest tensor.
// usage: bench_write [FOLDER] [SCALE]   (FOLDER defaults to /tmp/peft_bench_write; SCALE divides sizes)
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "peft_c.h"

namespace {

struct Tensor {
  std::string name;
  std::vector<uint64_t> shape;
  uint64_t nbytes;
};

std::vector<Tensor> layout(uint64_t scale) {
  std::vector<Tensor> tensors;
  tensors.push_back({"model.embed_tokens.weight", {65536 / scale, 1024}, 65536 / scale * 1024 * 4});
  for (int layer = 0; layer < 12; ++layer) {
    for (const char* part : {"mlp.up_proj", "mlp.down_proj", "mlp.gate_proj", "self_attn.o_proj"}) {
      const std::string name = "model.layers." + std::to_string(layer) + "." + part + ".weight";
      tensors.push_back({name, {1024, 4096 / scale}, 1024 * 4096 / scale * 4});
    }
  }
  return tensors;
}

bool check(peft_error* err, const char* what) {
  if (err == nullptr) return true;
  std::fprintf(stderr, "bench_write: %s: %s: %s\n", what, peft_error_code_name(peft_error_code(err)),
               peft_error_message(err));
  peft_error_free(err);
  return false;
}

int32_t fill(void* user, uint64_t offset, void* dst, uint64_t nbytes) {
  const uint32_t seed = *static_cast<const uint32_t*>(user);
  auto* words = static_cast<float*>(dst);
  for (uint64_t i = 0; i < nbytes / 4; ++i) words[i] = static_cast<float>((offset / 4 + i + seed) % 1000) * 0.001f;
  return 0;
}

int generate(const std::string& path, uint64_t scale) {
  peft_writer* w = nullptr;
  if (!check(peft_writer_new(path.c_str(), &w), "new")) return 1;
  check(peft_writer_set_metadata(w, "format", "pt"), "metadata");
  std::vector<Tensor> tensors = layout(scale);
  for (const Tensor& t : tensors) {
    if (!check(peft_writer_add_tensor(w, t.name.c_str(), PEFT_DTYPE_F32, t.shape.data(), t.shape.size()), "add")) return 1;
  }
  check(peft_writer_start(w), "start");
  for (size_t p = 0; p < tensors.size(); ++p) {
    uint32_t seed = static_cast<uint32_t>(p);
    if (!check(peft_writer_write_from_callback(w, peft_writer_tensor_name(w, p), PEFT_DTYPE_F32, fill, &seed), "write"))
      return 1;
  }
  if (!check(peft_writer_finish(w), "finish")) return 1;
  peft_writer_free(w);
  return 0;
}

// Rewrites `src` into `dst` (a file, or a folder when shard_size > 0), converting floats to `dtype`.
int rewrite(const std::string& src, const std::string& dst, int32_t dtype, uint64_t shard_size, bool only_open) {
  peft_checkpoint* ck = nullptr;
  if (!check(peft_checkpoint_open(src.c_str(), nullptr, &ck), "open")) return 1;
  if (only_open) {
    peft_checkpoint_free(ck);
    return 0;
  }
  peft_writer* w = nullptr;
  if (!check(shard_size ? peft_writer_new_checkpoint(dst.c_str(), shard_size, &w) : peft_writer_new(dst.c_str(), &w),
             "new"))
    return 1;
  if (!shard_size) check(peft_writer_set_metadata(w, "format", "pt"), "metadata");
  const size_t count = peft_checkpoint_tensor_count(ck);
  for (size_t i = 0; i < count; ++i) {
    const int32_t out = dtype >= 0 ? dtype : peft_checkpoint_tensor_dtype(ck, i);
    if (!check(peft_writer_add_tensor(w, peft_checkpoint_tensor_name(ck, i), out, peft_checkpoint_tensor_shape(ck, i),
                                      peft_checkpoint_tensor_ndim(ck, i)),
               "add"))
      return 1;
  }
  check(peft_writer_start(w), "start");
  for (size_t p = 0; p < count; ++p) {
    if (!check(peft_writer_write_from_checkpoint(w, peft_writer_tensor_name(w, p), ck,
                                                 peft_writer_tensor_declaration(w, p)),
               "write"))
      return 1;
  }
  if (!check(peft_writer_finish(w), "finish")) return 1;
  peft_writer_free(w);
  peft_checkpoint_free(ck);
  return 0;
}

uint64_t output_bytes(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return 0;
  if (!S_ISDIR(st.st_mode)) return static_cast<uint64_t>(st.st_size);
  uint64_t total = 0;
  for (int k = 1; k <= 99; ++k) {
    char name[64];
    for (int n = k; n <= 99; ++n) {
      std::snprintf(name, sizeof name, "/model-%05d-of-%05d.safetensors", k, n);
      if (::stat((path + name).c_str(), &st) == 0) total += static_cast<uint64_t>(st.st_size);
    }
  }
  return total;
}

template <class Body>
void phase(const char* name, const std::string& output, uint64_t largest, Body body) {
  const auto start = std::chrono::steady_clock::now();
  const pid_t child = ::fork();
  if (child == 0) ::_exit(body());
  int status = 0;
  struct rusage usage {};
  ::wait4(child, &status, 0, &usage);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const uint64_t bytes = output.empty() ? 0 : output_bytes(output);
  const double rss_mb = static_cast<double>(usage.ru_maxrss) / 1024.0;
  std::printf("{\"phase\": \"%s\", \"ok\": %s, \"seconds\": %.3f, \"output_mb\": %.1f, \"mb_per_s\": %.1f, "
              "\"peak_rss_mb\": %.1f, \"largest_tensor_mb\": %.1f, \"peak_rss_over_largest\": %.3f}\n",
              name, WIFEXITED(status) && WEXITSTATUS(status) == 0 ? "true" : "false", seconds, bytes / 1e6,
              bytes / 1e6 / seconds, rss_mb, largest / 1048576.0, rss_mb / (largest / 1048576.0));
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string folder = argc > 1 ? argv[1] : "/tmp/peft_bench_write";
  const uint64_t scale = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 1;
  if (scale == 0 || 4096 % scale != 0) {
    std::fprintf(stderr, "usage: bench_write [FOLDER] [SCALE (divides 4096)]\n");
    return 2;
  }
  ::mkdir(folder.c_str(), 0755);
  const std::string src = folder + "/source.safetensors";
  uint64_t largest = 0;
  for (const Tensor& t : layout(scale)) largest = std::max(largest, t.nbytes);
  std::fflush(stdout);
  phase("generate", src, largest, [&] { return generate(src, scale); });
  phase("baseline", "", largest, [&] { return rewrite(src, "", -1, 0, true); });
  phase("copy", folder + "/copy.safetensors", largest,
        [&] { return rewrite(src, folder + "/copy.safetensors", -1, 0, false); });
  phase("to_bf16", folder + "/bf16.safetensors", largest,
        [&] { return rewrite(src, folder + "/bf16.safetensors", PEFT_DTYPE_BF16, 0, false); });
  phase("reshard", folder + "/sharded", largest,
        [&] { return rewrite(src, folder + "/sharded", -1, 200'000'000 / scale, false); });
  return 0;
}
