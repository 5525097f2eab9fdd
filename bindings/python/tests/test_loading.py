"""Finding the library (PEFT_C_LIB, the package's lib folder, pkg-config, find_library), the ABI check, and
the `peftc` console command. (The wheel itself is tested by scripts/test-packaging.sh.)

Each case runs in a fresh interpreter with a controlled environment, since the library loads once.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

import peft_c
from peft_c_test_support import PACKAGE_ROOT

PROBE = ("import peft_c, os; print(os.path.realpath(peft_c.library_path())); print(peft_c.version()); "
         "print(peft_c.library_path())")


@pytest.fixture(scope="module")
def real_library() -> pathlib.Path:
    return pathlib.Path(os.path.realpath(peft_c.library_path()))


def run(code: str, env: dict, pythonpath: str = str(PACKAGE_ROOT)) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items()
             if k not in ("PEFT_C_LIB", "PKG_CONFIG_PATH", "PKG_CONFIG_LIBDIR", "LD_LIBRARY_PATH")}
    clean.update(env)
    clean["PYTHONPATH"] = pythonpath
    return subprocess.run([sys.executable, "-c", code], env=clean, capture_output=True, text=True,
                          timeout=300)


def loaded_from(done: subprocess.CompletedProcess) -> pathlib.Path:
    assert done.returncode == 0, done.stderr
    return pathlib.Path(done.stdout.splitlines()[0])


def test_env_variable_naming_the_file(real_library):
    done = run(PROBE, {"PEFT_C_LIB": str(real_library)})
    assert loaded_from(done) == real_library
    assert done.stdout.splitlines()[1] == peft_c.version()


def test_env_variable_naming_a_folder(real_library, tmp_path):
    (tmp_path / f"libpeft_c.so.{peft_c.ABI_VERSION}").symlink_to(real_library)
    done = run(PROBE, {"PEFT_C_LIB": str(tmp_path)})
    assert loaded_from(done) == real_library


def test_env_variable_wrong_path_fails_on_first_use_not_on_import(tmp_path):
    code = ("import peft_c\n"
            "try:\n    peft_c.version()\n"
            "except peft_c.LibraryNotFoundError as e:\n    print('not found:', e)\n")
    done = run(code, {"PEFT_C_LIB": str(tmp_path / "nothing.so")})
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("not found:") and "nothing.so" in done.stdout


@pytest.mark.skipif(shutil.which("pkg-config") is None, reason="pkg-config is not installed")
def test_pkg_config_libdir(real_library, tmp_path):
    libdir = tmp_path / "lib"
    libdir.mkdir()
    (libdir / f"libpeft_c.so.{peft_c.ABI_VERSION}").symlink_to(real_library)
    pcdir = tmp_path / "pkgconfig"
    pcdir.mkdir()
    (pcdir / "peft_c.pc").write_text(
        f"libdir={libdir}\nName: peft_c\nDescription: test\nVersion: {peft_c.version()}\n"
        "Libs: -L${libdir} -lpeft_c\n")
    done = run(PROBE, {"PKG_CONFIG_LIBDIR": str(pcdir)})
    assert loaded_from(done) == real_library
    assert pathlib.Path(done.stdout.splitlines()[2]).parent == libdir  # found through pkg-config


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="find_library search rules differ")
def test_find_library_fallback(real_library, tmp_path):
    libdir = tmp_path / "lib"
    libdir.mkdir()
    for name in (f"libpeft_c.so.{peft_c.ABI_VERSION}", "libpeft_c.so"):
        (libdir / name).symlink_to(real_library)
    empty_pc = tmp_path / "nopc"
    empty_pc.mkdir()
    env = {"PKG_CONFIG_LIBDIR": str(empty_pc), "LD_LIBRARY_PATH": str(libdir)}
    probe = run("import ctypes.util; print(ctypes.util.find_library('peft_c'))", env)
    if probe.stdout.strip() == "None":
        pytest.skip("this system's find_library does not search LD_LIBRARY_PATH (no ld/gcc)")
    done = run(PROBE, env)
    assert loaded_from(done) == real_library


def test_nothing_found_says_how_to_fix(tmp_path):
    empty_pc = tmp_path / "nopc"
    empty_pc.mkdir()
    code = ("import peft_c._lib as L, ctypes.util\n"
            "ctypes.util.find_library = lambda name: None\n"
            "try:\n    L.load()\n"
            "except L.LibraryNotFoundError as e:\n    print(e)\n")
    done = run(code, {"PKG_CONFIG_LIBDIR": str(empty_pc)})
    assert done.returncode == 0, done.stderr
    assert "PEFT_C_LIB" in done.stdout


def test_abi_mismatch_is_refused(real_library):
    code = ("import peft_c._lib as L\n"
            "L.ABI_VERSION = L.ABI_VERSION + 1\n"
            "try:\n    L.load()\n"
            "except L.LibraryNotFoundError as e:\n    print('refused:', e)\n")
    done = run(code, {"PEFT_C_LIB": str(real_library)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("refused:") and "ABI" in done.stdout


def test_missing_symbol_is_reported_clearly(real_library):
    code = ("import peft_c\n"
            "lib = peft_c._lib.lib()\n"
            "try:\n    lib.peft_no_such_function\n"
            "except peft_c.MissingSymbolError as e:\n    print('missing:', e)\n")
    done = run(code, {"PEFT_C_LIB": str(real_library)})
    assert done.returncode == 0, done.stderr
    assert "peft_no_such_function" in done.stdout


def test_every_declared_function_is_exported():
    lib = peft_c._lib.lib()
    from peft_c._lib import PROTOTYPES

    missing = [name for name in PROTOTYPES if not lib.has(name)]
    assert missing == []


def package_copy(tmp_path: pathlib.Path) -> pathlib.Path:
    """A copy of the package (as a wheel lays it out) under tmp_path/site; returns its peft_c folder."""
    site = tmp_path / "site"
    shutil.copytree(PACKAGE_ROOT / "peft_c", site / "peft_c",
                    ignore=shutil.ignore_patterns("__pycache__", "lib", "bin", "share"))
    return site / "peft_c"


def test_library_inside_the_package_comes_first(real_library, tmp_path):
    package = package_copy(tmp_path)
    (package / "lib").mkdir()
    bundled = package / "lib" / f"libpeft_c.so.{peft_c.ABI_VERSION}"
    shutil.copyfile(real_library, bundled)  # a copy: a symlink would resolve to the build's file
    done = run(PROBE, {}, pythonpath=str(package.parent))
    assert loaded_from(done) == bundled
    # PEFT_C_LIB still overrides the bundled library
    done = run(PROBE, {"PEFT_C_LIB": str(real_library)}, pythonpath=str(package.parent))
    assert loaded_from(done) == real_library


def test_console_command_runs_the_bundled_peftc(tmp_path):
    peftc = os.environ.get("PEFTC") or str(PACKAGE_ROOT.parents[1] / "build" / "peftc")
    if not os.access(peftc, os.X_OK):
        pytest.skip("no built peftc (set PEFTC)")
    package = package_copy(tmp_path)
    code = "import sys, peft_c._peftc as p; sys.exit(p.main())"
    done = run(code, {}, pythonpath=str(package.parent))
    assert done.returncode == 127 and "is missing" in done.stderr
    (package / "bin").mkdir()
    (package / "bin" / "peftc").symlink_to(peftc)
    clean = {k: v for k, v in os.environ.items() if k != "PEFT_C_LIB"}
    done = subprocess.run([sys.executable, "-c", code, "--version"], capture_output=True, text=True,
                          timeout=60, env=dict(clean, PYTHONPATH=str(package.parent)))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("peftc ") and peft_c.version() in done.stdout
