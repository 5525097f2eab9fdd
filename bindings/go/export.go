package peft

/*
#include <stdlib.h>
#include <stdint.h>
#include <peft_c.h>
*/
import "C"

import (
	"strconv"
	"unsafe"
)

// ExportOption sets an option of Adapter.Export and Combine; CombineDeltas reads the combine settings
// (WithDensity, WithMajoritySign, WithSeed) from them.
type ExportOption func(*exportConfig)

type exportConfig struct {
	dtype        DType
	peftVersion  string
	density      float64
	hasDensity   bool
	majoritySign MajoritySign
	seed         uint64
	svdRank      int64
	svdClamp     float64
	hasSVDClamp  bool
}

// WithExportDType converts the F64, F32, F16 and BF16 tensors of the output to F32, BF16 or F16
// (rounding to nearest even, as torch does); KeepDType (the default) keeps each tensor's dtype.
func WithExportDType(dtype DType) ExportOption { return func(c *exportConfig) { c.dtype = dtype } }

// WithPEFTVersion targets an older PEFT release ("0.13", "0.17.1", ...): the config gets only the
// fields that release knows, and the export fails with ErrUnsupported naming a field whose value
// matters to the adapter but that the release does not know. "" (the default) keeps every field.
func WithPEFTVersion(version string) ExportOption {
	return func(c *exportConfig) { c.peftVersion = version }
}

// WithDensity sets PEFT's density for the pruning combinations of Combine: the fraction of each
// factor's values kept (of each module's delta for the SVD forms), from 0 to 1. CombineTies and
// CombineMagnitudePrune keep each factor's int(density * size) largest magnitudes (equal magnitudes:
// the lower index first; torch's topk leaves that order open); CombineDareLinear and CombineDareTies
// keep each value with probability density (see WithSeed) and divide the kept ones by it; their SVD
// forms (CombineTiesSVD, CombineDareLinearSVD, CombineDareTiesSVD, CombineMagnitudePruneSVD) do the
// same to each adapter's delta. 1 prunes nothing. Those eight methods need it (without it Combine
// fails with ErrInvalidArgument); cat, linear and svd, and Export, ignore it. A density outside
// [0, 1] (PEFT warns and prunes nothing above 1) or NaN fails with ErrInvalidArgument.
func WithDensity(density float64) ExportOption {
	return func(c *exportConfig) { c.density, c.hasDensity = density, true }
}

// MajoritySign is how the TIES combinations elect each value's sign (PEFT's majority_sign_method).
type MajoritySign int32

const (
	// MajoritySignTotal (the default): the sign of the sum of the pruned values ("total").
	MajoritySignTotal MajoritySign = C.PEFT_MAJORITY_SIGN_TOTAL
	// MajoritySignFrequency: the sign of the sum of their signs ("frequency").
	MajoritySignFrequency MajoritySign = C.PEFT_MAJORITY_SIGN_FREQUENCY
)

func (m MajoritySign) String() string {
	switch m {
	case MajoritySignTotal:
		return "total"
	case MajoritySignFrequency:
		return "frequency"
	}
	return "MajoritySign(" + strconv.Itoa(int(m)) + ")"
}

// WithMajoritySign sets PEFT's majority_sign_method for CombineTies and CombineDareTies (and their
// SVD forms CombineTiesSVD and CombineDareTiesSVD):
// MajoritySignTotal (the default) or MajoritySignFrequency. Another value fails with
// ErrInvalidArgument. The other methods, and Export, ignore it.
func WithMajoritySign(method MajoritySign) ExportOption {
	return func(c *exportConfig) { c.majoritySign = method }
}

// WithSeed sets the seed of the random masks of CombineDareLinear and CombineDareTies and of their
// SVD forms CombineDareLinearSVD and CombineDareTiesSVD (0 by default; any value). The masks are a function of the seed alone, the same on every machine and
// thread count (PEFT draws them with torch.bernoulli from torch's global generator, which no other
// program reproduces); include/peft_c.h (peft_export_options_set_combine_seed) gives the function.
// The other methods, and Export, ignore it.
func WithSeed(seed uint64) ExportOption { return func(c *exportConfig) { c.seed = seed } }

// WithSVDRank sets PEFT's svd_rank: the rank of the adapter the SVD combinations (CombineSVD and the
// *SVD methods) write. 0 (the default) means the largest of the adapters' ranks (each adapter's r or
// a larger rank_pattern value). A module whose layer allows less (min(out, in) below the rank) gets
// its full-rank factors padded with zeros (PEFT fails on such a module). A negative rank fails with
// ErrInvalidArgument. The other methods, and Export, ignore it.
func WithSVDRank(rank int64) ExportOption { return func(c *exportConfig) { c.svdRank = rank } }

// WithSVDClamp sets PEFT's svd_clamp for the SVD combinations: after the SVD, with hi the quantile of
// level quantile of the new lora_B's and lora_A's values together (torch.quantile's linear
// interpolation, in f32), every value of both is clamped to [-hi, hi]. The values depend on the sign
// LAPACK gives each singular vector pair; peft_c fixes it (the value of largest magnitude in each
// column of lora_B, the first of equal ones, is positive), so the clamp gives the same result with
// every LAPACK. No clamp by default; NaN clears it. A quantile outside [0, 1] fails with
// ErrInvalidArgument. The other methods, and Export, ignore it.
func WithSVDClamp(quantile float64) ExportOption {
	return func(c *exportConfig) { c.svdClamp, c.hasSVDClamp = quantile, true }
}

func newExportOptions(opts []ExportOption, cs *cstrings) (*C.peft_export_options, error) {
	cfg := exportConfig{dtype: KeepDType}
	for _, o := range opts {
		o(&cfg)
	}
	cver, err := cs.addOptional(cfg.peftVersion, "PEFT version")
	if err != nil {
		return nil, err
	}
	var o *C.peft_export_options
	if err := takeError(C.peft_export_options_new(&o)); err != nil {
		return nil, err
	}
	err = takeError(C.peft_export_options_set_dtype(o, C.int32_t(cfg.dtype)))
	if err == nil {
		err = takeError(C.peft_export_options_set_peft_version(o, cver))
	}
	if err == nil && cfg.hasDensity {
		err = takeError(C.peft_export_options_set_combine_density(o, C.double(cfg.density)))
	}
	if err == nil {
		err = takeError(C.peft_export_options_set_combine_majority_sign(o, C.int32_t(cfg.majoritySign)))
	}
	if err == nil {
		err = takeError(C.peft_export_options_set_combine_seed(o, C.uint64_t(cfg.seed)))
	}
	if err == nil {
		err = takeError(C.peft_export_options_set_combine_svd_rank(o, C.int64_t(cfg.svdRank)))
	}
	if err == nil && cfg.hasSVDClamp {
		err = takeError(C.peft_export_options_set_combine_svd_clamp(o, C.double(cfg.svdClamp)))
	}
	if err != nil {
		C.peft_export_options_free(o)
		return nil, err
	}
	return o, nil
}

// Export writes the adapter as a PEFT adapter folder (adapter_config.json and
// adapter_model.safetensors, as PeftModel.save_pretrained writes them), creating outDir if needed.
// Keys are made canonical on the way. Both files appear only when both are complete.
//
// Errors: ErrUnsupported naming the field when the target PEFT version cannot express the adapter;
// ErrInvalidArgument for an empty path or one that is not a folder; ErrIO naming the file.
func (a *Adapter) Export(outDir string, opts ...ExportOption) error {
	var cs cstrings
	defer cs.free()
	cout, err := cs.add(outDir, "output folder")
	if err != nil {
		return err
	}
	o, err := newExportOptions(opts, &cs)
	if err != nil {
		return err
	}
	defer C.peft_export_options_free(o)
	p, err := a.use()
	if err != nil {
		return err
	}
	defer a.done()
	return takeError(C.peft_adapter_export(p, cout, o))
}

// CombineMethod is how Combine stacks the adapters (PEFT's combination_type).
type CombineMethod int32

const (
	// CombineCat stacks the factors (rank = sum of ranks): exactly the weighted sum of the deltas.
	CombineCat CombineMethod = C.PEFT_COMBINE_CAT
	// CombineLinear sums sqrt-weighted factors (equal ranks); exact for one adapter only.
	CombineLinear CombineMethod = C.PEFT_COMBINE_LINEAR
	// CombineTies is linear after magnitude pruning, sign election and disjoint mean of each factor
	// ("ties"; needs WithDensity, reads WithMajoritySign).
	CombineTies CombineMethod = C.PEFT_COMBINE_TIES
	// CombineDareLinear is linear after random pruning with rescale of each factor ("dare_linear";
	// needs WithDensity, reads WithSeed).
	CombineDareLinear CombineMethod = C.PEFT_COMBINE_DARE_LINEAR
	// CombineDareTies is ties with random pruning (with rescale) instead of magnitude ("dare_ties";
	// needs WithDensity, reads WithMajoritySign and WithSeed).
	CombineDareTies CombineMethod = C.PEFT_COMBINE_DARE_TIES
	// CombineMagnitudePrune is linear after magnitude pruning of each factor ("magnitude_prune";
	// needs WithDensity).
	CombineMagnitudePrune CombineMethod = C.PEFT_COMBINE_MAGNITUDE_PRUNE
	// CombineSVD is the weighted sum of the modules' deltas, factored by truncated SVD at the new
	// rank ("svd"; reads WithSVDRank and WithSVDClamp; the ranks may differ).
	CombineSVD CombineMethod = C.PEFT_COMBINE_SVD
	// CombineTiesSVD is svd of the deltas after magnitude pruning, sign election and disjoint mean
	// ("ties_svd"; needs WithDensity, reads WithMajoritySign).
	CombineTiesSVD CombineMethod = C.PEFT_COMBINE_TIES_SVD
	// CombineDareLinearSVD is svd of the deltas after random pruning with rescale ("dare_linear_svd";
	// needs WithDensity, reads WithSeed).
	CombineDareLinearSVD CombineMethod = C.PEFT_COMBINE_DARE_LINEAR_SVD
	// CombineDareTiesSVD is ties_svd with random pruning (with rescale) instead of magnitude
	// ("dare_ties_svd"; needs WithDensity, reads WithMajoritySign and WithSeed).
	CombineDareTiesSVD CombineMethod = C.PEFT_COMBINE_DARE_TIES_SVD
	// CombineMagnitudePruneSVD is svd of the deltas after magnitude pruning ("magnitude_prune_svd";
	// needs WithDensity).
	CombineMagnitudePruneSVD CombineMethod = C.PEFT_COMBINE_MAGNITUDE_PRUNE_SVD
)

func (m CombineMethod) String() string {
	switch m {
	case CombineCat:
		return "cat"
	case CombineLinear:
		return "linear"
	case CombineTies:
		return "ties"
	case CombineDareLinear:
		return "dare_linear"
	case CombineDareTies:
		return "dare_ties"
	case CombineMagnitudePrune:
		return "magnitude_prune"
	case CombineSVD:
		return "svd"
	case CombineTiesSVD:
		return "ties_svd"
	case CombineDareLinearSVD:
		return "dare_linear_svd"
	case CombineDareTiesSVD:
		return "dare_ties_svd"
	case CombineMagnitudePruneSVD:
		return "magnitude_prune_svd"
	}
	return "CombineMethod(" + strconv.Itoa(int(m)) + ")"
}

// Combine combines adapters into a new adapter folder as PEFT's add_weighted_adapter does, one
// finite weight per adapter (negative weights subtract). The config is the first adapter's with the
// new rank; factors are computed in f32 and written as F32 unless WithExportDType says otherwise.
// CombineTies, CombineDareLinear, CombineDareTies and CombineMagnitudePrune are linear with the A
// factors and the B factors each pruned and merged by PEFT's function of that name
// (peft/utils/merge_utils.py): magnitude or random pruning (WithDensity), then the weighted sum, or
// for the TIES types per value the mean of the weighted values whose sign is the majority sign of the
// pruned values (WithMajoritySign). Like linear, they combine the factors, not the deltas.
//
// CombineSVD and its pruning forms (CombineTiesSVD, CombineDareLinearSVD, CombineDareTiesSVD,
// CombineMagnitudePruneSVD) combine each module's deltas instead: dW_i = s_i * B_i @ A_i in f32,
// pruned as above for all but svd, summed with the weights (or elected for the TIES types), then
// factored by truncated SVD (LAPACK's sgesdd, as torch.linalg.svd on CPU): lora_B = U S and lora_A =
// V^T of the leading r components, r = WithSVDRank or the largest of the adapters' ranks, clamped as
// WithSVDClamp says. The ranks may differ. The result is the best rank-r approximation of the
// combined delta.
//
// Errors: ErrUnsupported for what PEFT cannot combine (DoRA, lora_bias, full tensors, trainable
// tokens, ...); ErrInvalidArgument for no adapters, a count mismatch, a weight that is not finite, an
// unknown method, a method other than cat or the SVD types with unequal ranks, a pruning method
// without WithDensity, a density outside [0, 1], an unknown majority sign, a negative WithSVDRank or
// a WithSVDClamp outside [0, 1]; ErrNonFinite when a module's combined delta is not finite (SVD
// types); ErrShapeMismatch naming the module; ErrIO.
func Combine(adapters []*Adapter, weights []float64, method CombineMethod, outDir string, opts ...ExportOption) error {
	if len(adapters) == 0 {
		return argError("no adapters to combine")
	}
	if len(weights) != len(adapters) {
		return argError("%d weights for %d adapters", len(weights), len(adapters))
	}
	var cs cstrings
	defer cs.free()
	cout, err := cs.add(outDir, "output folder")
	if err != nil {
		return err
	}
	o, err := newExportOptions(opts, &cs)
	if err != nil {
		return err
	}
	defer C.peft_export_options_free(o)
	list, err := useAdapters(adapters, weights)
	if err != nil {
		return err
	}
	defer list.release()
	return takeError(C.peft_adapter_combine(list.ptrs, list.weights, list.n, C.int32_t(method), cout, o))
}

// adapterList is the C arrays of adapters and weights Combine and CombineDeltas pass, with the
// adapters in use until release.
type adapterList struct {
	ptrs    **C.peft_adapter
	weights *C.double
	n       C.size_t
	used    []*Adapter
}

// useAdapters checks the counts, marks every adapter in use and copies the handles and weights into
// C memory; the caller calls release once the call has returned.
func useAdapters(adapters []*Adapter, weights []float64) (*adapterList, error) {
	if len(adapters) == 0 {
		return nil, argError("no adapters to combine")
	}
	if len(weights) != len(adapters) {
		return nil, argError("%d weights for %d adapters", len(weights), len(adapters))
	}
	n := C.size_t(len(adapters))
	l := &adapterList{
		ptrs:    (**C.peft_adapter)(C.calloc(n, C.size_t(unsafe.Sizeof((*C.peft_adapter)(nil))))),
		weights: (*C.double)(C.calloc(n, C.size_t(unsafe.Sizeof(C.double(0))))),
		n:       n,
	}
	ptrSlice, weightSlice := unsafe.Slice(l.ptrs, len(adapters)), unsafe.Slice(l.weights, len(adapters))
	for i, a := range adapters {
		if a == nil {
			l.release()
			return nil, argError("adapter %d is nil", i)
		}
		p, err := a.use()
		if err != nil {
			l.release()
			return nil, err
		}
		l.used = append(l.used, a)
		ptrSlice[i], weightSlice[i] = p, C.double(weights[i])
	}
	return l, nil
}

func (l *adapterList) release() {
	for _, a := range l.used {
		a.done()
	}
	l.used = nil
	C.free(unsafe.Pointer(l.ptrs))
	C.free(unsafe.Pointer(l.weights))
}

// The ggml types ExportGGUF writes factors in (ggml's numbering).
const (
	GGMLF32  GGMLType = 0
	GGMLF16  GGMLType = 1
	GGMLQ8_0 GGMLType = 8
	GGMLBF16 GGMLType = 30
)

// ExportGGUF writes the adapter as a GGUF LoRA adapter that llama.cpp loads (--lora,
// llama-export-lora), with PEFT's exact scale for every module: general.architecture (the base's),
// adapter.lora.alpha, and a "<GGUF tensor>.lora_a"/".lora_b" pair per module, named by the base's
// architecture table. base is a Hugging Face model folder or hub id (its config.json) or a GGUF model
// file; "" uses the adapter's base_model_name_or_path. typ is the factors' type: GGMLF32, GGMLF16,
// GGMLBF16 or GGMLQ8_0 (a factor whose rows are not a multiple of 32 values is written F16, as
// llama.cpp's converter does). The file is written atomically.
//
// Errors: ErrUnsupported listing the modules GGUF cannot hold (DoRA, lora_B.bias, whole tensors,
// trainable tokens, conv layers) or for a base architecture without GGUF names; ErrUnresolvedKey
// listing the modules without a GGUF tensor; ErrInvalidArgument for another type or no base;
// ErrInvalidConfig for a base folder without a usable config.json; ErrNonFinite; ErrIO and the
// errors of Open for the base.
func (a *Adapter) ExportGGUF(outPath, base string, typ GGMLType) error {
	var cs cstrings
	defer cs.free()
	cout, err := cs.add(outPath, "output path")
	if err != nil {
		return err
	}
	cbase, err := cs.addOptional(base, "base")
	if err != nil {
		return err
	}
	p, err := a.use()
	if err != nil {
		return err
	}
	defer a.done()
	return takeError(C.peft_adapter_export_gguf(p, cout, cbase, C.int32_t(typ)))
}

// ExportGGUFSplit is ExportGGUF for any LoRA adapter: what a GGUF LoRA cannot hold (DoRA,
// lora_B.bias, whole tensors such as modules_to_save, trainable tokens, conv layers) is merged
// PEFT-exactly into a copy of the base written to baseOut, the rest is written to outPath exactly as
// ExportGGUF writes it, so that llama.cpp applying outPath to baseOut gives PEFT's merged model.
// baseOut is a GGUF file for a GGUF base, a folder (created if needed) that transformers loads for a
// Hugging Face base; it must be neither the base nor outPath. With nothing to merge, baseOut is a
// copy of the base. base and typ are as for ExportGGUF. All or nothing: a failure leaves neither
// output.
//
// Errors: ErrInvalidArgument for an empty path, baseOut equal to the base or to outPath, another
// type or no base; the errors of ExportGGUF for the exported modules and of MergeCheckpoint for the
// merged ones (ErrUnresolvedKey, ErrUnsupported for trainable tokens or a target whose ggml type has no quantizer (the IQ types but IQ4_NL) in
// a GGUF base, ErrNonFinite, ErrIO).
func (a *Adapter) ExportGGUFSplit(outPath, base string, typ GGMLType, baseOut string) error {
	var cs cstrings
	defer cs.free()
	cout, err := cs.add(outPath, "output path")
	if err != nil {
		return err
	}
	cbase, err := cs.addOptional(base, "base")
	if err != nil {
		return err
	}
	cbaseOut, err := cs.add(baseOut, "base output")
	if err != nil {
		return err
	}
	p, err := a.use()
	if err != nil {
		return err
	}
	defer a.done()
	return takeError(C.peft_adapter_export_gguf_split(p, cout, cbase, C.int32_t(typ), cbaseOut))
}

// ImportGGUF writes a GGUF LoRA adapter (llama.cpp's convert_lora_to_gguf.py output, or
// ExportGGUF's) as a PEFT LoRA adapter folder (adapter_model.safetensors with F32 factors and
// adapter_config.json) that PEFT loads and merges to the weights llama.cpp applies, creating outDir
// if needed. base is required: a Hugging Face model folder or hub id, or a GGUF model file; it gives
// the head counts and becomes base_model_name_or_path. A failure leaves outDir as it was.
//
// Errors: ErrInvalidArgument for an empty argument, a file that is not a GGUF adapter or a base of
// another architecture; ErrUnsupported for an adapter type other than LoRA, an unknown architecture
// or tensors that are not LoRA factors; ErrUnresolvedKey listing the GGUF modules without a PEFT
// module; ErrInvalidCheckpoint for incomplete pairs; ErrShapeMismatch; ErrIO and the errors of Open.
func ImportGGUF(ggufPath, outDir, base string) error {
	var cs cstrings
	defer cs.free()
	cpath, err := cs.add(ggufPath, "GGUF path")
	if err != nil {
		return err
	}
	cout, err := cs.add(outDir, "output folder")
	if err != nil {
		return err
	}
	cbase, err := cs.add(base, "base")
	if err != nil {
		return err
	}
	return takeError(C.peft_adapter_import_gguf(cpath, cout, cbase))
}
