package peft_test

import (
	"os"
	"path/filepath"
	"testing"

	peft "github.com/peft-c/peft_c/bindings/go"
)

// CombineDeltas on llama_lora (0.7) and llama_rank_alpha_pattern (-1.3): exactly with linear (every
// module's error 0) and with ties at rank 4, the same files as `peftc adapter combine --deltas`
// writes; then the errors, each of which writes nothing.
func TestCombineDeltas(t *testing.T) {
	dir := t.TempDir()
	loraDir, patternDir := fixture("adapters", "llama_lora"), fixture("adapters", "llama_rank_alpha_pattern")
	adapters := []*peft.Adapter{mustAdapter(t, loraDir), mustAdapter(t, patternDir)}
	weights := []float64{0.7, -1.3}
	peftcArgs := func(out, method string, extra ...string) []string {
		args := []string{"adapter", "combine", "--deltas", "--adapter", loraDir + ":0.7", "--adapter", patternDir + ":-1.3",
			"--method", method, "--out", out}
		return append(args, extra...)
	}

	// Exact: the rank of each module is the sum of the adapters' ranks, the error 0.
	exact := filepath.Join(dir, "exact")
	report, err := peft.CombineDeltas(adapters, weights, peft.CombineLinear, exact, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(report) == 0 {
		t.Fatal("CombineDeltas reported no module")
	}
	for _, m := range report {
		if m.Error != 0 || m.Rank < 1 || m.Name == "" {
			t.Fatalf("exact combination: module %+v", m)
		}
	}
	peftc(t, peftcArgs(filepath.Join(dir, "exact-peftc"), "linear")...)
	sameFiles(t, exact, filepath.Join(dir, "exact-peftc"), adapterFiles...)
	gcPoint()

	// TIES on the deltas, truncated to rank 4.
	ties := filepath.Join(dir, "ties")
	report, err = peft.CombineDeltas(adapters, weights, peft.CombineTies, ties,
		[]peft.ExportOption{peft.WithDensity(0.5)}, peft.WithRank(4))
	if err != nil {
		t.Fatal(err)
	}
	if len(report) == 0 {
		t.Fatal("CombineDeltas reported no module")
	}
	for _, m := range report {
		if m.Rank != 4 || m.Error < 0 || m.Error >= 1 {
			t.Fatalf("ties at rank 4: module %+v", m)
		}
	}
	peftc(t, peftcArgs(filepath.Join(dir, "ties-peftc"), "ties", "--density", "0.5", "--rank", "4")...)
	sameFiles(t, ties, filepath.Join(dir, "ties-peftc"), adapterFiles...)
	gcPoint()

	// Errors, with the library's codes; none writes the output folder.
	notWritten := func(out string) {
		t.Helper()
		if _, err := os.Stat(out); !os.IsNotExist(err) {
			t.Fatalf("a failed CombineDeltas left %s (%v)", out, err)
		}
	}
	out := filepath.Join(dir, "no-density")
	_, err = peft.CombineDeltas(adapters, weights, peft.CombineTies, out, nil, peft.WithRank(4))
	wantCode(t, err, peft.CodeInvalidArgument)
	notWritten(out)
	out = filepath.Join(dir, "exact-ties")
	_, err = peft.CombineDeltas(adapters, weights, peft.CombineTies, out, []peft.ExportOption{peft.WithDensity(0.5)})
	wantCode(t, err, peft.CodeInvalidArgument)
	notWritten(out)
	dora := mustAdapter(t, fixture("adapters", "llama_dora"))
	out = filepath.Join(dir, "dora")
	_, err = peft.CombineDeltas([]*peft.Adapter{adapters[0], dora}, weights, peft.CombineLinear, out, nil)
	wantCode(t, err, peft.CodeUnsupported)
	notWritten(out)
	out = filepath.Join(dir, "svd")
	_, err = peft.CombineDeltas(adapters, weights, peft.CombineSVD, out, nil, peft.WithRank(4))
	wantCode(t, err, peft.CodeInvalidArgument)
	notWritten(out)
	out = filepath.Join(dir, "count")
	_, err = peft.CombineDeltas(adapters, weights[:1], peft.CombineLinear, out, nil)
	wantCode(t, err, peft.CodeInvalidArgument)
	notWritten(out)
}
