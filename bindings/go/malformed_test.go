package peft_test

import (
	"errors"
	"os"
	"testing"

	peft "github.com/peft-c/peft_c/bindings/go"
)

// Every malformed fixture fails with the code tests/fixtures/malformed/expected.json gives (the
// reference's failure kind, or peft_c's stricter verdict), opened from a file in both reading modes
// and from memory, and nothing leaks a handle.
func TestMalformedFixtures(t *testing.T) {
	var expected map[string]struct {
		Code        string `json:"code"`
		Description string `json:"description"`
	}
	readJSON(t, fixture("malformed", "expected.json"), &expected)
	if len(expected) < 50 {
		t.Fatalf("only %d malformed cases", len(expected))
	}
	before := peft.LiveHandles()
	for name, want := range expected {
		code := codeByName(t, want.Code)
		path := fixture("malformed", name)
		if _, err := os.Stat(path); err != nil {
			t.Fatal(err)
		}
		for _, mode := range openModes {
			c, err := mode.open(path)
			if err == nil {
				c.Close()
				t.Errorf("%s (%s), %s: opened; want %s", name, want.Description, mode.name, want.Code)
				continue
			}
			var e *peft.Error
			if !errors.As(err, &e) || e.Code != code || !errors.Is(err, peft.Sentinel(code)) {
				t.Errorf("%s (%s), %s: %v; want %s", name, want.Description, mode.name, err, want.Code)
			}
			if e != nil && e.Message == "" {
				t.Errorf("%s: empty message", name)
			}
			if c != nil {
				t.Errorf("%s: a checkpoint came back with the error", name)
			}
		}
		gcPoint()
	}
	if after := peft.LiveHandles(); after != before {
		t.Errorf("live handles %d -> %d", before, after)
	}
}
