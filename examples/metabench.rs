//! Metadata micro-benchmark on a mounted directory: creates, stats and deletes N empty files
//! (one thread, one syscall sequence per file) and prints operations per second of each phase.
//!
//! Usage: cargo run --release --example metabench -- DIR [N]   (DIR: an empty directory)
//! scripts/metabench.sh runs it on a SQLite and a PostgreSQL volume.

use std::time::Instant;

fn main() {
    let mut args = std::env::args().skip(1);
    let dir = std::path::PathBuf::from(args.next().expect("usage: metabench DIR [N]"));
    let n: usize = args.next().map_or(10_000, |s| s.parse().expect("N"));
    let names: Vec<_> = (0..n).map(|i| dir.join(format!("f{i:06}"))).collect();
    let phase = |what: &str, f: &dyn Fn(&std::path::Path)| {
        let t = Instant::now();
        for p in &names {
            f(p);
        }
        let s = t.elapsed().as_secs_f64();
        println!("{what:<7} {n} files in {s:.2}s: {:.0} ops/s", n as f64 / s);
    };
    phase("create", &|p| {
        std::fs::File::create(p).expect("create");
    });
    phase("stat", &|p| {
        std::fs::metadata(p).expect("stat");
    });
    phase("delete", &|p| std::fs::remove_file(p).expect("unlink"));
}
