package peft_test

import (
	"context"
	"errors"
	"math"
	"path/filepath"
	"slices"
	"testing"

	peft "github.com/peft-c/peft_c/bindings/go"
)

// readWeight reads one tensor of a model folder's model.safetensors as float32.
func readWeight(t *testing.T, dir, name string) []float32 {
	t.Helper()
	ckpt := mustOpen(t, filepath.Join(dir, "model.safetensors"))
	i, err := ckpt.Find(name)
	if err != nil {
		t.Fatal(err)
	}
	w, err := ckpt.ReadFloat32(i)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// matmulT is x [rows, in] times w [out, in] transposed, accumulated in float64.
func matmulT(x, w []float32, rows, in, out int) []float64 {
	y := make([]float64, rows*out)
	for i := 0; i < rows; i++ {
		for o := 0; o < out; o++ {
			var s float64
			for k := 0; k < in; k++ {
				s += float64(x[i*in+k]) * float64(w[o*in+k])
			}
			y[i*out+o] = s
		}
	}
	return y
}

func toFloat32(v []float64) []float32 {
	f := make([]float32, len(v))
	for i, x := range v {
		f[i] = float32(x)
	}
	return f
}

// DoRA in unmerged apply: with the layer's base weight given by SetBaseWeight, LoraApply on the base
// output gives x times the DoRA-merged weight (MergeCheckpoint's), and BaseWeightsChanged makes the
// registry use the buffer's new contents, as a fresh registry does.
func TestLoraApplyDoRA(t *testing.T) {
	const module, rows, n = "model.layers.0.self_attn.q_proj", 4, 16
	base := fixture("models", "llama")
	merged := filepath.Join(t.TempDir(), "merged")
	if _, err := peft.MergeCheckpoint(context.Background(), base, merged,
		peft.WithAdapterDir(fixture("adapters", "llama_dora"), 1)); err != nil {
		t.Fatal(err)
	}
	w := readWeight(t, base, module+".weight")
	wm := readWeight(t, merged, module+".weight")
	x := randomFloats(21, rows*n)
	y0 := toFloat32(matmulT(x, w, rows, n, n))
	want := matmulT(x, wm, rows, n, n)

	reg := mustRegistry(t, peft.F32, 1<<20)
	mustRegister(t, reg, "dora", fixture("adapters", "llama_dora"))
	lease := mustAcquire(t, reg, "dora")
	if err := reg.SetBaseWeight(module, peft.Float32Buffer(w, n, n), nil); err != nil {
		t.Fatal(err)
	}
	gcPoint()
	apply := func(l *peft.Lease, y0 []float32) []float32 {
		t.Helper()
		y := slices.Clone(y0)
		if err := peft.LoraApply(module, []*peft.Lease{l}, nil, peft.Float32Buffer(x, rows, n), peft.Float32Buffer(y, rows, n)); err != nil {
			t.Fatal(err)
		}
		return y
	}
	got := apply(lease, y0)
	for i := range got {
		if math.Abs(float64(got[i])-want[i]) > 1e-5*(1+math.Abs(want[i])) {
			t.Fatalf("element %d: %v, x W_merged^T = %v", i, got[i], want[i])
		}
	}

	// The host doubles its weight in place: the kept scale stays until BaseWeightsChanged.
	for i := range w {
		w[i] *= 2
	}
	y2 := toFloat32(matmulT(x, w, rows, n, n))
	stale := apply(lease, y2)
	if err := reg.BaseWeightsChanged(); err != nil {
		t.Fatal(err)
	}
	fresh := apply(lease, y2)
	if slices.Equal(float32Bits(stale), float32Bits(fresh)) {
		t.Fatal("BaseWeightsChanged did not change the DoRA output")
	}
	other := mustRegistry(t, peft.F32, 1<<20)
	mustRegister(t, other, "dora", fixture("adapters", "llama_dora"))
	w2 := slices.Clone(w)
	if err := other.SetBaseWeight(module+".weight", peft.Float32Buffer(w2, n, n), &peft.Buffer{}); err == nil {
		t.Fatal("an empty bias buffer was accepted")
	}
	if err := other.SetBaseWeight(module+".weight", peft.Float32Buffer(w2, n, n), nil); err != nil {
		t.Fatal(err)
	}
	if ref := apply(mustAcquire(t, other, "dora"), y2); !slices.Equal(float32Bits(ref), float32Bits(fresh)) {
		t.Fatal("after BaseWeightsChanged the output differs from a registry given the new weight")
	}

	// A zero bias gives the same output (the base output then holds no bias to take out).
	zero := make([]float32, n)
	if err := other.SetBaseWeight(module, peft.Float32Buffer(w2, n, n), &peft.Buffer{Data: peft.Float32Buffer(zero).Data, DType: peft.F32, Shape: []uint64{n}}); err != nil {
		t.Fatal(err)
	}
	if ref := apply(mustAcquire(t, other, "dora"), y2); !slices.Equal(float32Bits(ref), float32Bits(fresh)) {
		t.Fatal("a zero bias changed the output")
	}

	// Errors with the library's codes.
	wantCode(t, reg.SetBaseWeight(module, peft.Float32Buffer(w, 2, 8, 16), nil), peft.CodeShapeMismatch)
	wantCode(t, reg.SetBaseWeight(module, peft.Buffer{Data: make([]byte, n*n*8), DType: peft.F64, Shape: []uint64{n, n}}, nil), peft.CodeUnsupported)
	wantCode(t, reg.SetBaseWeight(module, peft.Float32Buffer(w[:8], n, n), nil), peft.CodeInvalidArgument)
	wantCode(t, reg.SetBaseWeight("a\x00b", peft.Float32Buffer(w, n, n), nil), peft.CodeInvalidArgument)
	// A weight whose shape does not fit the DoRA layer is refused by the apply.
	if err := reg.SetBaseWeight(module, peft.Float32Buffer(w[:8*n], 8, n), nil); err != nil {
		t.Fatal(err)
	}
	y := slices.Clone(y2)
	wantCode(t, peft.LoraApply(module, []*peft.Lease{lease}, nil, peft.Float32Buffer(x, rows, n), peft.Float32Buffer(y, rows, n)), peft.CodeShapeMismatch)
	reg.Close()
	if err := reg.BaseWeightsChanged(); !errors.Is(err, peft.ErrClosed) {
		t.Fatalf("BaseWeightsChanged on a closed registry: %v", err)
	}
}
