//! Compaction of a chunk of thousands of small slices (random small writes, as mmap writeback
//! makes them) never holds up the programs or the unmount: it used to keep the client busy
//! for minutes, past unmount and SIGTERM.

use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use crate::common::*;

const CHUNK: u64 = 64 << 20;
const WRITES: usize = 30_000;

/// Random 4 KiB-aligned offsets inside the first chunk.
fn offsets() -> Vec<u64> {
    let mut rng = rng::XorShift(7);
    (0..WRITES)
        .map(|_| rng.below(CHUNK / 4096 - 1) * 4096 + 512)
        .collect()
}

#[test]
fn a_chunk_of_thousands_of_slices_neither_stalls_reads_nor_the_unmount() {
    let vol = Volume::new();
    let m = vol.mount();
    let path = m.p("fragmented");
    let f = std::fs::File::create(&path).unwrap();
    for (i, off) in offsets().into_iter().enumerate() {
        f.write_all_at(&(i as u64).to_le_bytes().repeat(64), off)
            .unwrap();
    }
    // One commit: thousands of records in one chunk, each a piece of a packed slice.
    f.sync_all().unwrap();
    drop(f);
    // Reads of the fragmented chunk are answered while compaction may be under way.
    let want = {
        let mut model = vec![0u8; CHUNK as usize];
        for (i, off) in offsets().into_iter().enumerate() {
            let o = off as usize;
            model[o..o + 512].copy_from_slice(&(i as u64).to_le_bytes().repeat(64));
        }
        model
    };
    let got = std::fs::read(&path).unwrap();
    assert!(
        got == want[..got.len()],
        "the fragmented file reads back wrong"
    );
    // The unmount does not wait for compaction to finish: a generous deadline, minutes
    // below what the old final compaction round took.
    let start = Instant::now();
    let mp = m.unmount();
    let took = start.elapsed();
    eprintln!("unmount took {took:?}");
    assert!(
        took < Duration::from_secs(60),
        "unmount took {took:?} ({})",
        mp.display()
    );
    // And the data is whole after it, compacted or not.
    let m = vol.mount();
    let got = std::fs::read(m.p("fragmented")).unwrap();
    assert!(
        got == want[..got.len()],
        "the file reads back wrong after a remount"
    );
}
