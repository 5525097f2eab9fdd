package peft_test

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
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
