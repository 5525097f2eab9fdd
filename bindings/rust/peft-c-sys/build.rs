//! Finds libpeft_c for linking: through pkg-config (`peft_c.pc`, honouring `PKG_CONFIG_PATH`), or
//! from `PEFT_C_LIB_DIR` when set (a folder holding libpeft_c.so / peft_c.lib), which wins.

use std::env;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-env-changed=PEFT_C_LIB_DIR");
    println!("cargo:rerun-if-env-changed=PEFT_C_INCLUDE_DIR");

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
