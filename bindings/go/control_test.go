package peft_test

import (
	"encoding/binary"
	"errors"
	"math"
	"path/filepath"
	"slices"
	"testing"

	peft "github.com/peft-c/peft_c/bindings/go"
)

var (
	controlD1 = []float32{0.1, -0.25, 1.5, 3.0e-3}
	controlD3 = []float32{-1.0, 0.7, 0.0, 2.5}
)

func sampleControlVector(t *testing.T) *peft.ControlVector {
	t.Helper()
	v, err := peft.NewControlVector(4, "test-model")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { v.Close() })
	if err := v.SetDirection(1, controlD1); err != nil {
		t.Fatal(err)
	}
	if err := v.SetDirection(3, controlD3); err != nil {
		t.Fatal(err)
	}
	return v
}

func checkSampleControlVector(t *testing.T, what string, v *peft.ControlVector) {
	t.Helper()
	if v.NEmbd() != 4 || v.ModelHint() != "test-model" || v.LayerCount() != 2 {
		t.Fatalf("%s: n_embd %d, hint %q, %d layers", what, v.NEmbd(), v.ModelHint(), v.LayerCount())
	}
	if v.Layer(0) != 1 || v.Layer(1) != 3 || v.Layer(2) != -1 || !slices.Equal(v.Layers(), []int64{1, 3}) {
		t.Fatalf("%s: layers %v", what, v.Layers())
	}
	if !slices.Equal(v.Direction(1), controlD1) || !slices.Equal(v.Direction(3), controlD3) {
		t.Fatalf("%s: directions %v %v", what, v.Direction(1), v.Direction(3))
	}
	if v.Direction(2) != nil {
		t.Fatalf("%s: layer 2 has a direction", what)
	}
}

func TestControlVector(t *testing.T) {
	v := sampleControlVector(t)
	checkSampleControlVector(t, "new", v)

	t.Run("raw bytes", func(t *testing.T) {
		w, err := peft.NewControlVector(4, "")
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		if w.ModelHint() != "" {
			t.Fatalf("hint %q", w.ModelHint())
		}
		raw := make([]byte, 0, 32)
		for _, x := range []float64{0.5, -2, 1e-3, 8} {
			raw = binary.LittleEndian.AppendUint64(raw, math.Float64bits(x))
		}
		if err := w.SetDirectionBytes(5, peft.F64, raw); err != nil {
			t.Fatal(err)
		}
		if got := w.Direction(5); !slices.Equal(got, []float32{0.5, -2, 1e-3, 8}) {
			t.Fatalf("direction %v", got)
		}
		wantCode(t, w.SetDirectionBytes(5, peft.F64, raw[:8]), peft.CodeInvalidArgument)
	})

	t.Run("save and open", func(t *testing.T) {
		dir := t.TempDir()
		for _, f := range []struct {
			name   string
			format peft.FileFormat
		}{{"cv.gguf", peft.FormatGGUF}, {"cv.safetensors", peft.FormatSafetensors}} {
			path := filepath.Join(dir, f.name)
			if err := v.Save(path, f.format); err != nil {
				t.Fatal(err)
			}
			back, err := peft.OpenControlVector(path)
			if err != nil {
				t.Fatal(err)
			}
			checkSampleControlVector(t, f.name, back)
			back.Close()
		}
	})

	t.Run("add", func(t *testing.T) {
		dst := sampleControlVector(t)
		src, err := peft.NewControlVector(4, "")
		if err != nil {
			t.Fatal(err)
		}
		defer src.Close()
		s3 := []float32{0.3, 0.1, -7, 1e-7}
		s4 := []float32{1, 2, 3, 4}
		if err := src.SetDirection(3, s3); err != nil {
			t.Fatal(err)
		}
		if err := src.SetDirection(4, s4); err != nil {
			t.Fatal(err)
		}
		if err := dst.Add(src, 0.5); err != nil {
			t.Fatal(err)
		}
		half := float32(0.5)
		want3, want4 := make([]float32, 4), make([]float32, 4)
		for i := range 4 {
			p3, p4 := float32(s3[i]*half), float32(s4[i]*half) // explicit conversions: no fused multiply-add
			want3[i] = controlD3[i] + p3
			want4[i] = 0 + p4
		}
		if !slices.Equal(dst.Layers(), []int64{1, 3, 4}) || !slices.Equal(dst.Direction(1), controlD1) ||
			!slices.Equal(dst.Direction(3), want3) || !slices.Equal(dst.Direction(4), want4) {
			t.Fatalf("layers %v: %v %v %v", dst.Layers(), dst.Direction(1), dst.Direction(3), dst.Direction(4))
		}
		// src may be dst itself.
		if err := dst.Add(dst, 1); err != nil {
			t.Fatal(err)
		}
		if got := dst.Direction(4); !slices.Equal(got, []float32{want4[0] * 2, want4[1] * 2, want4[2] * 2, want4[3] * 2}) {
			t.Fatalf("self add: %v", got)
		}
		other, err := peft.NewControlVector(5, "")
		if err != nil {
			t.Fatal(err)
		}
		defer other.Close()
		wantCode(t, dst.Add(other, 1), peft.CodeShapeMismatch)
	})

	t.Run("apply and remove", func(t *testing.T) {
		original := []float32{1, 2, -3, 0.125, 10, -0.5, 0.333, 7}
		buf := slices.Clone(original)
		rec, err := v.Apply(3, 2, peft.Float32Buffer(buf, 2, 4))
		if err != nil {
			t.Fatal(err)
		}
		defer rec.Close()
		two := float32(2)
		for i, x := range original {
			d := float32(controlD3[i%4] * two)
			if want := x + d; buf[i] != want {
				t.Fatalf("element %d: %v, want %v", i, buf[i], want)
			}
		}
		if err := rec.Remove(peft.Float32Buffer(buf)); err != nil {
			t.Fatal(err)
		}
		for i := range buf {
			if math.Float32bits(buf[i]) != math.Float32bits(original[i]) {
				t.Fatalf("element %d not restored: %v, want %v", i, buf[i], original[i])
			}
		}
		wantCode(t, rec.Remove(peft.Float32Buffer(buf)), peft.CodeInvalidArgument) // spent

		if err := v.ApplyWithoutRecord(1, 2, peft.Float32Buffer(buf)); err != nil {
			t.Fatal(err)
		}
		for i, x := range original {
			d := float32(controlD1[i%4] * two)
			if want := x + d; buf[i] != want {
				t.Fatalf("element %d without record: %v, want %v", i, buf[i], want)
			}
		}

		buf = slices.Clone(original)
		rec2, err := v.Apply(2, 2, peft.Float32Buffer(buf))
		if err != nil {
			t.Fatal(err)
		}
		defer rec2.Close()
		if !slices.Equal(buf, original) {
			t.Fatalf("a layer without a direction changed the buffer: %v", buf)
		}
		wantCode(t, v.ApplyWithoutRecord(3, 1, peft.Float32Buffer(buf[:6])), peft.CodeInvalidArgument)
	})

	t.Run("errors", func(t *testing.T) {
		dir := t.TempDir()
		w := sampleControlVector(t)
		if err := w.SetDirection(0, controlD1); err != nil {
			t.Fatal(err)
		}
		wantCode(t, w.Save(filepath.Join(dir, "zero.gguf"), peft.FormatGGUF), peft.CodeInvalidArgument)
		if err := w.Save(filepath.Join(dir, "zero.safetensors"), peft.FormatSafetensors); err != nil {
			t.Fatal(err)
		}
		_, err := peft.OpenControlVector(filepath.Join(dir, "missing.gguf"))
		wantCode(t, err, peft.CodeIO)
		wantCode(t, w.SetDirection(2, []float32{1, float32(math.NaN()), 0, 0}), peft.CodeNonFinite)
		wantCode(t, w.SetDirection(-1, controlD1), peft.CodeInvalidArgument)
		wantCode(t, w.SetDirection(2, controlD1[:3]), peft.CodeInvalidArgument)
		_, err = peft.NewControlVector(0, "")
		wantCode(t, err, peft.CodeInvalidArgument)
		w.Close()
		if err := w.SetDirection(1, controlD1); !errors.Is(err, peft.ErrClosed) {
			t.Fatalf("after Close: %v", err)
		}
		if w.Direction(1) != nil || w.NEmbd() != 0 {
			t.Fatal("a closed vector still answers")
		}
	})
}
