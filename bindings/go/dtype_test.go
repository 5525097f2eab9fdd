package peft_test

import (
	"encoding/binary"
	"math"
	"os"
	"testing"

	peft "github.com/peft-c/peft_c/bindings/go"
)

func TestDTypeNames(t *testing.T) {
	names := []string{"BOOL", "F4", "F6_E2M3", "F6_E3M2", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0",
		"F8_E4M3FNUZ", "F8_E5M2FNUZ", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "C64", "F64", "I64", "U64"}
	if peft.DTypeCount != len(names) {
		t.Fatalf("DTypeCount %d", peft.DTypeCount)
	}
	bits := []int{8, 4, 6, 6, 8, 8, 8, 8, 8, 8, 8, 16, 16, 16, 16, 32, 32, 32, 64, 64, 64, 64}
	for i, name := range names {
		d := peft.DType(i)
		if d.String() != name || !d.Valid() || d.Bits() != bits[i] {
			t.Errorf("dtype %d: %q valid=%v bits=%d", i, d.String(), d.Valid(), d.Bits())
		}
		got, err := peft.ParseDType(name)
		if err != nil || got != d {
			t.Errorf("ParseDType(%q) = %v, %v", name, got, err)
		}
	}
	for _, bad := range []string{"f32", "F33", "", "F32\x00"} {
		_, err := peft.ParseDType(bad)
		wantCode(t, err, peft.CodeInvalidArgument)
	}
	if peft.DType(22).Valid() || peft.DType(-1).Valid() || peft.DType(22).Bits() != 0 || peft.DType(22).String() != "DType(22)" {
		t.Error("invalid dtypes look valid")
	}
}

func readTable(t *testing.T, name string) []byte {
	t.Helper()
	data, err := os.ReadFile(fixture("dtype", name))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// Convert against torch's conversion tables (tests/fixtures/dtype): every non-NaN result bit for
// bit, NaN as NaN.
func TestConvertMatchesTorch(t *testing.T) {
	cases := []struct {
		src, dst       string
		srcT, dstT     peft.DType
		fromPatternsOf int // >0: the source is every bit pattern of this many bits
	}{
		{"", "bf16_to_f32.bin", peft.BF16, peft.F32, 16},
		{"", "f16_to_f32.bin", peft.F16, peft.F32, 16},
		{"", "f8_e4m3_to_f32.bin", peft.F8E4M3, peft.F32, 8},
		{"", "f8_e5m2_to_f32.bin", peft.F8E5M2, peft.F32, 8},
		{"f32_samples.bin", "f32_to_bf16.bin", peft.F32, peft.BF16, 0},
		{"f32_samples.bin", "f32_to_f16.bin", peft.F32, peft.F16, 0},
		{"f64_samples.bin", "f64_to_f32.bin", peft.F64, peft.F32, 0},
		{"i64_samples.bin", "i64_to_f64.bin", peft.I64, peft.F64, 0},
		{"i64_samples.bin", "i64_to_f32.bin", peft.I64, peft.F32, 0},
		{"i64_samples.bin", "i64_to_f16.bin", peft.I64, peft.F16, 0},
	}
	for _, tc := range cases {
		t.Run(tc.dst, func(t *testing.T) {
			var src []byte
			if tc.fromPatternsOf > 0 {
				n := 1 << tc.fromPatternsOf
				src = make([]byte, n*tc.fromPatternsOf/8)
				for i := 0; i < n; i++ {
					if tc.fromPatternsOf == 16 {
						binary.LittleEndian.PutUint16(src[2*i:], uint16(i))
					} else {
						src[i] = byte(i)
					}
				}
			} else {
				src = readTable(t, tc.src)
			}
			want := readTable(t, tc.dst)
			got := make([]byte, len(want))
			if err := peft.Convert(got, tc.dstT, src, tc.srcT); err != nil {
				t.Fatal(err)
			}
			size := tc.dstT.Bits() / 8
			bad := 0
			for i := 0; i < len(want); i += size {
				g, w := floatAt(got[i:], tc.dstT), floatAt(want[i:], tc.dstT)
				if !sameFloat(g, w) {
					if bad++; bad < 5 {
						t.Errorf("element %d: got %v, want %v", i/size, g, w)
					}
				}
			}
			if bad > 0 {
				t.Fatalf("%d elements differ", bad)
			}
		})
	}
}

// floatAt decodes one element of F64, F32, F16 or BF16 as float64 (NaN payloads are not kept).
func floatAt(b []byte, d peft.DType) float64 {
	switch d {
	case peft.F64:
		return math.Float64frombits(binary.LittleEndian.Uint64(b))
	case peft.F32:
		return float64(math.Float32frombits(binary.LittleEndian.Uint32(b)))
	case peft.BF16:
		return float64(math.Float32frombits(uint32(binary.LittleEndian.Uint16(b)) << 16))
	case peft.F16:
		h := binary.LittleEndian.Uint16(b)
		sign := 1.0
		if h&0x8000 != 0 {
			sign = -1
		}
		exp, frac := int(h>>10&0x1f), float64(h&0x3ff)
		switch exp {
		case 0:
			return sign * math.Ldexp(frac, -24)
		case 0x1f:
			if frac != 0 {
				return math.NaN()
			}
			return sign * math.Inf(1)
		}
		return sign * math.Ldexp(1024+frac, exp-25)
	}
	panic("floatAt: " + d.String())
}

func TestConvertErrors(t *testing.T) {
	src := make([]byte, 8)
	wantCode(t, peft.Convert(make([]byte, 4), peft.F32, src, peft.F32), peft.CodeInvalidArgument) // too small
	wantCode(t, peft.Convert(make([]byte, 8), peft.F32, src[:7], peft.F32), peft.CodeInvalidArgument)
	wantCode(t, peft.Convert(make([]byte, 4), peft.F6E2M3, src[:4], peft.F6E2M3), peft.CodeInvalidArgument) // 32 bits are not whole F6 elements
	wantCode(t, peft.Convert(make([]byte, 4), peft.F32, src[:4], peft.DType(50)), peft.CodeInvalidArgument)
	wantCode(t, peft.Convert(make([]byte, 16), peft.I64, src, peft.F32), peft.CodeUnsupported)
	if err := peft.Convert(nil, peft.F32, nil, peft.BF16); err != nil {
		t.Fatalf("empty conversion: %v", err)
	}
	// Sub-byte dtypes: whole bytes only; a same-dtype copy works.
	f4 := []byte{0x12, 0x34}
	out := make([]byte, 2)
	if err := peft.Convert(out, peft.F4, f4, peft.F4); err != nil || out[0] != 0x12 || out[1] != 0x34 {
		t.Fatalf("F4 copy: %v %x", err, out)
	}
}
