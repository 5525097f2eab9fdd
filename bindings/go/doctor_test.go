package peft_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	peft "github.com/peft-c/peft_c/bindings/go"
)

type doctorReport struct {
	Summary struct {
		OK             bool `json:"ok"`
		MatchedModules int  `json:"matched_modules"`
	} `json:"summary"`
	Problems []struct {
		Kind string `json:"kind"`
	} `json:"problems"`
}

func decodeReport(t *testing.T, text string) doctorReport {
	t.Helper()
	var r doctorReport
	if err := json.Unmarshal([]byte(text), &r); err != nil {
		t.Fatal(err)
	}
	return r
}

// A clean fixture adapter: ok, every module matched; its fix is the adapter byte for byte.
func TestAdapterDoctorClean(t *testing.T) {
	adapter, base := fixture("adapters", "llama_lora"), fixture("models", "llama")
	text, err := peft.AdapterDoctor(adapter, base)
	if err != nil {
		t.Fatal(err)
	}
	r := decodeReport(t, text)
	if !r.Summary.OK || r.Summary.MatchedModules != 14 || len(r.Problems) != 0 {
		t.Fatalf("report: %+v", r)
	}
	out := filepath.Join(t.TempDir(), "fixed")
	again, err := peft.AdapterDoctorFix(adapter, base, out)
	if err != nil || again != text {
		t.Fatalf("fix: %v (report differs: %v)", err, again != text)
	}
	for _, f := range []string{"adapter_model.safetensors", "adapter_config.json"} {
		want, _ := os.ReadFile(filepath.Join(adapter, f))
		got, _ := os.ReadFile(filepath.Join(out, f))
		if !bytes.Equal(want, got) {
			t.Errorf("%s differs", f)
		}
	}
}

// A config whose r does not fit the tensors: problems of kind rank_mismatch, not an error.
func TestAdapterDoctorProblems(t *testing.T) {
	src := fixture("adapters", "llama_lora")
	dir := t.TempDir()
	weights, _ := os.ReadFile(filepath.Join(src, "adapter_model.safetensors"))
	config, _ := os.ReadFile(filepath.Join(src, "adapter_config.json"))
	os.WriteFile(filepath.Join(dir, "adapter_model.safetensors"), weights, 0o644)
	os.WriteFile(filepath.Join(dir, "adapter_config.json"), []byte(strings.Replace(string(config), `"r": 4,`, `"r": 2,`, 1)), 0o644)
	text, err := peft.AdapterDoctor(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	r := decodeReport(t, text)
	if r.Summary.OK || len(r.Problems) != 14 {
		t.Fatalf("report: %+v", r)
	}
	for _, p := range r.Problems {
		if p.Kind != "rank_mismatch" {
			t.Errorf("kind %q", p.Kind)
		}
	}
}

func TestAdapterDoctorErrors(t *testing.T) {
	dir := t.TempDir()
	if _, err := peft.AdapterDoctor(filepath.Join(dir, "absent"), ""); !errors.Is(err, peft.ErrNotFound) {
		t.Fatalf("want ErrNotFound, got %v", err)
	}
	if _, err := peft.AdapterDoctorFix(filepath.Join(dir, "absent"), "", filepath.Join(dir, "out")); !errors.Is(err, peft.ErrNotFound) {
		t.Fatalf("want ErrNotFound, got %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "out")); !os.IsNotExist(err) {
		t.Fatal("a failed fix wrote its output folder")
	}
}
