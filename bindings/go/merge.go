package peft

/*
#include <stdint.h>
#include <stdlib.h>
#include <peft_c.h>
peft_error* peftc_set_progress(peft_merge_options* opts, uintptr_t handle);
*/
import "C"

import (
	"context"
	"encoding/json"
	"math"
	"runtime/cgo"
	"strconv"
	"unsafe"
)

// KeepDType keeps every tensor's dtype in a merge (the default of WithMergeDType).
const KeepDType DType = C.PEFT_DTYPE_KEEP

// MergeOption sets an option of MergeCheckpoint.
type MergeOption func(*mergeConfig)

type mergeAdapter struct {
	adapter *Adapter
	dir     string
	weight  float64
}

type mergeConfig struct {
	adapters     []mergeAdapter
	dtype        DType
	maxShardSize uint64
	threads      uint32
	progress     func(done, total uint64)
	// requireConfig and allowNonFinite hold the library's defaults unless an option changes them.
	requireConfig  bool
	allowNonFinite bool
	quant          GGMLType
	storeReport    bool
	tiedEmbeddings TiedEmbeddings
	arithmetic     Arithmetic
	joinSplit      bool
	// combineSet says whether WithCombine was given; combineMethod and combineOpts are its arguments.
	combineSet    bool
	combineMethod CombineMethod
	combineOpts   []ExportOption
}

// WithAdapter adds an opened adapter to merge, with a weight that multiplies its LoRA scaling (1.0
// merges it as PEFT's merge_and_unload does). Adapters are applied in the order given. The adapter
// may have been opened with or without a base; it is checked against the merge's base either way.
func WithAdapter(a *Adapter, weight float64) MergeOption {
	return func(c *mergeConfig) { c.adapters = append(c.adapters, mergeAdapter{adapter: a, weight: weight}) }
}

// WithAdapterDir adds an adapter folder to merge, opened against the base by the merge.
func WithAdapterDir(dir string, weight float64) MergeOption {
	return func(c *mergeConfig) { c.adapters = append(c.adapters, mergeAdapter{dir: dir, weight: weight}) }
}

// WithMergeDType chooses the output dtype: KeepDType (the default), F32, BF16 or F16. Only F64, F32,
// F16 and BF16 tensors are converted; config.json's dtype is set to match.
func WithMergeDType(dtype DType) MergeOption { return func(c *mergeConfig) { c.dtype = dtype } }

// WithMaxShardSize reshards the output into shards of at most this many bytes of tensor data, as
// save_pretrained(max_shard_size=...) does; 0 (the default) keeps the base's files.
func WithMaxShardSize(bytes uint64) MergeOption {
	return func(c *mergeConfig) { c.maxShardSize = bytes }
}

// WithThreads limits the threads a merge uses: 0 (the default) for one per core, 1 for the calling
// thread only. Results are the same for every value.
func WithThreads(threads int) MergeOption {
	return func(c *mergeConfig) { c.threads = clampThreads(threads) }
}

// clampThreads maps a thread count to the C API's uint32 (negative counts mean "one per core": 0).
func clampThreads(threads int) uint32 {
	switch {
	case threads < 0:
		return 0
	case uint64(threads) > math.MaxUint32:
		return math.MaxUint32
	}
	return uint32(threads)
}

// WithProgress sets a function told the progress of a merge in bytes: done = 0 first, then at least
// once per tensor, last done = total. It runs on the goroutine that called MergeCheckpoint; a panic
// in it cancels the merge and is re-raised by MergeCheckpoint.
func WithProgress(report func(done, total uint64)) MergeOption {
	return func(c *mergeConfig) { c.progress = report }
}

// WithRequireConfig says whether the base folder must have a usable config.json (the default: true,
// as transformers cannot load a model folder without one; a merge without it fails with ErrNotFound
// before writing anything). With false such a base is merged and the output has no config.json.
func WithRequireConfig(require bool) MergeOption {
	return func(c *mergeConfig) { c.requireConfig = require }
}

// WithAllowNonFinite says whether merged tensors holding an infinity or a NaN are written as computed
// (by default, false, the merge fails with ErrNonFinite naming the first such tensor, nothing written).
func WithAllowNonFinite(allow bool) MergeOption {
	return func(c *mergeConfig) { c.allowNonFinite = allow }
}

// WithQuant chooses the ggml type the merged tensors of a GGUF base are written in (F32, F16, BF16,
// Q8_0, Q4_K, ...): every merged tensor of two or more dimensions is written in it (one-dimensional
// ones keep theirs). By default each merged tensor keeps its own type, a block-quantized one
// quantized again with ggml's reference quantizer. A type without a quantizer here (the IQ types but
// IQ4_NL) fails the merge with ErrUnsupported; with WithMergeDType also set, ErrInvalidArgument.
// Ignored for a safetensors base.
func WithQuant(t GGMLType) MergeOption { return func(c *mergeConfig) { c.quant = t } }

// WithStoreReport asks a merge into a GGUF base to measure what storing each merged tensor costs
// (MergeResult.StoreReport); one more quantization per merged tensor. Ignored for a safetensors base.
func WithStoreReport(report bool) MergeOption { return func(c *mergeConfig) { c.storeReport = report } }

// TiedEmbeddings is what a merge does with a base whose output embedding (lm_head) is tied to its
// input embedding (tie_word_embeddings) when the adapters change one side.
type TiedEmbeddings int32

const (
	// TiedUntie (the default): the merged model computes what the adapter's forward computes; where
	// the two sides change differently they are untied (lm_head.weight written as the original
	// embedding plus its own changes, tie_word_embeddings set to false, a note); changes PEFT makes
	// to both sides alike (trainable tokens, ensure_weight_tying's tied LoRA) land once in the shared
	// tensor, which stays tied.
	TiedUntie TiedEmbeddings = C.PEFT_MERGE_TIED_UNTIE
	// TiedShared is PEFT's merge_and_unload: the changes of either side land in the one shared tensor,
	// which stays tied (a modules_to_save copy still unties).
	TiedShared TiedEmbeddings = C.PEFT_MERGE_TIED_SHARED
)

// WithTiedEmbeddings chooses what a merge does with tied embeddings: TiedUntie (the default) or
// TiedShared. Another value fails the merge with ErrInvalidArgument.
func WithTiedEmbeddings(policy TiedEmbeddings) MergeOption {
	return func(c *mergeConfig) { c.tiedEmbeddings = policy }
}

// Arithmetic is the order of a merge's f32 arithmetic for plain LoRA modules: PEFT's or ggml's.
type Arithmetic int32

const (
	// ArithmeticPEFT (the default) follows PEFT: the merge equals PEFT's merge_and_unload() bit for
	// bit (the delta scaling * B @ A as one float chain over the rank, every adapter's delta summed,
	// added to the weight once).
	ArithmeticPEFT Arithmetic = C.PEFT_MERGE_ARITHMETIC_PEFT
	// ArithmeticGGML follows llama.cpp's llama-export-lora as ggml's scalar reference CPU code
	// computes it: each delta value is the rank's float products added in double in rank order and
	// rounded to float once, multiplied by the adapter's scale weight * alpha / rank (in float; the
	// weight alone when alpha is 0) and added to the weight in float, adapter after adapter. A merge
	// into a GGUF base then equals, byte for byte, ggml's quantization of llama-export-lora's F32
	// merge of the same (dequantized) base. SIMD builds of llama.cpp differ from both orders in the
	// last bits.
	ArithmeticGGML Arithmetic = C.PEFT_MERGE_ARITHMETIC_GGML
)

func (a Arithmetic) String() string {
	switch a {
	case ArithmeticPEFT:
		return "peft"
	case ArithmeticGGML:
		return "ggml"
	}
	return "Arithmetic(" + strconv.Itoa(int(a)) + ")"
}

// WithArithmetic chooses the order of the merge's f32 arithmetic for plain LoRA modules:
// ArithmeticPEFT (the default) or ArithmeticGGML. Both orders give the same bits on every CPU. The
// ggml order applies to plain LoRA modules (lora_B.bias keeps PEFT's arithmetic), into GGUF bases and
// into safetensors bases (exact against ggml for F32 weights; BF16/F16 weights are rounded after
// each adapter); with it, MergeCheckpoint refuses DoRA modules and the other PEFT methods (LoHa,
// LoKr, IA3, ...) with ErrUnsupported naming each module and its method, before anything is written.
// Another value fails the merge with ErrInvalidArgument.
func WithArithmetic(arithmetic Arithmetic) MergeOption {
	return func(c *mergeConfig) { c.arithmetic = arithmetic }
}

// WithJoinSplit chooses what a merge into a split GGUF base (NAME-00001-of-00003.gguf, ... as
// llama-gguf-split cuts them) writes. By default (false) the same layout: one output part per base
// part, named OUT-0000K-of-0000N.gguf after outDir (its prefix when it is itself such a name, else
// the path without .gguf), each with the same tensors, order and metadata as its base part; the parts
// appear together or not at all, and MergeResult.Files lists them. With true the merge writes the one
// file outDir instead, as llama-gguf-split --merge joins parts (the first part's metadata with
// split.count set to 0, then every tensor in part order). No effect on a base of one file.
func WithJoinSplit(join bool) MergeOption { return func(c *mergeConfig) { c.joinSplit = join } }

// WithCombine makes a merge of several adapters combine their changes on the deltas, as PEFT's
// merge_utils does, before they go into each weight, instead of adding them one after the other:
// W' = round(W + combine(w_i dW_i)), each dW_i the module's own change (PEFT's get_delta_weight),
// combined in f32. method is CombineLinear (the default: adapters added in turn) or CombineTies,
// CombineDareLinear, CombineDareTies or CombineMagnitudePrune, with the WithDensity, WithMajoritySign
// and WithSeed of combine (the other export options are not used): the weights CombineDeltas writes
// for the same inputs, merged in one pass and without a rank. lora_B biases and trainable token rows
// are added as usual. It is `peftc merge --combine`.
//
// MergeCheckpoint fails with ErrInvalidArgument for another method or a pruning method without
// WithDensity (or a density outside [0, 1]), and with ArithmeticGGML; with ErrUnsupported, before
// writing anything, listing the modules that have no delta to combine (DoRA, stacked expert
// parameters, embedding and convolution layers, IA3 and the rotations on a quantized base), or for a
// GGUF base. CombineModels takes its combination from its own arguments and ignores this setting
// (beyond checking it).
func WithCombine(method CombineMethod, combine ...ExportOption) MergeOption {
	return func(c *mergeConfig) {
		c.combineSet, c.combineMethod, c.combineOpts = true, method, combine
	}
}

// StoreReportEntry is what storing one merged GGUF tensor costs: RMS and Max compare the stored merge
// with the exact f32 merge, BaseRMS and BaseMax the base stored in Type with the base itself (0 for
// a tensor an adapter replaced whole).
type StoreReportEntry struct {
	Tensor   string  `json:"tensor"`
	BaseType string  `json:"base_type"`
	Type     string  `json:"type"`
	Values   uint64  `json:"values"`
	RMS      float64 `json:"rms"`
	Max      float64 `json:"max"`
	BaseRMS  float64 `json:"base_rms"`
	BaseMax  float64 `json:"base_max"`
}

// MergeResult is what a checkpoint merge did.
type MergeResult struct {
	Merged           uint64   // tensors changed by LoRA, DoRA, lora_B.bias or token rows
	Replaced         uint64   // tensors replaced whole by an adapter tensor
	Copied           uint64   // base tensors written unchanged (converted if the dtype changed)
	Added            uint64   // tensors the base file lacks (an untied output embedding)
	Bytes            uint64   // tensor bytes written
	Files            []string // files written, relative to the output folder (weight files first)
	UntiedEmbeddings bool     // whether tie_word_embeddings was set to false
	Notes            []string // decisions worth knowing
	// StoreReport has one entry per merged tensor, in file order, with WithStoreReport and a GGUF
	// base; empty otherwise.
	StoreReport []StoreReportEntry
}

// progressState is what the progress trampoline reaches through its cgo.Handle.
type progressState struct {
	ctx      context.Context
	report   func(done, total uint64)
	panicked bool
	panicVal any
}

// MergeCheckpoint merges adapters into a base model folder (config.json and model.safetensors or a
// sharded index) and writes the merged model folder outDir, which transformers' from_pretrained
// loads as if PEFT's merge_and_unload() had been saved. At least one adapter option is required.
//
// Everything is checked before anything is written; the output is all or nothing. Cancelling ctx
// stops the merge at its next progress point: the error then matches both ErrCancelled and
// ctx.Err() (context.Canceled or context.DeadlineExceeded), and outDir is as it was.
//
// Errors: ErrInvalidArgument (no adapters, outDir = baseDir, conflicting adapters),
// ErrUnresolvedKey, ErrShapeMismatch, ErrUnsupported, ErrCancelled, ErrIO, and the errors of Open
// and OpenAdapter for the inputs.
func MergeCheckpoint(ctx context.Context, baseDir, outDir string, opts ...MergeOption) (*MergeResult, error) {
	if err := ctx.Err(); err != nil {
		return nil, &Error{Code: CodeCancelled, Message: "the merge was not started: " + err.Error(), cause: err}
	}
	cfg := newMergeConfig(opts)
	var cs cstrings
	defer cs.free()
	cbase, err := cs.add(baseDir, "base folder")
	if err != nil {
		return nil, err
	}
	cout, err := cs.add(outDir, "output folder")
	if err != nil {
		return nil, err
	}
	o, err := newMergeOptions(&cfg, &cs)
	if err != nil {
		return nil, err
	}
	defer C.peft_merge_options_free(o)
	result, err := runMerge(ctx, &cfg, o, func(out **C.peft_merge_result) *C.peft_error {
		return C.peft_merge_checkpoint(cbase, cout, o, out)
	})
	if err != nil {
		return nil, err
	}
	defer C.peft_merge_result_free(result)
	res := mergeResult(result)
	if err := json.Unmarshal([]byte(goString(C.peft_merge_result_report_json(result))), &res.StoreReport); err != nil {
		return nil, &Error{Code: CodeInternal, Message: "the merge's store report is not JSON: " + err.Error()}
	}
	return res, nil
}

// CombineModels is whole-model task arithmetic: models are checkpoint folders (or hub ids) fine-tuned
// from baseDir, one finite weight each (negative weights subtract). Every floating-point tensor W of
// the base becomes W + combine(w_i (M_i - W)), M_i the same-named tensor of model i, the differences
// taken in f32 and rounded once to the output dtype; other tensors are copied from the base. outDir
// gets the base's files, shard names, index and other files, as MergeCheckpoint writes them, all at
// once.
//
// method is CombineLinear (the weighted sum of the differences) or CombineTies, CombineDareLinear,
// CombineDareTies or CombineMagnitudePrune, which prune and elect each tensor's differences as PEFT's
// merge_utils functions do; combine gives their WithDensity, WithMajoritySign and WithSeed (the other
// export options are not used; nil for none). opts are MergeCheckpoint's options without adapters:
// WithMergeDType, WithMaxShardSize, WithProgress, WithRequireConfig and WithAllowNonFinite apply
// (the threads and GGUF settings do not); ctx cancels as for MergeCheckpoint. In the result, Merged
// counts the combined tensors and Copied the others.
//
// Errors: ErrInvalidArgument for no models, a count mismatch, a weight that is not finite, another
// method, a pruning method without WithDensity, an adapter option (WithAdapter, WithAdapterDir) or an
// output over an input; ErrNotFound naming a base tensor a model lacks, or a missing folder;
// ErrShapeMismatch; ErrUnsupported (a GGUF or quantized base); ErrNonFinite; ErrCancelled; ErrIO.
// Nothing is written on failure.
func CombineModels(ctx context.Context, baseDir string, models []string, weights []float64, method CombineMethod,
	outDir string, combine []ExportOption, opts ...MergeOption) (*MergeResult, error) {
	if len(models) == 0 {
		return nil, argError("no models to combine")
	}
	if len(weights) != len(models) {
		return nil, argError("%d weights for %d models", len(weights), len(models))
	}
	if err := ctx.Err(); err != nil {
		return nil, &Error{Code: CodeCancelled, Message: "the combination was not started: " + err.Error(), cause: err}
	}
	cfg := newMergeConfig(opts)
	var cs cstrings
	defer cs.free()
	cbase, err := cs.add(baseDir, "base folder")
	if err != nil {
		return nil, err
	}
	cout, err := cs.add(outDir, "output folder")
	if err != nil {
		return nil, err
	}
	n := C.size_t(len(models))
	cmodels := (**C.char)(C.calloc(n, C.size_t(unsafe.Sizeof((*C.char)(nil)))))
	defer C.free(unsafe.Pointer(cmodels))
	cweights := (*C.double)(C.calloc(n, C.size_t(unsafe.Sizeof(C.double(0)))))
	defer C.free(unsafe.Pointer(cweights))
	modelSlice, weightSlice := unsafe.Slice(cmodels, len(models)), unsafe.Slice(cweights, len(models))
	for i, m := range models {
		if modelSlice[i], err = cs.add(m, "model folder"); err != nil {
			return nil, err
		}
		weightSlice[i] = C.double(weights[i])
	}
	co, err := newExportOptions(combine, &cs)
	if err != nil {
		return nil, err
	}
	defer C.peft_export_options_free(co)
	o, err := newMergeOptions(&cfg, &cs)
	if err != nil {
		return nil, err
	}
	defer C.peft_merge_options_free(o)
	result, err := runMerge(ctx, &cfg, o, func(out **C.peft_merge_result) *C.peft_error {
		return C.peft_model_combine(cbase, cmodels, cweights, n, C.int32_t(method), cout, co, o, out)
	})
	if err != nil {
		return nil, err
	}
	defer C.peft_merge_result_free(result)
	return mergeResult(result), nil
}

// newMergeConfig applies opts to the library's defaults.
func newMergeConfig(opts []MergeOption) mergeConfig {
	cfg := mergeConfig{dtype: KeepDType, requireConfig: true, quant: GGMLType(KeepDType)}
	for _, o := range opts {
		o(&cfg)
	}
	return cfg
}

// newMergeOptions makes the C merge options of cfg: its adapters and settings (the progress callback
// is set by runMerge). The caller frees them.
func newMergeOptions(cfg *mergeConfig, cs *cstrings) (*C.peft_merge_options, error) {
	var o *C.peft_merge_options
	if err := takeError(C.peft_merge_options_new(&o)); err != nil {
		return nil, err
	}
	var err error
	for _, ma := range cfg.adapters {
		if err = addMergeAdapter(o, ma, cs); err != nil {
			break
		}
	}
	if err == nil {
		err = takeError(C.peft_merge_options_set_dtype(o, C.int32_t(cfg.dtype)))
	}
	if err == nil {
		err = takeError(C.peft_merge_options_set_max_shard_size(o, C.uint64_t(cfg.maxShardSize)))
	}
	if err == nil {
		err = takeError(C.peft_merge_options_set_threads(o, C.uint32_t(cfg.threads)))
	}
	if err == nil {
		err = takeError(C.peft_merge_options_set_require_config(o, boolInt(cfg.requireConfig)))
	}
	if err == nil {
		err = takeError(C.peft_merge_options_set_allow_nonfinite(o, boolInt(cfg.allowNonFinite)))
	}
	if err == nil {
		err = takeError(C.peft_merge_options_set_quant(o, C.int32_t(cfg.quant)))
	}
	if err == nil {
		err = takeError(C.peft_merge_options_set_report(o, boolInt(cfg.storeReport)))
	}
	if err == nil {
		err = takeError(C.peft_merge_options_set_tied_embeddings(o, C.int32_t(cfg.tiedEmbeddings)))
	}
	if err == nil {
		err = takeError(C.peft_merge_options_set_arithmetic(o, C.int32_t(cfg.arithmetic)))
	}
	if err == nil {
		err = takeError(C.peft_merge_options_set_join_split(o, boolInt(cfg.joinSplit)))
	}
	if err == nil && cfg.combineSet {
		err = setMergeCombine(o, cfg, cs)
	}
	if err != nil {
		C.peft_merge_options_free(o)
		return nil, err
	}
	return o, nil
}

// setMergeCombine sets WithCombine's method and settings on o (the options copy the settings).
func setMergeCombine(o *C.peft_merge_options, cfg *mergeConfig, cs *cstrings) error {
	co, err := newExportOptions(cfg.combineOpts, cs)
	if err != nil {
		return err
	}
	defer C.peft_export_options_free(co)
	return takeError(C.peft_merge_options_set_combine(o, C.int32_t(cfg.combineMethod), co))
}

// runMerge sets cfg's progress function and ctx's cancellation on o, then runs call (a merge writing
// its result to out). A panic in the progress function is re-raised here; a cancellation's error
// carries ctx.Err(). On success the caller frees the result.
func runMerge(ctx context.Context, cfg *mergeConfig, o *C.peft_merge_options,
	call func(out **C.peft_merge_result) *C.peft_error) (*C.peft_merge_result, error) {
	state := &progressState{ctx: ctx, report: cfg.progress}
	h := cgo.NewHandle(state)
	defer h.Delete()
	if err := takeError(C.peftc_set_progress(o, C.uintptr_t(h))); err != nil {
		return nil, err
	}
	var result *C.peft_merge_result
	err := takeError(call(&result))
	if state.panicked {
		C.peft_merge_result_free(result)
		panic(state.panicVal)
	}
	if err != nil {
		if e, ok := err.(*Error); ok && e.Code == CodeCancelled && ctx.Err() != nil {
			e.cause = ctx.Err()
		}
		return nil, err
	}
	return result, nil
}

// addMergeAdapter adds one adapter to the C options; the options keep their own reference to an
// opened adapter, so the Go handle is only needed during the call.
func addMergeAdapter(o *C.peft_merge_options, ma mergeAdapter, cs *cstrings) error {
	if ma.adapter == nil {
		cdir, err := cs.add(ma.dir, "adapter folder")
		if err != nil {
			return err
		}
		return takeError(C.peft_merge_options_add_adapter_dir(o, cdir, C.double(ma.weight)))
	}
	ap, err := ma.adapter.use()
	if err != nil {
		return err
	}
	defer ma.adapter.done()
	return takeError(C.peft_merge_options_add_adapter(o, ap, C.double(ma.weight)))
}

func mergeResult(r *C.peft_merge_result) *MergeResult {
	count := func(which C.int32_t) uint64 { return uint64(C.peft_merge_result_tensor_count(r, which)) }
	res := &MergeResult{
		Merged:           count(C.PEFT_MERGE_TENSORS_MERGED),
		Replaced:         count(C.PEFT_MERGE_TENSORS_REPLACED),
		Copied:           count(C.PEFT_MERGE_TENSORS_COPIED),
		Added:            count(C.PEFT_MERGE_TENSORS_ADDED),
		Bytes:            uint64(C.peft_merge_result_bytes(r)),
		Files:            make([]string, C.peft_merge_result_file_count(r)),
		UntiedEmbeddings: C.peft_merge_result_untied_embeddings(r) != 0,
		Notes:            make([]string, C.peft_merge_result_note_count(r)),
	}
	for i := range res.Files {
		res.Files[i] = goString(C.peft_merge_result_file_name(r, C.size_t(i)))
	}
	for i := range res.Notes {
		res.Notes[i] = goString(C.peft_merge_result_note(r, C.size_t(i)))
	}
	return res
}
