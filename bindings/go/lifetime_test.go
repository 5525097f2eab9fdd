package peft_test

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"io"
	"math"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"testing"

	peft "github.com/peft-c/peft_c/bindings/go"
)

// Every handle type is an io.Closer.
var (
	_ io.Closer = (*peft.Checkpoint)(nil)
	_ io.Closer = (*peft.Writer)(nil)
	_ io.Closer = (*peft.Adapter)(nil)
	_ io.Closer = (*peft.Translator)(nil)
	_ io.Closer = (*peft.MergeRecord)(nil)
	_ io.Writer = (*peft.Writer)(nil)
)

// waitForCleanups collects garbage until the number of live handles drops to want. Cleanups run on
// a goroutine of the runtime after a collection, so this loops a bounded number of times.
func waitForCleanups(t *testing.T, want int64) {
	t.Helper()
	for i := 0; i < 200 && peft.LiveHandles() > want; i++ {
		runtime.GC()
		runtime.Gosched()
	}
	if got := peft.LiveHandles(); got > want {
		t.Fatalf("%d handles alive, want %d", got, want)
	}
}

// settle runs the cleanups of earlier tests' dropped handles, so that counts taken afterwards move
// only with the current test's handles.
func settle() {
	for i := 0; i < 20; i++ {
		runtime.GC()
		runtime.Gosched()
	}
}

// Calls after Close fail with ErrClosed (or give zero values), and Close is idempotent.
func TestUseAfterClose(t *testing.T) {
	c, err := peft.Open(fixture("safetensors", "dtype_f32.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
	_, err = c.View(0)
	wantClosed(t, err)
	_, err = c.ReadFloat32(0)
	wantClosed(t, err)
	_, err = c.Find("values")
	wantClosed(t, err)
	_, err = c.Tensors()
	wantClosed(t, err)
	_, err = c.Metadata(0)
	wantClosed(t, err)
	_, _, err = c.IndexMetadataJSON()
	wantClosed(t, err)
	if c.TensorCount() != 0 || c.FileCount() != 0 {
		t.Fatal("counts after Close")
	}
	var ce error
	if _, ce = c.Files(); !errors.Is(ce, peft.ErrClosed) {
		t.Fatal(ce)
	}
	if errors.Is(ce, peft.ErrBusy) || ce.Error() != "peft: use of a closed Checkpoint" {
		t.Fatalf("closed error %q", ce)
	}

	a, err := peft.OpenAdapter(fixture("adapters", "llama_lora"))
	if err != nil {
		t.Fatal(err)
	}
	a.Close()
	a.Close()
	_, err = a.Modules()
	wantClosed(t, err)
	_, err = a.Translator()
	wantClosed(t, err)
	wantClosed(t, a.Validate(fixture("models", "llama")))
	wantClosed(t, a.Export(t.TempDir()))
	_, err = a.MergeBuffer("model.layers.0.self_attn.q_proj", peft.Float32Buffer(make([]float32, 256), 16, 16), nil)
	wantClosed(t, err)
	if a.R() != 0 || a.ConfigJSON() != "" || a.ModuleCount() != 0 || a.Notes() != nil || a.UseDoRA() {
		t.Fatal("getters after Close")
	}

	tr, err := peft.NewBuiltinTranslator("llama")
	if err != nil {
		t.Fatal(err)
	}
	tr.Close()
	tr.Close()
	_, err = tr.ToNative("model.layers.0.self_attn.q_proj.weight")
	wantClosed(t, err)
	_, err = tr.ToHFAll([]string{"a"}, true)
	wantClosed(t, err)
	if tr.Family() != "" {
		t.Fatal("Family after Close")
	}

	w, err := peft.NewWriter(filepath.Join(t.TempDir(), "x.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	w.AddTensor("x", peft.F32, 1)
	src, _ := peft.Open(fixture("safetensors", "dtype_f32.safetensors"))
	src.Close()
	wantClosed(t, w.WriteFromCheckpoint("x", src, 0))
	w.Close()
}

// Close on a nil handle does nothing, as peft_<type>_free(NULL) does.
func TestNilClose(t *testing.T) {
	for _, c := range []io.Closer{(*peft.Checkpoint)(nil), (*peft.Writer)(nil), (*peft.Adapter)(nil),
		(*peft.Translator)(nil), (*peft.MergeRecord)(nil)} {
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// Children keep their parents alive: a translator from an adapter works after the adapter is
// closed and collected.
func TestChildOutlivesParent(t *testing.T) {
	a, err := peft.OpenAdapter(fixture("adapters", "llama_lora"))
	if err != nil {
		t.Fatal(err)
	}
	tr, err := a.Translator()
	if err != nil {
		t.Fatal(err)
	}
	a.Close()
	a = nil
	runtime.GC()
	runtime.GC()
	defer tr.Close()
	native, err := tr.ToNative("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight")
	if err != nil || native == "" {
		t.Fatalf("translator after its adapter was closed: %q %v", native, err)
	}
	// A merge record outlives its adapter too.
	b, _ := peft.OpenAdapter(fixture("adapters", "llama_lora"))
	w := make([]float32, 16*16)
	rec, err := b.MergeBuffer("model.layers.0.self_attn.q_proj", peft.Float32Buffer(w, 16, 16), nil)
	if err != nil {
		t.Fatal(err)
	}
	b.Close()
	runtime.GC()
	if err := rec.Remove(peft.Float32Buffer(w, 16, 16), nil); err != nil {
		t.Fatal(err)
	}
	rec.Close()
}

// Handles dropped without Close are released by the runtime cleanup; closed ones at once.
func TestCleanupReleasesDroppedHandles(t *testing.T) {
	settle()
	before := peft.LiveHandles()
	kept := []any{}
	for i := 0; i < 10; i++ {
		c, err := peft.Open(fixture("safetensors", "dtype_f32.safetensors"))
		if err != nil {
			t.Fatal(err)
		}
		a, err := peft.OpenAdapter(fixture("adapters", "llama_lora"))
		if err != nil {
			t.Fatal(err)
		}
		tr, err := peft.NewBuiltinTranslator("gpt2")
		if err != nil {
			t.Fatal(err)
		}
		w, err := peft.NewWriter(filepath.Join(t.TempDir(), "w.safetensors"))
		if err != nil {
			t.Fatal(err)
		}
		kept = append(kept, c, a, tr, w)
	}
	runtime.GC()
	if peft.LiveHandles() != before+40 {
		t.Fatalf("live handles %d while 40 are reachable, want %d", peft.LiveHandles(), before+40)
	}
	runtime.KeepAlive(kept)
	kept = nil // dropped without Close
	waitForCleanups(t, before)
	c, _ := peft.Open(fixture("safetensors", "dtype_f32.safetensors"))
	if peft.LiveHandles() != before+1 {
		t.Fatal("open did not count")
	}
	c.Close()
	if peft.LiveHandles() != before {
		t.Fatal("Close did not release at once")
	}
}

// A view stays valid across collections while its checkpoint is reachable and open.
func TestViewSurvivesGC(t *testing.T) {
	for _, pread := range []bool{false, true} {
		c, err := peft.Open(fixture("safetensors", "all_dtypes.safetensors"), peft.WithPread(pread))
		if err != nil {
			t.Fatal(err)
		}
		infos, _ := c.Tensors()
		views := make([][]byte, len(infos))
		sums := make([][32]byte, len(infos))
		for i := range infos {
			views[i], _ = c.View(i)
			sums[i] = sha256.Sum256(bytes.Clone(views[i]))
		}
		for round := 0; round < 5; round++ {
			runtime.GC()
			garbage := make([][]byte, 1000) // churn the heap
			for i := range garbage {
				garbage[i] = make([]byte, 1024)
			}
			for i, v := range views {
				if sha256.Sum256(v) != sums[i] {
					t.Fatalf("view %d changed after a collection", i)
				}
			}
		}
		runtime.KeepAlive(c)
		c.Close()
	}
}

// Many goroutines read the same checkpoint, adapter and translator at once (run with -race).
func TestConcurrentReads(t *testing.T) {
	c := mustOpen(t, fixture("safetensors", "all_dtypes.safetensors"))
	a := mustAdapter(t, fixture("adapters", "llama_lora"))
	tr, err := a.Translator()
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	infos, _ := c.Tensors()
	wantSums := make([][32]byte, len(infos))
	for i := range infos {
		v, _ := c.View(i)
		wantSums[i] = sha256.Sum256(v)
	}
	wantModules, _ := a.Modules()
	key := "base_model.model.model.layers.1.mlp.up_proj.lora_B.weight"
	wantNative, _ := tr.ToNative(key)
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for round := 0; round < 20; round++ {
				i := (g + round) % len(infos)
				v, err := c.View(i)
				if err != nil || sha256.Sum256(v) != wantSums[i] {
					errs <- errors.New("view differs")
					return
				}
				if idx, err := c.Find(infos[i].Name); err != nil || idx != i {
					errs <- errors.New("find differs")
					return
				}
				if _, err := c.Read(i, infos[i].DType); err != nil {
					errs <- err
					return
				}
				mods, err := a.Modules()
				if err != nil || len(mods) != len(wantModules) || mods[g%len(mods)].Name != wantModules[g%len(mods)].Name {
					errs <- errors.New("modules differ")
					return
				}
				if _, err := a.ReadTensorFloat32(g%len(mods), 0); err != nil {
					errs <- err
					return
				}
				if n, err := tr.ToNative(key); err != nil || n != wantNative {
					errs <- errors.New("translation differs")
					return
				}
				if round%5 == 0 {
					runtime.GC()
				}
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// Close while other goroutines are calling: their calls either succeed or fail with ErrClosed,
// and the C object is released once, after the last call returns.
func TestCloseDuringCalls(t *testing.T) {
	settle()
	before := peft.LiveHandles()
	c, err := peft.Open(fixture("safetensors", "dtype_f32.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	want, _ := c.ReadFloat32(1)
	var wg sync.WaitGroup
	start := make(chan struct{})
	failures := make(chan error, 16)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for i := 0; i < 500; i++ {
				got, err := c.ReadFloat32(1)
				if errors.Is(err, peft.ErrClosed) {
					return
				}
				if err != nil || !slices.Equal(float32Bits(got), float32Bits(want)) {
					failures <- errors.New("a read during Close returned wrong data")
					return
				}
			}
		}()
	}
	close(start)
	runtime.Gosched()
	c.Close()
	wg.Wait()
	close(failures)
	for err := range failures {
		t.Fatal(err)
	}
	if peft.LiveHandles() != before {
		t.Fatalf("live handles %d after Close and the last call, want %d", peft.LiveHandles(), before)
	}
}

func float32Bits(f []float32) []uint32 {
	out := make([]uint32, len(f))
	for i, v := range f {
		out[i] = math.Float32bits(v)
	}
	return out
}
