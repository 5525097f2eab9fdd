//! Finds libpeft_c for linking: through pkg-config (`peft_c.pc`, honouring `PKG_CONFIG_PATH`), or
//! from `PEFT_C_LIB_DIR` when set (a folder holding libpeft_c.so / peft_c.lib), which wins.
//! With the `bundled` feature it compiles the library instead, from the C++ sources the crate carries
//! in `csrc/` (scripts/sync-native-sources.sh puts them there; inside the repository, without that
//! copy, from the repository's own `src/`), and links it statically.

use std::env;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-env-changed=PEFT_C_LIB_DIR");
    println!("cargo:rerun-if-env-changed=PEFT_C_INCLUDE_DIR");

    if cfg!(feature = "bundled") {
        #[cfg(feature = "bundled")]
        bundled::build();
        return;
    }

    if let Some(dir) = env::var_os("PEFT_C_LIB_DIR") {
        let dir = PathBuf::from(dir);
        println!("cargo:rustc-link-search=native={}", dir.display());
        println!("cargo:rustc-link-lib=dylib=peft_c");
        if let Some(include) = env::var_os("PEFT_C_INCLUDE_DIR") {
            println!("cargo:include={}", PathBuf::from(include).display());
        }
        return;
    }

    // The ABI is stable within a SONAME; 0.1.0 is the first release carrying every function declared
    // in src/lib.rs.
    match pkg_config::Config::new().atleast_version("0.1.0").probe("peft_c") {
        Ok(library) => {
            if !library.link_paths.iter().any(|dir| holds_library(dir)) {
                relocated_prefix();
            }
            // Dependents' build scripts see DEP_PEFT_C_INCLUDE (from `links = "peft_c"`).
            if let Some(include) = library.include_paths.first() {
                println!("cargo:include={}", include.display());
            }
        }
        Err(err) => panic!(
            "\n\npeft-c-sys: libpeft_c was not found.\n\
             Install peft_c (cmake --install build --prefix PREFIX) and set\n\
             PKG_CONFIG_PATH=PREFIX/lib/pkgconfig, or set PEFT_C_LIB_DIR to the folder holding the\n\
             library. pkg-config said:\n{err}\n"
        ),
    }
}

fn holds_library(dir: &std::path::Path) -> bool {
    ["libpeft_c.so", "libpeft_c.dylib", "libpeft_c.a", "peft_c.lib"].iter().any(|f| dir.join(f).exists())
}

/// `cmake --install --prefix P` copies a peft_c.pc configured for the build's default prefix, so
/// its libdir may not hold the library. The .pc file itself sits in P/lib/pkgconfig: look there.
fn relocated_prefix() {
    let Ok(pcfiledir) = pkg_config::get_variable("peft_c", "pcfiledir") else { return };
    let libdir = PathBuf::from(pcfiledir).join("..");
    if holds_library(&libdir) {
        println!(
            "cargo:warning=peft_c.pc names a libdir without libpeft_c; linking from {} next to the .pc file",
            libdir.display()
        );
        println!("cargo:rustc-link-search=native={}", libdir.display());
    }
}

/// The `bundled` feature: the C++ library compiled with the `cc` crate, as CMakeLists.txt compiles it
/// (every `.cpp` under `src/`, C++20, the same definitions), into a static library.
#[cfg(feature = "bundled")]
mod bundled {
    use std::path::{Path, PathBuf};

    /// The folder holding `include/peft_c.h`, `src/` and `data/arch`: the crate's copy, or the
    /// repository this crate sits in.
    fn source_root() -> PathBuf {
        let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
        let copy = manifest.join("csrc");
        if copy.join("include/peft_c.h").exists() {
            return copy;
        }
        let repository = manifest.join("../../..");
        if repository.join("include/peft_c.h").exists() && repository.join("src/capi").is_dir() {
            return repository;
        }
        panic!(
            "\n\npeft-c-sys (bundled): no C++ sources in {} (run scripts/sync-native-sources.sh in the \
             peft_c repository) nor in a peft_c repository around the crate\n",
            copy.display()
        );
    }

    fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("peft-c-sys (bundled): reading {}: {e}", dir.display()))
            .map(|entry| entry.expect("directory entry").path())
            .collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                sources(&path, out);
            } else if path.extension().is_some_and(|ext| ext == "cpp") {
                out.push(path);
            }
        }
    }

    pub fn build() {
        let root = source_root();
        let root = root.canonicalize().unwrap_or(root);
        println!("cargo:rerun-if-changed={}", root.join("src").display());
        println!("cargo:rerun-if-changed={}", root.join("include").display());
        let mut files = Vec::new();
        sources(&root.join("src"), &mut files);
        // The translation tables are read at run time: PEFT_C_DATA_DIR, then share/peft_c next to the
        // program, then this folder (the crate's copy, which stays where cargo unpacked it).
        let data = root.join("data");
        let quoted = |s: &str| format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""));
        let mut build = cc::Build::new();
        build
            .cpp(true)
            .std("c++20")
            .files(&files)
            .include(root.join("include"))
            .include(root.join("src"))
            .define("PEFT_BUILD", None)
            .define("PEFT_STATIC", None)
            .define("NDEBUG", None)
            .define("PEFT_SOURCE_DATA_DIR", quoted(&data.to_string_lossy()).as_str())
            .define("PEFT_VERSION_STRING", quoted(env!("CARGO_PKG_VERSION")).as_str())
            // A numeric library: optimised whatever the profile (a debug build of the Rust program
            // would otherwise merge at -O0 speed).
            .opt_level(2)
            .flag("-fvisibility=hidden")
            .flag("-fvisibility-inlines-hidden")
            .flag_if_supported("-Wno-unused-parameter");
        build.compile("peft_c_bundled");
        // What the C++ library links (CMakeLists.txt: OpenBLAS, PCRE2, threads); the C++ runtime comes
        // from cc (`cpp(true)`).
        for lib in ["openblas", "pcre2-8", "pthread", "m"] {
            println!("cargo:rustc-link-lib=dylib={lib}");
        }
        println!("cargo:include={}", root.join("include").display());
        println!("cargo:bundled=1");
    }
}
