package peft_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	peft "github.com/peft-c/peft_c/bindings/go"
)

// An entry of tests/fixtures/adapters/MANIFEST.json (written by the generator from PEFT).
type adapterManifest struct {
	Path      string   `json:"path"`
	Base      string   `json:"base"`
	TaskType  *string  `json:"task_type"`
	R         int64    `json:"r"`
	LoraAlpha float64  `json:"lora_alpha"`
	UseRSLoRA bool     `json:"use_rslora"`
	UseDoRA   bool     `json:"use_dora"`
	Tensors   int      `json:"tensors"`
	DTypes    []string `json:"dtypes"`
}

func adapterFixtures(t *testing.T) map[string]adapterManifest {
	var m map[string]adapterManifest
	readJSON(t, fixture("adapters", "MANIFEST.json"), &m)
	if len(m) < 20 {
		t.Fatalf("only %d adapters in the manifest", len(m))
	}
	return m
}

// Every fixture adapter opens against its base and shows what PEFT wrote: config values, every
// tensor of adapter_model.safetensors under a module with its dtype, shape and bytes, and the
// scaling PEFT computes from the config.
func TestAdaptersMatchPEFT(t *testing.T) {
	for name, m := range adapterFixtures(t) {
		t.Run(name, func(t *testing.T) {
			dir := fixture(m.Path)
			a, err := peft.OpenAdapter(dir, peft.WithBaseDir(fixture(m.Base)))
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			gcPoint()
			checkAdapter(t, a, dir, m)
		})
	}
}

func checkAdapter(t *testing.T, a *peft.Adapter, dir string, m adapterManifest) {
	t.Helper()
	var config map[string]any
	readJSON(t, filepath.Join(dir, "adapter_config.json"), &config)
	if a.R() != m.R || a.LoraAlpha() != m.LoraAlpha || a.UseRSLoRA() != m.UseRSLoRA || a.UseDoRA() != m.UseDoRA {
		t.Fatalf("r=%d alpha=%v rslora=%v dora=%v; manifest %+v", a.R(), a.LoraAlpha(), a.UseRSLoRA(), a.UseDoRA(), m)
	}
	if (m.TaskType == nil && a.TaskType() != "") || (m.TaskType != nil && a.TaskType() != *m.TaskType) {
		t.Fatalf("task type %q, manifest %v", a.TaskType(), m.TaskType)
	}
	if a.PEFTType() != "LORA" || a.Bias() != config["bias"] || a.BaseModelNameOrPath() != config["base_model_name_or_path"] {
		t.Fatalf("peft_type %q bias %q base %q", a.PEFTType(), a.Bias(), a.BaseModelNameOrPath())
	}
	if a.LoraBias() != (config["lora_bias"] == true) || a.FanInFanOut() != (config["fan_in_fan_out"] == true) {
		t.Fatal("lora_bias / fan_in_fan_out differ from the config")
	}
	var fromLib map[string]any
	if err := json.Unmarshal([]byte(a.ConfigJSON()), &fromLib); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(fromLib, config) {
		t.Fatalf("ConfigJSON differs from adapter_config.json")
	}
	for field, value := range config {
		got, ok := a.ConfigField(field)
		var v any
		if !ok || json.Unmarshal([]byte(got), &v) != nil || !reflect.DeepEqual(v, value) {
			t.Fatalf("ConfigField(%q) = %q, %v; want %v", field, got, ok, value)
		}
	}
	if _, ok := a.ConfigField("no_such_field"); ok {
		t.Fatal("ConfigField found a field the file lacks")
	}
	file := mustOpen(t, filepath.Join(dir, "adapter_model.safetensors"))
	modules, err := a.Modules()
	if err != nil {
		t.Fatal(err)
	}
	if len(modules) != a.ModuleCount() {
		t.Fatal("Modules and ModuleCount disagree")
	}
	seen := map[string]bool{}
	for _, mod := range modules {
		if i, err := a.FindModule(mod.Name); err != nil || i != mod.Index {
			t.Fatalf("FindModule(%q) = %d, %v", mod.Name, i, err)
		}
		checkScaling(t, a, mod)
		for ti, mt := range mod.Tensors {
			index, err := file.Find(mt.Key)
			if err != nil {
				t.Fatalf("module %s: key %q is not in the file: %v", mod.Name, mt.Key, err)
			}
			info, _ := file.Tensor(index)
			if info.DType != mt.DType || !slices.Equal(info.Shape, mt.Shape) || seen[mt.Key] {
				t.Fatalf("%q: %v %v, file %v %v (seen %v)", mt.Key, mt.DType, mt.Shape, info.DType, info.Shape, seen[mt.Key])
			}
			seen[mt.Key] = true
			if mt.Role == "" || mt.BaseName == "" || !strings.HasSuffix(mt.Key, mt.Role) {
				t.Fatalf("%q: role %q base %q", mt.Key, mt.Role, mt.BaseName)
			}
			view, _ := file.View(index)
			got := make([]byte, len(view))
			if err := a.ReadTensorInto(mod.Index, ti, mt.DType, got); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, view) {
				t.Fatalf("%q: ReadTensorInto differs from the file's bytes", mt.Key)
			}
		}
		if (mod.Kind == peft.LayerTrainableTokens) != (len(mod.TokenIndices) > 0) {
			t.Fatalf("module %s of kind %v has token indices %v", mod.Name, mod.Kind, mod.TokenIndices)
		}
	}
	if len(seen) != file.TensorCount() || len(seen) != m.Tensors {
		t.Fatalf("modules hold %d tensors; the file has %d, the manifest %d", len(seen), file.TensorCount(), m.Tensors)
	}
}

// checkScaling recomputes a LoRA module's rank and scaling from its tensors and the config, as PEFT
// does (alpha / r, or alpha / sqrt(r) with rsLoRA).
func checkScaling(t *testing.T, a *peft.Adapter, mod peft.Module) {
	t.Helper()
	if mod.Kind == peft.LayerFull || mod.Kind == peft.LayerTrainableTokens {
		if mod.Rank != 0 || mod.Scaling != 0 {
			t.Fatalf("module %s of kind %v has rank %d", mod.Name, mod.Kind, mod.Rank)
		}
		return
	}
	ai := mod.Tensor("lora_A.weight")
	if ai < 0 {
		ai = mod.Tensor("lora_embedding_A")
	}
	if ai < 0 {
		t.Fatalf("LoRA module %s has no A factor: %+v", mod.Name, mod.Tensors)
	}
	// LoRA on stacked expert parameters (target_parameters): lora_A holds rank rows per expert.
	targetParameters, _ := a.ConfigField("target_parameters")
	stacked := targetParameters != "" && targetParameters != "null" && targetParameters != "[]"
	if rows := int64(mod.Tensors[ai].Shape[0]); rows != mod.Rank && !(stacked && rows%mod.Rank == 0) {
		t.Fatalf("module %s: rank %d, lora_A has %d rows", mod.Name, mod.Rank, rows)
	}
	want := mod.Alpha / float64(mod.Rank)
	if a.UseRSLoRA() {
		want = mod.Alpha / math.Sqrt(float64(mod.Rank))
	}
	if math.Abs(mod.Scaling-want) > 1e-12*math.Abs(want) {
		t.Fatalf("module %s: scaling %v, want %v", mod.Name, mod.Scaling, want)
	}
}

func TestAdapterRankAlphaPattern(t *testing.T) {
	a := mustAdapter(t, fixture("adapters", "llama_rank_alpha_pattern"))
	var config struct {
		R            int64              `json:"r"`
		RankPattern  map[string]int64   `json:"rank_pattern"`
		AlphaPattern map[string]float64 `json:"alpha_pattern"`
	}
	readJSON(t, fixture("adapters", "llama_rank_alpha_pattern", "adapter_config.json"), &config)
	modules, _ := a.Modules()
	ranks := map[int64]bool{}
	for _, m := range modules {
		ranks[m.Rank] = true
	}
	if len(config.RankPattern) == 0 || len(ranks) < 2 {
		t.Fatalf("the fixture should give several ranks: %v / %v", config.RankPattern, ranks)
	}
}

func TestAdapterOpenErrors(t *testing.T) {
	dir := t.TempDir()
	_, err := peft.OpenAdapter(filepath.Join(dir, "absent"))
	wantCode(t, err, peft.CodeNotFound)
	_, err = peft.OpenAdapter("x\x00y")
	wantCode(t, err, peft.CodeInvalidArgument)

	src := fixture("adapters", "llama_lora")
	broken := filepath.Join(dir, "broken")
	copyDir(t, src, broken)
	os.WriteFile(filepath.Join(broken, "adapter_config.json"), []byte(`{"peft_type": "LORA", "r": "four"`), 0o644)
	_, err = peft.OpenAdapter(broken)
	wantCode(t, err, peft.CodeInvalidConfig)

	wrongType := filepath.Join(dir, "wrong_type")
	copyDir(t, src, wrongType)
	os.WriteFile(filepath.Join(wrongType, "adapter_config.json"), []byte(`{"peft_type": "LORA", "r": "four"}`), 0o644)
	_, err = peft.OpenAdapter(wrongType)
	wantCode(t, err, peft.CodeInvalidConfig)
	if !strings.Contains(err.Error(), `"r"`) {
		t.Fatalf("the message does not name the field: %v", err)
	}

	pickle := filepath.Join(dir, "pickle")
	os.MkdirAll(pickle, 0o755)
	cfg, _ := os.ReadFile(filepath.Join(src, "adapter_config.json"))
	os.WriteFile(filepath.Join(pickle, "adapter_config.json"), cfg, 0o644)
	os.WriteFile(filepath.Join(pickle, "adapter_model.bin"), []byte("PK"), 0o644)
	_, err = peft.OpenAdapter(pickle)
	wantCode(t, err, peft.CodeUnsupported)

	damaged := filepath.Join(dir, "damaged")
	copyDir(t, src, damaged)
	os.WriteFile(filepath.Join(damaged, "adapter_model.safetensors"), []byte{1, 2, 3}, 0o644)
	_, err = peft.OpenAdapter(damaged)
	wantCode(t, err, peft.CodeHeaderTooSmall)

	// An adapter whose base lacks its modules.
	_, err = peft.OpenAdapter(src, peft.WithBaseDir(fixture("models", "gpt2")))
	var e *peft.Error
	if !errors.As(err, &e) || (e.Code != peft.CodeUnresolvedKey && e.Code != peft.CodeShapeMismatch) {
		t.Fatalf("llama adapter on a gpt2 base: %v", err)
	}
}

func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	if err := os.CopyFS(dst, os.DirFS(src)); err != nil {
		t.Fatal(err)
	}
}

func TestAdapterValidate(t *testing.T) {
	a := mustAdapter(t, fixture("adapters", "llama_lora"))
	if err := a.Validate(fixture("models", "llama")); err != nil {
		t.Fatal(err)
	}
	err := a.Validate(fixture("models", "gpt2"))
	var e *peft.Error
	if !errors.As(err, &e) || (e.Code != peft.CodeUnresolvedKey && e.Code != peft.CodeShapeMismatch) {
		t.Fatalf("validate against gpt2: %v", err)
	}
	// A base with other shapes: mistral's projections differ from llama's? Use the f16 llama: same
	// shapes, so it validates.
	if err := a.Validate(fixture("models", "llama_f16")); err != nil {
		t.Fatalf("validate against the f16 llama: %v", err)
	}
	err = a.Validate(filepath.Join(t.TempDir(), "absent"))
	if !errors.As(err, &e) || (e.Code != peft.CodeNotFound && e.Code != peft.CodeIO) {
		t.Fatalf("validate against a missing folder: %v", err)
	}
	wantCode(t, a.Validate("a\x00"), peft.CodeInvalidArgument)
}

func TestTranslatorRoundTrip(t *testing.T) {
	a := mustAdapter(t, fixture("adapters", "llama_lora"))
	tr, err := a.Translator()
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	if tr.Family() != "llama" || a.Family() != "llama" {
		t.Fatalf("family %q / %q", tr.Family(), a.Family())
	}
	file := mustOpen(t, fixture("adapters", "llama_lora", "adapter_model.safetensors"))
	infos, _ := file.Tensors()
	var keys []string
	for _, info := range infos {
		keys = append(keys, info.Name)
	}
	natives, err := tr.ToNativeAll(keys)
	if err != nil {
		t.Fatal(err)
	}
	back, err := tr.ToHFAll(natives, true)
	if err != nil {
		t.Fatal(err)
	}
	for i, key := range keys {
		gcPoint()
		one, err := tr.ToNative(key)
		if err != nil || one != natives[i] || strings.Contains(one, ".") && !strings.Contains(one, "/") {
			t.Fatalf("ToNative(%q) = %q, %v; batch %q", key, one, err, natives[i])
		}
		hf, err := tr.ToHF(one, true)
		if err != nil || hf != key || back[i] != key {
			t.Fatalf("round trip of %q: %q / %q, %v", key, hf, back[i], err)
		}
		bare, err := tr.ToHF(one, false)
		if err != nil || "base_model.model."+bare != key {
			t.Fatalf("ToHF without prefix: %q", bare)
		}
	}
	_, err = tr.ToNative("model.no_such_module.weight")
	wantCode(t, err, peft.CodeUnresolvedKey)
	_, err = tr.ToNativeAll([]string{keys[0], "nonsense.a", "nonsense.b"})
	wantCode(t, err, peft.CodeUnresolvedKey)
	if !strings.Contains(err.Error(), "nonsense.a") || !strings.Contains(err.Error(), "nonsense.b") {
		t.Fatalf("the batch error does not list every key: %v", err)
	}
	_, err = tr.ToHF("no/such/native/name", true)
	wantCode(t, err, peft.CodeUnresolvedKey)
	_, err = tr.ToHFAll([]string{"x\x00"}, true)
	wantCode(t, err, peft.CodeInvalidArgument)
	if got, err := tr.ToNativeAll(nil); err != nil || len(got) != 0 {
		t.Fatalf("empty batch: %v %v", got, err)
	}
}

func TestBuiltinTranslators(t *testing.T) {
	families, err := peft.BuiltinFamilies()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"llama", "gpt2", "bert"} {
		if !slices.Contains(families, want) {
			t.Fatalf("families %v lack %q", families, want)
		}
	}
	if !slices.IsSorted(families) {
		t.Fatalf("families not sorted: %v", families)
	}
	for _, f := range families {
		tr, err := peft.NewBuiltinTranslator(f)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if tr.Family() != f {
			t.Fatalf("family %q, want %q", tr.Family(), f)
		}
		tr.Close()
	}
	_, err = peft.NewBuiltinTranslator("no_such_family")
	wantCode(t, err, peft.CodeNotFound)
	_, err = peft.NewBuiltinTranslator("../etc")
	wantCode(t, err, peft.CodeInvalidArgument)

	tr, err := peft.DetectTranslator(fixture("models", "llama"), "")
	if err != nil || tr.Family() != "llama" {
		t.Fatalf("detect from the base: %v", err)
	}
	tr.Close()
	tr, err = peft.DetectTranslator("", "openai-community/gpt2")
	if err != nil || tr.Family() != "gpt2" {
		t.Fatalf("detect from a name: %v %v", tr, err)
	}
	tr.Close()
	_, err = peft.DetectTranslator("", "")
	wantCode(t, err, peft.CodeNotFound)

	// The caller's own table, from a file and from JSON: the built-in llama table file itself.
	table := filepath.Join("..", "..", "data", "arch", "llama.json")
	text, err := os.ReadFile(table)
	if err != nil {
		t.Fatal(err)
	}
	builtin, _ := peft.NewBuiltinTranslator("llama")
	defer builtin.Close()
	fromFile, err := peft.TranslatorFromFile(table)
	if err != nil {
		t.Fatal(err)
	}
	defer fromFile.Close()
	fromJSON, err := peft.TranslatorFromJSON(string(text))
	if err != nil {
		t.Fatal(err)
	}
	defer fromJSON.Close()
	key := "base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight"
	want, err := builtin.ToNative(key)
	if err != nil {
		t.Fatal(err)
	}
	for _, tr := range []*peft.Translator{fromFile, fromJSON} {
		if got, err := tr.ToNative(key); err != nil || got != want {
			t.Fatalf("own table: %q %v, built-in %q", got, err, want)
		}
	}
	_, err = peft.TranslatorFromJSON("{")
	wantCode(t, err, peft.CodeInvalidConfig)
	_, err = peft.TranslatorFromFile(filepath.Join(t.TempDir(), "absent.json"))
	wantCode(t, err, peft.CodeIO)
}

// An adapter opened with an explicit translator uses that table.
func TestAdapterWithTranslator(t *testing.T) {
	tr, err := peft.NewBuiltinTranslator("llama")
	if err != nil {
		t.Fatal(err)
	}
	a := mustAdapter(t, fixture("adapters", "mistral_lora"), peft.WithTranslator(tr))
	tr.Close() // the adapter shares the table
	if a.Family() != "llama" {
		t.Fatalf("family %q with an explicit llama table", a.Family())
	}
	closed, _ := peft.NewBuiltinTranslator("llama")
	closed.Close()
	_, err = peft.OpenAdapter(fixture("adapters", "mistral_lora"), peft.WithTranslator(closed))
	wantClosed(t, err)
}

func TestAdapterModuleErrors(t *testing.T) {
	a := mustAdapter(t, fixture("adapters", "llama_trainable_tokens"))
	_, err := a.FindModule("model.nothing")
	wantCode(t, err, peft.CodeNotFound)
	_, err = a.Module(-1)
	wantCode(t, err, peft.CodeInvalidArgument)
	_, err = a.Module(a.ModuleCount())
	wantCode(t, err, peft.CodeInvalidArgument)
	wantCode(t, a.ReadTensorInto(0, 99, peft.F32, make([]byte, 4)), peft.CodeInvalidArgument)
	wantCode(t, a.ReadTensorInto(-1, 0, peft.F32, make([]byte, 4)), peft.CodeInvalidArgument)
	wantCode(t, a.ReadTensorInto(0, 0, peft.F32, make([]byte, 3)), peft.CodeInvalidArgument)
	_, err = a.ReadTensorFloat32(0, 99)
	wantCode(t, err, peft.CodeInvalidArgument)
	modules, _ := a.Modules()
	tokens := slices.IndexFunc(modules, func(m peft.Module) bool { return m.Kind == peft.LayerTrainableTokens })
	if tokens < 0 {
		t.Fatal("no trainable-tokens module")
	}
	var config struct {
		Indices any `json:"trainable_token_indices"`
	}
	readJSON(t, fixture("adapters", "llama_trainable_tokens", "adapter_config.json"), &config)
	raw, _ := json.Marshal(config.Indices)
	for _, idx := range modules[tokens].TokenIndices {
		if !strings.Contains(string(raw), itoa64(idx)) {
			t.Fatalf("token index %d is not in the config's %s", idx, raw)
		}
	}
	if modules[tokens].Kind.String() != "TrainableTokens" || peft.LayerKind(42).String() != "LayerKind(42)" {
		t.Fatal("LayerKind names")
	}
	f, err := a.ReadTensorFloat32(tokens, 0)
	if err != nil || len(f) == 0 {
		t.Fatalf("read token rows: %v", err)
	}
}

func itoa64(v int64) string { return string(mustJSON(v)) }

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// llama_lora without "down_proj" in target_modules: strict opening refuses it; WithLenient drops the
// four down_proj tensors (PEFT's unexpected keys), one warning each.
func TestAdapterLenient(t *testing.T) {
	src := fixture("adapters", "llama_lora")
	dir := filepath.Join(t.TempDir(), "adapter")
	copyDir(t, src, dir)
	cfg, err := os.ReadFile(filepath.Join(src, "adapter_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	cfg = bytes.Replace(cfg, []byte(`"down_proj",`), nil, 1)
	if err := os.WriteFile(filepath.Join(dir, "adapter_config.json"), cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = peft.OpenAdapter(dir)
	wantCode(t, err, peft.CodeInvalidConfig)
	if w := mustAdapter(t, src).Warnings(); w != nil {
		t.Fatalf("a strict adapter has warnings: %v", w)
	}
	a, err := peft.OpenAdapter(dir, peft.WithBaseDir(fixture("models", "llama")), peft.WithLenient())
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	warnings := a.Warnings()
	if len(warnings) != 4 {
		t.Fatalf("want 4 warnings, got %q", warnings)
	}
	for _, w := range warnings {
		if !strings.HasPrefix(w, `unexpected key "base_model.model.model.layers.`) || !strings.Contains(w, "mlp.down_proj.lora_") {
			t.Errorf("unexpected warning %q", w)
		}
	}
	if a.ModuleCount() != 12 {
		t.Fatalf("want 12 modules, got %d", a.ModuleCount())
	}

	// A lenient registration keeps the same warnings; a strict one has none.
	reg := mustRegistry(t, peft.F32, 1<<20)
	mustRegister(t, reg, "plain", src)
	if err := reg.Register("lenient", dir, peft.WithBaseDir(fixture("models", "llama")), peft.WithLenient()); err != nil {
		t.Fatal(err)
	}
	if got, err := reg.Warnings("lenient"); err != nil || !slices.Equal(got, warnings) {
		t.Fatalf("registry warnings %q (%v), want %q", got, err, warnings)
	}
	if got, err := reg.Warnings("plain"); err != nil || len(got) != 0 {
		t.Fatalf("a strict registration has warnings %q (%v)", got, err)
	}
	_, err = reg.Warnings("absent")
	wantCode(t, err, peft.CodeNotFound)
}
