package peft_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	peft "github.com/peft-c/peft_c/bindings/go"
)

// loraDelta computes weight * scaling * B @ A in float64 for a Linear module ([out, r] @ [r, in])
// from the adapter's own tensors, an independent check of the library's merge, together with the
// magnitude weight * scaling * sum |B_ok A_ki| of each element's terms (which bounds the rounding
// error of a float32 computation).
func loraDelta(t *testing.T, a *peft.Adapter, mod peft.Module, weight float64) (delta, magnitude []float64) {
	t.Helper()
	ai, bi := mod.Tensor("lora_A.weight"), mod.Tensor("lora_B.weight")
	if mod.Kind != peft.LayerLinear || ai < 0 || bi < 0 {
		t.Fatalf("module %s is not a plain Linear LoRA layer", mod.Name)
	}
	A, err := a.ReadTensorFloat32(mod.Index, ai)
	if err != nil {
		t.Fatal(err)
	}
	B, err := a.ReadTensorFloat32(mod.Index, bi)
	if err != nil {
		t.Fatal(err)
	}
	r, in, out := int(mod.Tensors[ai].Shape[0]), int(mod.Tensors[ai].Shape[1]), int(mod.Tensors[bi].Shape[0])
	delta, magnitude = make([]float64, out*in), make([]float64, out*in)
	s := weight * mod.Scaling
	for o := 0; o < out; o++ {
		for i := 0; i < in; i++ {
			var sum, abs float64
			for k := 0; k < r; k++ {
				p := float64(B[o*r+k]) * float64(A[k*in+i])
				sum, abs = sum+p, abs+math.Abs(p)
			}
			delta[o*in+i], magnitude[o*in+i] = s*sum, math.Abs(s)*abs
		}
	}
	return delta, magnitude
}

// closeTo accepts the rounding of a float32 computation whose terms have this magnitude: a float32
// dot product of rank r and one addition err by at most (r + 2) units of 2^-24 of it; 8 units
// covers the fixtures' ranks.
func closeTo(got float32, want, magnitude float64) bool {
	return math.Abs(float64(got)-want) <= 8*0x1p-24*magnitude
}

func readTensor32(t *testing.T, c *peft.Checkpoint, name string) []float32 {
	t.Helper()
	i, err := c.Find(name)
	if err != nil {
		t.Fatal(err)
	}
	f, err := c.ReadFloat32(i)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// Merging llama_lora into the llama fixture: every targeted weight is W + scaling * B @ A (computed
// here in float64), every other tensor is the base's byte for byte, and the small files are copied.
func TestMergeCheckpoint(t *testing.T) {
	base := fixture("models", "llama")
	adapterDir := fixture("adapters", "llama_lora")
	out := filepath.Join(t.TempDir(), "merged")
	var calls []uint64
	var total uint64
	res, err := peft.MergeCheckpoint(context.Background(), base, out, peft.WithAdapterDir(adapterDir, 1),
		peft.WithProgress(func(done, tot uint64) {
			calls = append(calls, done)
			total = tot
			gcPoint()
		}))
	if err != nil {
		t.Fatal(err)
	}
	a := mustAdapter(t, adapterDir, peft.WithBaseDir(base))
	baseCkpt := mustOpen(t, base)
	merged := mustOpen(t, out)
	if res.Merged != uint64(a.ModuleCount()) || res.Replaced != 0 || res.Added != 0 ||
		res.Merged+res.Copied != uint64(baseCkpt.TensorCount()) {
		t.Fatalf("result %+v for %d modules, %d tensors", res, a.ModuleCount(), baseCkpt.TensorCount())
	}
	for _, f := range []string{"model.safetensors", "config.json", "generation_config.json"} {
		if !slices.Contains(res.Files, f) {
			t.Fatalf("files %v lack %s", res.Files, f)
		}
	}
	sameFile(t, filepath.Join(out, "config.json"), filepath.Join(base, "config.json"))
	// Progress: 0 first, never decreasing, total at the end, total = bytes written.
	if len(calls) < 2 || calls[0] != 0 || calls[len(calls)-1] != total || total != res.Bytes ||
		!slices.IsSorted(calls) {
		t.Fatalf("progress %v of %d, result bytes %d", calls, total, res.Bytes)
	}
	checkMerged(t, baseCkpt, merged, []*peft.Adapter{a}, []float64{1})
}

// checkMerged compares a merged checkpoint with base + the weighted deltas of the adapters.
func checkMerged(t *testing.T, baseCkpt, merged *peft.Checkpoint, adapters []*peft.Adapter, weights []float64) {
	t.Helper()
	deltas, magnitudes := map[string][]float64{}, map[string][]float64{}
	for ai, a := range adapters {
		modules, _ := a.Modules()
		for _, m := range modules {
			d, mag := loraDelta(t, a, m, weights[ai])
			name := m.Tensors[m.Tensor("lora_A.weight")].BaseName
			if prev, ok := deltas[name]; ok {
				for i := range d {
					d[i] += prev[i]
					mag[i] += magnitudes[name][i]
				}
			}
			deltas[name], magnitudes[name] = d, mag
		}
	}
	infos, _ := baseCkpt.Tensors()
	if merged.TensorCount() != len(infos) {
		t.Fatalf("%d tensors merged, base has %d", merged.TensorCount(), len(infos))
	}
	for _, info := range infos {
		mi, err := merged.Find(info.Name)
		if err != nil {
			t.Fatal(err)
		}
		delta, targeted := deltas[info.Name]
		if !targeted {
			bv, _ := baseCkpt.View(info.Index)
			mv, _ := merged.View(mi)
			if !bytes.Equal(bv, mv) {
				t.Fatalf("untargeted %q changed", info.Name)
			}
			continue
		}
		w := readTensor32(t, baseCkpt, info.Name)
		got := readTensor32(t, merged, info.Name)
		changed := 0
		for i := range w {
			want := float64(w[i]) + delta[i]
			// Adapters merged one after the other round once per adapter.
			if !closeTo(got[i], want, float64(len(adapters))*(math.Abs(float64(w[i]))+magnitudes[info.Name][i])) {
				t.Fatalf("%q[%d] = %v, want %v (base %v)", info.Name, i, got[i], want, w[i])
			}
			if got[i] != w[i] {
				changed++
			}
		}
		if changed == 0 {
			t.Fatalf("%q did not change", info.Name)
		}
	}
}

// Two adapters with weights, applied in order.
func TestMergeWeightedAdapters(t *testing.T) {
	base := fixture("models", "llama")
	a1 := mustAdapter(t, fixture("adapters", "llama_lora"))
	a2 := mustAdapter(t, fixture("adapters", "llama_lora_second"))
	out := filepath.Join(t.TempDir(), "merged")
	_, err := peft.MergeCheckpoint(context.Background(), base, out,
		peft.WithAdapter(a1, 0.75), peft.WithAdapter(a2, -0.5), peft.WithThreads(1))
	if err != nil {
		t.Fatal(err)
	}
	checkMerged(t, mustOpen(t, base), mustOpen(t, out), []*peft.Adapter{a1, a2}, []float64{0.75, -0.5})
}

// Output dtype and resharding: the tensors come out in BF16, split into shards with an index, and
// hold the F32 merge rounded once.
func TestMergeDTypeAndShards(t *testing.T) {
	base := fixture("models", "llama")
	dir := t.TempDir()
	f32Out, bf16Out := filepath.Join(dir, "f32"), filepath.Join(dir, "bf16")
	ctx := context.Background()
	if _, err := peft.MergeCheckpoint(ctx, base, f32Out, peft.WithAdapterDir(fixture("adapters", "llama_lora"), 1)); err != nil {
		t.Fatal(err)
	}
	res, err := peft.MergeCheckpoint(ctx, base, bf16Out, peft.WithAdapterDir(fixture("adapters", "llama_lora"), 1),
		peft.WithMergeDType(peft.BF16), peft.WithMaxShardSize(4096))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(res.Files, "model.safetensors.index.json") {
		t.Fatalf("no index among %v", res.Files)
	}
	f32c, bf16c := mustOpen(t, f32Out), mustOpen(t, bf16Out)
	if bf16c.FileCount() < 2 {
		t.Fatalf("%d shards", bf16c.FileCount())
	}
	var config map[string]any
	readJSON(t, filepath.Join(bf16Out, "config.json"), &config)
	if config["torch_dtype"] != "bfloat16" && config["dtype"] != "bfloat16" {
		t.Fatalf("config.json dtype not set: %v / %v", config["torch_dtype"], config["dtype"])
	}
	infos, _ := f32c.Tensors()
	for _, info := range infos {
		bi, err := bf16c.Find(info.Name)
		if err != nil {
			t.Fatal(err)
		}
		binfo, _ := bf16c.Tensor(bi)
		if binfo.DType != peft.BF16 {
			t.Fatalf("%q is %v", info.Name, binfo.DType)
		}
		f32view, _ := f32c.View(info.Index)
		want := make([]byte, len(f32view)/2)
		if err := peft.Convert(want, peft.BF16, f32view, peft.F32); err != nil {
			t.Fatal(err)
		}
		got, _ := bf16c.View(bi)
		// Rounding the f32 result once to bf16 equals computing in f32 and rounding once, except where
		// the f32 result itself was a rounding away from a bf16 tie; allow one bf16 ulp there.
		for i := 0; i+1 < len(got); i += 2 {
			g := int(uint16(got[i]) | uint16(got[i+1])<<8)
			w := int(uint16(want[i]) | uint16(want[i+1])<<8)
			if g != w && (g-w > 1 || w-g > 1) {
				t.Fatalf("%q element %d: bf16 %#04x, rounded f32 merge %#04x", info.Name, i/2, g, w)
			}
		}
	}
}

// Cancelling the context stops the merge: the error matches ErrCancelled and context.Canceled, and
// the output folder is as it was (absent).
func TestMergeCancel(t *testing.T) {
	base := fixture("models", "llama")
	out := filepath.Join(t.TempDir(), "cancelled")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	calls := 0
	_, err := peft.MergeCheckpoint(ctx, base, out, peft.WithAdapterDir(fixture("adapters", "llama_lora"), 1),
		peft.WithProgress(func(done, total uint64) {
			if calls++; calls == 2 {
				cancel()
			}
		}))
	wantCode(t, err, peft.CodeCancelled)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("%v does not match context.Canceled", err)
	}
	if _, statErr := os.Stat(out); !os.IsNotExist(statErr) {
		t.Fatal("the cancelled merge left its output folder")
	}
	// A context that is already done does not start the merge.
	dead, cancel2 := context.WithTimeout(context.Background(), -1)
	defer cancel2()
	_, err = peft.MergeCheckpoint(dead, base, out, peft.WithAdapterDir(fixture("adapters", "llama_lora"), 1))
	if !errors.Is(err, peft.ErrCancelled) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("dead context: %v", err)
	}
	// An existing output folder keeps its content after a cancelled merge.
	keep := filepath.Join(t.TempDir(), "existing")
	os.MkdirAll(keep, 0o755)
	os.WriteFile(filepath.Join(keep, "model.safetensors"), []byte("old"), 0o644)
	ctx3, cancel3 := context.WithCancel(context.Background())
	_, err = peft.MergeCheckpoint(ctx3, base, keep, peft.WithAdapterDir(fixture("adapters", "llama_lora"), 1),
		peft.WithProgress(func(done, total uint64) {
			if done > 0 {
				cancel3()
			}
		}))
	cancel3()
	wantCode(t, err, peft.CodeCancelled)
	entries, _ := os.ReadDir(keep)
	if data, _ := os.ReadFile(filepath.Join(keep, "model.safetensors")); string(data) != "old" || len(entries) != 1 {
		t.Fatalf("the output folder changed: %d entries", len(entries))
	}
}

// A panic in the progress function cancels the merge and is raised again in the caller.
func TestMergeProgressPanic(t *testing.T) {
	out := filepath.Join(t.TempDir(), "panicked")
	defer func() {
		if r := recover(); r != "progress failed" {
			t.Fatalf("recovered %v", r)
		}
		if _, err := os.Stat(out); !os.IsNotExist(err) {
			t.Fatal("output left behind")
		}
	}()
	peft.MergeCheckpoint(context.Background(), fixture("models", "llama"), out,
		peft.WithAdapterDir(fixture("adapters", "llama_lora"), 1),
		peft.WithProgress(func(done, total uint64) { panic("progress failed") }))
	t.Fatal("the panic was swallowed")
}

func TestMergeErrors(t *testing.T) {
	ctx := context.Background()
	base := fixture("models", "llama")
	dir := t.TempDir()
	_, err := peft.MergeCheckpoint(ctx, base, filepath.Join(dir, "a"))
	wantCode(t, err, peft.CodeInvalidArgument) // no adapters
	_, err = peft.MergeCheckpoint(ctx, base, base, peft.WithAdapterDir(fixture("adapters", "llama_lora"), 1))
	wantCode(t, err, peft.CodeInvalidArgument) // out = base
	_, err = peft.MergeCheckpoint(ctx, base, filepath.Join(dir, "b"), peft.WithAdapterDir(fixture("adapters", "gpt2_lora"), 1))
	var e *peft.Error
	if !errors.As(err, &e) || (e.Code != peft.CodeUnresolvedKey && e.Code != peft.CodeShapeMismatch) {
		t.Fatalf("gpt2 adapter on llama: %v", err)
	}
	_, err = peft.MergeCheckpoint(ctx, base, filepath.Join(dir, "c"), peft.WithAdapterDir(fixture("adapters", "llama_lora"), math.Inf(1)))
	wantCode(t, err, peft.CodeInvalidArgument)
	_, err = peft.MergeCheckpoint(ctx, base, filepath.Join(dir, "d"), peft.WithAdapterDir(fixture("adapters", "llama_lora"), 1),
		peft.WithMergeDType(peft.I32))
	wantCode(t, err, peft.CodeInvalidArgument)
	_, err = peft.MergeCheckpoint(ctx, filepath.Join(dir, "absent"), filepath.Join(dir, "e"), peft.WithAdapterDir(fixture("adapters", "llama_lora"), 1))
	if err == nil {
		t.Fatal("merged a missing base")
	}
	_, err = peft.MergeCheckpoint(ctx, base, filepath.Join(dir, "f\x00"), peft.WithAdapterDir(fixture("adapters", "llama_lora"), 1))
	wantCode(t, err, peft.CodeInvalidArgument)
	a, _ := peft.OpenAdapter(fixture("adapters", "llama_lora"))
	a.Close()
	_, err = peft.MergeCheckpoint(ctx, base, filepath.Join(dir, "g"), peft.WithAdapter(a, 1))
	wantClosed(t, err)
	entries, _ := os.ReadDir(dir)
	if len(entries) != 0 {
		t.Fatalf("failed merges left %d entries", len(entries))
	}
}

// A base folder without config.json is refused unless WithRequireConfig(false) says it is not needed.
func TestMergeRequireConfig(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	base := filepath.Join(dir, "base")
	model, err := os.ReadFile(fixture("models", "llama", "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(base, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(base, "model.safetensors"), model, 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out")
	adapter := peft.WithAdapterDir(fixture("adapters", "llama_lora"), 1)
	_, err = peft.MergeCheckpoint(ctx, base, out, adapter)
	wantCode(t, err, peft.CodeNotFound)
	if _, statErr := os.Stat(out); !os.IsNotExist(statErr) {
		t.Fatal("a refused merge wrote its output folder")
	}
	res, err := peft.MergeCheckpoint(ctx, base, out, adapter, peft.WithRequireConfig(false))
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(res.Files, "config.json") {
		t.Fatalf("files written: %v", res.Files)
	}
	if _, err := os.Stat(filepath.Join(out, "config.json")); !os.IsNotExist(err) {
		t.Fatal("the merge wrote a config.json the base does not have")
	}
}

// lora_alpha 4e12 overflows F16: refused by default, written as computed with WithAllowNonFinite(true).
func TestMergeAllowNonFinite(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	adapter := filepath.Join(dir, "adapter")
	if err := os.Mkdir(adapter, 0o755); err != nil {
		t.Fatal(err)
	}
	var config map[string]any
	readJSON(t, fixture("adapters", "llama_lora", "adapter_config.json"), &config)
	config["lora_alpha"] = 4e12
	text, _ := json.Marshal(config)
	weights, err := os.ReadFile(fixture("adapters", "llama_lora", "adapter_model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	if os.WriteFile(filepath.Join(adapter, "adapter_config.json"), text, 0o644) != nil ||
		os.WriteFile(filepath.Join(adapter, "adapter_model.safetensors"), weights, 0o644) != nil {
		t.Fatal("cannot write the adapter")
	}
	base, out := fixture("models", "llama"), filepath.Join(dir, "out")
	opts := []peft.MergeOption{peft.WithAdapterDir(adapter, 1), peft.WithMergeDType(peft.F16)}
	_, err = peft.MergeCheckpoint(ctx, base, out, opts...)
	wantCode(t, err, peft.CodeNonFinite)
	if _, err := peft.MergeCheckpoint(ctx, base, out, append(opts, peft.WithAllowNonFinite(true))...); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(out, "model.safetensors")); err != nil {
		t.Fatal(err)
	}
}

// config.json of a merge with tied embeddings and a replaced embedding: the merge unties them and
// says so.
func TestMergeEmbeddingUntie(t *testing.T) {
	var models map[string]struct {
		Tied bool `json:"tie_word_embeddings"`
	}
	readJSON(t, fixture("models", "MANIFEST.json"), &models)
	out := filepath.Join(t.TempDir(), "merged")
	res, err := peft.MergeCheckpoint(context.Background(), fixture("models", "llama"), out,
		peft.WithAdapterDir(fixture("adapters", "llama_embedding"), 1))
	if err != nil {
		t.Fatal(err)
	}
	var config map[string]any
	readJSON(t, filepath.Join(out, "config.json"), &config)
	tied, _ := config["tie_word_embeddings"].(bool)
	if res.UntiedEmbeddings == tied && models["llama"].Tied {
		t.Fatalf("untied=%v but config says tie_word_embeddings=%v", res.UntiedEmbeddings, tied)
	}
	raw, _ := json.Marshal(res)
	if res.Merged+res.Replaced+res.Copied+res.Added == 0 {
		t.Fatalf("empty result %s", raw)
	}
}

// writeLMHeadAdapter writes a LoRA on the tied lm_head of the gemma fixture (vocabulary 64, hidden 16).
func writeLMHeadAdapter(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	config := `{"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 2, "lora_alpha": 2, "target_modules": ["lm_head"]}`
	if err := os.WriteFile(filepath.Join(dir, "adapter_config.json"), []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	w, err := peft.NewWriter(filepath.Join(dir, "adapter_model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	factors := map[string][]uint64{"base_model.model.lm_head.lora_A.weight": {2, 16}, "base_model.model.lm_head.lora_B.weight": {64, 2}}
	names := []string{"base_model.model.lm_head.lora_A.weight", "base_model.model.lm_head.lora_B.weight"}
	for _, name := range names {
		if err := w.AddTensor(name, peft.F32, factors[name]...); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		shape := factors[name]
		data := make([]byte, 4*shape[0]*shape[1])
		for i := 0; i < len(data)/4; i++ {
			binary.LittleEndian.PutUint32(data[4*i:], math.Float32bits(float32(i%5-2)*0.125))
		}
		if err := w.WriteTensor(name, peft.F32, data); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Finish(); err != nil {
		t.Fatal(err)
	}
}

func TestMergeTiedEmbeddings(t *testing.T) {
	adapter := filepath.Join(t.TempDir(), "lm_head")
	writeLMHeadAdapter(t, adapter)
	tied := func(out string) bool {
		var config map[string]any
		readJSON(t, filepath.Join(out, "config.json"), &config)
		return config["tie_word_embeddings"] == true
	}
	// The default unties: lm_head.weight added, tie_word_embeddings false.
	out := filepath.Join(t.TempDir(), "untie")
	res, err := peft.MergeCheckpoint(context.Background(), fixture("models", "gemma"), out, peft.WithAdapterDir(adapter, 1))
	if err != nil {
		t.Fatal(err)
	}
	if !res.UntiedEmbeddings || res.Added != 1 || tied(out) {
		t.Fatalf("default policy: untied=%v added=%d tied=%v", res.UntiedEmbeddings, res.Added, tied(out))
	}
	// TiedShared: the change lands in the shared embedding, which stays tied.
	out = filepath.Join(t.TempDir(), "shared")
	res, err = peft.MergeCheckpoint(context.Background(), fixture("models", "gemma"), out, peft.WithAdapterDir(adapter, 1),
		peft.WithTiedEmbeddings(peft.TiedShared))
	if err != nil {
		t.Fatal(err)
	}
	if res.UntiedEmbeddings || res.Added != 0 || res.Merged != 1 || !tied(out) {
		t.Fatalf("shared policy: untied=%v added=%d merged=%d tied=%v", res.UntiedEmbeddings, res.Added, res.Merged, tied(out))
	}
	_, err = peft.MergeCheckpoint(context.Background(), fixture("models", "gemma"), filepath.Join(t.TempDir(), "bad"),
		peft.WithAdapterDir(adapter, 1), peft.WithTiedEmbeddings(2))
	if !errors.Is(err, peft.ErrInvalidArgument) {
		t.Fatalf("policy 2: %v", err)
	}
}
