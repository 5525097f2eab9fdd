package peft_test

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	peft "github.com/peft-c/peft_c/bindings/go"
)

// corpusDir is the real-world corpus (adapters and checkpoints people published): $PEFT_CORPUS, or
// ../shared/corpus/real next to the repository.
func corpusDir(t *testing.T) string {
	dir := os.Getenv("PEFT_CORPUS")
	if dir == "" {
		dir = filepath.Join("..", "..", "..", "shared", "corpus", "real")
	}
	if _, err := os.Stat(filepath.Join(dir, "MANIFEST.md")); err != nil {
		t.Skipf("the real-world corpus is absent (%s; set PEFT_CORPUS): skipping", dir)
	}
	return dir
}

func corpusFiles(t *testing.T, name string) []string {
	var found []string
	filepath.WalkDir(corpusDir(t), func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && d.Name() == name {
			found = append(found, path)
		}
		return nil
	})
	if len(found) == 0 {
		t.Fatalf("no %s in the corpus", name)
	}
	return found
}

// Every safetensors file of the corpus opens, and every tensor reads.
func TestCorpusFiles(t *testing.T) {
	var files []string
	filepath.WalkDir(corpusDir(t), func(path string, d fs.DirEntry, err error) error {
		if err == nil && filepath.Ext(path) == ".safetensors" {
			files = append(files, path)
		}
		return nil
	})
	for _, path := range files {
		c, err := peft.Open(path)
		if err != nil {
			t.Errorf("%s: %v", path, err)
			continue
		}
		infos, err := c.Tensors()
		if err != nil || len(infos) == 0 {
			t.Errorf("%s: %d tensors, %v", path, len(infos), err)
		}
		for _, info := range infos {
			view, err := c.View(info.Index)
			if err != nil || uint64(len(view)) != info.NumBytes() {
				t.Errorf("%s %q: view %v", path, info.Name, err)
			}
			if _, err := c.ReadFloat32(info.Index); err != nil {
				t.Errorf("%s %q: %v", path, info.Name, err)
			}
		}
		c.Close()
	}
}

// Every adapter of the corpus opens, exports, and the export opens again with the same modules and
// tensors.
func TestCorpusAdapters(t *testing.T) {
	out := t.TempDir()
	for i, cfg := range corpusFiles(t, "adapter_config.json") {
		dir := filepath.Dir(cfg)
		rel, _ := filepath.Rel(corpusDir(t), dir)
		t.Run(rel, func(t *testing.T) {
			a, err := peft.OpenAdapter(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			exported := filepath.Join(out, filepath.Base(dir)+string(rune('a'+i)))
			if err := a.Export(exported); err != nil {
				t.Fatal(err)
			}
			b := mustAdapter(t, exported)
			am, _ := a.Modules()
			bm, _ := b.Modules()
			if len(am) != len(bm) {
				t.Fatalf("%d modules after export, %d before", len(bm), len(am))
			}
			for mi := range am {
				j, err := b.FindModule(am[mi].Name)
				if err != nil {
					t.Fatal(err)
				}
				other, _ := b.Module(j)
				if other.Rank != am[mi].Rank || other.Scaling != am[mi].Scaling || len(other.Tensors) != len(am[mi].Tensors) {
					t.Fatalf("module %s differs after export", am[mi].Name)
				}
				for ti, mt := range am[mi].Tensors {
					tj := other.Tensor(mt.Role)
					if tj < 0 || !bytes.Equal(mustRead(t, a, mi, ti, mt.DType), mustRead(t, b, j, tj, mt.DType)) {
						t.Fatalf("tensor %s of %s differs after export", mt.Role, am[mi].Name)
					}
				}
			}
		})
	}
}

func mustRead(t *testing.T, a *peft.Adapter, module, tensor int, dtype peft.DType) []byte {
	t.Helper()
	m, err := a.Module(module)
	if err != nil {
		t.Fatal(err)
	}
	n := peft.TensorInfo{Shape: m.Tensors[tensor].Shape}.NumElements()
	buf := make([]byte, int(n)*dtype.Bits()/8)
	if err := a.ReadTensorInto(module, tensor, dtype, buf); err != nil {
		t.Fatal(err)
	}
	return buf
}
