// LoRA extraction from a fine-tuned checkpoint and conversion of adapters to plain LoRA
// (src/capi/lowrank_api.cpp): Extract, Adapter.ConvertToLoRA, ConvertInitial, and the combination of
// adapters in delta space, CombineDeltas.

package peft

/*
#include <stdint.h>
#include <peft_c.h>
*/
import "C"

import "unsafe"

// SVDMethod is how Extract and ConvertToLoRA compute the truncated SVD.
type SVDMethod int32

const (
	SVDExact      SVDMethod = C.PEFT_SVD_EXACT      // LAPACK sgesdd of the whole matrix (the default)
	SVDRandomized SVDMethod = C.PEFT_SVD_RANDOMIZED // randomized range finder; exact where it does not pay
)

// LowRankOption sets an option of Extract, Adapter.ConvertToLoRA and CombineDeltas. Extract and
// ConvertToLoRA require a rank (WithRank) or an energy fraction (WithEnergy); CombineDeltas without
// either writes the exact sum. The later of the two wins.
type LowRankOption func(*lowRankConfig)

type lowRankConfig struct {
	rank    int64
	energy  float64
	svd     SVDMethod
	threads uint32
	dtype   DType
	modules []string
	base    string
}

// WithRank factors every module to this rank (at least 1; a module with fewer rows or columns fails).
func WithRank(rank int64) LowRankOption {
	return func(c *lowRankConfig) { c.rank, c.energy = rank, 0 }
}

// WithEnergy chooses each module's rank as PEFT's _find_cutoff_index does: the smallest k whose top-k
// squared singular values reach this fraction, in (0, 1], of their sum.
func WithEnergy(fraction float64) LowRankOption {
	return func(c *lowRankConfig) { c.energy, c.rank = fraction, 0 }
}

// WithSVD chooses the SVD method (default SVDExact).
func WithSVD(method SVDMethod) LowRankOption { return func(c *lowRankConfig) { c.svd = method } }

// WithLowRankThreads limits the modules factored at once (0, the default: one per hardware thread).
func WithLowRankThreads(threads int) LowRankOption {
	return func(c *lowRankConfig) { c.threads = clampThreads(threads) }
}

// WithLowRankDType writes the factors in F32 (the default; KeepDType means the same), BF16 or F16.
func WithLowRankDType(dtype DType) LowRankOption { return func(c *lowRankConfig) { c.dtype = dtype } }

// WithModules selects the modules Extract considers, as PEFT's target_modules list does (exact names
// or suffixes such as "q_proj"); none (the default) means the Linear and Conv1D layers "all-linear"
// names. ConvertToLoRA ignores it.
func WithModules(names ...string) LowRankOption {
	return func(c *lowRankConfig) { c.modules = append([]string(nil), names...) }
}

// WithBase is the base model (a folder, or a hub id in the offline cache) ConvertToLoRA converts
// against: multiplicative methods (IA3, OFT, BOFT, HRA, MiSS "bat") need it, their dW being W' - W,
// and additive ones such as VeRA take their layer shapes from it. Without it (or with ""), the base
// the adapter was opened with, if any, is used. CombineDeltas uses it likewise (default: the first
// adapter's base). Extract ignores it.
func WithBase(base string) LowRankOption { return func(c *lowRankConfig) { c.base = base } }

// LowRankModule is one module of an extraction or conversion: its rank in the written adapter and
// the relative error ||dW - B A||_F / ||dW||_F of the f32 factors (0 for a zero dW).
type LowRankModule struct {
	Name  string
	Rank  int64
	Error float64
}

// newLowRankOptions builds the C options; the caller frees them.
func newLowRankOptions(opts []LowRankOption, cs *cstrings) (*C.peft_lowrank_options, error) {
	cfg := lowRankConfig{svd: SVDExact, dtype: KeepDType}
	for _, o := range opts {
		o(&cfg)
	}
	names := make([]*C.char, len(cfg.modules)) // Go memory holding C pointers, read during the call
	for i, m := range cfg.modules {
		p, err := cs.add(m, "module name")
		if err != nil {
			return nil, err
		}
		names[i] = p
	}
	var cbase *C.char
	if cfg.base != "" {
		p, err := cs.add(cfg.base, "base model")
		if err != nil {
			return nil, err
		}
		cbase = p
	}
	var o *C.peft_lowrank_options
	if err := takeError(C.peft_lowrank_options_new(&o)); err != nil {
		return nil, err
	}
	var err error
	switch {
	case cfg.rank != 0:
		err = takeError(C.peft_lowrank_options_set_rank(o, C.int64_t(cfg.rank)))
	case cfg.energy != 0:
		err = takeError(C.peft_lowrank_options_set_energy(o, C.double(cfg.energy)))
	}
	if err == nil {
		err = takeError(C.peft_lowrank_options_set_svd(o, C.int32_t(cfg.svd)))
	}
	if err == nil {
		err = takeError(C.peft_lowrank_options_set_threads(o, C.uint32_t(cfg.threads)))
	}
	if err == nil {
		err = takeError(C.peft_lowrank_options_set_dtype(o, C.int32_t(cfg.dtype)))
	}
	if err == nil && len(names) > 0 {
		err = takeError(C.peft_lowrank_options_set_modules(o, (**C.char)(unsafe.Pointer(unsafe.SliceData(names))),
			C.size_t(len(names))))
	}
	if err == nil && cbase != nil {
		err = takeError(C.peft_lowrank_options_set_base(o, cbase))
	}
	if err != nil {
		C.peft_lowrank_options_free(o)
		return nil, err
	}
	return o, nil
}

// takeLowRankReport copies a report and frees it.
func takeLowRankReport(r *C.peft_lowrank_report) []LowRankModule {
	defer C.peft_lowrank_report_free(r)
	modules := make([]LowRankModule, C.peft_lowrank_report_module_count(r))
	for i := range modules {
		at := C.size_t(i)
		modules[i] = LowRankModule{
			Name:  goString(C.peft_lowrank_report_module_name(r, at)),
			Rank:  int64(C.peft_lowrank_report_module_rank(r, at)),
			Error: float64(C.peft_lowrank_report_module_error(r, at)),
		}
	}
	return modules
}

// Extract makes a LoRA adapter from a fully fine-tuned checkpoint: dW = W_tuned - W_base per module,
// truncated SVD (lora_B = U S, lora_A = V^T as PEFT's convert_to_lora), written to outDir as a PEFT
// adapter folder. base and tuned are model folders (or hub ids in the offline cache) with the same
// tensor names. Returns the report, one entry per extracted module.
//
// Errors: ErrInvalidArgument (no rank or energy, a rank above a module's dimensions, modules that
// select nothing, no weight that changed); ErrUnresolvedKey; ErrShapeMismatch; ErrUnsupported for a
// selected module that is not Linear or Conv1D; ErrNonFinite; ErrNotFound, ErrIO and format errors.
func Extract(base, tuned, outDir string, opts ...LowRankOption) ([]LowRankModule, error) {
	var cs cstrings
	defer cs.free()
	cbase, err := cs.add(base, "base model")
	if err != nil {
		return nil, err
	}
	ctuned, err := cs.add(tuned, "fine-tuned model")
	if err != nil {
		return nil, err
	}
	cout, err := cs.add(outDir, "output folder")
	if err != nil {
		return nil, err
	}
	o, err := newLowRankOptions(opts, &cs)
	if err != nil {
		return nil, err
	}
	defer C.peft_lowrank_options_free(o)
	var report *C.peft_lowrank_report
	if err := takeError(C.peft_adapter_extract(cbase, ctuned, cout, o, &report)); err != nil {
		return nil, err
	}
	return takeLowRankReport(report), nil
}

// ConvertToLoRA writes the adapter as a plain LoRA of another rank, by truncated SVD of each
// module's dW, as PEFT's convert_to_lora / save_as_lora do. Returns the report.
//
// Errors: ErrUnsupported naming what PEFT does not convert (lora_bias, DoRA, embedding and conv
// modules, modules_to_save, trainable tokens) or a method that needs a base without one (WithBase);
// ErrInvalidArgument (no rank or energy, a rank above a module's dimensions); ErrNotFound (the base
// has no weight for a module); ErrNonFinite; ErrIO.
func (a *Adapter) ConvertToLoRA(outDir string, opts ...LowRankOption) ([]LowRankModule, error) {
	var cs cstrings
	defer cs.free()
	cout, err := cs.add(outDir, "output folder")
	if err != nil {
		return nil, err
	}
	o, err := newLowRankOptions(opts, &cs)
	if err != nil {
		return nil, err
	}
	defer C.peft_lowrank_options_free(o)
	p, err := a.use()
	if err != nil {
		return nil, err
	}
	defer a.done()
	var report *C.peft_lowrank_report
	if err := takeError(C.peft_adapter_convert_to_lora(p, cout, o, &report)); err != nil {
		return nil, err
	}
	return takeLowRankReport(report), nil
}

// CombineDeltas combines adapters in delta space and writes the result as a plain LoRA adapter:
// the weighted sum of each module's true change dW_i, as ConvertToLoRA computes it (any mergeable
// method, LoRA with its own scaling, rsLoRA and patterns included; with a base, W' - W of IA3, OFT,
// BOFT and HRA), one finite weight per adapter (negative weights subtract). Unlike Combine, whose
// linear and pruning methods combine the LoRA factors, this adds what a merge would add; the inputs
// may mix methods and ranks.
//
// method is CombineLinear (sum_i w_i dW_i) or one of the pruning methods CombineTies,
// CombineDareLinear, CombineDareTies and CombineMagnitudePrune, which prune and elect on the deltas
// as PEFT's merge_utils functions do; combine gives their WithDensity, WithMajoritySign and WithSeed
// (the other export options are not used; nil for none). opts are the low-rank options: with
// neither WithRank nor WithEnergy the sum is written exactly (lora_A the rows w_i * s_i * A_i, lora_B
// the columns B_i, the rank the sum of the ranks, error 0), which needs LoRA inputs and
// CombineLinear; with one of them each module's sum is factored by truncated SVD as ConvertToLoRA
// does. WithSVD, WithLowRankThreads, WithLowRankDType and WithBase (default: the first adapter's
// base) apply too. Returns the report, one entry per written module.
//
// Errors: ErrUnsupported naming the adapter and module (DoRA, lora_bias, modules_to_save and other
// whole tensors, trainable tokens, embedding and conv modules, a multiplicative module without a
// base); ErrInvalidArgument for no adapters, a count mismatch, another method, a weight that is not
// finite, a pruning method without WithDensity, an exact combination of a non-LoRA module or with
// pruning, or a rank above a module's dimensions; ErrShapeMismatch; ErrNotFound (the base has no
// weight for a module); ErrNonFinite; ErrIO.
func CombineDeltas(adapters []*Adapter, weights []float64, method CombineMethod, outDir string,
	combine []ExportOption, opts ...LowRankOption) ([]LowRankModule, error) {
	if len(adapters) == 0 {
		return nil, argError("no adapters to combine")
	}
	if len(weights) != len(adapters) {
		return nil, argError("%d weights for %d adapters", len(weights), len(adapters))
	}
	var cs cstrings
	defer cs.free()
	cout, err := cs.add(outDir, "output folder")
	if err != nil {
		return nil, err
	}
	co, err := newExportOptions(combine, &cs)
	if err != nil {
		return nil, err
	}
	defer C.peft_export_options_free(co)
	o, err := newLowRankOptions(opts, &cs)
	if err != nil {
		return nil, err
	}
	defer C.peft_lowrank_options_free(o)
	list, err := useAdapters(adapters, weights)
	if err != nil {
		return nil, err
	}
	defer list.release()
	var report *C.peft_lowrank_report
	if err := takeError(C.peft_adapter_combine_deltas(list.ptrs, list.weights, list.n, C.int32_t(method), cout, co, o,
		&report)); err != nil {
		return nil, err
	}
	return takeLowRankReport(report), nil
}

// ConvertInitial turns a PiSSA / CorDA / OLoRA / LoRA-GA / LoftQ initialised adapter, after training
// (tunedDir), into a LoRA on the original base, exactly as PEFT's
// save_pretrained(path_initial_model_for_weight_conversion=initialDir) does: lora_A = [A; A0],
// lora_B = [B, -B0], the rank doubled. WithExportDType converts the factors (the PEFT version is not
// used).
//
// Errors: ErrUnsupported for a tensor other than lora_A / lora_B weights, or use_rslora with rank or
// alpha patterns; ErrInvalidArgument for adapters with different modules; ErrShapeMismatch; ErrIO;
// the errors of OpenAdapter.
func ConvertInitial(tunedDir, initialDir, outDir string, opts ...ExportOption) error {
	var cs cstrings
	defer cs.free()
	ctuned, err := cs.add(tunedDir, "fine-tuned adapter folder")
	if err != nil {
		return err
	}
	cinitial, err := cs.add(initialDir, "initial adapter folder")
	if err != nil {
		return err
	}
	cout, err := cs.add(outDir, "output folder")
	if err != nil {
		return err
	}
	o, err := newExportOptions(opts, &cs)
	if err != nil {
		return err
	}
	defer C.peft_export_options_free(o)
	return takeError(C.peft_adapter_convert_initial(ctuned, cinitial, cout, o))
}
