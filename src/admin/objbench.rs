//! `objbench`: measure a bucket itself, below unkai's data layer.
//!
//! Runs, under a fresh prefix `objbench-<random>/`, the requests a volume makes: sequential
//! PUT and GET of small objects (latency), PUT and GET of block-sized objects with N requests
//! in flight (throughput), LIST of the small objects and their parallel DELETE (rates). Every
//! object it creates is deleted at the end, after a failure or an interruption too. With a
//! sample tree (`--sample`), `admin::codecs` then writes it once per codec under the same
//! prefix.
//!
//! Not for: measuring a mounted file system (caches, buffering and metadata are not involved
//! here).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Instant;

use anyhow::{Context, bail};
use bytes::Bytes;
use indicatif::{ProgressBar, ProgressStyle};
use rand::RngCore;
use serde::Serialize;

use crate::object::{self, ObjectStorage, Policy};

/// What to measure.
#[derive(Clone, Debug)]
pub struct Options {
    /// Small objects written, read, listed and deleted.
    pub small_count: usize,
    pub small_size: u64,
    /// Size of the large objects of the throughput runs.
    pub block_size: u64,
    /// Large objects per throughput run (one run per entry of `parallel`).
    pub blocks: usize,
    /// Requests in flight of each throughput run; the largest also for DELETE.
    pub parallel: Vec<usize>,
    /// Listings of the small objects (the median is reported).
    pub listings: usize,
    /// No progress display.
    pub quiet: bool,
    /// A tree written once per codec (`admin::codecs`), and how much of it is read.
    pub sample: Option<std::path::PathBuf>,
    pub sample_size: u64,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            small_count: 200,
            small_size: 4 << 10,
            block_size: 4 << 20,
            blocks: 64,
            parallel: vec![1, 4, 16],
            listings: 3,
            quiet: false,
            sample: None,
            sample_size: 256 << 20,
        }
    }
}

/// Summary of a set of durations, in seconds.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Stats {
    pub count: usize,
    pub min: f64,
    pub p50: f64,
    pub p99: f64,
    pub mean: f64,
    pub max: f64,
}

impl Stats {
    /// Summarizes samples (seconds), in any order.
    pub fn of(samples: &[f64]) -> Stats {
        if samples.is_empty() {
            return Stats::default();
        }
        let mut s = samples.to_vec();
        s.sort_by(|a, b| a.total_cmp(b));
        Stats {
            count: s.len(),
            min: s[0],
            p50: percentile(&s, 50.0),
            p99: percentile(&s, 99.0),
            mean: s.iter().sum::<f64>() / s.len() as f64,
            max: s[s.len() - 1],
        }
    }
}

/// The `p`-th percentile (0 to 100) of sorted samples, interpolating linearly between the
/// two nearest ranks (as numpy's default does); 0 for no samples.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    match sorted.len() {
        0 => 0.0,
        1 => sorted[0],
        n => {
            let rank = p.clamp(0.0, 100.0) / 100.0 * (n - 1) as f64;
            let lo = rank.floor() as usize;
            let hi = (lo + 1).min(n - 1);
            sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - lo as f64)
        }
    }
}

/// The kind of a measured row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OpKind {
    Put,
    Get,
    List,
    Delete,
}

impl OpKind {
    fn name(self) -> &'static str {
        match self {
            OpKind::Put => "PUT",
            OpKind::Get => "GET",
            OpKind::List => "LIST",
            OpKind::Delete => "DELETE",
        }
    }
}

/// What a row's rate counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum RateUnit {
    /// Requests per second.
    #[serde(rename = "ops/s")]
    Ops,
    /// 10^6 bytes per second.
    #[serde(rename = "MB/s")]
    Mbps,
    /// Objects per second.
    #[serde(rename = "objects/s")]
    Objects,
}

impl RateUnit {
    fn label(self) -> &'static str {
        match self {
            RateUnit::Ops => "ops/s",
            RateUnit::Mbps => "MB/s",
            RateUnit::Objects => "objects/s",
        }
    }
}

/// One measurement: a batch of requests of one kind.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub op: OpKind,
    /// Size of each object (bytes).
    pub object_size: u64,
    /// Objects written, read, listed or deleted.
    pub objects: usize,
    /// Requests in flight.
    pub parallel: usize,
    /// Wall time of the batch (seconds).
    pub seconds: f64,
    /// Latency of each request (for LIST: of each complete listing), seconds.
    pub latency: Stats,
    pub rate: f64,
    pub rate_unit: RateUnit,
    /// Every request's latency (seconds), in the order they finished.
    pub samples: Vec<f64>,
}

/// The outcome of a run.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub storage: String,
    /// Where the objects lived (relative to the storage URL).
    pub prefix: String,
    pub rows: Vec<Row>,
    /// Objects created (and deleted again).
    pub created: usize,
    /// Wall time of the whole run, cleanup included (seconds).
    pub seconds: f64,
    /// With a sample tree: its files and bytes, and what each codec made of it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sample: Option<SampleInfo>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub codecs: Vec<super::codecs::CodecRow>,
}

/// The sample tree of a run (`--sample`).
#[derive(Clone, Debug, Serialize)]
pub struct SampleInfo {
    pub dir: String,
    pub files: usize,
    pub bytes: u64,
    pub objects: usize,
    pub packs: usize,
}

impl Report {
    /// The rows as a table of aligned columns.
    pub fn table(&self) -> String {
        let mut lines = vec![[
            "OPERATION".to_string(),
            "SIZE".into(),
            "OBJECTS".into(),
            "PARALLEL".into(),
            "P50".into(),
            "P99".into(),
            "MEAN".into(),
            "RATE".into(),
        ]];
        for r in &self.rows {
            lines.push([
                r.op.name().to_string(),
                size(r.object_size),
                r.objects.to_string(),
                r.parallel.to_string(),
                duration(r.latency.p50),
                duration(r.latency.p99),
                duration(r.latency.mean),
                format!("{} {}", rate(r.rate), r.rate_unit.label()),
            ]);
        }
        let mut width = [0; 8];
        for l in &lines {
            for (w, c) in width.iter_mut().zip(l) {
                *w = (*w).max(c.chars().count());
            }
        }
        let mut out = String::new();
        for l in &lines {
            let mut s = String::new();
            for (i, (c, w)) in l.iter().zip(width).enumerate() {
                // Names left-aligned, figures right-aligned.
                if i == 0 || i == 7 {
                    s.push_str(&format!("{c:<w$}  "));
                } else {
                    s.push_str(&format!("{c:>w$}  "));
                }
            }
            out.push_str(s.trim_end());
            out.push('\n');
        }
        out
    }
}

/// A byte count in binary units, exact where it can be: 4 KiB, 1.5 MiB.
fn size(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut u = 0;
    while u < UNITS.len() - 1 && n >= 1 << (10 * (u + 1)) {
        u += 1;
    }
    let unit = 1u64 << (10 * u);
    if n % unit == 0 {
        format!("{} {}", n / unit, UNITS[u])
    } else {
        format!("{:.1} {}", n as f64 / unit as f64, UNITS[u])
    }
}

/// A figure with three significant digits (no exponent).
fn sig3(v: f64) -> String {
    if v <= 0.0 || !v.is_finite() {
        return "0".into();
    }
    let digits = v.log10().floor() as i32;
    let decimals = (2 - digits).max(0) as usize;
    format!("{v:.decimals$}")
}

/// A duration (seconds) in s, ms or µs.
fn duration(secs: f64) -> String {
    if secs >= 1.0 {
        format!("{} s", sig3(secs))
    } else if secs >= 1e-3 {
        format!("{} ms", sig3(secs * 1e3))
    } else {
        format!("{} µs", sig3(secs * 1e6))
    }
}

fn rate(v: f64) -> String {
    if v >= 1000.0 {
        format!("{v:.0}")
    } else {
        sig3(v)
    }
}

/// A random hex string of 8 digits.
fn random_hex() -> String {
    format!("{:08x}", rand::random::<u32>())
}

/// Random bytes (incompressible).
fn random_bytes(n: u64) -> Bytes {
    let mut v = vec![0u8; n as usize];
    rand::rng().fill_bytes(&mut v);
    Bytes::from(v)
}

/// Checks the options; returns a one-line reason for the first bad one.
pub fn validate(opts: &Options) -> anyhow::Result<()> {
    if opts.small_count == 0 {
        bail!("--small-count must be at least 1");
    }
    if opts.small_size == 0 || opts.small_size > 1 << 30 {
        bail!("--small-size must be 1 byte to 1 GiB");
    }
    if opts.block_size == 0 || opts.block_size > 1 << 30 {
        bail!("--block-size must be 1 byte to 1 GiB");
    }
    if opts.blocks == 0 {
        bail!("--blocks must be at least 1");
    }
    if opts.parallel.is_empty() || opts.parallel.iter().any(|&p| p == 0 || p > 1024) {
        bail!("--parallel takes numbers from 1 to 1024, e.g. 1,4,16");
    }
    if opts.listings == 0 {
        bail!("at least one listing is needed");
    }
    Ok(())
}

/// Measures the bucket at `url`. Creates the bucket if it is missing (as `format` does).
/// Setting `cancel` stops the run after the requests in flight; the objects are deleted and
/// an "interrupted" error returned.
pub fn objbench(url: &str, opts: &Options, cancel: Arc<AtomicBool>) -> anyhow::Result<Report> {
    validate(opts)?;
    let max_parallel = opts.parallel.iter().copied().max().unwrap_or(1);
    let policy = Policy {
        max_inflight: Policy::default().max_inflight.max(max_parallel),
        max_uploads: Policy::default().max_uploads.max(max_parallel),
        ..Policy::default()
    };
    // The sample first: a bad directory is refused before the bucket is touched.
    let sample = match &opts.sample {
        Some(dir) => Some(super::codecs::read_sample(
            dir,
            opts.block_size,
            opts.sample_size,
        )?),
        None => None,
    };
    let obj = Arc::new(ObjectStorage::open_with(url, true, policy)?);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let prefix = format!("objbench-{}", random_hex());
    let started = Instant::now();
    // Proves the bucket usable, creating it if missing; leaves nothing behind.
    if let Err(e) = rt.block_on(obj.check(&prefix)) {
        if !object::is_missing_bucket(&e) {
            return Err(e.into());
        }
        rt.block_on(obj.create_bucket())
            .map_err(|why| anyhow::anyhow!("{e}; creating the bucket failed too: {why}"))?;
        eprintln!("unkai: created the bucket of {url}");
        rt.block_on(obj.check(&prefix))?;
    }
    let pb = progress(opts);
    let created = Arc::new(AtomicUsize::new(0));
    let bench = Bench {
        obj: obj.clone(),
        prefix: prefix.clone(),
        cancel,
        pb: pb.clone(),
        created: created.clone(),
        phases: 4 + 3 * opts.parallel.len(),
        phase: AtomicUsize::new(0),
    };
    let res = rt.block_on(async {
        let rows = bench.run(opts).await?;
        let codecs = match &sample {
            Some(s) => {
                super::codecs::run(&obj, &prefix, s, max_parallel, &bench.cancel, &pb).await?
            }
            None => Vec::new(),
        };
        anyhow::Ok((rows, codecs))
    });
    pb.set_length(0);
    pb.set_message("cleaning up");
    let cleanup = rt.block_on(cleanup(&obj, &prefix, max_parallel));
    pb.finish_and_clear();
    let (rows, codecs) = match (res, cleanup) {
        (Ok(got), Ok(())) => got,
        (Err(e), Ok(())) => return Err(e),
        (Ok(_), Err(c)) => return Err(c),
        (Err(e), Err(c)) => return Err(e.context(format!("{c:#}"))),
    };
    Ok(Report {
        storage: url.to_string(),
        prefix: format!("{prefix}/"),
        rows,
        created: created.load(Ordering::Relaxed) + codecs.iter().map(|c| c.objects).sum::<usize>(),
        seconds: started.elapsed().as_secs_f64(),
        sample: match (&opts.sample, &sample) {
            (Some(dir), Some(s)) => Some(SampleInfo {
                dir: dir.display().to_string(),
                files: s.files,
                bytes: s.bytes,
                objects: s.blocks.len(),
                packs: s.packs,
            }),
            _ => None,
        },
        codecs,
    })
}

fn progress(opts: &Options) -> ProgressBar {
    if opts.quiet {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(0);
    pb.set_style(
        ProgressStyle::with_template("{msg:28} {bar:30} {pos}/{len}  {elapsed}")
            .expect("valid template"),
    );
    pb
}

/// Deletes everything under `prefix`; fails if anything is left.
async fn cleanup(obj: &Arc<ObjectStorage>, prefix: &str, parallel: usize) -> anyhow::Result<()> {
    let what = || format!("cleaning up {prefix}/ in {}", obj.url());
    for _ in 0..3 {
        let left = obj.list(prefix).await.with_context(what)?;
        if left.is_empty() {
            return Ok(());
        }
        let keys: Vec<String> = left.into_iter().map(|o| o.key).collect();
        for_each_parallel(keys, parallel, |key| {
            let obj = obj.clone();
            async move { obj.delete(&key).await.map(|()| 0u64) }
        })
        .await
        .with_context(what)?;
    }
    let left = obj.list(prefix).await.with_context(what)?;
    if !left.is_empty() {
        bail!(
            "{} objects are left under {prefix}/ in {}",
            left.len(),
            obj.url()
        );
    }
    Ok(())
}

/// Runs `f` on every item with at most `parallel` in flight.
async fn for_each_parallel<T, F, Fut>(items: Vec<T>, parallel: usize, f: F) -> object::Result<()>
where
    F: Fn(T) -> Fut,
    Fut: std::future::Future<Output = object::Result<u64>>,
{
    use futures::StreamExt;
    let mut s = futures::stream::iter(items.into_iter().map(f)).buffer_unordered(parallel.max(1));
    while let Some(r) = s.next().await {
        r?;
    }
    Ok(())
}

/// The state of one run.
struct Bench {
    obj: Arc<ObjectStorage>,
    prefix: String,
    cancel: Arc<AtomicBool>,
    pb: ProgressBar,
    created: Arc<AtomicUsize>,
    /// Steps of the run, and the current one (for the progress display).
    phases: usize,
    phase: AtomicUsize,
}

/// A request to time.
#[derive(Clone, Copy)]
enum Req {
    Put,
    Get,
    Delete,
}

impl Bench {
    fn small_key(&self, i: usize) -> String {
        format!("{}/small/{i:06}", self.prefix)
    }

    fn block_key(&self, parallel: usize, i: usize) -> String {
        format!("{}/blocks-p{parallel}/{i:06}", self.prefix)
    }

    /// Shows the next step of the run, of `len` requests.
    fn phase(&self, what: String, len: usize) {
        let k = self.phase.fetch_add(1, Ordering::Relaxed) + 1;
        self.pb.set_length(len as u64);
        self.pb.set_position(0);
        self.pb.set_message(format!("[{k}/{}] {what}", self.phases));
    }

    async fn run(&self, opts: &Options) -> anyhow::Result<Vec<Row>> {
        let mut rows = Vec::new();
        let small = random_bytes(opts.small_size);
        let keys: Vec<String> = (0..opts.small_count).map(|i| self.small_key(i)).collect();

        // Latency: one request at a time.
        self.phase(format!("PUT {}", size(opts.small_size)), keys.len());
        rows.push(
            self.batch(Req::Put, &keys, &small, 1, RateUnit::Ops)
                .await?,
        );
        self.phase(format!("GET {}", size(opts.small_size)), keys.len());
        rows.push(
            self.batch(Req::Get, &keys, &small, 1, RateUnit::Ops)
                .await?,
        );

        // Throughput: large objects, N in flight; each run's objects deleted after it.
        let block = random_bytes(opts.block_size);
        for &n in &opts.parallel {
            let keys: Vec<String> = (0..opts.blocks).map(|i| self.block_key(n, i)).collect();
            self.phase(format!("PUT {} x{n}", size(opts.block_size)), keys.len());
            rows.push(
                self.batch(Req::Put, &keys, &block, n, RateUnit::Mbps)
                    .await?,
            );
            self.phase(format!("GET {} x{n}", size(opts.block_size)), keys.len());
            rows.push(
                self.batch(Req::Get, &keys, &block, n, RateUnit::Mbps)
                    .await?,
            );
            self.phase(
                format!("deleting {} x{n}", size(opts.block_size)),
                keys.len(),
            );
            let (obj, pb) = (&self.obj, &self.pb);
            for_each_parallel(keys, n, |key| async move {
                obj.delete(&key).await?;
                pb.inc(1);
                Ok(0u64)
            })
            .await?;
        }

        // LIST the small objects: the median of a few complete listings.
        self.phase(format!("LIST {} objects", opts.small_count), opts.listings);
        let list_prefix = format!("{}/small", self.prefix);
        let mut samples = Vec::new();
        for _ in 0..opts.listings {
            self.check_cancel()?;
            let t = Instant::now();
            let listed = self.obj.list(&list_prefix).await?;
            samples.push(t.elapsed().as_secs_f64());
            self.pb.inc(1);
            if listed.len() != opts.small_count {
                bail!(
                    "listing {list_prefix}/ found {} objects, expected {}",
                    listed.len(),
                    opts.small_count
                );
            }
        }
        let latency = Stats::of(&samples);
        rows.push(Row {
            op: OpKind::List,
            object_size: opts.small_size,
            objects: opts.small_count,
            parallel: 1,
            seconds: samples.iter().sum(),
            rate: opts.small_count as f64 / latency.p50.max(1e-9),
            rate_unit: RateUnit::Objects,
            latency,
            samples,
        });

        // DELETE the small objects, as many in flight as the largest throughput run.
        let n = opts.parallel.iter().copied().max().unwrap_or(1);
        self.phase(format!("DELETE {} x{n}", size(opts.small_size)), keys.len());
        rows.push(
            self.batch(Req::Delete, &keys, &small, n, RateUnit::Objects)
                .await?,
        );
        Ok(rows)
    }

    fn check_cancel(&self) -> anyhow::Result<()> {
        if self.cancel.load(Ordering::Relaxed) {
            bail!("interrupted");
        }
        Ok(())
    }

    /// Runs `req` on every key with `parallel` workers; times each request and the batch.
    async fn batch(
        &self,
        req: Req,
        keys: &[String],
        data: &Bytes,
        parallel: usize,
        rate_unit: RateUnit,
    ) -> anyhow::Result<Row> {
        let keys: Arc<[String]> = keys.into();
        let next = Arc::new(AtomicUsize::new(0));
        let started = Instant::now();
        let mut workers = tokio::task::JoinSet::new();
        for _ in 0..parallel.min(keys.len()) {
            let (keys, next, data) = (keys.clone(), next.clone(), data.clone());
            let (obj, cancel, pb, created) = (
                self.obj.clone(),
                self.cancel.clone(),
                self.pb.clone(),
                self.created.clone(),
            );
            workers.spawn(async move {
                let mut samples = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(key) = keys.get(i) else {
                        return Ok(samples);
                    };
                    if cancel.load(Ordering::Relaxed) {
                        bail!("interrupted");
                    }
                    let t = Instant::now();
                    match req {
                        Req::Put => {
                            obj.put(key, data.clone()).await?;
                            created.fetch_add(1, Ordering::Relaxed);
                        }
                        Req::Get => {
                            let got = obj.get(key).await?;
                            if got.len() != data.len() {
                                bail!(
                                    "GET {key} returned {} bytes, expected {}",
                                    got.len(),
                                    data.len()
                                );
                            }
                        }
                        Req::Delete => obj.delete(key).await?,
                    }
                    samples.push(t.elapsed().as_secs_f64());
                    pb.inc(1);
                }
            });
        }
        let mut samples = Vec::with_capacity(keys.len());
        let mut first_err = None;
        // Every worker finishes its request in flight, so that nothing lands after cleanup.
        while let Some(r) = workers.join_next().await {
            match r.context("a benchmark task failed")? {
                Ok(s) => samples.extend(s),
                Err(e) => {
                    // Stop the others after their current request.
                    next.store(keys.len(), Ordering::Relaxed);
                    first_err.get_or_insert(e);
                }
            }
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        let seconds = started.elapsed().as_secs_f64();
        let rate = match rate_unit {
            RateUnit::Mbps => (keys.len() * data.len()) as f64 / seconds.max(1e-9) / 1e6,
            RateUnit::Ops | RateUnit::Objects => keys.len() as f64 / seconds.max(1e-9),
        };
        Ok(Row {
            op: match req {
                Req::Put => OpKind::Put,
                Req::Get => OpKind::Get,
                Req::Delete => OpKind::Delete,
            },
            object_size: data.len() as u64,
            objects: keys.len(),
            parallel,
            seconds,
            latency: Stats::of(&samples),
            rate,
            rate_unit,
            samples,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn percentile_interpolates_between_ranks() {
        let s: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&s, 0.0), 1.0);
        assert_eq!(percentile(&s, 100.0), 100.0);
        assert!((percentile(&s, 50.0) - 50.5).abs() < 1e-9);
        assert!((percentile(&s, 99.0) - 99.01).abs() < 1e-9);
        assert!((percentile(&[1.0, 2.0, 3.0, 4.0, 5.0], 50.0) - 3.0).abs() < 1e-12);
        assert!((percentile(&[10.0, 20.0], 25.0) - 12.5).abs() < 1e-12);
    }

    #[test]
    fn percentile_of_few_samples() {
        assert_eq!(percentile(&[], 50.0), 0.0);
        assert_eq!(percentile(&[7.0], 50.0), 7.0);
        assert_eq!(percentile(&[7.0], 99.0), 7.0);
        // Out-of-range percentiles clamp to the extremes.
        assert_eq!(percentile(&[1.0, 2.0], 150.0), 2.0);
        assert_eq!(percentile(&[1.0, 2.0], -5.0), 1.0);
    }

    #[test]
    fn stats_sort_their_samples() {
        let st = Stats::of(&[5.0, 1.0, 3.0, 2.0, 4.0]);
        assert_eq!(st.count, 5);
        assert_eq!(st.min, 1.0);
        assert_eq!(st.max, 5.0);
        assert_eq!(st.p50, 3.0);
        assert!((st.p99 - 4.96).abs() < 1e-9);
        assert!((st.mean - 3.0).abs() < 1e-12);
        assert_eq!(Stats::of(&[]), Stats::default());
    }

    #[test]
    fn a_slow_tail_shows_in_p99_not_p50() {
        let mut s = vec![0.001; 980];
        s.extend(vec![0.5; 20]);
        let st = Stats::of(&s);
        assert_eq!(st.p50, 0.001);
        assert!(st.p99 > 0.1, "{st:?}");
        assert!(st.mean > st.p50);
    }

    #[test]
    fn figures_format() {
        assert_eq!(size(4 << 10), "4 KiB");
        assert_eq!(size(4 << 20), "4 MiB");
        assert_eq!(size(1536), "1.5 KiB");
        assert_eq!(size(100), "100 B");
        assert_eq!(duration(0.0123), "12.3 ms");
        assert_eq!(duration(0.000_045_6), "45.6 µs");
        assert_eq!(duration(0.000_000_5), "0.500 µs");
        assert_eq!(duration(2.5), "2.50 s");
        assert_eq!(rate(123456.7), "123457");
        assert_eq!(rate(81.234), "81.2");
    }

    #[test]
    fn options_are_checked() {
        assert!(validate(&Options::default()).is_ok());
        let bad = |f: fn(&mut Options)| {
            let mut o = Options::default();
            f(&mut o);
            validate(&o).is_err()
        };
        assert!(bad(|o| o.small_count = 0));
        assert!(bad(|o| o.blocks = 0));
        assert!(bad(|o| o.block_size = 0));
        assert!(bad(|o| o.parallel = vec![]));
        assert!(bad(|o| o.parallel = vec![1, 0]));
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn runs_on_a_directory_and_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("file://{}", dir.path().display());
        let opts = Options {
            small_count: 10,
            small_size: 100,
            block_size: 64 << 10,
            blocks: 4,
            parallel: vec![1, 3],
            listings: 2,
            quiet: true,
            ..Options::default()
        };
        let rep = objbench(&url, &opts, Arc::new(AtomicBool::new(false))).unwrap();
        let ops: Vec<(OpKind, usize)> = rep.rows.iter().map(|r| (r.op, r.parallel)).collect();
        use OpKind::*;
        assert_eq!(
            ops,
            [
                (Put, 1),
                (Get, 1),
                (Put, 1),
                (Get, 1),
                (Put, 3),
                (Get, 3),
                (List, 1),
                (Delete, 3)
            ]
        );
        for r in &rep.rows {
            assert!(r.rate > 0.0 && r.latency.p50 > 0.0, "{r:?}");
        }
        assert_eq!(rep.created, 10 + 2 * 4);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        let obj = ObjectStorage::open(&url, false).unwrap();
        assert!(rt().block_on(obj.list("")).unwrap().is_empty());
    }

    #[test]
    fn an_interrupted_run_deletes_what_it_made() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("file://{}", dir.path().display());
        let opts = Options {
            small_count: 1_000_000,
            quiet: true,
            ..Options::default()
        };
        let cancel = Arc::new(AtomicBool::new(false));
        let c = cancel.clone();
        let path = dir.path().to_path_buf();
        let stopper = std::thread::spawn(move || {
            // Once some objects exist.
            let deadline = Instant::now() + Duration::from_secs(30);
            while Instant::now() < deadline {
                let made = std::fs::read_dir(&path).unwrap().count() > 0;
                if made {
                    std::thread::sleep(Duration::from_millis(100));
                    break;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            c.store(true, Ordering::Relaxed);
        });
        let err = objbench(&url, &opts, cancel).unwrap_err();
        stopper.join().unwrap();
        assert!(format!("{err:#}").contains("interrupted"), "{err:#}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
