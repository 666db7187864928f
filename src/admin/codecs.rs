//! `objbench --sample DIR`: what compression (and encryption) make of a tree of files. The
//! files are laid out as a volume lays them out — each file cut into blocks, files up to
//! `data::pack::max_piece` packed together into block-sized packs — and written to the
//! bucket once per codec (none, lz4, zstd, zstd with AES-256-GCM), each object encoded as a
//! volume formatted with that codec encodes it (`data::codec`; `data::block` for none). The
//! report gives the bytes the application wrote against the bytes the bucket then holds (its
//! own listing), and the CPU time of encoding and decoding; every object is read back,
//! decoded and compared.
//!
//! Not for: request rates (the rest of `objbench`), or a mount's own overheads (padding of
//! packs sealed early, metadata): the figures are the codecs' alone.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use anyhow::{Context, bail};
use bytes::Bytes;
use futures::StreamExt;
use indicatif::ProgressBar;
use serde::Serialize;

use crate::data::block::{SEGMENT, Sums, seal_of};
use crate::data::codec::Codec;
use crate::data::keys::DataKey;
use crate::meta::format::Compression;
use crate::object::ObjectStorage;

/// A sample tree as a volume lays it out: its blocks and packs.
pub struct Sample {
    pub files: usize,
    pub bytes: u64,
    pub blocks: Vec<Bytes>,
    /// How many of the blocks are packs of small files.
    pub packs: usize,
}

/// What one codec made of the sample.
#[derive(Clone, Debug, Serialize)]
pub struct CodecRow {
    pub codec: String,
    pub objects: usize,
    /// Bytes of the files (what the application wrote).
    pub written: u64,
    /// Bytes of the objects, as the bucket lists them.
    pub stored: u64,
    /// Seconds of one core encoding every block, and decoding every object.
    pub encode_seconds: f64,
    pub decode_seconds: f64,
}

/// Reads the regular files under `dir` (in name order, symbolic links not followed) until
/// `limit` bytes, and lays them out in blocks of `block_size`.
pub fn read_sample(dir: &Path, block_size: u64, limit: u64) -> anyhow::Result<Sample> {
    fn walk(d: &Path, out: &mut Vec<std::path::PathBuf>) -> std::io::Result<()> {
        let mut entries: Vec<_> = std::fs::read_dir(d)?.collect::<Result<_, _>>()?;
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let t = e.file_type()?;
            if t.is_dir() {
                walk(&e.path(), out)?;
            } else if t.is_file() {
                out.push(e.path());
            }
        }
        Ok(())
    }
    let mut paths = Vec::new();
    walk(dir, &mut paths).with_context(|| {
        format!(
            "--sample {}: cannot read the tree: give a readable directory",
            dir.display()
        )
    })?;
    let piece_max = crate::data::pack::max_piece(block_size as u32) as u64;
    let bs = block_size as usize;
    let mut s = Sample {
        files: 0,
        bytes: 0,
        blocks: Vec::new(),
        packs: 0,
    };
    let mut pack: Vec<u8> = Vec::new();
    for p in paths {
        if s.bytes >= limit {
            break;
        }
        let Ok(data) = std::fs::read(&p) else {
            continue; // vanished or unreadable: not part of the sample
        };
        if data.is_empty() {
            continue;
        }
        s.files += 1;
        s.bytes += data.len() as u64;
        if data.len() as u64 <= piece_max {
            if pack.len() + data.len() > bs {
                s.blocks.push(std::mem::take(&mut pack).into());
                s.packs += 1;
            }
            pack.extend_from_slice(&data);
        } else {
            s.blocks.extend(data.chunks(bs).map(Bytes::copy_from_slice));
        }
    }
    if !pack.is_empty() {
        s.blocks.push(pack.into());
        s.packs += 1;
    }
    if s.files == 0 {
        bail!(
            "--sample {}: no files to read: give a directory holding files",
            dir.display()
        );
    }
    Ok(s)
}

/// How one row encodes: plain objects (data and checksums) or the codec's.
enum Way {
    Plain,
    Coded(Codec),
}

impl Way {
    fn encode(&self, key: &str, data: &[u8]) -> Bytes {
        let sums = sums(key);
        match self {
            Way::Plain => sums.encode(data),
            Way::Coded(c) => c.encode(key, sums, data),
        }
    }

    fn decode(&self, key: &str, obj: Bytes, len: usize) -> Option<Bytes> {
        let sums = sums(key);
        match self {
            Way::Plain => sums.decode(obj, len),
            Way::Coded(c) => c.decode(key, sums, obj, len).ok(),
        }
    }
}

fn sums(key: &str) -> Sums {
    Sums {
        seal: seal_of(key),
        segment: SEGMENT,
    }
}

/// Writes the sample once per codec under `prefix/codec-NAME/`, lists, reads back and
/// deletes it; `parallel` requests in flight.
pub async fn run(
    obj: &Arc<ObjectStorage>,
    prefix: &str,
    sample: &Sample,
    parallel: usize,
    cancel: &AtomicBool,
    pb: &ProgressBar,
) -> anyhow::Result<Vec<CodecRow>> {
    let ways = [
        ("none", Way::Plain),
        ("lz4", Way::Coded(Codec::with(Compression::Lz4, None))),
        ("zstd", Way::Coded(Codec::with(Compression::Zstd, None))),
        (
            "zstd+aes-256-gcm",
            Way::Coded(Codec::with(
                Compression::Zstd,
                Some(Arc::new(DataKey::generate())),
            )),
        ),
    ];
    let mut rows = Vec::new();
    for (name, way) in &ways {
        let dir = format!("{prefix}/codec-{}", name.replace('+', "-"));
        let key = |i: usize| format!("{dir}/{i:06}");
        pb.set_length(sample.blocks.len() as u64 * 2);
        pb.set_position(0);
        pb.set_message(format!("sample with {name}"));
        // Encoded one after the other on this task (timed), put `parallel` at once.
        let mut encode_seconds = 0.0;
        let mut puts = futures::stream::iter(sample.blocks.iter().enumerate().map(|(i, b)| {
            let t = Instant::now();
            let body = way.encode(&key(i), b);
            encode_seconds += t.elapsed().as_secs_f64();
            let (obj, k) = (obj.clone(), key(i));
            async move { obj.put(&k, body).await }
        }))
        .buffer_unordered(parallel.max(1));
        while let Some(r) = puts.next().await {
            r?;
            pb.inc(1);
            if cancel.load(Ordering::Relaxed) {
                bail!("interrupted");
            }
        }
        drop(puts);
        let listed = obj.list(&dir).await?;
        if listed.len() != sample.blocks.len() {
            bail!(
                "listing {dir}/ found {} objects, expected {}",
                listed.len(),
                sample.blocks.len()
            );
        }
        let stored = listed.iter().map(|o| o.size).sum();
        let mut decode_seconds = 0.0;
        let mut gets = futures::stream::iter((0..sample.blocks.len()).map(|i| {
            let (obj, k) = (obj.clone(), key(i));
            async move { obj.get(&k).await.map(|b| (i, k, b)) }
        }))
        .buffer_unordered(parallel.max(1));
        while let Some(r) = gets.next().await {
            let (i, k, got) = r?;
            let t = Instant::now();
            let data = way.decode(&k, got, sample.blocks[i].len());
            decode_seconds += t.elapsed().as_secs_f64();
            if data.as_ref() != Some(&sample.blocks[i]) {
                bail!("{k} did not read back as written ({name})");
            }
            pb.inc(1);
            if cancel.load(Ordering::Relaxed) {
                bail!("interrupted");
            }
        }
        drop(gets);
        let keys: Vec<String> = listed.into_iter().map(|o| o.key).collect();
        let mut deletes = futures::stream::iter(keys.into_iter().map(|k| {
            let obj = obj.clone();
            async move { obj.delete(&k).await }
        }))
        .buffer_unordered(parallel.max(1));
        while let Some(r) = deletes.next().await {
            r?;
        }
        rows.push(CodecRow {
            codec: name.to_string(),
            objects: sample.blocks.len(),
            written: sample.bytes,
            stored,
            encode_seconds,
            decode_seconds,
        });
    }
    Ok(rows)
}

/// The rows as a table: bytes written and stored, the share stored, and each codec's speed
/// on one core (MB/s of file bytes).
pub fn table(rows: &[CodecRow]) -> String {
    let mut lines = vec![[
        "CODEC".to_string(),
        "OBJECTS".into(),
        "WRITTEN".into(),
        "STORED".into(),
        "STORED/WRITTEN".into(),
        "ENCODE".into(),
        "DECODE".into(),
    ]];
    let mbps = |bytes: u64, s: f64| format!("{:.0} MB/s", bytes as f64 / s.max(1e-9) / 1e6);
    for r in rows {
        lines.push([
            r.codec.clone(),
            r.objects.to_string(),
            r.written.to_string(),
            r.stored.to_string(),
            format!("{:.3}", r.stored as f64 / r.written.max(1) as f64),
            mbps(r.written, r.encode_seconds),
            mbps(r.written, r.decode_seconds),
        ]);
    }
    let mut width = [0; 7];
    for l in &lines {
        for (w, c) in width.iter_mut().zip(l) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    for l in &lines {
        let mut s = String::new();
        for (i, (c, w)) in l.iter().zip(width).enumerate() {
            if i == 0 {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Files are laid out as a volume does: large ones in blocks, small ones packed.
    #[test]
    fn samples_are_laid_out_in_blocks_and_packs() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("d")).unwrap();
        std::fs::write(dir.path().join("big"), vec![1u8; 200_000]).unwrap();
        for i in 0..10 {
            std::fs::write(
                dir.path().join("d").join(format!("s{i}")),
                vec![2u8; 20_000],
            )
            .unwrap();
        }
        std::fs::write(dir.path().join("empty"), b"").unwrap();
        let s = read_sample(dir.path(), 64 << 10, u64::MAX).unwrap();
        assert_eq!((s.files, s.bytes), (11, 400_000));
        // 200,000 bytes in 4 blocks; ten 20,000-byte files in packs of three.
        assert_eq!(
            s.blocks.len(),
            4 + 4,
            "{:?}",
            s.blocks.iter().map(|b| b.len()).collect::<Vec<_>>()
        );
        assert_eq!(s.packs, 4);
        assert_eq!(
            s.blocks.iter().map(|b| b.len() as u64).sum::<u64>(),
            400_000
        );
        let few = read_sample(dir.path(), 64 << 10, 1).unwrap();
        assert_eq!(few.files, 1);
        assert!(read_sample(&dir.path().join("nope"), 64 << 10, 1).is_err());
    }
}
