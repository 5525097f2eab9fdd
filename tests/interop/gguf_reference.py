"""llama.cpp's own converters and tools as references for the GGUF interop tests.

Imported by test modules (pytest puts this folder on sys.path); not tests themselves. The tools come from
scripts/llama-cpp.sh, which builds them once per machine into ~/.cache/peft_c/llama and whose `--env` mode
prints the variables read here (scripts/test.sh exports them before the interop tests):

  PEFT_LLAMA_CPP_BIN     llama-export-lora, llama-quantize, llama-gguf
  PEFT_LLAMA_CPP_SRC     the llama.cpp tree: convert_hf_to_gguf.py, convert_lora_to_gguf.py
  PEFT_GGUF_PY           gguf-py (the `gguf` Python package of that tree)
  PEFT_LLAMA_CPP_PYDEPS  the converters' extra Python packages (sentencepiece)

Without PEFT_LLAMA_CPP_BIN every helper skips the calling test and says how to get the tools; with it set
but pointing at something incomplete, the test fails (a broken reference must not look like a skip).

Every conversion, merge and quantization runs once per test session for the same inputs: results are cached
in a session folder (removed at exit) and returned as paths that callers must treat as read-only; pass
`out_path` to get a copy of your own. The converters run in subprocesses with the Hub switched off.

The tiny fixture models have no tokenizer, and convert_hf_to_gguf.py refuses a model without one. The
llama, qwen2, gemma and phi3 converters all take a SentencePiece `tokenizer.model` first, so
`convert_hf_to_gguf` stages the model folder (symbolic links to its files) together with a tiny
SentencePiece model written by `write_sentencepiece_model` (no training, no download). The gpt2, gpt_neox,
bloom and falcon converters only take a BPE tokenizer whose pre-tokenizer they recognise by the hash of its
output on a test text (get_vocab_base_pre), which no tiny tokenizer can match: for those model types without
a tokenizer the converter runs with its vocabulary reader (TextModel.get_vocab_base) replaced by one giving
vocab_size placeholder tokens (`_BPE_VOCAB_STUB`). The same run also gives the GPT-NeoX converter the
`rotary_pct` it reads, which transformers 5 keeps as rope_parameters.partial_rotary_factor only. Only
metadata differs; every tensor goes through the converter's own code.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import pathlib
import shutil
import struct
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pytest

HOW_TO_GET = 'run `eval "$(scripts/llama-cpp.sh --env)"`, as scripts/test.sh does'
HF_OUTTYPES = ("f32", "f16", "bf16", "q8_0")
LORA_OUTTYPES = ("f32", "f16", "bf16", "q8_0")


@dataclass(frozen=True)
class LlamaCpp:
    """Where the reference tools are."""

    bin: pathlib.Path      # llama-export-lora, llama-quantize, llama-gguf
    src: pathlib.Path      # convert_hf_to_gguf.py, convert_lora_to_gguf.py
    gguf_py: pathlib.Path  # the `gguf` package's parent folder
    pydeps: pathlib.Path | None  # sentencepiece's parent folder

    def tool(self, name: str) -> pathlib.Path:
        path = self.bin / name
        if not os.access(path, os.X_OK):
            pytest.fail(f"{path} is missing or not executable: rebuild with scripts/llama-cpp.sh", pytrace=False)
        return path

    def python_env(self) -> dict:
        """The environment of a converter: gguf-py and sentencepiece importable, the Hub off."""
        env = dict(os.environ)
        paths = [str(self.gguf_py)] + ([str(self.pydeps)] if self.pydeps else [])
        if env.get("PYTHONPATH"):
            paths.append(env["PYTHONPATH"])
        env.update(PYTHONPATH=os.pathsep.join(paths), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                   HF_HUB_DISABLE_TELEMETRY="1", TOKENIZERS_PARALLELISM="false", PYTHONWARNINGS="ignore")
        return env


def llama_cpp() -> LlamaCpp:
    """The reference tools; skips the calling test when PEFT_LLAMA_CPP_BIN is unset."""
    bin_dir = os.environ.get("PEFT_LLAMA_CPP_BIN")
    if not bin_dir:
        pytest.skip(f"llama.cpp reference tools not available: PEFT_LLAMA_CPP_BIN is not set ({HOW_TO_GET})")
    missing = [name for name in ("PEFT_LLAMA_CPP_SRC", "PEFT_GGUF_PY") if not os.environ.get(name)]
    if missing:
        pytest.fail(f"PEFT_LLAMA_CPP_BIN is set but {', '.join(missing)} is not ({HOW_TO_GET})", pytrace=False)
    pydeps = os.environ.get("PEFT_LLAMA_CPP_PYDEPS")
    tools = LlamaCpp(pathlib.Path(bin_dir), pathlib.Path(os.environ["PEFT_LLAMA_CPP_SRC"]),
                     pathlib.Path(os.environ["PEFT_GGUF_PY"]), pathlib.Path(pydeps) if pydeps else None)
    for path in (tools.bin, tools.src / "convert_hf_to_gguf.py", tools.src / "convert_lora_to_gguf.py",
                 tools.gguf_py / "gguf" / "__init__.py"):
        if not path.exists():
            pytest.fail(f"llama.cpp reference incomplete: {path} does not exist ({HOW_TO_GET})", pytrace=False)
    return tools


def gguf_module():
    """gguf-py of the reference tree (GGUFReader, GGMLQuantizationType, quants, ...)."""
    path = str(llama_cpp().gguf_py)
    if path not in sys.path:
        sys.path.insert(0, path)
    import gguf

    return gguf


def read_gguf(path: os.PathLike):
    """gguf-py's GGUFReader on a file."""
    return gguf_module().GGUFReader(str(path))


def tensors(path: os.PathLike) -> dict:
    """name -> (ggml type name, ne, values or raw bytes as gguf-py reads them)."""
    return {t.name: (t.tensor_type.name, [int(n) for n in t.shape], np.array(t.data)) for t in read_gguf(path).tensors}


def metadata(path: os.PathLike) -> dict:
    """key -> value of a GGUF file's metadata, in order (gguf-py's virtual GGUF.* fields left out)."""
    out = {}
    for field in read_gguf(path).fields.values():
        if field.name.startswith("GGUF."):
            continue
        out[field.name] = field.contents()
    return out


def rewrite_gguf(src: os.PathLike, dst: os.PathLike, set_metadata: dict | None = None,
                 tensors: Sequence[tuple] | None = None) -> pathlib.Path:
    """gguf-py writes a copy of GGUF `src` at `dst`: its metadata in order, with `set_metadata`
    {key: (value, GGUFValueType)} replacing or adding values (value None removes the key), and `tensors`
    [(name, numpy array, GGMLQuantizationType)] instead of src's when given (quantized types as raw uint8
    rows, as gguf-py reads them). Returns dst."""
    gguf = gguf_module()
    reader = read_gguf(src)
    changes = dict(set_metadata or {})
    arch = changes.get("general.architecture", (None,))[0] or reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(str(dst), arch)
    for field in reader.fields.values():
        if field.name.startswith("GGUF."):
            continue
        value_type = field.types[0]
        sub_type = field.types[-1] if value_type == gguf.GGUFValueType.ARRAY else None
        value = field.contents()
        if field.name in changes:
            value, value_type = changes.pop(field.name)
            sub_type = None
        if value is not None:
            writer.add_key_value(field.name, value, value_type, sub_type=sub_type)
    for key, (value, value_type) in changes.items():
        if value is not None:
            writer.add_key_value(key, value, value_type)
    if tensors is None:
        tensors = [(t.name, np.array(t.data), t.tensor_type) for t in reader.tensors]
    for name, data, tensor_type in tensors:
        writer.add_tensor(name, data, raw_dtype=tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return pathlib.Path(dst)


def dequantized_gguf(src: os.PathLike, dst: os.PathLike) -> pathlib.Path:
    """A copy of GGUF `src` with every block-quantized tensor dequantized to F32 by gguf-py (llama-export-lora
    refuses quantized adapters: this is the adapter it merges instead)."""
    gguf = gguf_module()
    F32 = gguf.GGMLQuantizationType.F32
    out = []
    for t in read_gguf(src).tensors:
        if t.tensor_type in (F32, gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.BF16):
            out.append((t.name, np.array(t.data), t.tensor_type))
        else:
            out.append((t.name, gguf.quants.dequantize(np.array(t.data), t.tensor_type).astype(np.float32), F32))
    return rewrite_gguf(src, dst, tensors=out)


# --- peftc and comparisons ------------------------------------------------------------------------------

def run_peftc(peftc: pathlib.Path, *args, expect: int = 0) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(peftc), *map(str, args)], capture_output=True, text=True)
    assert proc.returncode == expect, f"peftc {' '.join(map(str, args))}: exit {proc.returncode}\n{proc.stderr}"
    return proc


def assert_same_lora_file(ours: os.PathLike, reference: os.PathLike) -> None:
    """Two GGUF LoRA adapters hold the same tensors (names, types, shapes and values, exactly) and the
    same general.architecture, general.type, adapter.type and adapter.lora.alpha."""
    got, want = tensors(ours), tensors(reference)
    assert got.keys() == want.keys()
    for name, (kind, ne, values) in want.items():
        assert got[name][:2] == (kind, ne), name
        assert np.array_equal(got[name][2], values), name
    ours_kv, want_kv = metadata(ours), metadata(reference)
    for key in ("general.architecture", "general.type", "adapter.type", "adapter.lora.alpha"):
        assert ours_kv[key] == want_kv[key], key


def relative_error(ours: np.ndarray, reference: np.ndarray) -> float:
    ours, reference = np.asarray(ours, dtype=np.float64), np.asarray(reference, dtype=np.float64)
    scale = max(float(np.max(np.abs(reference))), 1e-30)
    return float(np.max(np.abs(ours - reference))) / scale


def assert_same_merge(out: os.PathLike, reference: os.PathLike, base: os.PathLike) -> int:
    """A merged GGUF `out` against llama-export-lora's `reference` on the same `base`: the same tensors,
    types and shapes; tensors the adapters did not touch copied byte for byte; merged F32 tensors within
    1e-6 relative, F16 ones at most one step apart; the base's metadata unchanged and in order. Returns how
    many tensors the merge changed."""
    got, want, before = tensors(out), tensors(reference), tensors(base)
    assert got.keys() == want.keys() == before.keys()
    changed = 0
    for name, (kind, ne, values) in want.items():
        assert got[name][:2] == (kind, ne), name
        if np.array_equal(before[name][2], values):
            # Untouched by the adapters: copied byte for byte.
            assert np.array_equal(got[name][2], values), name
            continue
        changed += 1
        if kind == "F32":
            assert relative_error(got[name][2], values) <= 1e-6, name
        else:
            # Both round the same f32 sum once; the sums may differ in their last bits.
            steps = np.abs(got[name][2].view(np.int16).astype(np.int32) - values.view(np.int16).astype(np.int32))
            assert steps.max() <= 1, name
    assert list(metadata(out).items()) == list(metadata(base).items())
    return changed


# --- session cache --------------------------------------------------------------------------------------

_session: pathlib.Path | None = None
_cache: dict[tuple, pathlib.Path] = {}


def _session_dir() -> pathlib.Path:
    global _session
    if _session is None:
        # No ':' or ',' in the path: llama-export-lora's --lora-scaled splits on them.
        _session = pathlib.Path(tempfile.mkdtemp(prefix="peft_c_gguf_"))
        atexit.register(shutil.rmtree, _session, ignore_errors=True)
    return _session


def _identity(path: os.PathLike) -> tuple:
    """What decides whether a cached result still holds for an input file or folder."""
    p = pathlib.Path(path).resolve()
    if p.is_dir():
        return (str(p),) + tuple((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in sorted(p.iterdir())
                                 if f.is_file())
    st = p.stat()
    return (str(p), st.st_size, st.st_mtime_ns)


def _cached(key: tuple, name: str, make, out_path: os.PathLike | None) -> pathlib.Path:
    """Runs make(path) once per session for key; returns the cached file or a copy at out_path."""
    if key not in _cache:
        folder = _session_dir() / hashlib.sha256(repr(key).encode()).hexdigest()[:16]
        shutil.rmtree(folder, ignore_errors=True)  # left by an earlier failed attempt
        folder.mkdir()
        result = folder / name
        make(result)
        if not result.is_file():
            pytest.fail(f"the reference produced no {result}", pytrace=False)
        _cache[key] = result
    if out_path is None:
        return _cache[key]
    shutil.copyfile(_cache[key], out_path)
    return pathlib.Path(out_path)


def _run(args: Sequence[os.PathLike | str], what: str, env: dict | None = None, cwd=None) -> str:
    proc = subprocess.run([str(a) for a in args], capture_output=True, text=True, env=env,
                          cwd=cwd or _session_dir())
    if proc.returncode != 0:
        output = (proc.stdout + proc.stderr)[-4000:]
        pytest.fail(f"{what} failed (exit {proc.returncode}): {' '.join(map(str, args))}\n{output}",
                    pytrace=False)
    return proc.stdout + proc.stderr


# --- tokenizer ------------------------------------------------------------------------------------------

def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _pb_bytes(field: int, data: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(data)) + data


def _pb_int(field: int, value: int) -> bytes:
    return _varint(field << 3) + _varint(value)


def _pb_float(field: int, value: float) -> bytes:
    return _varint(field << 3 | 5) + struct.pack("<f", value)


def sentencepiece_model(vocab_size: int) -> bytes:
    """A minimal SentencePiece unigram model (sentencepiece_model.proto, hand-encoded): <unk>=0, <s>=1,
    </s>=2 (the ids of the fixture configs), then single characters, padded to vocab_size pieces."""
    pieces = [("<unk>", 2), ("<s>", 3), ("</s>", 3)]  # types: 1 normal, 2 unknown, 3 control
    chars = "\u2581abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    pieces += [(c, 1) for c in chars]
    pieces += [(f"<x{i}>", 1) for i in range(max(0, vocab_size - len(pieces)))]
    pieces = pieces[:vocab_size]
    body = b"".join(_pb_bytes(1, _pb_bytes(1, text.encode()) + _pb_float(2, -float(i)) + _pb_int(3, kind))
                    for i, (text, kind) in enumerate(pieces))
    # TrainerSpec: model_type 3 = UNIGRAM (1), vocab_size 4, unk/bos/eos ids 40/41/42.
    trainer = _pb_int(3, 1) + _pb_int(4, vocab_size) + _pb_int(40, 0) + _pb_int(41, 1) + _pb_int(42, 2)
    # NormalizerSpec: name 1, add_dummy_prefix 3, remove_extra_whitespaces 4, escape_whitespaces 5.
    normalizer = _pb_bytes(1, b"identity") + _pb_int(3, 1) + _pb_int(4, 0) + _pb_int(5, 1)
    return body + _pb_bytes(2, trainer) + _pb_bytes(3, normalizer)


def write_sentencepiece_model(path: os.PathLike, vocab_size: int) -> pathlib.Path:
    path = pathlib.Path(path)
    path.write_bytes(sentencepiece_model(vocab_size))
    return path


def _staged_model(model_dir: pathlib.Path, into: pathlib.Path) -> pathlib.Path:
    """into/<model folder name>: links to the model's files plus a tokenizer.model if it has no tokenizer.
    The folder keeps the model's name, which the converter writes as general.name."""
    import json

    staged = into / model_dir.name
    staged.mkdir()
    for f in sorted(model_dir.iterdir()):
        if f.is_file():
            (staged / f.name).symlink_to(f.resolve())
    if not any((model_dir / name).exists() for name in ("tokenizer.model", "tokenizer.json")):
        config = json.loads((model_dir / "config.json").read_text())
        vocab = config.get("vocab_size") or config.get("text_config", {}).get("vocab_size")
        write_sentencepiece_model(staged / "tokenizer.model", int(vocab))
    return staged


# Model types whose converter reads only a recognised BPE tokenizer (see the module docstring).
BPE_VOCAB_MODEL_TYPES = ("gpt2", "gpt_neox", "bloom", "falcon", "qwen3_moe", "gpt_oss")

# Runs convert_hf_to_gguf.py (argv[1], its arguments after it) with TextModel.get_vocab_base giving
# vocab_size placeholder tokens instead of reading a tokenizer, and rotary_pct in the hyperparameters.
_BPE_VOCAB_STUB = """
import os, runpy, sys
script = sys.argv[1]
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(script))
import gguf
from conversion.base import ModelBase, TextModel

def placeholder_vocab(self):
    n = int(self.hparams["vocab_size"])
    return [f"<t{i}>" for i in range(n)], [gguf.TokenType.NORMAL] * n, "gpt-2"

load_hparams = ModelBase.load_hparams

def with_rotary_pct(dir_model, is_mistral_format):
    hparams = load_hparams(dir_model, is_mistral_format)
    rope = hparams.get("rope_parameters") or {}
    if "rotary_pct" not in hparams and "partial_rotary_factor" in rope:
        hparams["rotary_pct"] = rope["partial_rotary_factor"]
    return hparams

TextModel.get_vocab_base = placeholder_vocab
ModelBase.load_hparams = staticmethod(with_rotary_pct)
runpy.run_path(script, run_name="__main__")
"""


def _needs_vocab_stub(model_dir: pathlib.Path) -> bool:
    import json

    if any((model_dir / name).exists() for name in ("tokenizer.json", "vocab.json")):
        return False
    return json.loads((model_dir / "config.json").read_text()).get("model_type") in BPE_VOCAB_MODEL_TYPES


# --- the references -------------------------------------------------------------------------------------

def convert_hf_to_gguf(model_dir: os.PathLike, out_path: os.PathLike | None = None,
                       outtype: str = "f32") -> pathlib.Path:
    """convert_hf_to_gguf.py on a transformers model folder (a tiny SentencePiece tokenizer is added when
    the folder has none; BPE_VOCAB_MODEL_TYPES get placeholder tokens). outtype: f32, f16, bf16 or q8_0. Returns the GGUF file."""
    if outtype not in HF_OUTTYPES:
        raise ValueError(f"outtype {outtype!r} is not one of {HF_OUTTYPES}")
    tools = llama_cpp()
    model_dir = pathlib.Path(model_dir)

    def make(result: pathlib.Path) -> None:
        staged = _staged_model(model_dir, result.parent)
        stub = ["-c", _BPE_VOCAB_STUB] if _needs_vocab_stub(model_dir) else []
        _run([sys.executable, *stub, tools.src / "convert_hf_to_gguf.py", staged, "--outfile", result,
              "--outtype", outtype], f"convert_hf_to_gguf.py on {model_dir}", env=tools.python_env())

    return _cached(("hf", _identity(model_dir), outtype), f"{model_dir.name}.{outtype}.gguf", make, out_path)


def convert_lora_to_gguf(adapter_dir: os.PathLike, base_dir: os.PathLike, out_path: os.PathLike | None = None,
                         outtype: str = "f32") -> pathlib.Path:
    """convert_lora_to_gguf.py on a PEFT LoRA adapter folder; base_dir is the base model folder (only its
    config.json is read). outtype: f32, f16, bf16 or q8_0. Returns the GGUF adapter."""
    if outtype not in LORA_OUTTYPES:
        raise ValueError(f"outtype {outtype!r} is not one of {LORA_OUTTYPES}")
    tools = llama_cpp()
    adapter_dir, base_dir = pathlib.Path(adapter_dir), pathlib.Path(base_dir)

    def make(result: pathlib.Path) -> None:
        _run([sys.executable, tools.src / "convert_lora_to_gguf.py", adapter_dir, "--base", base_dir,
              "--outfile", result, "--outtype", outtype], f"convert_lora_to_gguf.py on {adapter_dir}",
             env=tools.python_env())

    key = ("lora", _identity(adapter_dir), _identity(base_dir / "config.json"), outtype)
    return _cached(key, f"{adapter_dir.name}.{outtype}.gguf", make, out_path)


def export_lora(base_gguf: os.PathLike, adapters: Sequence[tuple[os.PathLike, float]],
                out_path: os.PathLike | None = None, threads: int = 1) -> pathlib.Path:
    """llama-export-lora: merges GGUF LoRA adapters, each with its user scale (the tool multiplies it by
    alpha / rank), into a GGUF base. Returns the merged GGUF."""
    tools = llama_cpp()
    if not adapters:
        raise ValueError("export_lora needs at least one adapter")

    def make(result: pathlib.Path) -> None:
        args = [tools.tool("llama-export-lora"), "-m", base_gguf, "-o", result, "-t", str(threads)]
        for adapter, scale in adapters:
            if any(c in str(adapter) for c in ":,"):
                raise ValueError(f"llama-export-lora cannot take a path with ':' or ',': {adapter}")
            args += ["--lora-scaled", f"{adapter}:{float(scale)!r}"]
        _run(args, "llama-export-lora")

    key = ("export", _identity(base_gguf), tuple((_identity(a), float(s)) for a, s in adapters), threads)
    return _cached(key, "merged.gguf", make, out_path)


def quantize(in_path: os.PathLike, out_path: os.PathLike | None = None, type: str = "Q8_0",
             extra: Sequence[str] = (), threads: int = 1) -> pathlib.Path:
    """llama-quantize: `type` is a file type name (Q8_0, Q4_K_M, ...); extra holds flags such as --pure.
    Returns the quantized GGUF."""
    tools = llama_cpp()

    def make(result: pathlib.Path) -> None:
        _run([tools.tool("llama-quantize"), *extra, in_path, result, type, str(threads)], "llama-quantize")

    key = ("quantize", _identity(in_path), type, tuple(extra))
    return _cached(key, f"{pathlib.Path(in_path).stem}.{type}.gguf", make, out_path)


def ggml_reads(path: os.PathLike) -> tuple[bool, str]:
    """Whether ggml's own GGUF reader (gguf_init_from_file with data, via `llama-gguf FILE r n`) accepts a
    file, and what it printed. On a file ggml refuses, the example tool then crashes on the missing context
    (exit -11 after a `gguf_init_from_...` message): any nonzero exit counts as refused."""
    tools = llama_cpp()
    proc = subprocess.run([str(tools.tool("llama-gguf")), str(path), "r", "n"], capture_output=True, text=True,
                          cwd=_session_dir())
    return proc.returncode == 0, proc.stdout + proc.stderr


# --- references for comparisons -----------------------------------------------------------------------

def peft_merged_gguf(model_dir: os.PathLike, adapters: Sequence[tuple[os.PathLike, float]],
                     folder: os.PathLike) -> pathlib.Path:
    """PEFT's merge_and_unload() of the adapters into the model (merge_support.peft_merged), saved to
    `folder` with the model's side files, converted by convert_hf_to_gguf.py to F32: the reference a GGUF
    merge must equal."""
    from merge_support import peft_merged

    model_dir, folder = pathlib.Path(model_dir), pathlib.Path(folder)
    peft_merged(model_dir, [(pathlib.Path(a), w) for a, w in adapters]).save_pretrained(str(folder))
    for side_file in model_dir.iterdir():  # the tokenizer and config files beside the weights
        if not side_file.name.endswith(".safetensors") and not (folder / side_file.name).exists():
            (folder / side_file.name).write_bytes(side_file.read_bytes())
    return convert_hf_to_gguf(folder, outtype="f32")
