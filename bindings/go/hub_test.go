package peft_test

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	peft "github.com/peft-c/peft_c/bindings/go"
)

// layHubSnapshot lays the files of folder src into cache as huggingface_hub does:
// models--org--name/blobs/<sha256>, snapshots/<commit>/<file> -> ../../blobs/<sha256>, refs/main.
// Returns the snapshot folder.
func layHubSnapshot(t *testing.T, cache, repo, commit, src string) string {
	t.Helper()
	root := filepath.Join(cache, "models--"+strings.ReplaceAll(repo, "/", "--"))
	snapshot := filepath.Join(root, "snapshots", commit)
	for _, dir := range []string{filepath.Join(root, "blobs"), filepath.Join(root, "refs"), snapshot} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(data)
		blob := hex.EncodeToString(sum[:])
		if err := os.WriteFile(filepath.Join(root, "blobs", blob), data, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join("..", "..", "blobs", blob), filepath.Join(snapshot, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "refs", "main"), []byte(commit), 0o644); err != nil {
		t.Fatal(err)
	}
	return snapshot
}

func TestHubResolve(t *testing.T) {
	model := fixture("models", "llama")
	if _, err := os.Stat(filepath.Join(model, "model.safetensors")); err != nil {
		t.Skip("fixture absent (run tests/fixtures/generate.py)")
	}
	cache := t.TempDir()
	t.Setenv("HF_HUB_CACHE", cache)
	commit := strings.Repeat("ab12", 10)
	snapshot := layHubSnapshot(t, cache, "org/tiny", commit, model)

	dir, err := peft.HubCacheDir()
	if err != nil || dir != cache {
		t.Fatalf("HubCacheDir() = %q, %v; want %q", dir, err, cache)
	}
	for _, id := range []string{"org/tiny", "org/tiny@main", "org/tiny@" + commit, "org/tiny@ab12ab1"} {
		got, err := peft.HubResolve(id)
		if err != nil || got != snapshot {
			t.Errorf("HubResolve(%q) = %q, %v; want %q", id, got, err, snapshot)
		}
	}
	if got, err := peft.HubResolve(model); err != nil || got != model {
		t.Errorf("HubResolve(existing path) = %q, %v; want it unchanged", got, err)
	}

	// An id opens like the folder it stands for.
	byID := mustOpen(t, "org/tiny")
	byPath := mustOpen(t, model)
	if byID.TensorCount() != byPath.TensorCount() || byID.TensorCount() == 0 {
		t.Errorf("the id opens %d tensors, the folder %d", byID.TensorCount(), byPath.TensorCount())
	}

	_, err = peft.HubResolve("org/absent")
	if !errors.Is(err, peft.ErrNotFound) || !strings.Contains(err.Error(), cache) {
		t.Errorf("HubResolve(absent) = %v; want ErrNotFound naming the cache", err)
	}
	_, err = peft.HubResolve("org/tiny@v9")
	if !errors.Is(err, peft.ErrNotFound) || !strings.Contains(err.Error(), `"main"`) {
		t.Errorf("HubResolve(absent revision) = %v; want ErrNotFound listing the refs", err)
	}
	for _, text := range []string{"../up", "a/b/c", "/no/such/folder", "org/name@"} {
		if _, err := peft.HubResolve(text); !errors.Is(err, peft.ErrInvalidArgument) {
			t.Errorf("HubResolve(%q) = %v; want ErrInvalidArgument", text, err)
		}
	}
	if _, err := peft.HubResolve("org/ti\x00ny"); !errors.Is(err, peft.ErrInvalidArgument) {
		t.Errorf("a NUL byte: %v; want ErrInvalidArgument", err)
	}
}
