package peft_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	peft "github.com/peft-c/peft_c/bindings/go"
)

// fixturesDir is the repository's tests/fixtures, relative to this module.
var fixturesDir = filepath.Join("..", "..", "tests", "fixtures")

func fixture(parts ...string) string {
	return filepath.Join(append([]string{fixturesDir}, parts...)...)
}

// gcStress is set by PEFTC_TEST_GC=1 (test.sh's forced-GC run): gcPoint then collects garbage, and
// runs pending cleanups, between the calls of a test.
var gcStress = os.Getenv("PEFTC_TEST_GC") != ""

func gcPoint() {
	if gcStress {
		runtime.GC()
	}
}

func readJSON(t testing.TB, path string, v any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

func mustOpen(t testing.TB, path string, opts ...peft.OpenOption) *peft.Checkpoint {
	t.Helper()
	c, err := peft.Open(path, opts...)
	if err != nil {
		t.Fatalf("Open(%s): %v", path, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func mustAdapter(t testing.TB, dir string, opts ...peft.AdapterOption) *peft.Adapter {
	t.Helper()
	a, err := peft.OpenAdapter(dir, opts...)
	if err != nil {
		t.Fatalf("OpenAdapter(%s): %v", dir, err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}

// codeByName maps a code's name ("INVALID_OFFSET") to the code, as the library names them.
func codeByName(t testing.TB, name string) peft.Code {
	t.Helper()
	for c := peft.Code(0); c < 100; c++ {
		if c.String() == name {
			return c
		}
	}
	t.Fatalf("no error code is named %q", name)
	return 0
}

// wantCode fails unless err is a *peft.Error with this code, matched both ways.
func wantCode(t testing.TB, err error, code peft.Code) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error; want %v", code)
	}
	var e *peft.Error
	if !errors.As(err, &e) || e.Code != code {
		t.Fatalf("error %v; want code %v", err, code)
	}
	if !errors.Is(err, peft.Sentinel(code)) {
		t.Fatalf("errors.Is(%v, sentinel of %v) is false", err, code)
	}
}
