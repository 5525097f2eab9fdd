//! Opens a LoRA adapter, validates it against its base model, merges it into a copy of the base
//! and exports it as a PEFT adapter folder.
//!
//!     cargo run -p peft-c-example -- BASE_DIR ADAPTER_DIR OUT_DIR
//!
//! writes OUT_DIR/merged (the merged model) and OUT_DIR/adapter (the exported adapter).
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use peft_c::{Adapter, MergeOptions};

fn run(base: &Path, adapter_dir: &Path, out: &Path) -> peft_c::Result<()> {
    // Open the adapter and check every module against the base model's weights.
    let adapter = Adapter::open(adapter_dir)?;
    adapter.validate(base)?;
    println!(
        "{}: r={} lora_alpha={} {} modules",
        adapter_dir.display(),
        adapter.r(),
        adapter.lora_alpha(),
        adapter.module_count()
    );

    // Merge it into the base (streaming; the output folder appears only when complete).
    let mut options = MergeOptions::new()?;
    options.add_adapter(&adapter, 1.0)?;
    let merged_dir = out.join("merged");
    let mut next_report = 0;
    let result =
        peft_c::merge_checkpoint_with_progress(base, &merged_dir, &mut options, |done, total| {
            let percent = done * 100 / total.max(1);
            if percent >= next_report {
                eprintln!("merging: {percent}% of {total} bytes");
                next_report = percent + 25;
            }
            ControlFlow::Continue(()) // ControlFlow::Break(()) would cancel the merge
        })?;
    println!(
        "{}: {} tensors merged, {} copied",
        merged_dir.display(),
        result.merged(),
        result.copied()
    );

    // Export the adapter as PEFT's save_pretrained writes it.
    let adapter_out = out.join("adapter");
    adapter.export(&adapter_out, None)?;
    println!("{}: exported", adapter_out.display());
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    let [base, adapter_dir, out] = args.as_slice() else {
        eprintln!("usage: peft-c-example BASE_DIR ADAPTER_DIR OUT_DIR");
        return ExitCode::from(2);
    };
    match run(base, adapter_dir, out) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("peft-c-example: {err}");
            ExitCode::FAILURE
        }
    }
}
