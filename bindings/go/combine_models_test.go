package peft_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	peft "github.com/peft-c/peft_c/bindings/go"
)

// fineTune writes a "fine-tuned" copy of the llama fixture to dir: config.json copied, every F32
// tensor of model.safetensors moved by small deterministic noise (the phase sets which noise), written
// with the binding's SaveFile.
func fineTune(t *testing.T, dir string, phase float64) {
	t.Helper()
	base := fixture("models", "llama")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	config, err := os.ReadFile(filepath.Join(base, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), config, 0o644); err != nil {
		t.Fatal(err)
	}
	c := mustOpen(t, filepath.Join(base, "model.safetensors"))
	infos, err := c.Tensors()
	if err != nil {
		t.Fatal(err)
	}
	var tensors []peft.TensorData
	for ti, info := range infos {
		data, err := c.Read(info.Index, info.DType)
		if err != nil {
			t.Fatal(err)
		}
		if info.DType == peft.F32 {
			for j := 0; j+4 <= len(data); j += 4 {
				v := math.Float32frombits(binary.LittleEndian.Uint32(data[j:]))
				v += float32(0.02 * math.Sin(phase+float64(ti)*1.7+float64(j/4)*0.61))
				binary.LittleEndian.PutUint32(data[j:], math.Float32bits(v))
			}
		}
		tensors = append(tensors, peft.TensorData{Name: info.Name, DType: info.DType, Shape: info.Shape, Data: data})
	}
	if err := peft.SaveFile(filepath.Join(dir, "model.safetensors"), tensors, map[string]string{"format": "pt"}); err != nil {
		t.Fatal(err)
	}
}

// CombineModels: two fine-tuned copies of the llama fixture by dare_ties, the same model.safetensors
// as `peftc model combine` writes; the base with itself is the base, byte for byte; then the errors,
// each of which writes nothing.
func TestCombineModels(t *testing.T) {
	dir := t.TempDir()
	base := fixture("models", "llama")
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	fineTune(t, a, 0.3)
	fineTune(t, b, 2.1)
	models, weights := []string{a, b}, []float64{0.7, -0.4}
	dareTies := []peft.ExportOption{peft.WithDensity(0.5), peft.WithSeed(5),
		peft.WithMajoritySign(peft.MajoritySignFrequency)}

	out := filepath.Join(dir, "dare_ties")
	res, err := peft.CombineModels(context.Background(), base, models, weights, peft.CombineDareTies, out, dareTies)
	if err != nil {
		t.Fatal(err)
	}
	if res.Merged == 0 || !slices.Contains(res.Files, "model.safetensors") {
		t.Fatalf("result %+v", res)
	}
	peftc(t, "model", "combine", "--base", base, "--model", a+":0.7", "--model", b+":-0.4", "--method", "dare_ties",
		"--density", "0.5", "--seed", "5", "--majority-sign", "frequency", "--out", filepath.Join(dir, "dare_ties-peftc"))
	sameFiles(t, out, filepath.Join(dir, "dare_ties-peftc"), "model.safetensors")
	changed, err := os.ReadFile(filepath.Join(out, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	original, err := os.ReadFile(filepath.Join(base, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(changed, original) {
		t.Fatal("the combination of two fine-tuned models is the base")
	}
	gcPoint()

	// The base with itself: every difference is 0.
	same := filepath.Join(dir, "same")
	res, err = peft.CombineModels(context.Background(), base, []string{base, base}, []float64{0.5, 1.5},
		peft.CombineLinear, same, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Merged == 0 {
		t.Fatalf("result %+v", res)
	}
	sameFiles(t, same, base, "model.safetensors")
	gcPoint()

	// Errors, with the library's codes; none writes the output folder.
	notWritten := func(out string) {
		t.Helper()
		if _, err := os.Stat(out); !os.IsNotExist(err) {
			t.Fatalf("a failed CombineModels left %s (%v)", out, err)
		}
	}
	for i, tc := range []struct {
		method  peft.CombineMethod
		combine []peft.ExportOption
		opts    []peft.MergeOption
	}{
		{peft.CombineTies, nil, nil}, // no density
		{peft.CombineSVD, []peft.ExportOption{peft.WithDensity(0.5)}, nil},
		{peft.CombineLinear, nil, []peft.MergeOption{peft.WithAdapterDir(fixture("adapters", "llama_lora"), 1)}},
		{peft.CombineLinear, nil, []peft.MergeOption{peft.WithAdapter(mustAdapter(t, fixture("adapters", "llama_lora")), 1)}},
	} {
		out := filepath.Join(dir, "bad"+strconv.Itoa(i))
		_, err := peft.CombineModels(context.Background(), base, models, weights, tc.method, out, tc.combine, tc.opts...)
		wantCode(t, err, peft.CodeInvalidArgument)
		notWritten(out)
	}
	out = filepath.Join(dir, "count")
	_, err = peft.CombineModels(context.Background(), base, models, weights[:1], peft.CombineLinear, out, nil)
	wantCode(t, err, peft.CodeInvalidArgument)
	notWritten(out)
}

// WithCombine: the llama fixture with llama_lora (0.9) and llama_rslora (-0.6) combined by ties at
// density 0.5 writes the same model.safetensors as `peftc merge --combine ties --density 0.5`, which
// differs from the plain merge; CombineLinear is the plain merge; a pruning method without a density
// and another method fail with ErrInvalidArgument, writing nothing.
func TestMergeCombine(t *testing.T) {
	dir := t.TempDir()
	base := fixture("models", "llama")
	lora, rslora := fixture("adapters", "llama_lora"), fixture("adapters", "llama_rslora")
	adapters := []peft.MergeOption{peft.WithAdapterDir(lora, 0.9), peft.WithAdapterDir(rslora, -0.6)}
	merge := func(name string, opts ...peft.MergeOption) (string, error) {
		out := filepath.Join(dir, name)
		_, err := peft.MergeCheckpoint(context.Background(), base, out, append(slices.Clone(adapters), opts...)...)
		return out, err
	}

	ties, err := merge("ties", peft.WithCombine(peft.CombineTies, peft.WithDensity(0.5)))
	if err != nil {
		t.Fatal(err)
	}
	peftc(t, "merge", "--base", base, "--out", filepath.Join(dir, "ties-peftc"), "--adapter", lora+":0.9",
		"--adapter", rslora+":-0.6", "--combine", "ties", "--density", "0.5")
	sameFiles(t, ties, filepath.Join(dir, "ties-peftc"), "model.safetensors")
	gcPoint()

	plain, err := merge("plain")
	if err != nil {
		t.Fatal(err)
	}
	linear, err := merge("linear", peft.WithCombine(peft.CombineLinear))
	if err != nil {
		t.Fatal(err)
	}
	sameFiles(t, linear, plain, "model.safetensors")
	x, err := os.ReadFile(filepath.Join(ties, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	y, err := os.ReadFile(filepath.Join(plain, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(x, y) {
		t.Fatal("the ties merge is the plain merge")
	}
	gcPoint()

	for i, opt := range []peft.MergeOption{
		peft.WithCombine(peft.CombineTies),                                // no density
		peft.WithCombine(peft.CombineDareTies, peft.WithSeed(3)),          // no density
		peft.WithCombine(peft.CombineSVD, peft.WithDensity(0.5)),          // not a merge's method
		peft.WithCombine(peft.CombineMagnitudePrune, peft.WithDensity(2)), // density outside [0, 1]
	} {
		out, err := merge("bad"+strconv.Itoa(i), opt)
		wantCode(t, err, peft.CodeInvalidArgument)
		if _, err := os.Stat(out); !os.IsNotExist(err) {
			t.Fatalf("a failed merge left %s (%v)", out, err)
		}
	}
}
