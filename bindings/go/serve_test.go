package peft_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	peft "github.com/peft-c/peft_c/bindings/go"
)

var (
	_ io.Closer = (*peft.Registry)(nil)
	_ io.Closer = (*peft.Lease)(nil)
	_ io.Closer = (*peft.HostModel)(nil)
)

func mustRegistry(t testing.TB, storage peft.DType, budget uint64, opts ...peft.RegistryOption) *peft.Registry {
	t.Helper()
	r, err := peft.NewRegistry(storage, budget, opts...)
	if err != nil {
		t.Fatalf("NewRegistry(%v, %d): %v", storage, budget, err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

func mustRegister(t testing.TB, r *peft.Registry, name, dir string) {
	t.Helper()
	if err := r.Register(name, dir); err != nil {
		t.Fatalf("Register(%q, %s): %v", name, dir, err)
	}
}

func mustAcquire(t testing.TB, r *peft.Registry, name string) *peft.Lease {
	t.Helper()
	l, err := r.Acquire(name)
	if err != nil {
		t.Fatalf("Acquire(%q): %v", name, err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func mustStats(t testing.TB, r *peft.Registry) peft.RegistryStats {
	t.Helper()
	s, err := r.Stats()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// loraBytes is what an adapter's loaded LoRA tensors take in a registry storing elemBytes-byte
// elements: every lora_A, lora_B, lora_B.bias and DoRA magnitude, counted from the adapter's header.
func loraBytes(t testing.TB, a *peft.Adapter, elemBytes uint64) uint64 {
	t.Helper()
	modules, err := a.Modules()
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, m := range modules {
		for _, tensor := range m.Tensors {
			switch tensor.Role {
			case "lora_A.weight", "lora_B.weight", "lora_B.bias", "lora_magnitude_vector":
				count := uint64(1)
				for _, d := range tensor.Shape {
					count *= d
				}
				n += count * elemBytes
			}
		}
	}
	return n
}

// Registering reads headers only; acquiring loads once and pins; releasing unpins; trimming evicts.
func TestRegistryRegisterAcquireRelease(t *testing.T) {
	reg := mustRegistry(t, peft.F32, 1<<20)
	mustRegister(t, reg, "a", fixture("adapters", "llama_lora"))
	mustRegister(t, reg, "b", fixture("adapters", "llama_lora_second"))
	if names, err := reg.Names(); err != nil || !slices.Equal(names, []string{"a", "b"}) {
		t.Fatalf("Names = %q, %v", names, err)
	}
	if s := mustStats(t, reg); s.Registered != 2 || s.Loaded != 0 || s.LoadedBytes != 0 || s.BudgetBytes != 1<<20 || s.Loads != 0 {
		t.Fatalf("stats after registering: %+v", s)
	}
	la, err := reg.Acquire("a")
	if err != nil {
		t.Fatal(err)
	}
	gcPoint()
	want := loraBytes(t, mustAdapter(t, fixture("adapters", "llama_lora")), 4)
	if la.Name() != "a" || la.Version() != 1 || la.Bytes() != want {
		t.Fatalf("lease %q version %d bytes %d; want a, 1, %d", la.Name(), la.Version(), la.Bytes(), want)
	}
	for _, name := range []string{"model.layers.0.self_attn.q_proj", "model.layers.1.mlp.down_proj.weight",
		"base_model.model.model.layers.0.self_attn.v_proj"} {
		if !la.HasModule(name) {
			t.Errorf("HasModule(%q) is false", name)
		}
	}
	for _, name := range []string{"model.layers.0.input_layernorm", "lm_head", "model.layers.2.self_attn.q_proj", "a\x00b"} {
		if la.HasModule(name) {
			t.Errorf("HasModule(%q) is true", name)
		}
	}
	if s := mustStats(t, reg); s.Loads != 1 || s.Hits != 0 || s.Loaded != 1 || s.Pinned != 1 || s.LoadedBytes != want || s.PeakLoadedBytes != want {
		t.Fatalf("stats after the first acquisition: %+v", s)
	}
	la2 := mustAcquire(t, reg, "a")
	if s := mustStats(t, reg); s.Loads != 1 || s.Hits != 1 || s.Loaded != 1 || s.Pinned != 1 || la2.Version() != 1 {
		t.Fatalf("stats after the second acquisition: %+v", s)
	}
	la.Close()
	if s := mustStats(t, reg); s.Pinned != 1 {
		t.Fatalf("one lease left, pinned %d", s.Pinned)
	}
	la2.Close()
	if s := mustStats(t, reg); s.Pinned != 0 || s.Loaded != 1 || s.LoadedBytes != want {
		t.Fatalf("released, still loaded: %+v", s)
	}
	if err := reg.Trim(); err != nil {
		t.Fatal(err)
	}
	if s := mustStats(t, reg); s.Loaded != 0 || s.LoadedBytes != 0 || s.Evictions != 1 || s.PeakLoadedBytes != want {
		t.Fatalf("after Trim: %+v", s)
	}
	if lb := mustAcquire(t, reg, "b"); lb.Version() != 2 || lb.Name() != "b" {
		t.Fatalf("b: version %d name %q", lb.Version(), lb.Name())
	}

	_, err = reg.Acquire("nope")
	wantCode(t, err, peft.CodeNotFound)
	if !errors.Is(err, peft.ErrNotFound) {
		t.Fatal("errors.Is(err, ErrNotFound) is false")
	}
	wantCode(t, reg.Unregister("nope"), peft.CodeNotFound)
	missing := filepath.Join(t.TempDir(), "missing")
	_, openErr := peft.OpenAdapter(missing)
	var e *peft.Error
	if !errors.As(openErr, &e) {
		t.Fatalf("OpenAdapter of a missing folder: %v", openErr)
	}
	wantCode(t, reg.Register("x", missing), e.Code) // the errors of peft_adapter_open
	wantCode(t, reg.Register("", fixture("adapters", "llama_lora")), peft.CodeInvalidArgument)
	wantCode(t, reg.Register("a\x00b", fixture("adapters", "llama_lora")), peft.CodeInvalidArgument)
	wantCode(t, reg.Register("a\nb", fixture("adapters", "llama_lora")), peft.CodeInvalidArgument)
	if err := reg.Unregister("a"); err != nil {
		t.Fatal(err)
	}
	if names, err := reg.Names(); err != nil || !slices.Equal(names, []string{"b"}) {
		t.Fatalf("Names after Unregister = %q, %v", names, err)
	}
	_, err = reg.Acquire("a")
	wantCode(t, err, peft.CodeNotFound)
	if s := mustStats(t, reg); s.Registered != 1 {
		t.Fatalf("registered %d after Unregister", s.Registered)
	}
	empty := mustRegistry(t, peft.BF16, 0)
	if names, err := empty.Names(); err != nil || names == nil || len(names) != 0 {
		t.Fatalf("Names of an empty registry = %#v, %v", names, err)
	}
	_, err = peft.NewRegistry(peft.F64, 1<<20)
	wantCode(t, err, peft.CodeInvalidArgument)
}

// The budget is never exceeded: a load that cannot fit beside the pinned adapters is ErrOverBudget;
// unpinned adapters are evicted to make room; a budget below the pinned bytes is refused.
func TestRegistryBudget(t *testing.T) {
	sa := loraBytes(t, mustAdapter(t, fixture("adapters", "llama_lora")), 4)
	sb := loraBytes(t, mustAdapter(t, fixture("adapters", "llama_lora_second")), 4)
	reg := mustRegistry(t, peft.F32, max(sa, sb))
	mustRegister(t, reg, "a", fixture("adapters", "llama_lora"))
	mustRegister(t, reg, "b", fixture("adapters", "llama_lora_second"))
	la := mustAcquire(t, reg, "a")
	_, err := reg.Acquire("b")
	if !errors.Is(err, peft.ErrOverBudget) {
		t.Fatalf("acquiring beyond the budget: %v, want ErrOverBudget", err)
	}
	wantCode(t, err, peft.CodeOverBudget)
	if s := mustStats(t, reg); s.Loaded != 1 || s.LoadedBytes != sa || s.Pinned != 1 {
		t.Fatalf("a failed load changed the registry: %+v", s)
	}
	la.Close()
	lb := mustAcquire(t, reg, "b") // evicts a
	if s := mustStats(t, reg); s.Loaded != 1 || s.LoadedBytes != sb || s.Evictions != 1 || s.PeakLoadedBytes > max(sa, sb) {
		t.Fatalf("after evicting a for b: %+v", s)
	}
	err = reg.SetBudget(sb - 1)
	wantCode(t, err, peft.CodeOverBudget)
	if s := mustStats(t, reg); s.BudgetBytes != max(sa, sb) || s.Loaded != 1 {
		t.Fatalf("a refused budget changed the registry: %+v", s)
	}
	lb.Close()
	if err := reg.SetBudget(sb - 1); err != nil {
		t.Fatal(err)
	}
	if s := mustStats(t, reg); s.BudgetBytes != sb-1 || s.Loaded != 0 || s.LoadedBytes != 0 || s.Evictions != 2 {
		t.Fatalf("after lowering the budget: %+v", s)
	}
	_, err = reg.Acquire("b")
	wantCode(t, err, peft.CodeOverBudget)

	// BF16 storage takes half the bytes of F32, so the adapter fits in half the budget.
	half := mustRegistry(t, peft.BF16, sa/2)
	mustRegister(t, half, "a", fixture("adapters", "llama_lora"))
	if l := mustAcquire(t, half, "a"); l.Bytes() != sa/2 {
		t.Fatalf("BF16 lease takes %d bytes, want %d", l.Bytes(), sa/2)
	}
}

// A name registered again serves the new version to new leases while old leases keep the old one;
// adapters registered from memory behave as from their folder.
func TestRegistryReplaceAndRegisterBytes(t *testing.T) {
	reg := mustRegistry(t, peft.F32, 1<<20)
	mustRegister(t, reg, "m", fixture("adapters", "llama_lora"))
	l1 := mustAcquire(t, reg, "m")
	dir := fixture("adapters", "llama_lora_second")
	config, err := os.ReadFile(filepath.Join(dir, "adapter_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	weights, err := os.ReadFile(filepath.Join(dir, "adapter_model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	if err := reg.RegisterBytes("m", string(config), weights); err != nil {
		t.Fatal(err)
	}
	clear(weights) // the registry has its own copy
	gcPoint()
	l2 := mustAcquire(t, reg, "m")
	if l2.Version() <= l1.Version() || l1.Name() != "m" || l2.Name() != "m" {
		t.Fatalf("versions %d then %d", l1.Version(), l2.Version())
	}
	if s := mustStats(t, reg); s.Registered != 1 || s.Loaded != 2 || s.Pinned != 2 {
		t.Fatalf("two versions leased: %+v", s)
	}
	module := "model.layers.0.self_attn.o_proj"
	checkApply(t, l1, mustAdapter(t, fixture("adapters", "llama_lora")), module, false)
	checkApply(t, l2, mustAdapter(t, dir), module, false)
	l1.Close() // the old version's memory goes with its last lease
	if s := mustStats(t, reg); s.Loaded != 1 || s.Pinned != 1 {
		t.Fatalf("old version released: %+v", s)
	}

	good, err := os.ReadFile(filepath.Join(dir, "adapter_model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	_, openErr := peft.OpenBytes(good[:5])
	var e *peft.Error
	if !errors.As(openErr, &e) || !e.Code.IsFormat() {
		t.Fatalf("OpenBytes of 5 bytes: %v", openErr)
	}
	wantCode(t, reg.RegisterBytes("m", string(config), good[:5]), e.Code)
	wantCode(t, reg.RegisterBytes("m", "{", good), peft.CodeInvalidConfig)
	wantCode(t, reg.RegisterBytes("m", "{\x00}", good), peft.CodeInvalidArgument)
	l3 := mustAcquire(t, reg, "m") // failed registrations left the registry as it was
	if l3.Version() != l2.Version() {
		t.Fatalf("version %d after failed registrations, want %d", l3.Version(), l2.Version())
	}
}

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
	wantCode(t, peft.LoraApply(module, []*peft.Lease{ld}, nil, xb, yb), peft.CodeUnsupported)                   // DoRA
	unchanged("a DoRA layer")
	wantCode(t, peft.LoraApply(module, []*peft.Lease{la, ld}, []int32{0, 1, 0}, xb, yb), peft.CodeUnsupported)
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

// hostWeights reads the base weights an adapter's LoRA layers apply to, as float32 buffers.
type hostWeight struct {
	name  string
	shape []uint64
	data  []float32
	orig  []float32
}

func readHostWeights(t *testing.T, base *peft.Checkpoint, a *peft.Adapter) []*hostWeight {
	t.Helper()
	modules, err := a.Modules()
	if err != nil {
		t.Fatal(err)
	}
	var ws []*hostWeight
	for _, m := range modules {
		name := m.Tensors[m.Tensor("lora_A.weight")].BaseName
		info, err := base.TensorByName(name)
		if err != nil {
			t.Fatal(err)
		}
		data := readTensor32(t, base, name)
		ws = append(ws, &hostWeight{name: name, shape: info.Shape, data: data, orig: slices.Clone(data)})
	}
	return ws
}

func mustHostModel(t *testing.T) *peft.HostModel {
	t.Helper()
	h, err := peft.NewHostModel()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

// mergedWith merges adapter dir into base with the checkpoint merge (the reference for a swap).
func mergedWith(t *testing.T, base, dir string, weight float64) *peft.Checkpoint {
	t.Helper()
	out := filepath.Join(t.TempDir(), "merged")
	if _, err := peft.MergeCheckpoint(context.Background(), base, out, peft.WithAdapterDir(dir, weight)); err != nil {
		t.Fatal(err)
	}
	return mustOpen(t, out)
}

func sameAs(t *testing.T, ws []*hostWeight, merged *peft.Checkpoint, what string) {
	t.Helper()
	for _, w := range ws {
		want := w.orig
		if merged != nil {
			want = readTensor32(t, merged, w.name)
		}
		if !slices.Equal(float32Bits(w.data), float32Bits(want)) {
			t.Fatalf("%s: %s differs", what, w.name)
		}
	}
}

// A host model swaps adapters into the host's own buffers: each merge gives the checkpoint merge's
// bytes, and swapping back to none restores the original weights bit for bit.
func TestHostModelSwap(t *testing.T) {
	baseDir := fixture("models", "llama")
	base := mustOpen(t, baseDir)
	dirA, dirB := fixture("adapters", "llama_lora"), fixture("adapters", "llama_lora_second")
	reg := mustRegistry(t, peft.F32, 1<<20)
	mustRegister(t, reg, "a", dirA)
	mustRegister(t, reg, "b", dirB)
	ws := readHostWeights(t, base, mustAdapter(t, dirA))
	host := mustHostModel(t)
	for _, w := range ws {
		if err := host.AddWeight(w.name, peft.Float32Buffer(w.data, w.shape...), nil); err != nil {
			t.Fatal(err)
		}
	}
	lmHead := readTensor32(t, base, "lm_head.weight") // a weight no adapter touches
	lmOrig := slices.Clone(lmHead)
	if err := host.AddWeight("lm_head", peft.Float32Buffer(lmHead, 64, 16), nil); err != nil {
		t.Fatal(err)
	}
	if host.Current() != "" {
		t.Fatalf("Current before any swap: %q", host.Current())
	}

	la := mustAcquire(t, reg, "a")
	st, err := host.Swap(la, 1)
	if err != nil {
		t.Fatal(err)
	}
	la.Close() // the host model holds the adapter itself
	gcPoint()
	if st.LayersMerged != uint64(len(ws)) || st.LayersRemoved != 0 || st.SavedBytes == 0 || host.Current() != "a" {
		t.Fatalf("swap to a: %+v, current %q", st, host.Current())
	}
	sameAs(t, ws, mergedWith(t, baseDir, dirA, 1), "merged a")
	if err := reg.Trim(); err != nil {
		t.Fatal(err)
	}
	if s := mustStats(t, reg); s.Pinned != 1 || s.Loaded != 1 {
		t.Fatalf("the merged adapter was not pinned by the host model: %+v", s)
	}

	lb := mustAcquire(t, reg, "b")
	if st, err = host.Swap(lb, 0.5); err != nil {
		t.Fatal(err)
	}
	lb.Close()
	if st.LayersRemoved != uint64(len(ws)) || st.LayersMerged != uint64(len(ws)) || host.Current() != "b" {
		t.Fatalf("swap a -> b: %+v, current %q", st, host.Current())
	}
	sameAs(t, ws, mergedWith(t, baseDir, dirB, 0.5), "merged b at 0.5")

	if st, err = host.Swap(nil, 1); err != nil {
		t.Fatal(err)
	}
	if st.LayersRemoved != uint64(len(ws)) || st.LayersMerged != 0 || host.Current() != "" {
		t.Fatalf("swap b -> none: %+v, current %q", st, host.Current())
	}
	sameAs(t, ws, nil, "swapped back to none")
	if !slices.Equal(float32Bits(lmHead), float32Bits(lmOrig)) {
		t.Fatal("a weight no adapter targets changed")
	}
	if err := reg.Trim(); err != nil {
		t.Fatal(err)
	}
	if s := mustStats(t, reg); s.Pinned != 0 || s.Loaded != 0 {
		t.Fatalf("after swapping to none and trimming: %+v", s)
	}

	// Not exact: PEFT's arithmetic unmerge, within rounding of the original.
	if err := host.SetExact(false); err != nil {
		t.Fatal(err)
	}
	la = mustAcquire(t, reg, "a")
	savedExact := st.SavedBytes // the copies taken by the exact swaps, kept
	if st, err = host.Swap(la, 1); err != nil || st.SavedBytes != savedExact {
		t.Fatalf("inexact swap: %+v (%d bytes of copies kept before), %v", st, savedExact, err)
	}
	if _, err = host.Swap(nil, 1); err != nil {
		t.Fatal(err)
	}
	adapter := mustAdapter(t, dirA)
	for _, w := range ws {
		mod, _ := adapter.Module(mustFind(t, adapter, w.name[:len(w.name)-len(".weight")]))
		_, magnitude := loraDelta(t, adapter, mod, 1)
		for i := range w.data {
			if !closeTo(w.data[i], float64(w.orig[i]), 2*(math.Abs(float64(w.orig[i]))+2*magnitude[i])) {
				t.Fatalf("%s[%d]: %v after an arithmetic unmerge, was %v", w.name, i, w.data[i], w.orig[i])
			}
		}
	}
}

// With a translator the host names its weights its own way.
func TestHostModelNativeNames(t *testing.T) {
	baseDir, dir := fixture("models", "llama"), fixture("adapters", "llama_lora")
	adapter := mustAdapter(t, dir)
	tr, err := adapter.Translator()
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	reg := mustRegistry(t, peft.F32, 1<<20)
	mustRegister(t, reg, "a", dir)
	ws := readHostWeights(t, mustOpen(t, baseDir), adapter)
	host := mustHostModel(t)
	if err := host.SetTranslator(tr); err != nil {
		t.Fatal(err)
	}
	for _, w := range ws {
		native, err := tr.ToNative(w.name)
		if err != nil {
			t.Fatal(err)
		}
		if err := host.AddWeight(native, peft.Float32Buffer(w.data, w.shape...), nil); err != nil {
			t.Fatalf("AddWeight(%q): %v", native, err)
		}
	}
	wantCode(t, host.SetTranslator(nil), peft.CodeInvalidArgument) // after weights were added
	wantCode(t, host.AddWeight("no/such/weight", peft.Float32Buffer(make([]float32, 4), 2, 2), nil), peft.CodeUnresolvedKey)
	if _, err := host.Swap(mustAcquire(t, reg, "a"), 1); err != nil {
		t.Fatal(err)
	}
	sameAs(t, ws, mergedWith(t, baseDir, dir, 1), "merged through native names")
	if _, err := host.Swap(nil, 1); err != nil {
		t.Fatal(err)
	}
	sameAs(t, ws, nil, "swapped back to none")
}

// lora_bias adapters add lora_B.bias to the host's bias buffers, and swapping out restores them.
func TestHostModelLoraBias(t *testing.T) {
	baseDir, dir := fixture("models", "qwen2"), fixture("adapters", "qwen2_lora_bias")
	base := mustOpen(t, baseDir)
	adapter := mustAdapter(t, dir, peft.WithBaseDir(baseDir))
	reg := mustRegistry(t, peft.F32, 1<<20)
	if err := reg.Register("bias", dir, peft.WithBaseDir(baseDir)); err != nil {
		t.Fatal(err)
	}
	lease := mustAcquire(t, reg, "bias")
	ws := readHostWeights(t, base, adapter)
	biases := make([]*hostWeight, len(ws))
	plain := mustHostModel(t)
	host := mustHostModel(t)
	for i, w := range ws {
		name := w.name[:len(w.name)-len(".weight")] + ".bias"
		b := readTensor32(t, base, name)
		biases[i] = &hostWeight{name: name, shape: []uint64{uint64(len(b))}, data: b, orig: slices.Clone(b)}
		bias := peft.Float32Buffer(b, uint64(len(b)))
		if err := host.AddWeight(w.name, peft.Float32Buffer(w.data, w.shape...), &bias); err != nil {
			t.Fatal(err)
		}
		if err := plain.AddWeight(w.name, peft.Float32Buffer(slices.Clone(w.orig), w.shape...), nil); err != nil {
			t.Fatal(err)
		}
	}
	_, err := plain.Swap(lease, 1)
	wantCode(t, err, peft.CodeInvalidArgument) // the adapter needs the bias buffers
	if _, err := host.Swap(lease, 1); err != nil {
		t.Fatal(err)
	}
	merged := mergedWith(t, baseDir, dir, 1)
	sameAs(t, ws, merged, "merged weights")
	sameAs(t, biases, merged, "merged biases")
	if _, err := host.Swap(nil, 1); err != nil {
		t.Fatal(err)
	}
	sameAs(t, ws, nil, "weights swapped back")
	sameAs(t, biases, nil, "biases swapped back")
}

// A bias one element shorter or longer than its layer's output features is refused at the swap with
// ErrShapeMismatch naming the layer; no weight or bias changes (nor is a bias written past its end).
// An empty bias is refused at once.
func TestHostModelLoraBiasOfAnotherLength(t *testing.T) {
	baseDir, dir := fixture("models", "qwen2"), fixture("adapters", "qwen2_lora_bias")
	base := mustOpen(t, baseDir)
	adapter := mustAdapter(t, dir, peft.WithBaseDir(baseDir))
	reg := mustRegistry(t, peft.F32, 1<<20)
	mustRegister(t, reg, "bias", dir)
	lease := mustAcquire(t, reg, "bias")
	const wrong = "model.layers.0.self_attn.v_proj.weight" // [8, 16]: 8 output features
	for _, change := range []int{-1, 1} {
		ws := readHostWeights(t, base, adapter)
		var biases []*hostWeight
		host := mustHostModel(t)
		for _, w := range ws {
			name := w.name[:len(w.name)-len(".weight")] + ".bias"
			b := readTensor32(t, base, name)
			if w.name == wrong {
				if len(b) != 8 {
					t.Fatalf("%s has %d elements, the test expects 8", name, len(b))
				}
				b = append(b, 0.5)[:8+change] // the 8 values and one more, or 7 of them
			}
			biases = append(biases, &hostWeight{name: name, data: b, orig: slices.Clone(b)})
			bias := peft.Float32Buffer(b, uint64(len(b)))
			if err := host.AddWeight(w.name, peft.Float32Buffer(w.data, w.shape...), &bias); err != nil {
				t.Fatal(err)
			}
		}
		_, err := host.Swap(lease, 1)
		wantCode(t, err, peft.CodeShapeMismatch)
		if !strings.Contains(err.Error(), "v_proj") {
			t.Fatalf("the error does not name the layer: %v", err)
		}
		if host.Current() != "" {
			t.Fatalf("Current after a refused swap: %q", host.Current())
		}
		sameAs(t, ws, nil, fmt.Sprintf("weights after a refused swap (bias %+d)", change))
		sameAs(t, biases, nil, fmt.Sprintf("biases after a refused swap (bias %+d)", change))
	}

	host := mustHostModel(t)
	empty := peft.Buffer{Data: []byte{}, DType: peft.F32}
	wantCode(t, host.AddWeight(wrong, peft.Float32Buffer(make([]float32, 8*16), 8, 16), &empty), peft.CodeShapeMismatch)
	odd := peft.Buffer{Data: make([]byte, 6), DType: peft.F32}
	wantCode(t, host.AddWeight(wrong, peft.Float32Buffer(make([]float32, 8*16), 8, 16), &odd), peft.CodeInvalidArgument)
}

// Swaps that cannot be done completely change nothing; weights are refused when they cannot be used.
func TestHostModelErrors(t *testing.T) {
	baseDir, dir := fixture("models", "llama"), fixture("adapters", "llama_lora")
	base := mustOpen(t, baseDir)
	reg := mustRegistry(t, peft.F32, 1<<20)
	mustRegister(t, reg, "a", dir)
	lease := mustAcquire(t, reg, "a")
	ws := readHostWeights(t, base, mustAdapter(t, dir))

	// Only some of the adapter's layers: UNRESOLVED_KEY, nothing merged.
	partial := mustHostModel(t)
	if err := partial.AddWeight(ws[0].name, peft.Float32Buffer(ws[0].data, ws[0].shape...), nil); err != nil {
		t.Fatal(err)
	}
	_, err := partial.Swap(lease, 1)
	wantCode(t, err, peft.CodeUnresolvedKey)
	sameAs(t, ws[:1], nil, "a refused swap")
	if partial.Current() != "" {
		t.Fatal("a refused swap set Current")
	}

	// A weight of another shape under a layer's name: SHAPE_MISMATCH, nothing merged.
	host := mustHostModel(t)
	var q, k *hostWeight
	for _, w := range ws {
		switch w.name {
		case "model.layers.0.self_attn.q_proj.weight":
			q = w
		case "model.layers.0.self_attn.k_proj.weight":
			k = w
		}
	}
	for _, w := range ws {
		buf := peft.Float32Buffer(w.data, w.shape...)
		if w == q {
			buf = peft.Float32Buffer(k.data, k.shape...) // [8, 16] where [16, 16] is needed
		}
		if w == k {
			continue
		}
		if err := host.AddWeight(w.name, buf, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := host.AddWeight(k.name, peft.Float32Buffer(make([]float32, 8*16), 8, 16), nil); err != nil {
		t.Fatal(err)
	}
	_, err = host.Swap(lease, 1)
	wantCode(t, err, peft.CodeShapeMismatch)
	sameAs(t, ws, nil, "a swap refused for a shape")

	good := mustHostModel(t)
	for _, w := range ws {
		if err := good.AddWeight(w.name, peft.Float32Buffer(w.data, w.shape...), nil); err != nil {
			t.Fatal(err)
		}
	}
	w0 := ws[0]
	wantCode(t, good.AddWeight(w0.name, peft.Float32Buffer(w0.data, w0.shape...), nil), peft.CodeInvalidArgument) // twice
	wantCode(t, good.AddWeight("lm_head", peft.Float32Buffer(make([]float32, 10), 64, 16), nil), peft.CodeInvalidArgument)
	wantCode(t, good.AddWeight("lm_head", peft.Buffer{Data: make([]byte, 64*16*8), DType: peft.F64, Shape: []uint64{64, 16}}, nil), peft.CodeUnsupported)
	wantCode(t, good.AddWeight("lm_head\x00", peft.Float32Buffer(make([]float32, 64*16), 64, 16), nil), peft.CodeInvalidArgument)
	_, err = good.Swap(lease, math.NaN())
	wantCode(t, err, peft.CodeInvalidArgument)
	_, err = good.Swap(lease, math.Inf(1))
	wantCode(t, err, peft.CodeInvalidArgument)
	sameAs(t, ws, nil, "a swap with a weight that is not finite")
	if _, err := good.Swap(lease, 1); err != nil {
		t.Fatal(err)
	}
	wantCode(t, good.AddWeight("lm_head", peft.Float32Buffer(make([]float32, 64*16), 64, 16), nil), peft.CodeInvalidArgument) // while merged

	// Exact mode: the host model owns the buffers' contents; taking the adapter out writes the
	// original bytes back over whatever someone else wrote.
	w0.data[3] += 1
	if _, err := good.Swap(nil, 1); err != nil {
		t.Fatal(err)
	}
	sameAs(t, ws, nil, "restored over a write behind the host model's back")

	closed := mustAcquire(t, reg, "a")
	closed.Close()
	_, err = good.Swap(closed, 1)
	wantClosed(t, err)
}

// Close is idempotent; calls after it fail with ErrClosed or give zero values; nil handles close.
func TestServeUseAfterClose(t *testing.T) {
	for _, c := range []io.Closer{(*peft.Registry)(nil), (*peft.Lease)(nil), (*peft.HostModel)(nil)} {
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
	reg, err := peft.NewRegistry(peft.F32, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	mustRegister(t, reg, "a", fixture("adapters", "llama_lora"))
	lease, err := reg.Acquire("a")
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if reg.Close() != nil || lease.Close() != nil {
			t.Fatal("Close returned an error")
		}
	}
	wantClosed(t, reg.Register("b", fixture("adapters", "llama_lora")))
	wantClosed(t, reg.RegisterBytes("b", "{}", nil))
	wantClosed(t, reg.Unregister("a"))
	wantClosed(t, reg.Trim())
	wantClosed(t, reg.SetBudget(1))
	_, err = reg.Acquire("a")
	wantClosed(t, err)
	_, err = reg.Names()
	wantClosed(t, err)
	_, err = reg.Stats()
	wantClosed(t, err)
	if lease.Name() != "" || lease.Version() != 0 || lease.Bytes() != 0 || lease.HasModule("model.layers.0.self_attn.q_proj") {
		t.Fatal("a closed lease still answers")
	}

	host, err := peft.NewHostModel()
	if err != nil {
		t.Fatal(err)
	}
	host.Close()
	host.Close()
	_, err = host.Swap(nil, 1)
	wantClosed(t, err)
	wantClosed(t, host.AddWeight("lm_head", peft.Float32Buffer(make([]float32, 4), 2, 2), nil))
	wantClosed(t, host.SetExact(true))
	wantClosed(t, host.SetTranslator(nil))
	if host.Current() != "" {
		t.Fatal("Current after Close")
	}
}

// A lease outlives its registry: after the registry is closed and collected, the lease still applies
// and a host model still swaps it in and out.
func TestLeaseOutlivesRegistry(t *testing.T) {
	dir := fixture("adapters", "llama_lora")
	reg, err := peft.NewRegistry(peft.F32, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	mustRegister(t, reg, "a", dir)
	lease, err := reg.Acquire("a")
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Close()
	reg.Close()
	reg = nil
	runtime.GC()
	runtime.GC()
	adapter := mustAdapter(t, dir)
	if lease.Name() != "a" || lease.Bytes() != loraBytes(t, adapter, 4) || !lease.HasModule("model.layers.0.mlp.up_proj") {
		t.Fatalf("lease after its registry was closed: %q %d", lease.Name(), lease.Bytes())
	}
	checkApply(t, lease, adapter, "model.layers.0.mlp.up_proj", false)

	baseDir := fixture("models", "llama")
	ws := readHostWeights(t, mustOpen(t, baseDir), adapter)
	host := mustHostModel(t)
	for _, w := range ws {
		if err := host.AddWeight(w.name, peft.Float32Buffer(w.data, w.shape...), nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := host.Swap(lease, 1); err != nil {
		t.Fatal(err)
	}
	lease.Close() // the host model's hold is the last one
	runtime.GC()
	sameAs(t, ws, mergedWith(t, baseDir, dir, 1), "merged from a registry that is gone")
	if _, err := host.Swap(nil, 1); err != nil {
		t.Fatal(err)
	}
	sameAs(t, ws, nil, "swapped out")
}

// Registries, leases and host models (with pinned weights and biases) dropped without Close are
// released by their runtime cleanups; closed ones at once.
func TestServeCleanup(t *testing.T) {
	settle()
	before := peft.LiveHandles()
	kept := []any{}
	for i := 0; i < 5; i++ {
		reg, err := peft.NewRegistry(peft.F32, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		mustRegister(t, reg, "a", fixture("adapters", "llama_lora"))
		lease, err := reg.Acquire("a")
		if err != nil {
			t.Fatal(err)
		}
		host, err := peft.NewHostModel()
		if err != nil {
			t.Fatal(err)
		}
		w, b := make([]float32, 16*16), make([]float32, 16)
		bias := peft.Float32Buffer(b, 16)
		if err := host.AddWeight("model.layers.0.self_attn.o_proj.weight", peft.Float32Buffer(w, 16, 16), &bias); err != nil {
			t.Fatal(err)
		}
		kept = append(kept, reg, lease, host)
	}
	runtime.GC()
	if got := peft.LiveHandles(); got != before+15 {
		t.Fatalf("live handles %d while 15 are reachable, want %d", got, before+15)
	}
	runtime.KeepAlive(kept)
	kept = nil
	waitForCleanups(t, before)
	// The runtime panics when it collects a Pinner that still pins something: collecting the host
	// models' pinners now shows that their cleanups unpinned the weights.
	settle()
	host, err := peft.NewHostModel()
	if err != nil {
		t.Fatal(err)
	}
	if peft.LiveHandles() != before+1 {
		t.Fatal("NewHostModel did not count")
	}
	host.Close()
	if peft.LiveHandles() != before {
		t.Fatal("Close did not release at once")
	}
}
