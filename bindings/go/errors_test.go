package peft_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"testing"

	peft "github.com/peft-c/peft_c/bindings/go"
)

// Every PEFT_ERR_* constant of the header has a Go code of the same value with a sentinel, and the
// library names it as the header does.
func TestErrorCodesMatchHeader(t *testing.T) {
	header, err := os.ReadFile("../../include/peft_c.h")
	if err != nil {
		t.Fatal(err)
	}
	defs := regexp.MustCompile(`#define PEFT_ERR_([A-Z0-9_]+) (\d+)`).FindAllStringSubmatch(string(header), -1)
	if len(defs) < 20 {
		t.Fatalf("found only %d PEFT_ERR_ constants in the header", len(defs))
	}
	for _, d := range defs {
		value, _ := strconv.Atoi(d[2])
		code := peft.Code(value)
		if code.String() != d[1] {
			t.Errorf("code %d: library name %q, header PEFT_ERR_%s", value, code.String(), d[1])
		}
		s := peft.Sentinel(code)
		if s == nil || s.Code != code {
			t.Errorf("no sentinel for PEFT_ERR_%s", d[1])
		}
		if code.IsFormat() != (value >= 1 && value <= 10) {
			t.Errorf("IsFormat of %s is %v", d[1], code.IsFormat())
		}
	}
	if peft.CodeOK.String() != "OK" || peft.Code(12345).String() != "UNKNOWN" {
		t.Errorf("OK / unknown names: %q %q", peft.CodeOK.String(), peft.Code(12345).String())
	}
	if peft.Sentinel(peft.CodeOK) != nil {
		t.Error("CodeOK has a sentinel")
	}
}

func TestErrorIsAndAs(t *testing.T) {
	_, err := peft.Open(fixture("malformed", "offset_gap.safetensors"))
	if !errors.Is(err, peft.ErrInvalidOffset) {
		t.Fatalf("errors.Is(%v, ErrInvalidOffset) is false", err)
	}
	if errors.Is(err, peft.ErrInvalidHeader) {
		t.Fatal("an INVALID_OFFSET error matches ErrInvalidHeader")
	}
	var e *peft.Error
	if !errors.As(fmt.Errorf("wrapped: %w", err), &e) {
		t.Fatal("errors.As through a wrapper failed")
	}
	if e.Code != peft.CodeInvalidOffset || e.Message == "" || !e.Code.IsFormat() {
		t.Fatalf("got %#v", e)
	}
	if want := "peft: INVALID_OFFSET: " + e.Message; err.Error() != want {
		t.Fatalf("Error() = %q, want %q", err.Error(), want)
	}
	// The same code with another message is not the same error; with the same message it is.
	if errors.Is(err, &peft.Error{Code: peft.CodeInvalidOffset, Message: "other"}) {
		t.Fatal("matched a different message")
	}
	if !errors.Is(err, &peft.Error{Code: peft.CodeInvalidOffset, Message: e.Message}) {
		t.Fatal("did not match an equal error")
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, peft.ErrClosed) {
		t.Fatal("matched an unrelated error")
	}
}

func TestErrorNamesTheFile(t *testing.T) {
	path := fixture("malformed", "offset_gap.safetensors")
	_, err := peft.Open(path)
	var e *peft.Error
	if !errors.As(err, &e) {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`offset_gap\.safetensors|tensor`).MatchString(e.Message) {
		t.Fatalf("message %q names neither the file nor the tensor", e.Message)
	}
}

func TestKernels(t *testing.T) {
	got := peft.Kernels()
	if got != "portable" && got != "avx2" && got != "avx512" {
		t.Fatalf("kernel table %q", got)
	}
	if os.Getenv("PEFT_C_KERNELS") == "portable" && got != "portable" {
		t.Errorf("PEFT_C_KERNELS=portable, but the library runs %q", got)
	}
}

func TestVersion(t *testing.T) {
	if err := peft.CheckVersion(); err != nil {
		t.Fatal(err)
	}
	if peft.Version() != peft.HeaderVersion {
		t.Errorf("library %s, header %s", peft.Version(), peft.HeaderVersion)
	}
	if peft.ABIVersion() != peft.HeaderABIVersion {
		t.Errorf("ABI %d vs %d", peft.ABIVersion(), peft.HeaderABIVersion)
	}
	want := fmt.Sprint(peft.VersionNumber()/10000, ".", peft.VersionNumber()/100%100, ".", peft.VersionNumber()%100)
	if peft.Version() != want {
		t.Errorf("Version %q, VersionNumber %d", peft.Version(), peft.VersionNumber())
	}
}
