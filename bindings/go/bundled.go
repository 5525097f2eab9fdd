//go:build peftc_bundled

package peft

import (
	"os"
	"path/filepath"
	"runtime"
)

// The library statically compiled in (-tags peftc_bundled) has no install prefix to find its
// translation tables (data/arch) in. Unless PEFT_C_DATA_DIR names a folder, point it at the module's
// own data folder, found from this file's path at build time: the module cache or the checkout the
// program was built from. A program moved elsewhere sets PEFT_C_DATA_DIR itself.
func init() {
	if os.Getenv("PEFT_C_DATA_DIR") != "" {
		return
	}
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return
	}
	dir := filepath.Join(filepath.Dir(file), "..", "..", "data")
	if info, err := os.Stat(filepath.Join(dir, "arch")); err == nil && info.IsDir() {
		os.Setenv("PEFT_C_DATA_DIR", dir)
	}
}
