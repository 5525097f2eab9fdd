// Helpers shared by the writer tests: scratch folders, whole-file reads, listing leftovers, and
// injected file-system failures (AtomicFile's fault hook).
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/atomic_file.hpp"

namespace writer_test {

namespace fs = std::filesystem;

// A fresh folder under the system temp dir, removed with everything in it on destruction.
class ScratchDir {
 public:
  ScratchDir() {
    std::string pattern = (fs::temp_directory_path() / "peft_writer_test_XXXXXX").string();
    std::vector<char> buf(pattern.begin(), pattern.end());
    buf.push_back('\0');
    path_ = ::mkdtemp(buf.data());
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  std::string path(const std::string& name = {}) const { return name.empty() ? path_ : path_ + "/" + name; }

 private:
  std::string path_;
};

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Names of the entries of a folder that are writer temporaries.
inline std::vector<std::string> temporaries(const std::string& folder) {
  std::vector<std::string> found;
  for (const auto& entry : fs::directory_iterator(folder)) {
    const std::string name = entry.path().filename().string();
    if (peft::is_atomic_temp_name(name)) found.push_back(name);
  }
  return found;
}

inline std::vector<std::string> entries(const std::string& folder) {
  std::vector<std::string> found;
  for (const auto& entry : fs::directory_iterator(folder)) found.push_back(entry.path().filename().string());
  std::sort(found.begin(), found.end());
  return found;
}

inline std::string le64(uint64_t n) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return out;
}

// The fault hook's state: fail operation `op` with `error` from its `countdown`-th call on.
struct Injection {
  peft::testing::FileOp op = peft::testing::FileOp::write;
  int error = 0;
  int countdown = 0;
  int seen = 0;
};
inline Injection g_injection;

inline int inject(peft::testing::FileOp op, const std::string&) {
  if (op != g_injection.op) return 0;
  return ++g_injection.seen >= g_injection.countdown ? g_injection.error : 0;
}

// Installs the hook for one scope.
struct HookScope {
  HookScope(peft::testing::FileOp op, int error, int countdown = 1) {
    g_injection = {op, error, countdown, 0};
    peft::testing::fault_hook = &inject;
  }
  ~HookScope() { peft::testing::fault_hook = nullptr; }
};

}  // namespace writer_test
