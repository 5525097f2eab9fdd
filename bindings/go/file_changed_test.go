package peft_test

// Files that change under open handles: a safetensors file truncated or rewritten in place after it
// was opened gives CodeIO from every call that reads it (Checkpoint.Read and View,
// Adapter.ReadTensorFloat32, Registry.Acquire), and a merge whose base or adapter is truncated by its
// progress function fails with CodeIO and leaves no output. Before the library read files with
// pread, these calls died of SIGBUS (which ends the test binary).

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	peft "github.com/peft-c/peft_c/bindings/go"
)

const changedElements = 1 << 14 // 64 KiB per tensor: a truncation removes whole pages

// writePair writes two F32 tensors, a[i] = i + offset and b[i] = -(i + offset), into path (truncating
// and rewriting the same file when it exists), then ages it.
func writePair(t *testing.T, path string, offset float32) {
	t.Helper()
	n := changedElements * 4
	header := fmt.Sprintf(`{"a":{"dtype":"F32","shape":[%d],"data_offsets":[0,%d]},`+
		`"b":{"dtype":"F32","shape":[%d],"data_offsets":[%d,%d]}}`, changedElements, n, changedElements, n, 2*n)
	for len(header)%8 != 0 {
		header += " "
	}
	data := make([]byte, 8+len(header)+2*n)
	binary.LittleEndian.PutUint64(data, uint64(len(header)))
	copy(data[8:], header)
	body := data[8+len(header):]
	for i := 0; i < changedElements; i++ {
		v := float32(i) + offset
		binary.LittleEndian.PutUint32(body[4*i:], math.Float32bits(v))
		binary.LittleEndian.PutUint32(body[n+4*i:], math.Float32bits(-v))
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	age(t, path)
}

// age moves the file's modification time a day back, as for any file written before it is opened;
// a change made afterwards then moves it, whatever the file system's timestamp granularity.
func age(t *testing.T, path string) {
	t.Helper()
	past := time.Now().Add(-24 * time.Hour)
	if err := os.Chtimes(path, past, past); err != nil {
		t.Fatal(err)
	}
}

// wantIO fails unless err is a *peft.Error with CodeIO whose message contains needle.
func wantIO(t *testing.T, what string, err error, needle string) {
	t.Helper()
	var e *peft.Error
	if !errors.As(err, &e) || e.Code != peft.CodeIO || !strings.Contains(e.Message, needle) {
		t.Errorf("%s: want IO naming %q, got %v", what, needle, err)
	}
}

func TestFileChangedUnderCheckpoint(t *testing.T) {
	for _, pread := range []bool{false, true} {
		t.Run(fmt.Sprintf("pread=%v", pread), func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "pair.safetensors")

			// Truncated between calls.
			writePair(t, path, 0)
			c := mustOpen(t, path, peft.WithPread(pread))
			if b, err := c.ReadFloat32(1); err != nil || b[7] != -7 {
				t.Fatalf("read before truncation: %v", err)
			}
			if err := os.Truncate(path, 4096); err != nil {
				t.Fatal(err)
			}
			for index := 0; index < 2; index++ {
				_, err := c.ReadFloat32(index)
				wantIO(t, "ReadFloat32 after truncation", err, "truncated")
				_, err = c.Read(index, peft.BF16)
				wantIO(t, "Read(BF16) after truncation", err, "pair.safetensors")
				_, err = c.View(index)
				wantIO(t, "View after truncation", err, "truncated")
			}
			c.Close()

			// Rewritten in place with other values of the same size.
			writePair(t, path, 0)
			c = mustOpen(t, path, peft.WithPread(pread))
			writePair(t, path, 100)
			if err := os.Chtimes(path, time.Now(), time.Now()); err != nil { // as any real write leaves it
				t.Fatal(err)
			}
			_, err := c.ReadFloat32(0)
			wantIO(t, "ReadFloat32 after rewrite", err, "changed since it was opened")
			_, err = c.View(0)
			wantIO(t, "View after rewrite", err, "changed since it was opened")
		})
	}
}

func copyAdapter(t *testing.T, name string) (dir, weights string) {
	t.Helper()
	dir = filepath.Join(t.TempDir(), name)
	copyDir(t, fixture("adapters", "llama_lora"), dir)
	weights = filepath.Join(dir, "adapter_model.safetensors")
	age(t, weights)
	return dir, weights
}

func TestFileChangedUnderAdapterAndRegistry(t *testing.T) {
	dir, weights := copyAdapter(t, "adapter")
	a := mustAdapter(t, dir)
	if _, err := a.ReadTensorFloat32(0, 0); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(weights, 4096); err != nil {
		t.Fatal(err)
	}
	_, err := a.ReadTensorFloat32(0, 0)
	wantIO(t, "ReadTensorFloat32 after truncation", err, "adapter_model.safetensors")

	r, err := peft.NewRegistry(peft.F32, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	dir, weights = copyAdapter(t, "registered")
	if err := r.Register("a", dir); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(weights, 4096); err != nil {
		t.Fatal(err)
	}
	lease, err := r.Acquire("a")
	if lease != nil {
		lease.Close()
	}
	wantIO(t, "Acquire after truncation", err, "truncated")
}

func TestMergeInputTruncatedWhileMerging(t *testing.T) {
	for _, victim := range []string{"base", "adapter"} {
		for _, threads := range []int{1, 2} {
			t.Run(fmt.Sprintf("%s/threads=%d", victim, threads), func(t *testing.T) {
				base := filepath.Join(t.TempDir(), "base")
				copyDir(t, fixture("models", "llama"), base)
				adapter, weights := copyAdapter(t, "adapter")
				path := weights
				if victim == "base" {
					path = filepath.Join(base, "model.safetensors")
					age(t, path)
				}
				truncated := false
				progress := func(done, total uint64) {
					if done > 0 && !truncated {
						if err := os.Truncate(path, 4096); err != nil {
							t.Error(err)
						}
						truncated = true
					}
				}
				out := filepath.Join(t.TempDir(), "merged")
				_, err := peft.MergeCheckpoint(context.Background(), base, out, peft.WithAdapterDir(adapter, 1),
					peft.WithThreads(threads), peft.WithProgress(progress))
				wantIO(t, "MergeCheckpoint", err, filepath.Base(path))
				if !truncated {
					t.Error("the progress function never ran after the first tensor")
				}
				if _, err := os.Stat(out); !os.IsNotExist(err) {
					t.Errorf("the failed merge left %s behind (%v)", out, err)
				}
			})
		}
	}
}
