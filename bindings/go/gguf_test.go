package peft_test

import (
	"errors"
	"math"
	"os"
	"reflect"
	"strings"
	"testing"

	peft "github.com/peft-c/peft_c/bindings/go"
)

// ggufSample is tests/fixtures/gguf/bindings_sample.gguf, written by bindings_sample.py next to it in
// the byte layout of tests/capi/test_gguf.c; the expected values below are the ones that script packs.
var ggufSample = fixture("gguf", "bindings_sample.gguf")

func openGGUFSample(t *testing.T) map[string]*peft.Checkpoint {
	t.Helper()
	data, err := os.ReadFile(ggufSample)
	if err != nil {
		t.Fatal(err)
	}
	mem, err := peft.OpenBytes(data)
	if err != nil {
		t.Fatalf("OpenBytes: %v", err)
	}
	t.Cleanup(func() { mem.Close() })
	return map[string]*peft.Checkpoint{
		"mmap":   mustOpen(t, ggufSample),
		"pread":  mustOpen(t, ggufSample, peft.WithPread(true)),
		"memory": mem,
	}
}

func TestGGUFFormatAndMetadata(t *testing.T) {
	want := []struct {
		key  string
		typ  peft.GGUFType
		elem peft.GGUFType
		val  any
	}{
		{"general.architecture", peft.GGUFString, -1, "llama"},
		{"general.alignment", peft.GGUFU32, -1, uint64(64)},
		{"a.u8", peft.GGUFU8, -1, uint64(200)},
		{"a.i8", peft.GGUFI8, -1, int64(-2)},
		{"a.u16", peft.GGUFU16, -1, uint64(0x1234)},
		{"a.i16", peft.GGUFI16, -1, int64(-1)},
		{"a.i32", peft.GGUFI32, -1, int64(-7)},
		{"a.f32", peft.GGUFF32, -1, 1.5},
		{"a.bool", peft.GGUFBool, -1, true},
		{"a.u64", peft.GGUFU64, -1, uint64(math.MaxUint64)},
		{"a.i64", peft.GGUFI64, -1, int64(-5)},
		{"a.f64", peft.GGUFF64, -1, math.Pi},
		{"a.tokens", peft.GGUFArray, peft.GGUFString, []any{"<s>", "", "hello"}},
		{"a.ids", peft.GGUFArray, peft.GGUFI32, []any{int64(10), int64(-20)}},
	}
	for mode, c := range openGGUFSample(t) {
		t.Run(mode, func(t *testing.T) {
			if f, err := c.FileFormat(0); err != nil || f != peft.FormatGGUF || f.String() != "gguf" {
				t.Fatalf("FileFormat(0) = %v, %v", f, err)
			}
			if v, err := c.GGUFVersion(0); err != nil || v != 3 {
				t.Fatalf("GGUFVersion(0) = %d, %v", v, err)
			}
			if _, err := c.FileFormat(1); !errors.Is(err, peft.ErrInvalidArgument) {
				t.Fatalf("FileFormat(1): %v", err)
			}
			entries, err := c.GGUFMetadata(0)
			if err != nil {
				t.Fatal(err)
			}
			gcPoint()
			if len(entries) != len(want) {
				t.Fatalf("%d entries, want %d", len(entries), len(want))
			}
			for i, w := range want {
				e := entries[i]
				if e.Key != w.key || e.Value.Type != w.typ || e.Value.ElemType != w.elem || !reflect.DeepEqual(e.Value.Value(), w.val) {
					t.Errorf("entry %d: %s %v/%v %#v, want %s %v/%v %#v", i, e.Key, e.Value.Type, e.Value.ElemType, e.Value.Value(), w.key, w.typ, w.elem, w.val)
				}
			}
			// Safetensors metadata is absent from a GGUF file.
			if m, err := c.Metadata(0); err != nil || m != nil {
				t.Fatalf("Metadata(0) = %v, %v", m, err)
			}
		})
	}
}

func TestGGUFValueGetters(t *testing.T) {
	c := mustOpen(t, ggufSample)
	get := func(key string) peft.GGUFValue {
		t.Helper()
		v, err := c.GGUFValue(0, key)
		if err != nil {
			t.Fatalf("GGUFValue(%s): %v", key, err)
		}
		return v
	}
	if x, ok := get("a.u64").Uint(); !ok || x != math.MaxUint64 {
		t.Errorf("a.u64 Uint = %d, %v", x, ok)
	}
	if _, ok := get("a.u64").Int(); ok {
		t.Error("a.u64 (2^64-1) read as int64")
	}
	if x, ok := get("a.i32").Int(); !ok || x != -7 {
		t.Errorf("a.i32 Int = %d, %v", x, ok)
	}
	if _, ok := get("a.i32").Uint(); ok {
		t.Error("a.i32 (-7) read as uint64")
	}
	if x, ok := get("a.u8").Int(); !ok || x != 200 {
		t.Errorf("a.u8 Int = %d, %v", x, ok)
	}
	if x, ok := get("a.f32").Float(); !ok || x != 1.5 {
		t.Errorf("a.f32 Float = %v, %v", x, ok)
	}
	if _, ok := get("a.f32").Int(); ok {
		t.Error("a.f32 read as an integer")
	}
	if x, ok := get("a.bool").Bool(); !ok || !x {
		t.Errorf("a.bool Bool = %v, %v", x, ok)
	}
	if s, ok := get("general.architecture").Text(); !ok || s != "llama" {
		t.Errorf("general.architecture Text = %q, %v", s, ok)
	}
	if _, ok := get("a.u8").Text(); ok {
		t.Error("a.u8 read as a string")
	}
	tokens := get("a.tokens")
	if tokens.Len() != 3 || tokens.Index(0).Type != peft.GGUFString {
		t.Fatalf("a.tokens: len %d", tokens.Len())
	}
	if s, ok := tokens.Index(2).Text(); !ok || s != "hello" {
		t.Errorf("a.tokens[2] = %q, %v", s, ok)
	}
	if get("a.u8").Len() != 0 {
		t.Error("a scalar has elements")
	}
	_, err := c.GGUFValue(0, "no.such.key")
	var perr *peft.Error
	if !errors.As(err, &perr) || perr.Code != peft.CodeNotFound || !strings.Contains(perr.Message, "no.such.key") {
		t.Fatalf("missing key: %v", err)
	}
	if _, err := c.GGUFValue(1, "a.u8"); !errors.Is(err, peft.ErrInvalidArgument) {
		t.Fatalf("file 1: %v", err)
	}
	if _, err := c.GGUFValue(0, "nul\x00key"); !errors.Is(err, peft.ErrInvalidArgument) {
		t.Fatalf("key with a NUL byte: %v", err)
	}
}

func TestGGUFTensors(t *testing.T) {
	for mode, c := range openGGUFSample(t) {
		t.Run(mode, func(t *testing.T) {
			infos, err := c.Tensors()
			if err != nil {
				t.Fatal(err)
			}
			if len(infos) != 2 || infos[0].Name != "w" || infos[1].Name != "q" {
				t.Fatalf("tensors: %+v", infos)
			}
			w, q := infos[0], infos[1]
			if w.DType != peft.F16 || w.GGMLType != 1 || w.GGMLType.String() != "F16" || !reflect.DeepEqual(w.Shape, []uint64{2, 3}) {
				t.Errorf("w: %+v", w)
			}
			values, err := c.ReadFloat32(w.Index)
			if err != nil || !reflect.DeepEqual(values, []float32{1, 2, 3, 4, 5, 6}) {
				t.Errorf("w read: %v, %v", values, err)
			}
			if q.DType.Valid() || q.GGMLType.String() != "Q8_0" || !reflect.DeepEqual(q.Shape, []uint64{1, 32}) || q.DataOffsets != [2]uint64{64, 98} {
				t.Errorf("q: %+v", q)
			}
			block, size, err := q.GGMLType.Geometry()
			if err != nil || q.NumBytes() != q.NumElements()/uint64(block)*uint64(size) {
				t.Errorf("q geometry %d %d %v, %d bytes", block, size, err, q.NumBytes())
			}
			raw, err := c.View(q.Index)
			if err != nil || len(raw) != 34 || raw[0] != 0x00 || raw[1] != 0x3C || int8(raw[2]) != -16 || raw[33] != 15 {
				t.Errorf("q view: %v, %v", raw, err)
			}
			_, err = c.ReadFloat32(q.Index)
			var perr *peft.Error
			if !errors.As(err, &perr) || perr.Code != peft.CodeUnsupported || !strings.Contains(perr.Message, "block-quantized") {
				t.Errorf("q read: %v", err)
			}
		})
	}
}

func TestGGUFSideOfASafetensorsFile(t *testing.T) {
	c := mustOpen(t, fixture("safetensors", "metadata_one.safetensors"))
	if f, err := c.FileFormat(0); err != nil || f != peft.FormatSafetensors || f.String() != "safetensors" {
		t.Fatalf("FileFormat = %v, %v", f, err)
	}
	if v, err := c.GGUFVersion(0); err != nil || v != 0 {
		t.Fatalf("GGUFVersion = %d, %v", v, err)
	}
	if m, err := c.GGUFMetadata(0); err != nil || m != nil {
		t.Fatalf("GGUFMetadata = %v, %v", m, err)
	}
	if _, err := c.GGUFValue(0, "general.architecture"); !errors.Is(err, peft.ErrNotFound) {
		t.Fatalf("GGUFValue: %v", err)
	}
	infos, err := c.Tensors()
	if err != nil || len(infos) == 0 {
		t.Fatalf("Tensors: %v", err)
	}
	for _, info := range infos {
		if info.GGMLType != -1 || !info.DType.Valid() {
			t.Errorf("%s: ggml type %d, dtype %v", info.Name, info.GGMLType, info.DType)
		}
	}
}

func TestGGMLTypes(t *testing.T) {
	if s := peft.GGMLType(12).String(); s != "Q4_K" {
		t.Errorf("12 = %s", s)
	}
	if s := peft.GGMLType(4).String(); s != "GGMLType(4)" || peft.GGMLType(4).Valid() { // the removed Q4_2
		t.Errorf("4 = %s", s)
	}
	if x, err := peft.ParseGGMLType("BF16"); err != nil || x != 30 {
		t.Errorf("BF16 = %d, %v", x, err)
	}
	if _, err := peft.ParseGGMLType("bf16"); !errors.Is(err, peft.ErrInvalidArgument) {
		t.Errorf("bf16: %v", err)
	}
	for _, c := range []struct {
		t           peft.GGMLType
		block, size uint32
	}{{0, 1, 4}, {8, 32, 34}, {14, 256, 210}} {
		if b, s, err := c.t.Geometry(); err != nil || b != c.block || s != c.size {
			t.Errorf("%v geometry = %d, %d, %v", c.t, b, s, err)
		}
	}
	if _, _, err := peft.GGMLType(31).Geometry(); !errors.Is(err, peft.ErrInvalidArgument) {
		t.Errorf("31: %v", err)
	}
	if s := peft.GGUFArray.String(); s != "ARRAY" {
		t.Errorf("GGUFArray = %s", s)
	}
}
