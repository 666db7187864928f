//! The client's memory stays bounded under writes that arrive through the kernel's writeback
//! of a shared mapping (random 8-byte stores by two threads into a sparse file: thousands of
//! 4 KiB writes per chunk, packed, read back by page faults and compacted), and what was
//! stored comes back after a remount. Before, such a writer made the client grow to tens of
//! gigabytes until the OOM killer ended it.

use std::collections::HashSet;
use std::fs::OpenOptions;
use std::os::fd::AsRawFd;
use std::path::Path;

use crate::common::*;

const FILE_SIZE: usize = 64 << 20;
const THREADS: u64 = 2;
const STORES_PER_THREAD: usize = 200_000;
/// Resident memory the client may reach, with 32 MiB of write buffers and 32 MiB of block
/// cache (the rest: threads, request buffers, one compaction, the allocator's slack).
const MAX_RESIDENT_KIB: u64 = 1 << 20;

/// The offsets thread `t` stores to, in order (xorshift, 8-byte aligned): its own value at
/// each is the offset itself, so that any slot tells whether it holds what was stored.
fn offsets(t: u64, n: usize) -> impl Iterator<Item = usize> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (t + 1);
    (0..n).map(move |_| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % (FILE_SIZE as u64 - 8)) as usize & !7
    })
}

/// Stores through a shared mapping of `path` (made sparse, FILE_SIZE long) and msyncs.
fn write_through_mapping(path: &Path) {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .unwrap();
    f.set_len(FILE_SIZE as u64).unwrap();
    // SAFETY: a fresh shared mapping of a file we hold open, unmapped below; the threads
    // store to disjoint-or-equal aligned u64 slots (a race on a slot stores the same value).
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            FILE_SIZE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    };
    assert_ne!(base, libc::MAP_FAILED, "mmap");
    let addr = base as usize;
    std::thread::scope(|s| {
        for t in 0..THREADS {
            s.spawn(move || {
                for off in offsets(t, STORES_PER_THREAD) {
                    // SAFETY: inside the mapping, aligned.
                    unsafe { ((addr + off) as *mut u64).write_volatile(off as u64) };
                }
            });
        }
    });
    // SAFETY: the mapping made above.
    unsafe {
        assert_eq!(libc::msync(base, FILE_SIZE, libc::MS_SYNC), 0, "msync");
        libc::munmap(base, FILE_SIZE);
    }
}

/// The server's peak resident memory (VmHWM), in KiB.
fn peak_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/PID/status")
}

#[test]
fn writes_through_a_shared_mapping_stay_within_memory_and_come_back() {
    let vol = Volume::new();
    let m = vol.mount_with(&["--buffer-size", "32M", "--memory-cache-size", "32M"]);
    write_through_mapping(&m.p("mapped"));
    let peak = peak_kib(m.pid());
    m.unmount();
    assert!(
        peak < MAX_RESIDENT_KIB,
        "the client reached {} MiB resident",
        peak >> 10
    );
    eprintln!("peak resident memory of the client: {} MiB", peak >> 10);

    // Every slot holds what was stored there, or zero where nothing was.
    let m = vol.mount();
    let got = std::fs::read(m.p("mapped")).unwrap();
    assert_eq!(got.len(), FILE_SIZE);
    let stored: HashSet<usize> = (0..THREADS)
        .flat_map(|t| offsets(t, STORES_PER_THREAD))
        .collect();
    let mut wrong = 0;
    for (i, slot) in got.chunks_exact(8).enumerate() {
        let off = i * 8;
        let v = u64::from_ne_bytes(slot.try_into().unwrap());
        let want = if stored.contains(&off) { off as u64 } else { 0 };
        if v != want {
            if wrong < 5 {
                eprintln!("slot {off}: {v:#x}, stored {want:#x}");
            }
            wrong += 1;
        }
    }
    assert_eq!(wrong, 0, "slots that do not hold what was stored");
}
