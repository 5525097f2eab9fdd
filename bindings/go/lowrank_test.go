package peft_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	peft "github.com/peft-c/peft_c/bindings/go"
)

// peftc runs the command-line tool (PEFTC, else the repository's build/peftc), the reference the
// binding's output files are compared with byte for byte.
func peftc(t *testing.T, args ...string) {
	t.Helper()
	bin := os.Getenv("PEFTC")
	if bin == "" {
		bin = filepath.Join("..", "..", "build", "peftc")
		if _, err := os.Stat(bin); err != nil {
			t.Skipf("no peftc to compare with (set PEFTC): %v", err)
		}
	}
	if out, err := exec.Command(bin, args...).CombinedOutput(); err != nil {
		t.Fatalf("peftc %v: %v\n%s", args, err, out)
	}
}

// sameFiles fails unless every named file of dir a is byte-identical to the one in dir b.
func sameFiles(t *testing.T, a, b string, names ...string) {
	t.Helper()
	for _, name := range names {
		x, err := os.ReadFile(filepath.Join(a, name))
		if err != nil {
			t.Fatal(err)
		}
		y, err := os.ReadFile(filepath.Join(b, name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(x, y) {
			t.Fatalf("%s differs between %s and %s", name, a, b)
		}
	}
}

var adapterFiles = []string{"adapter_model.safetensors", "adapter_config.json"}

// Extraction from a base and a "fine-tuned" model (the base with llama_lora merged), conversion of
// llama_lora to rank 2, and the initial-adapter conversion: the same files as peftc writes.
func TestLowRank(t *testing.T) {
	dir := t.TempDir()
	base := fixture("models", "llama")
	tuned := filepath.Join(dir, "tuned")
	if _, err := peft.MergeCheckpoint(context.Background(), base, tuned,
		peft.WithAdapterDir(fixture("adapters", "llama_lora"), 1)); err != nil {
		t.Fatal(err)
	}
	gcPoint()
	out := filepath.Join(dir, "extracted")
	report, err := peft.Extract(base, tuned, out, peft.WithRank(2), peft.WithLowRankThreads(2),
		peft.WithModules("q_proj", "v_proj"))
	if err != nil {
		t.Fatal(err)
	}
	if len(report) == 0 {
		t.Fatal("Extract reported no module")
	}
	for _, m := range report {
		if m.Rank != 2 || m.Error < 0 || m.Error >= 1 || filepath.Ext(m.Name) != ".q_proj" && filepath.Ext(m.Name) != ".v_proj" {
			t.Fatalf("module %+v", m)
		}
	}
	peftc(t, "adapter", "extract", "--base", base, "--tuned", tuned, "--out", filepath.Join(dir, "extracted-peftc"),
		"--rank", "2", "--threads", "2", "--modules", "q_proj,v_proj")
	sameFiles(t, out, filepath.Join(dir, "extracted-peftc"), adapterFiles...)
	gcPoint()

	// The energy fraction picks a rank per module; BF16 factors.
	energy, err := peft.Extract(base, tuned, filepath.Join(dir, "energy"), peft.WithEnergy(0.9),
		peft.WithLowRankDType(peft.BF16), peft.WithSVD(peft.SVDRandomized))
	if err != nil {
		t.Fatal(err)
	}
	peftc(t, "adapter", "extract", "--base", base, "--tuned", tuned, "--out", filepath.Join(dir, "energy-peftc"),
		"--energy", "0.9", "--dtype", "bf16", "--svd", "randomized")
	sameFiles(t, filepath.Join(dir, "energy"), filepath.Join(dir, "energy-peftc"), adapterFiles...)
	for _, m := range energy {
		if m.Rank < 1 {
			t.Fatalf("module %+v", m)
		}
	}

	// Conversion of an adapter to another rank.
	lora := mustAdapter(t, fixture("adapters", "llama_lora"))
	converted, err := lora.ConvertToLoRA(filepath.Join(dir, "r2"), peft.WithRank(2))
	if err != nil {
		t.Fatal(err)
	}
	if len(converted) != lora.ModuleCount() {
		t.Fatalf("%d modules converted of %d", len(converted), lora.ModuleCount())
	}
	peftc(t, "adapter", "convert", fixture("adapters", "llama_lora"), filepath.Join(dir, "r2-peftc"), "--to", "lora",
		"--rank", "2")
	sameFiles(t, filepath.Join(dir, "r2"), filepath.Join(dir, "r2-peftc"), adapterFiles...)

	// The initial-adapter conversion doubles the rank, exactly.
	loraDir := fixture("adapters", "llama_lora")
	if err := peft.ConvertInitial(loraDir, loraDir, filepath.Join(dir, "doubled")); err != nil {
		t.Fatal(err)
	}
	peftc(t, "adapter", "convert", loraDir, filepath.Join(dir, "doubled-peftc"), "--to", "lora", "--initial", loraDir)
	sameFiles(t, filepath.Join(dir, "doubled"), filepath.Join(dir, "doubled-peftc"), adapterFiles...)
	doubled := mustAdapter(t, filepath.Join(dir, "doubled"))
	if doubled.ModuleCount() != lora.ModuleCount() {
		t.Fatalf("%d modules after the initial conversion, %d before", doubled.ModuleCount(), lora.ModuleCount())
	}

	// Errors, with the library's codes.
	_, err = lora.ConvertToLoRA(filepath.Join(dir, "none"))
	wantCode(t, err, peft.CodeInvalidArgument) // neither a rank nor an energy
	_, err = lora.ConvertToLoRA(filepath.Join(dir, "big"), peft.WithRank(100000))
	wantCode(t, err, peft.CodeInvalidArgument)
	_, err = mustAdapter(t, fixture("adapters", "llama_dora")).ConvertToLoRA(filepath.Join(dir, "dora"), peft.WithRank(2))
	wantCode(t, err, peft.CodeUnsupported)
	_, err = peft.Extract(base, base, filepath.Join(dir, "same"), peft.WithRank(2))
	wantCode(t, err, peft.CodeInvalidArgument) // no weight changed
	_, err = peft.Extract(base, tuned, filepath.Join(dir, "x"), peft.WithEnergy(1.5))
	wantCode(t, err, peft.CodeInvalidArgument)
	_, err = peft.Extract(base, tuned, filepath.Join(dir, "x"), peft.WithRank(2), peft.WithModules(""))
	wantCode(t, err, peft.CodeInvalidArgument)
	_, err = peft.Extract(base, tuned, filepath.Join(dir, "x"), peft.WithRank(2), peft.WithSVD(7))
	wantCode(t, err, peft.CodeInvalidArgument)
	if !errors.Is(peft.ConvertInitial(loraDir, fixture("adapters", "llama_dora"), filepath.Join(dir, "mixed")), peft.ErrUnsupported) {
		t.Fatal("the initial conversion of a LoRA against a DoRA adapter is not ErrUnsupported")
	}
	wantCode(t, peft.ConvertInitial(loraDir, "a\x00b", filepath.Join(dir, "x")), peft.CodeInvalidArgument)
	lora.Close()
	_, err = lora.ConvertToLoRA(filepath.Join(dir, "closed"), peft.WithRank(2))
	if !errors.Is(err, peft.ErrClosed) {
		t.Fatalf("ConvertToLoRA on a closed adapter: %v", err)
	}
}

// writeIA3Adapter writes an IA3 adapter on the llama fixture's layer-0 k_proj (8 x 16), ia3_l =
// 1 + i / 16, as tests/capi/test_lowrank.c does: multiplicative, so it converts against a base only.
func writeIA3Adapter(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	config := `{"peft_type": "IA3", "target_modules": ["k_proj"], "feedforward_modules": [], "task_type": "CAUSAL_LM"}`
	if err := os.WriteFile(filepath.Join(dir, "adapter_config.json"), []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	header := `{"base_model.model.model.layers.0.self_attn.k_proj.ia3_l": ` +
		`{"dtype": "F32", "shape": [8, 1], "data_offsets": [0, 32]}}`
	file := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
	file = append(file, header...)
	for i := 0; i < 8; i++ {
		file = binary.LittleEndian.AppendUint32(file, math.Float32bits(1+float32(i)/16))
	}
	if err := os.WriteFile(filepath.Join(dir, "adapter_model.safetensors"), file, 0o644); err != nil {
		t.Fatal(err)
	}
}

// ConvertToLoRA of a multiplicative adapter against a base (WithBase): refused without one, the
// files of peftc adapter convert --base with one.
func TestConvertToLoRAAgainstBase(t *testing.T) {
	dir := t.TempDir()
	ia3Dir := filepath.Join(dir, "ia3")
	writeIA3Adapter(t, ia3Dir)
	ia3 := mustAdapter(t, ia3Dir)
	_, err := ia3.ConvertToLoRA(filepath.Join(dir, "nobase"), peft.WithRank(2))
	wantCode(t, err, peft.CodeUnsupported)
	if err == nil || !strings.Contains(err.Error(), "IA3") || !strings.Contains(err.Error(), "base") {
		t.Fatalf("without a base: %v", err)
	}
	base := fixture("models", "llama")
	report, err := ia3.ConvertToLoRA(filepath.Join(dir, "r2"), peft.WithRank(2), peft.WithBase(base))
	if err != nil {
		t.Fatal(err)
	}
	if len(report) != 1 || report[0].Name != "model.layers.0.self_attn.k_proj" || report[0].Rank != 2 ||
		report[0].Error <= 0 || report[0].Error >= 1 {
		t.Fatalf("report %+v (dW = diag(l - 1) W is full rank: rank 2 loses some)", report)
	}
	peftc(t, "adapter", "convert", ia3Dir, filepath.Join(dir, "r2-peftc"), "--to", "lora", "--rank", "2", "--base", base)
	sameFiles(t, filepath.Join(dir, "r2"), filepath.Join(dir, "r2-peftc"), adapterFiles...)
	_, err = ia3.ConvertToLoRA(filepath.Join(dir, "gpt2"), peft.WithRank(2), peft.WithBase(fixture("models", "gpt2")))
	wantCode(t, err, peft.CodeNotFound) // gpt2 has no k_proj
	_, err = ia3.ConvertToLoRA(filepath.Join(dir, "nul"), peft.WithRank(2), peft.WithBase("a\x00b"))
	wantCode(t, err, peft.CodeInvalidArgument)
	// WithBase("") is no base: refused again.
	_, err = ia3.ConvertToLoRA(filepath.Join(dir, "cleared"), peft.WithRank(2), peft.WithBase(base), peft.WithBase(""))
	wantCode(t, err, peft.CodeUnsupported)
}

// A merge into the Q8_0 GGUF fixture with WithQuant and WithStoreReport: the file peftc merge --quant
// writes, and the report's figures.
func TestMergeQuantizedGGUF(t *testing.T) {
	dir := t.TempDir()
	base, adapter := fixture("gguf", "bindings_q8_0.gguf"), fixture("gguf", "bindings_q8_0_lora")
	for _, quant := range []string{"Q4_0", "Q8_0", "F16"} {
		typ, err := peft.ParseGGMLType(quant)
		if err != nil {
			t.Fatal(err)
		}
		out := filepath.Join(dir, quant+".gguf")
		res, err := peft.MergeCheckpoint(context.Background(), base, out, peft.WithAdapterDir(adapter, 1),
			peft.WithQuant(typ), peft.WithStoreReport(true))
		if err != nil {
			t.Fatal(err)
		}
		if res.Merged != 1 || len(res.StoreReport) != 1 {
			t.Fatalf("%s: %+v", quant, res)
		}
		e := res.StoreReport[0]
		if e.Tensor != "blk.0.ffn_down.weight" || e.BaseType != "Q8_0" || e.Type != quant || e.Values != 512 ||
			!(e.RMS > 0 && e.RMS <= e.Max) || !(e.BaseRMS >= 0 && e.BaseRMS <= e.BaseMax) {
			t.Fatalf("%s: report %+v", quant, e)
		}
		peftc(t, "merge", "--base", base, "--adapter", adapter, "--out", filepath.Join(dir, "peftc-"+quant+".gguf"),
			"--quant", quant, "--report")
		a, _ := os.ReadFile(out)
		b, _ := os.ReadFile(filepath.Join(dir, "peftc-"+quant+".gguf"))
		if len(a) == 0 || !bytes.Equal(a, b) {
			t.Fatalf("%s: the merged file differs from peftc merge --quant's", quant)
		}
		ckpt := mustOpen(t, out)
		info, err := ckpt.TensorByName("blk.0.ffn_down.weight")
		if err != nil {
			t.Fatal(err)
		}
		if info.GGMLType != typ {
			t.Fatalf("%s: the merged tensor is %v", quant, info.GGMLType)
		}
	}
	// No report unless asked; the base's type kept by default.
	res, err := peft.MergeCheckpoint(context.Background(), base, filepath.Join(dir, "kept.gguf"), peft.WithAdapterDir(adapter, 1))
	if err != nil {
		t.Fatal(err)
	}
	if res.StoreReport == nil || len(res.StoreReport) != 0 {
		t.Fatalf("a report without WithStoreReport: %+v", res.StoreReport)
	}
	iq2, _ := peft.ParseGGMLType("IQ2_XS")
	_, err = peft.MergeCheckpoint(context.Background(), base, filepath.Join(dir, "x.gguf"), peft.WithAdapterDir(adapter, 1), peft.WithQuant(iq2))
	wantCode(t, err, peft.CodeUnsupported)
	_, err = peft.MergeCheckpoint(context.Background(), base, filepath.Join(dir, "x.gguf"), peft.WithAdapterDir(adapter, 1),
		peft.WithQuant(8), peft.WithMergeDType(peft.F16))
	wantCode(t, err, peft.CodeInvalidArgument)
	_, err = peft.MergeCheckpoint(context.Background(), base, filepath.Join(dir, "x.gguf"), peft.WithAdapterDir(adapter, 1), peft.WithQuant(999))
	wantCode(t, err, peft.CodeInvalidArgument)
	if _, err := os.Stat(filepath.Join(dir, "x.gguf")); err == nil {
		t.Fatal("a refused merge wrote its output")
	}
}

// WithArithmetic(ArithmeticGGML) into the Q8_0 GGUF fixture writes the file peftc merge --arithmetic
// ggml writes; WithJoinSplit has no effect on a base of one file; bad values are refused.
func TestMergeArithmeticAndJoinSplit(t *testing.T) {
	dir := t.TempDir()
	base, adapter := fixture("gguf", "bindings_q8_0.gguf"), fixture("gguf", "bindings_q8_0_lora")
	// Written F32 (Q8_0 rounds the two orders' last bits away on this fixture).
	f32, err := peft.ParseGGMLType("F32")
	if err != nil {
		t.Fatal(err)
	}
	ggml, peftF32 := filepath.Join(dir, "ggml.gguf"), filepath.Join(dir, "peft-f32.gguf")
	if _, err := peft.MergeCheckpoint(context.Background(), base, ggml, peft.WithAdapterDir(adapter, 0.5),
		peft.WithArithmetic(peft.ArithmeticGGML), peft.WithQuant(f32)); err != nil {
		t.Fatal(err)
	}
	if _, err := peft.MergeCheckpoint(context.Background(), base, peftF32, peft.WithAdapterDir(adapter, 0.5),
		peft.WithQuant(f32)); err != nil {
		t.Fatal(err)
	}
	peftc(t, "merge", "--base", base, "--adapter", adapter+":0.5", "--out", filepath.Join(dir, "peftc-ggml.gguf"),
		"--arithmetic", "ggml", "--quant", "F32")
	want, _ := os.ReadFile(filepath.Join(dir, "peftc-ggml.gguf"))
	got, _ := os.ReadFile(ggml)
	if len(got) == 0 || !bytes.Equal(got, want) {
		t.Fatal("the ggml-order merge differs from peftc merge --arithmetic ggml's")
	}
	if other, _ := os.ReadFile(peftF32); bytes.Equal(got, other) {
		t.Fatal("the ggml and PEFT orders wrote the same F32 merge")
	}
	// The default order, and WithArithmetic(ArithmeticPEFT), give peftc merge's file.
	peftc(t, "merge", "--base", base, "--adapter", adapter+":0.5", "--out", filepath.Join(dir, "peftc-peft.gguf"))
	want, _ = os.ReadFile(filepath.Join(dir, "peftc-peft.gguf"))
	for _, opts := range [][]peft.MergeOption{nil, {peft.WithArithmetic(peft.ArithmeticPEFT)}, {peft.WithJoinSplit(true)}} {
		out := filepath.Join(dir, "peft.gguf")
		os.Remove(out)
		res, err := peft.MergeCheckpoint(context.Background(), base, out, append(opts, peft.WithAdapterDir(adapter, 0.5))...)
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Files) != 1 {
			t.Fatalf("files %v", res.Files)
		}
		got, _ = os.ReadFile(out)
		if len(got) == 0 || !bytes.Equal(got, want) {
			t.Fatalf("options %d: the merge differs from peftc merge's", len(opts))
		}
	}
	if peft.ArithmeticPEFT.String() != "peft" || peft.ArithmeticGGML.String() != "ggml" {
		t.Fatal("arithmetic names")
	}
	_, err = peft.MergeCheckpoint(context.Background(), base, filepath.Join(dir, "x.gguf"), peft.WithAdapterDir(adapter, 1),
		peft.WithArithmetic(peft.Arithmetic(2)))
	wantCode(t, err, peft.CodeInvalidArgument)
	_, err = peft.MergeCheckpoint(context.Background(), fixture("models", "llama"), filepath.Join(dir, "dora"),
		peft.WithAdapterDir(fixture("adapters", "llama_dora"), 1), peft.WithArithmetic(peft.ArithmeticGGML))
	wantCode(t, err, peft.CodeUnsupported)
	for _, name := range []string{"x.gguf", "dora"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err == nil {
			t.Fatalf("a refused merge wrote %s", name)
		}
	}
}

// ggufKV is one metadata entry of writeTinyGGUF: typ 2 (u16), 5 (i32), 6 (f32) or 8 (string).
type ggufKV struct {
	key   string
	typ   uint32
	value any
}

// writeTinyGGUF writes a GGUF file of F32 2 x 2 tensors (values first, first + 0.25, ...).
func writeTinyGGUF(t *testing.T, path string, kvs []ggufKV, names []string, first float32) {
	t.Helper()
	var b bytes.Buffer
	le := binary.LittleEndian
	put := func(values ...any) {
		for _, v := range values {
			if err := binary.Write(&b, le, v); err != nil {
				t.Fatal(err)
			}
		}
	}
	text := func(s string) { put(uint64(len(s))); b.WriteString(s) }
	b.WriteString("GGUF")
	put(uint32(3), uint64(len(names)), uint64(len(kvs)))
	for _, kv := range kvs {
		text(kv.key)
		put(kv.typ)
		if s, ok := kv.value.(string); ok {
			text(s)
		} else {
			put(kv.value)
		}
	}
	for i, name := range names {
		text(name)
		put(uint32(2), uint64(2), uint64(2), uint32(0), uint64(32*i))
	}
	b.Write(make([]byte, (32-b.Len()%32)%32))
	for i := range names {
		for k := 0; k < 4; k++ {
			put(first + float32(4*i+k)*0.25)
		}
		b.Write(make([]byte, 16))
	}
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// A base split into two parts merges into two parts by default and, with WithJoinSplit(true), into
// the one file peftc merge --join-split writes.
func TestMergeJoinSplit(t *testing.T) {
	dir := t.TempDir()
	for no, name := range []string{"blk.0.attn_v.weight", "blk.0.ffn_down.weight"} {
		var kvs []ggufKV
		if no == 0 {
			kvs = append(kvs, ggufKV{"general.architecture", 8, "llama"})
		}
		kvs = append(kvs, ggufKV{"split.no", 2, uint16(no)}, ggufKV{"split.tensors.count", 5, int32(2)},
			ggufKV{"split.count", 2, uint16(2)})
		writeTinyGGUF(t, filepath.Join(dir, "model-0000"+strconv.Itoa(no+1)+"-of-00002.gguf"), kvs, []string{name}, 1-2*float32(no))
	}
	lora := filepath.Join(dir, "lora.gguf")
	writeTinyGGUF(t, lora, []ggufKV{{"general.architecture", 8, "llama"}, {"general.type", 8, "adapter"},
		{"adapter.type", 8, "lora"}, {"adapter.lora.alpha", 6, float32(2)}},
		[]string{"blk.0.ffn_down.weight.lora_a", "blk.0.ffn_down.weight.lora_b"}, 0.5)
	base := filepath.Join(dir, "model-00002-of-00002.gguf")
	parts, err := peft.MergeCheckpoint(context.Background(), base, filepath.Join(dir, "out.gguf"), peft.WithAdapterDir(lora, 1))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(parts.Files, ",") != "out-00001-of-00002.gguf,out-00002-of-00002.gguf" {
		t.Fatalf("parts %v", parts.Files)
	}
	joined, err := peft.MergeCheckpoint(context.Background(), base, filepath.Join(dir, "joined.gguf"),
		peft.WithAdapterDir(lora, 1), peft.WithJoinSplit(true))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(joined.Files, ",") != "joined.gguf" {
		t.Fatalf("joined %v", joined.Files)
	}
	peftc(t, "merge", "--base", base, "--adapter", lora, "--out", filepath.Join(dir, "peftc.gguf"), "--join-split")
	want, _ := os.ReadFile(filepath.Join(dir, "peftc.gguf"))
	got, _ := os.ReadFile(filepath.Join(dir, "joined.gguf"))
	if len(got) == 0 || !bytes.Equal(got, want) {
		t.Fatal("the joined merge differs from peftc merge --join-split's")
	}
}
