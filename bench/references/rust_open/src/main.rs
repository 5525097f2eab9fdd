//! Opens a safetensors file repeatedly with the `safetensors` crate, indexes every tensor (name,
//! dtype, shape, find by name) and prints the median and best time per open in microseconds, in the
//! JSON form of bench/bench_open.cpp.
//! usage: rust_open FILE [ITERATIONS]
use safetensors::SafeTensors;
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 2 {
        eprintln!("usage: rust_open FILE [ITERATIONS]");
        std::process::exit(2);
    }
    let iterations: usize = args.get(2).map_or(50, |s| s.parse().expect("ITERATIONS is a number"));
    let mut micros = Vec::with_capacity(iterations);
    let mut checksum: usize = 0;
    for _ in 0..iterations {
        let start = Instant::now();
        let file = std::fs::File::open(&args[1]).expect("the file opens");
        // SAFETY: the benchmark's file is not changed while it is mapped.
        let map = unsafe { memmap2::Mmap::map(&file) }.expect("the file maps");
        let tensors = SafeTensors::deserialize(&map).expect("the file is valid");
        for name in tensors.names() {
            let view = tensors.tensor(name).expect("every listed name is found");
            checksum += view.shape().len() + view.dtype().bitsize();
        }
        micros.push(start.elapsed().as_secs_f64() * 1e6);
    }
    micros.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!(
        "{{\"median_us\": {:.1}, \"best_us\": {:.1}, \"iterations\": {}, \"checksum\": {}}}",
        micros[micros.len() / 2], micros[0], iterations, checksum
    );
}
