//! `unkai objbench`: measure a bucket's latency, throughput and request rates.

use anyhow::Context;

use crate::admin::objbench::{self, Options};
use crate::volume;

/// Measure a bucket: latency, throughput and request rates of the object storage itself.
///
/// Latency of small PUTs and GETs (one request at a time), throughput of block-sized PUTs and
/// GETs with N requests in flight, and the rates of LIST and DELETE. No volume is needed: it
/// works under a fresh prefix `objbench-<random>/` and deletes every object it created at the
/// end, also after an error or Ctrl-C. A missing bucket is created, as by `unkai format`.
/// Credentials and endpoints come from the environment, as for every unkai command.
#[derive(clap::Args)]
#[command(
    after_help = "Rates: MB/s is 10^6 bytes per second; small PUT/GET run one request at a time, \
so their ops/s is 1/latency.\n\nExamples:\n  unkai objbench file:///data/bucket\n  \
AWS_REGION=eu-west-1 unkai objbench s3://mybucket/tmp\n  \
unkai objbench --parallel 1,8,32,64 --blocks 256 gs://mybucket\n  \
unkai objbench --small-count 1000 --json bench.json s3://mybucket\n  \
unkai objbench --sample ~/src --sample-size 1G s3://mybucket   # bytes stored with lz4, zstd"
)]
pub struct Args {
    /// The storage to measure: file:///abs/dir, s3://bucket[/prefix], gs://bucket[/prefix],
    /// az://container[/prefix] or memory://.
    storage_url: String,
    /// Small objects written, read, listed and deleted (latency, LIST and DELETE rates).
    #[arg(long, value_name = "N", default_value_t = 200)]
    small_count: usize,
    /// Size of a small object.
    #[arg(long, value_name = "SIZE", default_value = "4K")]
    small_size: String,
    /// Size of the objects of the throughput runs (unkai's block size).
    #[arg(long, value_name = "SIZE", default_value = "4M")]
    block_size: String,
    /// Block-sized objects written and read by each throughput run.
    #[arg(long, value_name = "N", default_value_t = 64)]
    blocks: usize,
    /// Requests in flight, one throughput run each (comma-separated); DELETE uses the largest.
    #[arg(
        long,
        value_name = "N,...",
        value_delimiter = ',',
        default_value = "1,4,16"
    )]
    parallel: Vec<usize>,
    /// Also write the files under DIR (a write workload) as a volume lays them out, once per
    /// codec (none, lz4, zstd, zstd with AES-256-GCM), and report the bytes written against
    /// the bytes the bucket then holds, with each codec's speed on one core.
    #[arg(long, value_name = "DIR")]
    sample: Option<std::path::PathBuf>,
    /// Bytes of the --sample tree read at most, e.g. 1G.
    #[arg(long, value_name = "SIZE", default_value = "256M")]
    sample_size: String,
    /// Also write every figure (each request's latency included) to FILE as JSON.
    #[arg(long, value_name = "FILE")]
    json: Option<std::path::PathBuf>,
    /// No progress display.
    #[arg(short, long)]
    quiet: bool,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let opts = Options {
        small_count: a.small_count,
        small_size: volume::parse_size_flag("--small-size", &a.small_size, "KiB")?,
        block_size: volume::parse_size_flag("--block-size", &a.block_size, "KiB")?,
        blocks: a.blocks,
        parallel: a.parallel,
        quiet: a.quiet,
        sample: a.sample,
        sample_size: volume::parse_size(&a.sample_size)?,
        ..Options::default()
    };
    objbench::validate(&opts)?;
    let cancel = super::catch_interrupts(
        "unkai: interrupted: deleting the objects created (interrupt again to quit)",
        "unkai: interrupted again: objects may be left under objbench-*/",
    )?;
    let rep = objbench::objbench(&a.storage_url, &opts, cancel)?;
    println!("storage {} (under {})", rep.storage, rep.prefix);
    print!("{}", rep.table());
    if let Some(s) = &rep.sample {
        println!(
            "\nsample {}: {} files, {} bytes, laid out as {} objects ({} packs of small files)",
            s.dir, s.files, s.bytes, s.objects, s.packs
        );
        print!("{}", crate::admin::codecs::table(&rep.codecs));
    }
    println!(
        "{} objects created and deleted in {:.1} s",
        rep.created, rep.seconds
    );
    if let Some(path) = a.json {
        let text = serde_json::to_string_pretty(&rep)?;
        std::fs::write(&path, text + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
