package peft_test

import (
	"os"
	"path/filepath"
	"testing"

	peft "github.com/peft-c/peft_c/bindings/go"
)

// wantGGUFNames checks a translator for GGUF names both ways on LLaMA's first query projection.
func wantGGUFNames(t *testing.T, tr *peft.Translator) {
	t.Helper()
	if f := tr.Family(); f != "llama" {
		t.Errorf("Family() = %q, want llama", f)
	}
	got, err := tr.ToNative("model.layers.0.self_attn.q_proj.weight")
	if err != nil || got != "blk.0.attn_q.weight" {
		t.Errorf("ToNative = %q, %v; want blk.0.attn_q.weight", got, err)
	}
	back, err := tr.ToHF("blk.0.attn_q.weight", true)
	if err != nil || back != "base_model.model.model.layers.0.self_attn.q_proj.weight" {
		t.Errorf("ToHF = %q, %v", back, err)
	}
	// Adapter factor keys are not GGUF tensor names.
	_, err = tr.ToNative("model.layers.0.self_attn.q_proj.lora_A.weight")
	wantCode(t, err, peft.CodeUnresolvedKey)
}

// A translator from the sample GGUF file (general.architecture "llama", no head counts) and one from
// an architecture and head counts read the same GGUF names; the checkpoint may be closed first.
func TestGGUFTranslators(t *testing.T) {
	c := mustOpen(t, ggufSample)
	fromFile, err := peft.TranslatorFromGGUF(c)
	if err != nil {
		t.Fatal(err)
	}
	defer fromFile.Close()
	c.Close()
	gcPoint()
	wantGGUFNames(t, fromFile)

	fromArch, err := peft.NewGGUFTranslator("llama", 4, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer fromArch.Close()
	gcPoint()
	wantGGUFNames(t, fromArch)
}

func TestGGUFTranslatorsBadInput(t *testing.T) {
	_, err := peft.NewGGUFTranslator("llama", 0, 2)
	wantCode(t, err, peft.CodeInvalidArgument)
	_, err = peft.NewGGUFTranslator("nosucharch", 4, 2)
	wantCode(t, err, peft.CodeUnsupported)
	// A safetensors checkpoint is not a GGUF file.
	c := mustOpen(t, fixture("models", "llama"))
	_, err = peft.TranslatorFromGGUF(c)
	wantCode(t, err, peft.CodeInvalidArgument)
	c.Close()
	_, err = peft.TranslatorFromGGUF(c)
	if err == nil {
		t.Error("TranslatorFromGGUF on a closed checkpoint succeeded")
	}
}

// The plain fixture adapter has nothing GGUF cannot hold: the split export writes the GGUF adapter
// and a copy of the base.
func TestExportGGUFSplit(t *testing.T) {
	a := mustAdapter(t, fixture("adapters", "llama_lora"))
	base := fixture("models", "llama")
	dir := t.TempDir()
	out, baseOut := filepath.Join(dir, "out.gguf"), filepath.Join(dir, "base_out")
	if err := a.ExportGGUFSplit(out, base, peft.GGMLF32, baseOut); err != nil {
		t.Fatal(err)
	}
	gcPoint()
	c := mustOpen(t, out)
	if f, err := c.FileFormat(0); err != nil || f != peft.FormatGGUF {
		t.Fatalf("FileFormat(0) = %v, %v", f, err)
	}
	copied, err := os.ReadFile(filepath.Join(baseOut, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	original, err := os.ReadFile(filepath.Join(base, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	if string(copied) != string(original) {
		t.Error("the base copy's model.safetensors differs from the base's")
	}
}

func TestExportGGUFSplitBadInput(t *testing.T) {
	a := mustAdapter(t, fixture("adapters", "llama_lora"))
	base := fixture("models", "llama")
	dir := t.TempDir()
	out := filepath.Join(dir, "out.gguf")
	wantCode(t, a.ExportGGUFSplit(out, base, peft.GGMLF32, base), peft.CodeInvalidArgument)
	wantCode(t, a.ExportGGUFSplit(out, base, peft.GGMLF32, out), peft.CodeInvalidArgument)
	wantCode(t, a.ExportGGUFSplit(out, base, peft.GGMLF32, ""), peft.CodeInvalidArgument)
	wantCode(t, a.ExportGGUFSplit(out, base, 2, filepath.Join(dir, "base_out")), peft.CodeInvalidArgument)
	if entries, err := os.ReadDir(dir); err != nil || len(entries) != 0 {
		t.Fatalf("failed split exports left %v (%v)", entries, err)
	}
}
