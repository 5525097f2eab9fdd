package peft_test

import (
	"errors"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"testing"

	peft "github.com/peft-c/peft_c/bindings/go"
)

// lora computes the contribution of one Linear module in float64 from the adapter's own tensors
// (rounded to BF16 first when the registry stores BF16): for each row, the value scaling *
// B (A x) and the magnitude |scaling| * sum |B_ok| |A_kj x_j| that bounds a float32 computation's
// rounding error.
type lora struct {
	a, b       []float64
	r, in, out int
	scaling    float64
}

func loadLora(t *testing.T, a *peft.Adapter, module string, bf16 bool) lora {
	t.Helper()
	m, err := a.Module(mustFind(t, a, module))
	if err != nil {
		t.Fatal(err)
	}
	ai, bi := m.Tensor("lora_A.weight"), m.Tensor("lora_B.weight")
	if m.Kind != peft.LayerLinear || ai < 0 || bi < 0 {
		t.Fatalf("module %s is not a plain Linear LoRA layer", module)
	}
	read := func(i int) []float64 {
		f, err := a.ReadTensorFloat32(m.Index, i)
		if err != nil {
			t.Fatal(err)
		}
		if bf16 {
			f = roundBF16(t, f)
		}
		out := make([]float64, len(f))
		for j, v := range f {
			out[j] = float64(v)
		}
		return out
	}
	return lora{a: read(ai), b: read(bi), r: int(m.Tensors[ai].Shape[0]), in: int(m.Tensors[ai].Shape[1]),
		out: int(m.Tensors[bi].Shape[0]), scaling: m.Scaling}
}

func (l lora) delta(x []float32) (delta, magnitude []float64) {
	h, habs := make([]float64, l.r), make([]float64, l.r)
	for k := 0; k < l.r; k++ {
		for j := 0; j < l.in; j++ {
			p := l.a[k*l.in+j] * float64(x[j])
			h[k], habs[k] = h[k]+p, habs[k]+math.Abs(p)
		}
	}
	delta, magnitude = make([]float64, l.out), make([]float64, l.out)
	for o := 0; o < l.out; o++ {
		for k := 0; k < l.r; k++ {
			delta[o] += l.b[o*l.r+k] * h[k]
			magnitude[o] += math.Abs(l.b[o*l.r+k]) * habs[k]
		}
		delta[o] *= l.scaling
		magnitude[o] *= math.Abs(l.scaling)
	}
	return delta, magnitude
}

// near reports whether a float32 result of sums of n terms lies within their rounding error of want.
func near(got float32, want, magnitude float64, n int) bool {
	return math.Abs(float64(got)-want) <= float64(n+2)*0x1p-24*magnitude
}

func roundBF16(t *testing.T, f []float32) []float32 {
	t.Helper()
	bf := make([]uint16, len(f))
	if err := peft.Convert(uint16Raw(bf), peft.BF16, float32RawView(f), peft.F32); err != nil {
		t.Fatal(err)
	}
	out := make([]float32, len(f))
	if err := peft.Convert(float32RawView(out), peft.F32, uint16Raw(bf), peft.BF16); err != nil {
		t.Fatal(err)
	}
	return out
}

func randomFloats(seed uint64, n int) []float32 {
	rng := rand.New(rand.NewPCG(seed, 7))
	f := make([]float32, n)
	for i := range f {
		f[i] = float32(rng.NormFloat64())
	}
	return f
}

// checkApply applies one lease to random activations and checks every row against lora.delta.
func checkApply(t *testing.T, lease *peft.Lease, a *peft.Adapter, module string, bf16Storage bool) {
	t.Helper()
	l := loadLora(t, a, module, bf16Storage)
	const rows = 5
	x, y0 := randomFloats(1, rows*l.in), randomFloats(2, rows*l.out)
	y := slices.Clone(y0)
	if err := peft.LoraApply(module, []*peft.Lease{lease}, nil, peft.Float32Buffer(x, rows, uint64(l.in)),
		peft.Float32Buffer(y, rows, uint64(l.out))); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < rows; i++ {
		d, mag := l.delta(x[i*l.in : (i+1)*l.in])
		for o := 0; o < l.out; o++ {
			want := float64(y0[i*l.out+o]) + d[o]
			if !near(y[i*l.out+o], want, math.Abs(float64(y0[i*l.out+o]))+mag[o], l.in+l.r) {
				t.Fatalf("%s row %d out %d: %v, want %v", module, i, o, y[i*l.out+o], want)
			}
		}
	}
}

// LoraApply adds each row's adapter contribution, computed here from the adapters' tensors, and
// leaves rows without an adapter or without that layer bit for bit.
func TestLoraApply(t *testing.T) {
	reg := mustRegistry(t, peft.F32, 1<<20)
	mustRegister(t, reg, "a", fixture("adapters", "llama_lora"))
	mustRegister(t, reg, "rs", fixture("adapters", "llama_rslora"))
	la, lr := mustAcquire(t, reg, "a"), mustAcquire(t, reg, "rs")
	adapterA := mustAdapter(t, fixture("adapters", "llama_lora"))
	adapterR := mustAdapter(t, fixture("adapters", "llama_rslora"))
	leases := []*peft.Lease{la, lr}

	// A mixed batch on a layer both adapters have.
	module := "model.layers.1.self_attn.q_proj"
	loras := []lora{loadLora(t, adapterA, module, false), loadLora(t, adapterR, module, false)}
	in, out := loras[0].in, loras[0].out
	rowLease := []int32{0, 1, -1, 0, 1, 1}
	rows := len(rowLease)
	x, y0 := randomFloats(3, rows*in), randomFloats(4, rows*out)
	y := slices.Clone(y0)
	if err := peft.LoraApply(module, leases, rowLease, peft.Float32Buffer(x, uint64(rows), uint64(in)),
		peft.Float32Buffer(y, uint64(rows), uint64(out))); err != nil {
		t.Fatal(err)
	}
	gcPoint()
	for i, li := range rowLease {
		got, before := y[i*out:(i+1)*out], y0[i*out:(i+1)*out]
		if li < 0 {
			if !slices.Equal(float32Bits(got), float32Bits(before)) {
				t.Fatalf("row %d without an adapter changed", i)
			}
			continue
		}
		d, mag := loras[li].delta(x[i*in : (i+1)*in])
		for o := range got {
			if want := float64(before[o]) + d[o]; !near(got[o], want, math.Abs(float64(before[o]))+mag[o], in+loras[li].r) {
				t.Fatalf("row %d (adapter %d) out %d: %v, want %v", i, li, o, got[o], want)
			}
		}
	}

	// The same layer named by its weight, with the PEFT prefix: the same result, bit for bit.
	y2 := slices.Clone(y0)
	if err := peft.LoraApply("base_model.model."+module+".weight", leases, rowLease,
		peft.Float32Buffer(x, uint64(rows), uint64(in)), peft.Float32Buffer(y2, uint64(rows), uint64(out))); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(float32Bits(y2), float32Bits(y)) {
		t.Fatal("a weight name gave another result than the module path")
	}

	// A layer only one adapter has (rslora targets attention only): the other's rows stay as they were.
	mlp := "model.layers.0.mlp.down_proj"
	if lr.HasModule(mlp) || !la.HasModule(mlp) {
		t.Fatal("fixture: llama_rslora should not have down_proj, llama_lora should")
	}
	lm := loadLora(t, adapterA, mlp, false)
	xm, ym0 := randomFloats(5, rows*lm.in), randomFloats(6, rows*lm.out)
	ym := slices.Clone(ym0)
	if err := peft.LoraApply(mlp, leases, rowLease, peft.Float32Buffer(xm, uint64(rows), uint64(lm.in)),
		peft.Float32Buffer(ym, uint64(rows), uint64(lm.out))); err != nil {
		t.Fatal(err)
	}
	for i, li := range rowLease {
		got, before := ym[i*lm.out:(i+1)*lm.out], ym0[i*lm.out:(i+1)*lm.out]
		if li != 0 {
			if !slices.Equal(float32Bits(got), float32Bits(before)) {
				t.Fatalf("row %d (adapter %d, no %s) changed", i, li, mlp)
			}
			continue
		}
		d, mag := lm.delta(xm[i*lm.in : (i+1)*lm.in])
		for o := range got {
			if want := float64(before[o]) + d[o]; !near(got[o], want, math.Abs(float64(before[o]))+mag[o], lm.in+lm.r) {
				t.Fatalf("%s row %d out %d: %v, want %v", mlp, i, o, got[o], want)
			}
		}
	}

	// Every row with leases[0] when rowLease is nil; zero rows do nothing.
	checkApply(t, lr, adapterR, "model.layers.0.self_attn.k_proj", false)
	if err := peft.LoraApply(module, leases, nil, peft.Float32Buffer(nil, 0, uint64(in)), peft.Float32Buffer(nil, 0, uint64(out))); err != nil {
		t.Fatal(err)
	}

	// BF16 storage: the factors are rounded to BF16 once, at load.
	reg16 := mustRegistry(t, peft.BF16, 1<<20)
	mustRegister(t, reg16, "a", fixture("adapters", "llama_lora"))
	checkApply(t, mustAcquire(t, reg16, "a"), adapterA, module, true)

	// A BF16 output: computed in float32 and rounded once to BF16.
	l := loras[0]
	y16 := make([]uint16, rows*out)
	if err := peft.Convert(uint16Raw(y16), peft.BF16, float32RawView(y0), peft.F32); err != nil {
		t.Fatal(err)
	}
	widened := make([]float32, len(y16))
	if err := peft.Convert(float32RawView(widened), peft.F32, uint16Raw(y16), peft.BF16); err != nil {
		t.Fatal(err)
	}
	if err := peft.LoraApply(module, leases[:1], nil, peft.Float32Buffer(x, uint64(rows), uint64(in)),
		peft.Uint16Buffer(y16, peft.BF16, uint64(rows), uint64(out))); err != nil {
		t.Fatal(err)
	}
	got := make([]float32, len(y16))
	if err := peft.Convert(float32RawView(got), peft.F32, uint16Raw(y16), peft.BF16); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < rows; i++ {
		d, mag := l.delta(x[i*in : (i+1)*in])
		for o := 0; o < out; o++ {
			want := float64(widened[i*out+o]) + d[o]
			if math.Abs(float64(got[i*out+o])-want) > 0x1p-8*math.Abs(want)+float64(in+l.r+2)*0x1p-24*(math.Abs(want)+mag[o]) {
				t.Fatalf("BF16 output row %d out %d: %v, want %v", i, o, got[i*out+o], want)
			}
		}
	}
}

// Bad arguments are refused with stable codes, and y is left unchanged.
func TestLoraApplyErrors(t *testing.T) {
	reg := mustRegistry(t, peft.F32, 1<<20)
	mustRegister(t, reg, "a", fixture("adapters", "llama_lora"))
	mustRegister(t, reg, "dora", fixture("adapters", "llama_dora"))
	la, ld := mustAcquire(t, reg, "a"), mustAcquire(t, reg, "dora")
	module := "model.layers.0.self_attn.q_proj" // [16, 16]
	const rows = 3
	x, y := randomFloats(8, rows*16), randomFloats(9, rows*16)
	y0 := slices.Clone(y)
	xb, yb := peft.Float32Buffer(x, rows, 16), peft.Float32Buffer(y, rows, 16)
	one := []*peft.Lease{la}
	unchanged := func(what string) {
		t.Helper()
		if !slices.Equal(float32Bits(y), float32Bits(y0)) {
			t.Fatalf("%s changed the output", what)
		}
	}
	wantCode(t, peft.LoraApply(module, one, nil, peft.Float32Buffer(x[:rows*15], rows, 15), yb), peft.CodeShapeMismatch)
	unchanged("in_features 15")
	wantCode(t, peft.LoraApply(module, one, nil, xb, peft.Float32Buffer(y[:rows*8], rows, 8)), peft.CodeShapeMismatch)
	unchanged("out_features 8")
	wantCode(t, peft.LoraApply(module, one, []int32{0, 1, 0}, xb, yb), peft.CodeInvalidArgument)
	unchanged("an index past the leases")
	wantCode(t, peft.LoraApply(module, one, []int32{0, -2, 0}, xb, yb), peft.CodeInvalidArgument)
	unchanged("index -2")
	wantCode(t, peft.LoraApply(module, one, []int32{0, 0}, xb, yb), peft.CodeInvalidArgument) // too short
	wantCode(t, peft.LoraApply(module, nil, nil, xb, yb), peft.CodeInvalidArgument)
	wantCode(t, peft.LoraApply(module, []*peft.Lease{la, nil}, nil, xb, yb), peft.CodeInvalidArgument)
	wantCode(t, peft.LoraApply(module, one, nil, peft.Float32Buffer(x, rows, 16), peft.Float32Buffer(y[:2*16], 2, 16)), peft.CodeInvalidArgument)
	wantCode(t, peft.LoraApply(module, one, nil, peft.Float32Buffer(x, rows, 8), yb), peft.CodeInvalidArgument) // data longer than the shape
	wantCode(t, peft.LoraApply(module, one, nil, peft.Buffer{Data: make([]byte, rows*16*8), DType: peft.F64, Shape: []uint64{rows, 16}}, yb), peft.CodeUnsupported)
	wantCode(t, peft.LoraApply(module, one, nil, xb, peft.Float32Buffer(y, rows*16)), peft.CodeInvalidArgument) // 1-D
	wantCode(t, peft.LoraApply(module, []*peft.Lease{ld}, nil, xb, yb), peft.CodeNotFound)                      // DoRA without its base weight
	unchanged("a DoRA layer")
	wantCode(t, peft.LoraApply(module, []*peft.Lease{la, ld}, []int32{0, 1, 0}, xb, yb), peft.CodeNotFound)
	unchanged("a batch with a DoRA layer")
	wantCode(t, peft.LoraApply("a\x00b", one, nil, xb, yb), peft.CodeInvalidArgument)
	if err := peft.LoraApply("model.layers.0.nothing", one, nil, xb, yb); err != nil {
		t.Fatalf("a layer the adapter does not have: %v", err)
	}
	unchanged("a layer the adapter does not have")

	// With a translator, layers are named with the host's names, and an unknown name is an error.
	adapter := mustAdapter(t, fixture("adapters", "llama_lora"))
	tr, err := adapter.Translator()
	if err != nil {
		t.Fatal(err)
	}
	native, err := tr.ToNative(module + ".weight")
	if err != nil {
		t.Fatal(err)
	}
	regN := mustRegistry(t, peft.F32, 1<<20, peft.WithRegistryNativeNames(tr))
	tr.Close() // the registry shares the table
	mustRegister(t, regN, "a", fixture("adapters", "llama_lora"))
	ln := mustAcquire(t, regN, "a")
	if !ln.HasModule(native) {
		t.Fatalf("HasModule(%q) with the translator is false", native)
	}
	yn, yh := slices.Clone(y0), slices.Clone(y0)
	if err := peft.LoraApply(native, []*peft.Lease{ln}, nil, xb, peft.Float32Buffer(yn, rows, 16)); err != nil {
		t.Fatalf("native name %q: %v", native, err)
	}
	if err := peft.LoraApply(module, one, nil, xb, peft.Float32Buffer(yh, rows, 16)); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(float32Bits(yn), float32Bits(yh)) || slices.Equal(yn, y0) {
		t.Fatal("the native name gave another result than the HuggingFace name")
	}
	wantCode(t, peft.LoraApply("no/such/layer", []*peft.Lease{ln}, nil, xb, yb), peft.CodeUnresolvedKey)
	unchanged("an unresolved native name")

	la.Close()
	wantClosed(t, peft.LoraApply(module, one, nil, xb, yb))
	unchanged("a closed lease")
}

// Leases and the registry used from many goroutines at once (run with -race): applies with shared
// leases, acquisitions and releases, stats; and a lease closed while others apply with it.
func TestLeaseConcurrentUse(t *testing.T) {
	reg := mustRegistry(t, peft.F32, 1<<20)
	mustRegister(t, reg, "a", fixture("adapters", "llama_lora"))
	mustRegister(t, reg, "rs", fixture("adapters", "llama_rslora"))
	la, lr := mustAcquire(t, reg, "a"), mustAcquire(t, reg, "rs")
	closing := mustAcquire(t, reg, "a")
	module := "model.layers.1.self_attn.v_proj" // [8, 16]
	loras := []lora{
		loadLora(t, mustAdapter(t, fixture("adapters", "llama_lora")), module, false),
		loadLora(t, mustAdapter(t, fixture("adapters", "llama_rslora")), module, false),
	}
	in, out := loras[0].in, loras[0].out
	rowLease := []int32{1, 0, -1, 1, 0, 0, 1}
	rows := len(rowLease)
	x, y0 := randomFloats(10, rows*in), randomFloats(11, rows*out)
	check := func(y []float32) error {
		for i, li := range rowLease {
			for o := 0; o < out; o++ {
				want, mag := float64(y0[i*out+o]), math.Abs(float64(y0[i*out+o]))
				if li >= 0 {
					d, m := loras[li].delta(x[i*in : (i+1)*in])
					want, mag = want+d[o], mag+m[o]
				}
				if !near(y[i*out+o], want, mag, in+4) {
					return errors.New("a concurrent apply gave a wrong result")
				}
			}
		}
		return nil
	}
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make(chan error, 64)
	for g := 0; g < 12; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			<-start
			for round := 0; round < 25; round++ {
				y := slices.Clone(y0)
				err := peft.LoraApply(module, []*peft.Lease{la, lr}, rowLease, peft.Float32Buffer(x, uint64(rows), uint64(in)),
					peft.Float32Buffer(y, uint64(rows), uint64(out)))
				if err == nil {
					err = check(y)
				}
				if err != nil {
					errs <- err
					return
				}
				// The lease closed by the main goroutine meanwhile: each call works or gets ErrClosed.
				y = slices.Clone(y0)
				err = peft.LoraApply(module, []*peft.Lease{closing}, nil, peft.Float32Buffer(x, uint64(rows), uint64(in)),
					peft.Float32Buffer(y, uint64(rows), uint64(out)))
				if err != nil && !errors.Is(err, peft.ErrClosed) {
					errs <- err
					return
				}
				switch g % 3 {
				case 0:
					l, err := reg.Acquire([]string{"a", "rs"}[round%2])
					if err != nil {
						errs <- err
						return
					}
					if l.Bytes() == 0 || !l.HasModule(module) {
						errs <- errors.New("a concurrently acquired lease is empty")
					}
					l.Close()
				case 1:
					s, err := reg.Stats()
					if err != nil || s.Pinned < 2 || s.LoadedBytes > s.BudgetBytes {
						errs <- errors.New("inconsistent stats during concurrent use")
						return
					}
				case 2:
					if la.Name() != "a" || lr.Version() != 2 {
						errs <- errors.New("lease getters differ during concurrent use")
						return
					}
				}
				if round%8 == 0 {
					runtime.GC()
				}
			}
		}(g)
	}
	close(start)
	runtime.Gosched()
	closing.Close()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if s := mustStats(t, reg); s.Pinned != 2 || s.Loaded != 2 {
		t.Fatalf("after the goroutines: %+v", s)
	}
}
