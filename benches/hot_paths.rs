//! Micro-benchmarks of the hot paths: building a chunk's read view from its slice records,
//! a block cache hit, and metadata operations on the embedded SQLite engine directly.
//! Run with `cargo bench`; figures are per operation.

use std::hint::black_box;
use std::sync::Arc;

use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};

use unkai::data::cache::MemoryCache;
use unkai::meta::format::SCHEMA_VERSION;
use unkai::meta::slice::{SliceRec, build_view};
use unkai::meta::sqlite::SqliteMeta;
use unkai::meta::{Ctx, Format, Kind, Meta, ROOT_INO, SessionInfo};

/// A chunk written `n` times at pseudo-random places (what random writes leave before
/// compaction).
fn fragmented(n: u32) -> Vec<SliceRec> {
    (0..n)
        .map(|i| {
            let pos = (i.wrapping_mul(2_654_435_761) >> 6) % (60 << 20);
            let len = 4096 + (i * 7919) % (1 << 20);
            SliceRec {
                pos,
                id: i as u64 + 1,
                size: len,
                off: 0,
                len,
            }
        })
        .collect()
}

fn slices(c: &mut Criterion) {
    // 16384: a chunk of random 4 KiB writes (mmap writeback) before compaction.
    for n in [1u32, 16, 256, 16384] {
        let recs = fragmented(n);
        c.bench_function(&format!("build_view of {n} slices"), |b| {
            b.iter(|| black_box(build_view(black_box(&recs))))
        });
    }
}

fn cache(c: &mut Criterion) {
    let cache = MemoryCache::new(256 << 20);
    let keys: Vec<String> = (0..1000)
        .map(|i| format!("vol/chunks/0/{i}/{i}_0_4194304"))
        .collect();
    let block = Bytes::from(vec![7u8; 64 << 10]);
    for k in &keys {
        cache.put(k, block.clone());
    }
    let mut i = 0;
    c.bench_function("block cache hit", |b| {
        b.iter(|| {
            i = (i + 1) % keys.len();
            black_box(cache.get(&keys[i]).expect("cached"))
        })
    });
}

fn metadata(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("meta.db");
    let fmt = Format {
        name: "bench".into(),
        uuid: "u".into(),
        storage: "memory://".into(),
        block_size: 4 << 20,
        trash_days: 0,
        capacity: 0,
        inodes: 0,
        created: 0,
        schema: SCHEMA_VERSION,
        checksums: true,
        hash_prefix: false,
        layout: 1,
        compress: Default::default(),
        encryption: None,
        quotas: false,
    };
    SqliteMeta::create(&path, "sqlite://bench", &fmt, false).unwrap();
    let meta: Arc<dyn Meta> = Arc::new(SqliteMeta::open(&path, "sqlite://bench").unwrap());
    meta.new_session(SessionInfo {
        host: "h".into(),
        pid: std::process::id(),
        mountpoint: "/bench".into(),
        version: "bench".into(),
        started: 0,
        heartbeat: 0,
        id: 0,
        ..Default::default()
    })
    .unwrap();
    let f = meta
        .mknod(
            &Ctx::ROOT,
            ROOT_INO,
            b"existing",
            Kind::File,
            0o644,
            0,
            None,
        )
        .unwrap();
    c.bench_function("meta lookup", |b| {
        b.iter(|| black_box(meta.lookup(&Ctx::ROOT, ROOT_INO, b"existing").unwrap()))
    });
    c.bench_function("meta getattr", |b| {
        b.iter(|| black_box(meta.getattr(f.ino).unwrap()))
    });
    let mut n = 0u64;
    c.bench_function("meta create + unlink", |b| {
        b.iter(|| {
            n += 1;
            let name = format!("f{n}");
            meta.mknod(
                &Ctx::ROOT,
                ROOT_INO,
                name.as_bytes(),
                Kind::File,
                0o644,
                0,
                None,
            )
            .unwrap();
            meta.unlink(&Ctx::ROOT, ROOT_INO, name.as_bytes()).unwrap();
        })
    });
}

criterion_group!(benches, slices, cache, metadata);
criterion_main!(benches);
