package peft_test

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	peft "github.com/peft-c/peft_c/bindings/go"
)

// hostWeights reads the base weights an adapter's LoRA layers apply to, as float32 buffers.
type hostWeight struct {
	name  string
	shape []uint64
	data  []float32
	orig  []float32
}

func readHostWeights(t *testing.T, base *peft.Checkpoint, a *peft.Adapter) []*hostWeight {
	t.Helper()
	modules, err := a.Modules()
	if err != nil {
		t.Fatal(err)
	}
	var ws []*hostWeight
	for _, m := range modules {
		name := m.Tensors[m.Tensor("lora_A.weight")].BaseName
		info, err := base.TensorByName(name)
		if err != nil {
			t.Fatal(err)
		}
		data := readTensor32(t, base, name)
		ws = append(ws, &hostWeight{name: name, shape: info.Shape, data: data, orig: slices.Clone(data)})
	}
	return ws
}

func mustHostModel(t *testing.T) *peft.HostModel {
	t.Helper()
	h, err := peft.NewHostModel()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

// mergedWith merges adapter dir into base with the checkpoint merge (the reference for a swap).
func mergedWith(t *testing.T, base, dir string, weight float64) *peft.Checkpoint {
	t.Helper()
	out := filepath.Join(t.TempDir(), "merged")
	if _, err := peft.MergeCheckpoint(context.Background(), base, out, peft.WithAdapterDir(dir, weight)); err != nil {
		t.Fatal(err)
	}
	return mustOpen(t, out)
}

func sameAs(t *testing.T, ws []*hostWeight, merged *peft.Checkpoint, what string) {
	t.Helper()
	for _, w := range ws {
		want := w.orig
		if merged != nil {
			want = readTensor32(t, merged, w.name)
		}
		if !slices.Equal(float32Bits(w.data), float32Bits(want)) {
			t.Fatalf("%s: %s differs", what, w.name)
		}
	}
}

// A host model swaps adapters into the host's own buffers: each merge gives the checkpoint merge's
// bytes, and swapping back to none restores the original weights bit for bit.
func TestHostModelSwap(t *testing.T) {
	baseDir := fixture("models", "llama")
	base := mustOpen(t, baseDir)
	dirA, dirB := fixture("adapters", "llama_lora"), fixture("adapters", "llama_lora_second")
	reg := mustRegistry(t, peft.F32, 1<<20)
	mustRegister(t, reg, "a", dirA)
	mustRegister(t, reg, "b", dirB)
	ws := readHostWeights(t, base, mustAdapter(t, dirA))
	host := mustHostModel(t)
	for _, w := range ws {
		if err := host.AddWeight(w.name, peft.Float32Buffer(w.data, w.shape...), nil); err != nil {
			t.Fatal(err)
		}
	}
	lmHead := readTensor32(t, base, "lm_head.weight") // a weight no adapter touches
	lmOrig := slices.Clone(lmHead)
	if err := host.AddWeight("lm_head", peft.Float32Buffer(lmHead, 64, 16), nil); err != nil {
		t.Fatal(err)
	}
	if host.Current() != "" {
		t.Fatalf("Current before any swap: %q", host.Current())
	}

	la := mustAcquire(t, reg, "a")
	st, err := host.Swap(la, 1)
	if err != nil {
		t.Fatal(err)
	}
	la.Close() // the host model holds the adapter itself
	gcPoint()
	if st.LayersMerged != uint64(len(ws)) || st.LayersRemoved != 0 || st.SavedBytes == 0 || host.Current() != "a" {
		t.Fatalf("swap to a: %+v, current %q", st, host.Current())
	}
	sameAs(t, ws, mergedWith(t, baseDir, dirA, 1), "merged a")
	if err := reg.Trim(); err != nil {
		t.Fatal(err)
	}
	if s := mustStats(t, reg); s.Pinned != 1 || s.Loaded != 1 {
		t.Fatalf("the merged adapter was not pinned by the host model: %+v", s)
	}

	lb := mustAcquire(t, reg, "b")
	if st, err = host.Swap(lb, 0.5); err != nil {
		t.Fatal(err)
	}
	lb.Close()
	if st.LayersRemoved != uint64(len(ws)) || st.LayersMerged != uint64(len(ws)) || host.Current() != "b" {
		t.Fatalf("swap a -> b: %+v, current %q", st, host.Current())
	}
	sameAs(t, ws, mergedWith(t, baseDir, dirB, 0.5), "merged b at 0.5")

	if st, err = host.Swap(nil, 1); err != nil {
		t.Fatal(err)
	}
	if st.LayersRemoved != uint64(len(ws)) || st.LayersMerged != 0 || host.Current() != "" {
		t.Fatalf("swap b -> none: %+v, current %q", st, host.Current())
	}
	sameAs(t, ws, nil, "swapped back to none")
	if !slices.Equal(float32Bits(lmHead), float32Bits(lmOrig)) {
		t.Fatal("a weight no adapter targets changed")
	}
	if err := reg.Trim(); err != nil {
		t.Fatal(err)
	}
	if s := mustStats(t, reg); s.Pinned != 0 || s.Loaded != 0 {
		t.Fatalf("after swapping to none and trimming: %+v", s)
	}

	// Not exact: PEFT's arithmetic unmerge, within rounding of the original.
	if err := host.SetExact(false); err != nil {
		t.Fatal(err)
	}
	la = mustAcquire(t, reg, "a")
	savedExact := st.SavedBytes // the copies taken by the exact swaps, kept
	if st, err = host.Swap(la, 1); err != nil || st.SavedBytes != savedExact {
		t.Fatalf("inexact swap: %+v (%d bytes of copies kept before), %v", st, savedExact, err)
	}
	if _, err = host.Swap(nil, 1); err != nil {
		t.Fatal(err)
	}
	adapter := mustAdapter(t, dirA)
	for _, w := range ws {
		mod, _ := adapter.Module(mustFind(t, adapter, w.name[:len(w.name)-len(".weight")]))
		_, magnitude := loraDelta(t, adapter, mod, 1)
		for i := range w.data {
			if !closeTo(w.data[i], float64(w.orig[i]), 2*(math.Abs(float64(w.orig[i]))+2*magnitude[i])) {
				t.Fatalf("%s[%d]: %v after an arithmetic unmerge, was %v", w.name, i, w.data[i], w.orig[i])
			}
		}
	}
}

// With a translator the host names its weights its own way.
func TestHostModelNativeNames(t *testing.T) {
	baseDir, dir := fixture("models", "llama"), fixture("adapters", "llama_lora")
	adapter := mustAdapter(t, dir)
	tr, err := adapter.Translator()
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	reg := mustRegistry(t, peft.F32, 1<<20)
	mustRegister(t, reg, "a", dir)
	ws := readHostWeights(t, mustOpen(t, baseDir), adapter)
	host := mustHostModel(t)
	if err := host.SetTranslator(tr); err != nil {
		t.Fatal(err)
	}
	for _, w := range ws {
		native, err := tr.ToNative(w.name)
		if err != nil {
			t.Fatal(err)
		}
		if err := host.AddWeight(native, peft.Float32Buffer(w.data, w.shape...), nil); err != nil {
			t.Fatalf("AddWeight(%q): %v", native, err)
		}
	}
	wantCode(t, host.SetTranslator(nil), peft.CodeInvalidArgument) // after weights were added
	wantCode(t, host.AddWeight("no/such/weight", peft.Float32Buffer(make([]float32, 4), 2, 2), nil), peft.CodeUnresolvedKey)
	if _, err := host.Swap(mustAcquire(t, reg, "a"), 1); err != nil {
		t.Fatal(err)
	}
	sameAs(t, ws, mergedWith(t, baseDir, dir, 1), "merged through native names")
	if _, err := host.Swap(nil, 1); err != nil {
		t.Fatal(err)
	}
	sameAs(t, ws, nil, "swapped back to none")
}

// lora_bias adapters add lora_B.bias to the host's bias buffers, and swapping out restores them.
func TestHostModelLoraBias(t *testing.T) {
	baseDir, dir := fixture("models", "qwen2"), fixture("adapters", "qwen2_lora_bias")
	base := mustOpen(t, baseDir)
	adapter := mustAdapter(t, dir, peft.WithBaseDir(baseDir))
	reg := mustRegistry(t, peft.F32, 1<<20)
	if err := reg.Register("bias", dir, peft.WithBaseDir(baseDir)); err != nil {
		t.Fatal(err)
	}
	lease := mustAcquire(t, reg, "bias")
	ws := readHostWeights(t, base, adapter)
	biases := make([]*hostWeight, len(ws))
	plain := mustHostModel(t)
	host := mustHostModel(t)
	for i, w := range ws {
		name := w.name[:len(w.name)-len(".weight")] + ".bias"
		b := readTensor32(t, base, name)
		biases[i] = &hostWeight{name: name, shape: []uint64{uint64(len(b))}, data: b, orig: slices.Clone(b)}
		bias := peft.Float32Buffer(b, uint64(len(b)))
		if err := host.AddWeight(w.name, peft.Float32Buffer(w.data, w.shape...), &bias); err != nil {
			t.Fatal(err)
		}
		if err := plain.AddWeight(w.name, peft.Float32Buffer(slices.Clone(w.orig), w.shape...), nil); err != nil {
			t.Fatal(err)
		}
	}
	_, err := plain.Swap(lease, 1)
	wantCode(t, err, peft.CodeInvalidArgument) // the adapter needs the bias buffers
	if _, err := host.Swap(lease, 1); err != nil {
		t.Fatal(err)
	}
	merged := mergedWith(t, baseDir, dir, 1)
	sameAs(t, ws, merged, "merged weights")
	sameAs(t, biases, merged, "merged biases")
	if _, err := host.Swap(nil, 1); err != nil {
		t.Fatal(err)
	}
	sameAs(t, ws, nil, "weights swapped back")
	sameAs(t, biases, nil, "biases swapped back")
}

// A bias one element shorter or longer than its layer's output features is refused at the swap with
// ErrShapeMismatch naming the layer; no weight or bias changes (nor is a bias written past its end).
// An empty bias is refused at once.
func TestHostModelLoraBiasOfAnotherLength(t *testing.T) {
	baseDir, dir := fixture("models", "qwen2"), fixture("adapters", "qwen2_lora_bias")
	base := mustOpen(t, baseDir)
	adapter := mustAdapter(t, dir, peft.WithBaseDir(baseDir))
	reg := mustRegistry(t, peft.F32, 1<<20)
	mustRegister(t, reg, "bias", dir)
	lease := mustAcquire(t, reg, "bias")
	const wrong = "model.layers.0.self_attn.v_proj.weight" // [8, 16]: 8 output features
	for _, change := range []int{-1, 1} {
		ws := readHostWeights(t, base, adapter)
		var biases []*hostWeight
		host := mustHostModel(t)
		for _, w := range ws {
			name := w.name[:len(w.name)-len(".weight")] + ".bias"
			b := readTensor32(t, base, name)
			if w.name == wrong {
				if len(b) != 8 {
					t.Fatalf("%s has %d elements, the test expects 8", name, len(b))
				}
				b = append(b, 0.5)[:8+change] // the 8 values and one more, or 7 of them
			}
			biases = append(biases, &hostWeight{name: name, data: b, orig: slices.Clone(b)})
			bias := peft.Float32Buffer(b, uint64(len(b)))
			if err := host.AddWeight(w.name, peft.Float32Buffer(w.data, w.shape...), &bias); err != nil {
				t.Fatal(err)
			}
		}
		_, err := host.Swap(lease, 1)
		wantCode(t, err, peft.CodeShapeMismatch)
		if !strings.Contains(err.Error(), "v_proj") {
			t.Fatalf("the error does not name the layer: %v", err)
		}
		if host.Current() != "" {
			t.Fatalf("Current after a refused swap: %q", host.Current())
		}
		sameAs(t, ws, nil, fmt.Sprintf("weights after a refused swap (bias %+d)", change))
		sameAs(t, biases, nil, fmt.Sprintf("biases after a refused swap (bias %+d)", change))
	}

	host := mustHostModel(t)
	empty := peft.Buffer{Data: []byte{}, DType: peft.F32}
	wantCode(t, host.AddWeight(wrong, peft.Float32Buffer(make([]float32, 8*16), 8, 16), &empty), peft.CodeShapeMismatch)
	odd := peft.Buffer{Data: make([]byte, 6), DType: peft.F32}
	wantCode(t, host.AddWeight(wrong, peft.Float32Buffer(make([]float32, 8*16), 8, 16), &odd), peft.CodeInvalidArgument)
}

// Swaps that cannot be done completely change nothing; weights are refused when they cannot be used.
func TestHostModelErrors(t *testing.T) {
	baseDir, dir := fixture("models", "llama"), fixture("adapters", "llama_lora")
	base := mustOpen(t, baseDir)
	reg := mustRegistry(t, peft.F32, 1<<20)
	mustRegister(t, reg, "a", dir)
	lease := mustAcquire(t, reg, "a")
	ws := readHostWeights(t, base, mustAdapter(t, dir))

	// Only some of the adapter's layers: UNRESOLVED_KEY, nothing merged.
	partial := mustHostModel(t)
	if err := partial.AddWeight(ws[0].name, peft.Float32Buffer(ws[0].data, ws[0].shape...), nil); err != nil {
		t.Fatal(err)
	}
	_, err := partial.Swap(lease, 1)
	wantCode(t, err, peft.CodeUnresolvedKey)
	sameAs(t, ws[:1], nil, "a refused swap")
	if partial.Current() != "" {
		t.Fatal("a refused swap set Current")
	}

	// A weight of another shape under a layer's name: SHAPE_MISMATCH, nothing merged.
	host := mustHostModel(t)
	var q, k *hostWeight
	for _, w := range ws {
		switch w.name {
		case "model.layers.0.self_attn.q_proj.weight":
			q = w
		case "model.layers.0.self_attn.k_proj.weight":
			k = w
		}
	}
	for _, w := range ws {
		buf := peft.Float32Buffer(w.data, w.shape...)
		if w == q {
			buf = peft.Float32Buffer(k.data, k.shape...) // [8, 16] where [16, 16] is needed
		}
		if w == k {
			continue
		}
		if err := host.AddWeight(w.name, buf, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := host.AddWeight(k.name, peft.Float32Buffer(make([]float32, 8*16), 8, 16), nil); err != nil {
		t.Fatal(err)
	}
	_, err = host.Swap(lease, 1)
	wantCode(t, err, peft.CodeShapeMismatch)
	sameAs(t, ws, nil, "a swap refused for a shape")

	good := mustHostModel(t)
	for _, w := range ws {
		if err := good.AddWeight(w.name, peft.Float32Buffer(w.data, w.shape...), nil); err != nil {
			t.Fatal(err)
		}
	}
	w0 := ws[0]
	wantCode(t, good.AddWeight(w0.name, peft.Float32Buffer(w0.data, w0.shape...), nil), peft.CodeInvalidArgument) // twice
	wantCode(t, good.AddWeight("lm_head", peft.Float32Buffer(make([]float32, 10), 64, 16), nil), peft.CodeInvalidArgument)
	wantCode(t, good.AddWeight("lm_head", peft.Buffer{Data: make([]byte, 64*16*8), DType: peft.F64, Shape: []uint64{64, 16}}, nil), peft.CodeUnsupported)
	wantCode(t, good.AddWeight("lm_head\x00", peft.Float32Buffer(make([]float32, 64*16), 64, 16), nil), peft.CodeInvalidArgument)
	_, err = good.Swap(lease, math.NaN())
	wantCode(t, err, peft.CodeInvalidArgument)
	_, err = good.Swap(lease, math.Inf(1))
	wantCode(t, err, peft.CodeInvalidArgument)
	sameAs(t, ws, nil, "a swap with a weight that is not finite")
	if _, err := good.Swap(lease, 1); err != nil {
		t.Fatal(err)
	}
	wantCode(t, good.AddWeight("lm_head", peft.Float32Buffer(make([]float32, 64*16), 64, 16), nil), peft.CodeInvalidArgument) // while merged

	// Exact mode: the host model owns the buffers' contents; taking the adapter out writes the
	// original bytes back over whatever someone else wrote.
	w0.data[3] += 1
	if _, err := good.Swap(nil, 1); err != nil {
		t.Fatal(err)
	}
	sameAs(t, ws, nil, "restored over a write behind the host model's back")

	closed := mustAcquire(t, reg, "a")
	closed.Close()
	_, err = good.Swap(closed, 1)
	wantClosed(t, err)
}

// A LoRA on fused MoE experts (target_parameters) swapped into Mixtral's experts held fused, as
// transformers 5 holds them in memory ([experts, out, in] buffers under the parameter's name): each
// expert's slice equals the checkpoint merge of its saved tensors, swapping to none restores every
// byte, and unmerged apply refuses the layers they adapt.
func TestHostModelSwapFusedExperts(t *testing.T) {
	baseDir := fixture("models", "mixtral")
	dir := fixture("adapters", "mixtral_target_parameters")
	base := mustOpen(t, baseDir)
	merged := mergedWith(t, baseDir, dir, 1)
	const experts = 2
	// A fused buffer: each expert's saved tensors (gate then up for gate_up_proj) one after another.
	type fused struct {
		name       string
		saved      []string
		shape      []uint64
		data, orig []float32
	}
	var weights []*fused
	for layer := 0; layer < 2; layer++ {
		at := func(e int, w string) string {
			return fmt.Sprintf("model.layers.%d.block_sparse_moe.experts.%d.%s.weight", layer, e, w)
		}
		for _, p := range []struct {
			param string
			parts []string
		}{{"gate_up_proj", []string{"w1", "w3"}}, {"down_proj", []string{"w2"}}} {
			w := &fused{name: fmt.Sprintf("model.layers.%d.mlp.experts.%s", layer, p.param)}
			var rows uint64
			for e := 0; e < experts; e++ {
				rows = 0
				for _, part := range p.parts {
					info, err := base.TensorByName(at(e, part))
					if err != nil {
						t.Fatal(err)
					}
					rows += info.Shape[0]
					w.shape = []uint64{experts, 0, info.Shape[1]}
					w.saved = append(w.saved, at(e, part))
					w.data = append(w.data, readTensor32(t, base, at(e, part))...)
				}
			}
			w.shape[1] = rows
			w.orig = slices.Clone(w.data)
			weights = append(weights, w)
		}
		q := fmt.Sprintf("model.layers.%d.self_attn.q_proj.weight", layer)
		info, err := base.TensorByName(q)
		if err != nil {
			t.Fatal(err)
		}
		data := readTensor32(t, base, q)
		weights = append(weights, &fused{name: q, saved: []string{q}, shape: info.Shape, data: data, orig: slices.Clone(data)})
	}

	reg := mustRegistry(t, peft.F32, 1<<20)
	mustRegister(t, reg, "experts", dir)
	host := mustHostModel(t)
	for _, w := range weights {
		if err := host.AddWeight(w.name, peft.Float32Buffer(w.data, w.shape...), nil); err != nil {
			t.Fatal(err)
		}
	}
	lease := mustAcquire(t, reg, "experts")
	st, err := host.Swap(lease, 1)
	if err != nil {
		t.Fatal(err)
	}
	if st.LayersMerged != uint64(len(weights)) {
		t.Fatalf("swap: %+v for %d weights", st, len(weights))
	}
	for _, w := range weights {
		var want []float32
		for _, s := range w.saved {
			want = append(want, readTensor32(t, merged, s)...)
		}
		if !slices.Equal(float32Bits(w.data), float32Bits(want)) {
			t.Fatalf("%s differs from the checkpoint merge", w.name)
		}
		if slices.Equal(w.data, w.orig) {
			t.Fatalf("%s unchanged", w.name)
		}
	}
	x, y := make([]float32, 16), make([]float32, 32)
	err = peft.LoraApply("model.layers.0.block_sparse_moe.experts.0.w1", []*peft.Lease{lease}, nil,
		peft.Float32Buffer(x, 1, 16), peft.Float32Buffer(y, 1, 32))
	wantCode(t, err, peft.CodeUnsupported)
	if !strings.Contains(err.Error(), "target_parameters") {
		t.Fatalf("unmerged apply: %v", err)
	}
	lease.Close()
	if _, err := host.Swap(nil, 1); err != nil {
		t.Fatal(err)
	}
	for _, w := range weights {
		if !slices.Equal(float32Bits(w.data), float32Bits(w.orig)) {
			t.Fatalf("%s not restored", w.name)
		}
	}
}
