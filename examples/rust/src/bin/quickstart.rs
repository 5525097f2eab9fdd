//! Merges a PEFT LoRA adapter into its base model: `quickstart BASE ADAPTER OUT`.
fn main() -> Result<(), peft_c::Error> {
    let args: Vec<String> = std::env::args().collect();
    let mut options = peft_c::MergeOptions::new()?;
    options.add_adapter_dir(&args[2], 1.0)?;
    let result = peft_c::merge_checkpoint(&args[1], &args[3], &options)?;
    println!("merged {} tensors into {}", result.merged(), args[3]);
    Ok(())
}
