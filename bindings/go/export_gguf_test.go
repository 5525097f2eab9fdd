package peft_test

import (
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	peft "github.com/peft-c/peft_c/bindings/go"
)

// The fixture adapter exported to GGUF against the fixture base opens as a GGUF LoRA adapter (a
// .lora_a/.lora_b pair per module, adapter.lora.alpha), and imports back to a PEFT adapter folder
// with the same modules.
func TestExportGGUFRoundTrip(t *testing.T) {
	a := mustAdapter(t, fixture("adapters", "llama_lora"))
	base := fixture("models", "llama")
	dir := t.TempDir()
	for _, typ := range []peft.GGMLType{peft.GGMLF32, peft.GGMLF16, peft.GGMLBF16} {
		t.Run(typ.String(), func(t *testing.T) {
			out := filepath.Join(dir, typ.String()+".gguf")
			if err := a.ExportGGUF(out, base, typ); err != nil {
				t.Fatal(err)
			}
			gcPoint()
			c := mustOpen(t, out)
			if f, err := c.FileFormat(0); err != nil || f != peft.FormatGGUF {
				t.Fatalf("FileFormat(0) = %v, %v", f, err)
			}
			for key, want := range map[string]string{"general.architecture": "llama", "general.type": "adapter", "adapter.type": "lora"} {
				v, err := c.GGUFValue(0, key)
				if err != nil {
					t.Fatal(err)
				}
				if s, ok := v.Text(); !ok || s != want {
					t.Errorf("%s = %#v, want %q", key, v.Value(), want)
				}
			}
			alpha, err := c.GGUFValue(0, "adapter.lora.alpha")
			if err != nil {
				t.Fatal(err)
			}
			if x, ok := alpha.Float(); alpha.Type != peft.GGUFF32 || !ok || x != a.LoraAlpha() {
				t.Errorf("adapter.lora.alpha = %v %#v, want F32 %v", alpha.Type, alpha.Value(), a.LoraAlpha())
			}
			infos, err := c.Tensors()
			if err != nil {
				t.Fatal(err)
			}
			if len(infos) != 2*a.ModuleCount() {
				t.Fatalf("%d tensors for %d modules", len(infos), a.ModuleCount())
			}
			pairs := map[string]int{}
			for _, info := range infos {
				stem, ok := strings.CutSuffix(info.Name, ".weight.lora_a")
				if !ok {
					stem, ok = strings.CutSuffix(info.Name, ".weight.lora_b")
				}
				if !ok || !strings.HasPrefix(stem, "blk.") {
					t.Errorf("tensor %q is not a GGUF LoRA factor", info.Name)
				}
				if info.GGMLType != typ {
					t.Errorf("%q is %v, want %v", info.Name, info.GGMLType, typ)
				}
				pairs[stem]++
			}
			for stem, n := range pairs {
				if n != 2 {
					t.Errorf("%s has %d factors", stem, n)
				}
			}
			q, err := c.TensorByName("blk.0.attn_q.weight.lora_a")
			if err != nil {
				t.Fatal(err)
			}
			if len(q.Shape) != 2 || q.Shape[0] != uint64(a.R()) {
				t.Errorf("blk.0.attn_q.weight.lora_a has shape %v, want rank %d first", q.Shape, a.R())
			}

			back := filepath.Join(dir, typ.String()+"-peft", "nested")
			if err := peft.ImportGGUF(out, back, base); err != nil {
				t.Fatal(err)
			}
			gcPoint()
			b := mustAdapter(t, back)
			if b.ModuleCount() != a.ModuleCount() || b.R() != a.R() || b.LoraAlpha() != a.LoraAlpha() {
				t.Fatalf("imported %d modules, r %d, alpha %v; want %d, %d, %v",
					b.ModuleCount(), b.R(), b.LoraAlpha(), a.ModuleCount(), a.R(), a.LoraAlpha())
			}
			if b.BaseModelNameOrPath() != base {
				t.Errorf("base_model_name_or_path %q, want %q", b.BaseModelNameOrPath(), base)
			}
			if got, want := moduleNames(t, b), moduleNames(t, a); !reflect.DeepEqual(got, want) {
				t.Errorf("imported modules %v, want %v", got, want)
			}
		})
	}
}

// A missing base is the binding's error with the library's code, and nothing is written.
func TestExportGGUFBadInput(t *testing.T) {
	a := mustAdapter(t, fixture("adapters", "llama_lora"))
	dir := t.TempDir()
	out := filepath.Join(dir, "out.gguf")
	// A base folder without config.json has no architecture.
	wantCode(t, a.ExportGGUF(out, t.TempDir(), peft.GGMLF32), peft.CodeInvalidConfig)
	// A type other than F32, F16, BF16 and Q8_0.
	wantCode(t, a.ExportGGUF(out, fixture("models", "llama"), 2), peft.CodeInvalidArgument)
	wantCode(t, a.ExportGGUF("", fixture("models", "llama"), peft.GGMLF32), peft.CodeInvalidArgument)
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Fatalf("a failed export left %s: %v", out, err)
	}

	if err := a.ExportGGUF(out, fixture("models", "llama"), peft.GGMLF32); err != nil {
		t.Fatal(err)
	}
	back := filepath.Join(dir, "peft")
	// The base is required.
	wantCode(t, peft.ImportGGUF(out, back, ""), peft.CodeInvalidArgument)
	// A GGUF file that is not an adapter.
	wantCode(t, peft.ImportGGUF(ggufSample, back, fixture("models", "llama")), peft.CodeInvalidArgument)
	wantCode(t, peft.ImportGGUF(filepath.Join(dir, "absent.gguf"), back, fixture("models", "llama")), peft.CodeIO)
	if _, err := os.Stat(back); !os.IsNotExist(err) {
		t.Fatalf("a failed import left %s: %v", back, err)
	}
}

func moduleNames(t *testing.T, a *peft.Adapter) []string {
	t.Helper()
	modules, err := a.Modules()
	if err != nil {
		t.Fatal(err)
	}
	names := make([]string, len(modules))
	for i, m := range modules {
		names[i] = m.Name
	}
	sort.Strings(names)
	return names
}
