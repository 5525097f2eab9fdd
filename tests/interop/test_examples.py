"""The Python example runs, and its merged model is byte-identical to what `peftc merge` writes for the
same base and adapter (the other languages' examples make the same comparison in their test hooks)."""
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
PEFTC = os.environ.get("PEFTC", str(ROOT / "build" / "peftc"))
BASE = ROOT / "tests" / "fixtures" / "models" / "llama"
ADAPTER = ROOT / "tests" / "fixtures" / "adapters" / "llama_lora"


def test_python_example_merges_like_peftc(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "bindings" / "python"))
    run = subprocess.run([sys.executable, str(ROOT / "examples" / "python" / "example.py"), str(BASE),
                          str(ADAPTER), str(tmp_path / "py")], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr
    cli = subprocess.run([PEFTC, "merge", "--base", str(BASE), "--adapter", str(ADAPTER), "--out",
                          str(tmp_path / "cli")], capture_output=True, text=True)
    assert cli.returncode == 0, cli.stderr
    ours = sorted(p.name for p in (tmp_path / "py" / "merged").glob("*.safetensors"))
    assert ours and ours == sorted(p.name for p in (tmp_path / "cli").glob("*.safetensors"))
    for name in ours:
        assert (tmp_path / "py" / "merged" / name).read_bytes() == (tmp_path / "cli" / name).read_bytes()
    assert (tmp_path / "py" / "adapter" / "adapter_model.safetensors").read_bytes() == \
        (ADAPTER / "adapter_model.safetensors").read_bytes()
