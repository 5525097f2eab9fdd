package peft_test

import (
	"context"
	"errors"
	"math"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	peft "github.com/peft-c/peft_c/bindings/go"
)

// The buffer merge of one layer gives the bytes the checkpoint merge writes, and removing it
// with the original rows kept restores the buffer bit for bit.
func TestMergeBufferMatchesCheckpointMerge(t *testing.T) {
	base := fixture("models", "llama")
	out := filepath.Join(t.TempDir(), "merged")
	if _, err := peft.MergeCheckpoint(context.Background(), base, out,
		peft.WithAdapterDir(fixture("adapters", "llama_lora"), 0.5)); err != nil {
		t.Fatal(err)
	}
	a := mustAdapter(t, fixture("adapters", "llama_lora"))
	baseCkpt, merged := mustOpen(t, base), mustOpen(t, out)
	modules, _ := a.Modules()
	for _, m := range modules {
		name := m.Tensors[m.Tensor("lora_A.weight")].BaseName
		info, _ := baseCkpt.TensorByName(name)
		w := readTensor32(t, baseCkpt, name)
		original := slices.Clone(w)
		rec, err := a.MergeBuffer(m.Name, peft.Float32Buffer(w, info.Shape...), nil,
			peft.WithWeight(0.5), peft.WithKeepOriginalRows(true))
		if err != nil {
			t.Fatal(err)
		}
		gcPoint()
		want := readTensor32(t, merged, name)
		if !slices.Equal(w, want) {
			t.Fatalf("%s: buffer merge differs from the checkpoint merge", m.Name)
		}
		if rec.Module() != m.Name || !rec.Active() || rec.SavedBytes() == 0 {
			t.Fatalf("record: %q active=%v saved=%d", rec.Module(), rec.Active(), rec.SavedBytes())
		}
		moved := slices.Clone(w) // the buffer may move between merge and removal
		if err := rec.Remove(peft.Float32Buffer(moved, info.Shape...), nil); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(moved, original) || rec.Active() {
			t.Fatalf("%s: removal did not restore the original", m.Name)
		}
		wantCode(t, rec.Remove(peft.Float32Buffer(moved, info.Shape...), nil), peft.CodeInvalidArgument) // spent
		rec.Close()
	}
}

// Arithmetic removal (no rows kept) in f32, a tensor name instead of a module path, and BF16 buffers.
func TestMergeBufferArithmetic(t *testing.T) {
	base := mustOpen(t, fixture("models", "llama"))
	a := mustAdapter(t, fixture("adapters", "llama_lora"))
	name := "model.layers.0.self_attn.q_proj.weight"
	info, _ := base.TensorByName(name)
	w := readTensor32(t, base, name)
	original := slices.Clone(w)
	rec, err := a.MergeBuffer("base_model.model."+name, peft.Float32Buffer(w, info.Shape...), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer rec.Close()
	if rec.SavedBytes() != 0 {
		t.Fatal("rows kept without the option")
	}
	if err := rec.Remove(peft.Float32Buffer(w, info.Shape...), nil); err != nil {
		t.Fatal(err)
	}
	mod, _ := a.Module(mustFind(t, a, "model.layers.0.self_attn.q_proj"))
	_, magnitude := loraDelta(t, a, mod, 1)
	for i := range w {
		// Merge and unmerge each round once: twice the error of one merge.
		if !closeTo(w[i], float64(original[i]), 2*(math.Abs(float64(original[i]))+2*magnitude[i])) {
			t.Fatalf("element %d: %v after unmerge, was %v", i, w[i], original[i])
		}
	}
	// BF16: the merge equals the F32 merge of the same (widened) values rounded once to BF16, to
	// within one BF16 ulp where the F32 result itself sits next to a BF16 tie.
	bf := make([]uint16, len(original))
	if err := peft.Convert(uint16Raw(bf), peft.BF16, float32RawView(original), peft.F32); err != nil {
		t.Fatal(err)
	}
	widened := make([]float32, len(bf))
	if err := peft.Convert(float32RawView(widened), peft.F32, uint16Raw(bf), peft.BF16); err != nil {
		t.Fatal(err)
	}
	rec2, err := a.MergeBuffer(name, peft.Uint16Buffer(bf, peft.BF16, info.Shape...), nil)
	if err != nil {
		t.Fatal(err)
	}
	rec2.Close() // closing the record leaves the merge in place
	r3, err := a.MergeBuffer(name, peft.Float32Buffer(widened, info.Shape...), nil)
	if err != nil {
		t.Fatal(err)
	}
	r3.Close()
	want := make([]uint16, len(bf))
	if err := peft.Convert(uint16Raw(want), peft.BF16, float32RawView(widened), peft.F32); err != nil {
		t.Fatal(err)
	}
	for i := range bf {
		if d := int(bf[i]) - int(want[i]); d > 1 || d < -1 {
			t.Fatalf("bf16 merge element %d: %#04x, rounded f32 merge %#04x", i, bf[i], want[i])
		}
	}
}

func mustFind(t *testing.T, a *peft.Adapter, module string) int {
	t.Helper()
	i, err := a.FindModule(module)
	if err != nil {
		t.Fatal(err)
	}
	return i
}

func uint16Raw(u []uint16) []byte {
	return peft.Uint16Buffer(u, peft.BF16).Data
}

func float32RawView(f []float32) []byte { return peft.Float32Buffer(f).Data }

func TestMergeBufferErrors(t *testing.T) {
	a := mustAdapter(t, fixture("adapters", "llama_lora"))
	w := make([]float32, 16*16)
	layer := "model.layers.0.self_attn.q_proj"
	buf := peft.Float32Buffer(w, 16, 16)
	_, err := a.MergeBuffer("model.layers.0.nothing", buf, nil)
	wantCode(t, err, peft.CodeNotFound)
	_, err = a.MergeBuffer(layer, peft.Float32Buffer(w, 16, 8), nil) // Data longer than the shape
	wantCode(t, err, peft.CodeInvalidArgument)
	_, err = a.MergeBuffer(layer, peft.Float32Buffer(w[:8*16], 8, 16), nil) // a shape that does not fit
	wantCode(t, err, peft.CodeShapeMismatch)
	_, err = a.MergeBuffer(layer, peft.Buffer{Data: make([]byte, 256*8), DType: peft.F64, Shape: []uint64{16, 16}}, nil)
	wantCode(t, err, peft.CodeUnsupported)
	_, err = a.MergeBuffer(layer, buf, nil, peft.WithWeight(math.NaN()))
	wantCode(t, err, peft.CodeInvalidArgument)
	_, err = a.MergeBuffer(layer, peft.Float32Buffer(w, 1<<40, 1<<40), nil)
	wantCode(t, err, peft.CodeValidationOverflow)
	if slices.ContainsFunc(w, func(f float32) bool { return f != 0 }) {
		t.Fatal("a failed merge changed the buffer")
	}
	rec, err := a.MergeBuffer(layer, buf, nil)
	if err != nil {
		t.Fatal(err)
	}
	wantCode(t, rec.Remove(peft.Float32Buffer(w[:128], 8, 16), nil), peft.CodeInvalidArgument) // another shape
	rec.Close()
	wantClosed(t, rec.Remove(buf, nil))
	if rec.Module() != "" || rec.Active() || rec.SavedBytes() != 0 {
		t.Fatal("a closed record still answers")
	}
}

// lora_bias adapters: the layer's bias buffer gets lora_B.bias; a bias of the wrong length or a
// missing one is refused before anything changes.
func TestMergeBufferLoraBias(t *testing.T) {
	baseDir := fixture("models", "qwen2")
	base := mustOpen(t, baseDir)
	a := mustAdapter(t, fixture("adapters", "qwen2_lora_bias"), peft.WithBaseDir(baseDir))
	modules, _ := a.Modules()
	mi := slices.IndexFunc(modules, func(m peft.Module) bool { return m.Tensor("lora_B.bias") >= 0 })
	if mi < 0 {
		t.Fatal("no module with lora_B.bias")
	}
	m := modules[mi]
	weightName := m.Tensors[m.Tensor("lora_A.weight")].BaseName
	biasName := m.Tensors[m.Tensor("lora_B.bias")].BaseName
	winfo, _ := base.TensorByName(weightName)
	w := readTensor32(t, base, weightName)
	b := readTensor32(t, base, biasName)
	origB := slices.Clone(b)
	_, err := a.MergeBuffer(m.Name, peft.Float32Buffer(w, winfo.Shape...), nil)
	wantCode(t, err, peft.CodeInvalidArgument) // the bias is needed
	short := peft.Float32Buffer(b[:len(b)-1], uint64(len(b)-1))
	_, err = a.MergeBuffer(m.Name, peft.Float32Buffer(w, winfo.Shape...), &short)
	wantCode(t, err, peft.CodeShapeMismatch)
	bias := peft.Float32Buffer(b, uint64(len(b)))
	rec, err := a.MergeBuffer(m.Name, peft.Float32Buffer(w, winfo.Shape...), &bias)
	if err != nil {
		t.Fatal(err)
	}
	defer rec.Close()
	biasTensor, err := a.ReadTensorFloat32(m.Index, m.Tensor("lora_B.bias"))
	if err != nil {
		t.Fatal(err)
	}
	for i := range b {
		want := float64(origB[i]) + m.Scaling*float64(biasTensor[i])
		if !closeTo(b[i], want, math.Abs(want)+1e-6) {
			t.Fatalf("bias[%d] = %v, want %v", i, b[i], want)
		}
	}
	// The checkpoint merge writes the same bias.
	out := filepath.Join(t.TempDir(), "merged")
	if _, err := peft.MergeCheckpoint(context.Background(), baseDir, out, peft.WithAdapter(a, 1)); err != nil {
		t.Fatal(err)
	}
	if got := readTensor32(t, mustOpen(t, out), biasName); !slices.Equal(got, b) {
		t.Fatalf("checkpoint merge bias %v, buffer merge %v", got, b)
	}
	if err := rec.Remove(peft.Float32Buffer(w, winfo.Shape...), &bias); err != nil {
		t.Fatal(err)
	}
}

// With a translator, layers are named with the host's own names.
func TestMergeBufferNativeNames(t *testing.T) {
	base := mustOpen(t, fixture("models", "llama"))
	a := mustAdapter(t, fixture("adapters", "llama_lora"))
	tr, err := a.Translator()
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	name := "model.layers.1.mlp.down_proj.weight"
	native, err := tr.ToNative(name)
	if err != nil {
		t.Fatal(err)
	}
	info, _ := base.TensorByName(name)
	w1 := readTensor32(t, base, name)
	w2 := slices.Clone(w1)
	r1, err := a.MergeBuffer(native, peft.Float32Buffer(w1, info.Shape...), nil, peft.WithNativeNames(tr))
	if err != nil {
		t.Fatalf("merge by native name %q: %v", native, err)
	}
	r1.Close()
	r2, err := a.MergeBuffer(name, peft.Float32Buffer(w2, info.Shape...), nil)
	if err != nil {
		t.Fatal(err)
	}
	r2.Close()
	if !slices.Equal(w1, w2) {
		t.Fatal("native and HF names merged differently")
	}
	_, err = a.MergeBuffer("no/such/layer", peft.Float32Buffer(w1, info.Shape...), nil, peft.WithNativeNames(tr))
	wantCode(t, err, peft.CodeUnresolvedKey)
}

// Merges into different buffers with the same adapter, from many goroutines at once.
func TestMergeBufferConcurrent(t *testing.T) {
	base := mustOpen(t, fixture("models", "llama"))
	a := mustAdapter(t, fixture("adapters", "llama_lora"))
	modules, _ := a.Modules()
	want := map[string][]float32{}
	for _, m := range modules {
		name := m.Tensors[0].BaseName
		info, _ := base.TensorByName(name)
		w := readTensor32(t, base, name)
		r, err := a.MergeBuffer(m.Name, peft.Float32Buffer(w, info.Shape...), nil, peft.WithBufferThreads(1))
		if err != nil {
			t.Fatal(err)
		}
		r.Close()
		want[m.Name] = w
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8*len(modules))
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, m := range modules {
				name := m.Tensors[0].BaseName
				info, err := base.TensorByName(name)
				if err != nil {
					errs <- err
					return
				}
				w, err := base.ReadFloat32(info.Index)
				if err != nil {
					errs <- err
					return
				}
				r, err := a.MergeBuffer(m.Name, peft.Float32Buffer(w, info.Shape...), nil)
				if err != nil {
					errs <- err
					return
				}
				r.Close()
				if !slices.Equal(w, want[m.Name]) {
					errs <- errors.New("concurrent merge of " + m.Name + " differs")
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}
