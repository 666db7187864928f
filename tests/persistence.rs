//! Data survives unmount and remount, lives as objects in the bucket, and deleting files
//! removes their objects.

use crate::common;

use crate::common::*;
use std::time::{Duration, Instant};

#[test]
fn write_unmount_remount_compare() {
    let vol = Volume::new();
    let m = vol.mount();
    let big = pattern(9 << 20, 1); // spans blocks (4 MiB)
    std::fs::create_dir_all(m.p("a/b")).unwrap();
    std::fs::write(m.p("a/b/big"), &big).unwrap();
    std::fs::write(m.p("small"), b"hello").unwrap();
    std::os::unix::fs::symlink("a/b/big", m.p("link")).unwrap();
    std::fs::hard_link(m.p("small"), m.p("a/hard")).unwrap();
    m.unmount();

    let m = vol.mount();
    assert_eq!(std::fs::read(m.p("a/b/big")).unwrap(), big);
    assert_eq!(std::fs::read(m.p("small")).unwrap(), b"hello");
    assert_eq!(
        std::fs::read_link(m.p("link")).unwrap().to_str(),
        Some("a/b/big")
    );
    use std::os::unix::fs::MetadataExt;
    assert_eq!(std::fs::metadata(m.p("small")).unwrap().nlink(), 2);
    assert_eq!(
        std::fs::metadata(m.p("a/hard")).unwrap().ino(),
        std::fs::metadata(m.p("small")).unwrap().ino()
    );
}

#[test]
fn data_is_objects_and_deletion_removes_them() {
    // In a process of its own: a parallel test's child inheriting the file's descriptor
    // commits its head early at its exit (a FLUSH); a small rest can then be packed and
    // staged, in no object yet when they are listed (the full suite caught the last 144 KiB
    // missing so).
    if common::in_own_process("persistence::data_is_objects_and_deletion_removes_them") {
        return;
    }
    let vol = Volume::new();
    let m = vol.mount();
    assert!(vol.objects().is_empty());
    let data = pattern(10 << 20, 2);
    std::fs::write(m.p("f"), &data).unwrap();
    let objs = vol.objects();
    // 10 MiB in 4 MiB blocks: at least 3 objects (more if the kernel's writeback cache sent
    // the file in parts, making 2 slices). Each holds its block's bytes (the length its key
    // names), then one CRC32C per 4 KiB.
    assert!(objs.len() >= 3, "{objs:?}");
    // Key file names: <slice id>_<block index>_<length>.
    let block = |p: &std::path::PathBuf| -> (u64, u32, usize) {
        let n = p.file_name().unwrap().to_string_lossy().into_owned();
        let parts: Vec<&str> = n.split('_').collect();
        (
            parts[0].parse().unwrap(),
            parts[1].parse().unwrap(),
            parts[2].parse().unwrap(),
        )
    };
    // Each slice's blocks, in block order, are a run of the file's bytes. Slice ids need not
    // follow offsets (the kernel's writeback cache writes pages back in its own order), so
    // each slice is placed by where its bytes are found in the (random, so unique) pattern;
    // together the slices cover the whole file.
    let mut slices: std::collections::BTreeMap<u64, Vec<(u32, Vec<u8>)>> = Default::default();
    for p in &objs {
        let (id, index, len) = block(p);
        let obj = std::fs::read(p).unwrap();
        assert_eq!(obj.len(), len + len.div_ceil(4 << 10) * 4, "{p:?}");
        slices
            .entry(id)
            .or_default()
            .push((index, obj[..len].to_vec()));
    }
    let mut covered = vec![false; data.len()];
    for (id, mut blocks) in slices {
        blocks.sort_by_key(|b| b.0);
        let indexes: Vec<u32> = blocks.iter().map(|b| b.0).collect();
        assert_eq!(
            indexes,
            (0..blocks.len() as u32).collect::<Vec<_>>(),
            "slice {id}"
        );
        let bytes: Vec<u8> = blocks.into_iter().flat_map(|b| b.1).collect();
        let key = &bytes[..bytes.len().min(64)];
        let at = data
            .windows(key.len())
            .position(|w| w == key)
            .unwrap_or_else(|| panic!("slice {id}'s bytes are not the file's"));
        assert_eq!(
            &data[at..at + bytes.len()],
            &bytes[..],
            "slice {id} at {at}"
        );
        covered[at..at + bytes.len()].fill(true);
    }
    assert!(
        covered.iter().all(|c| *c),
        "bytes from {:?} are in no object",
        covered.iter().position(|c| !c)
    );

    std::fs::remove_file(m.p("f")).unwrap();
    let start = Instant::now();
    while !vol.objects().is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "objects not deleted: {:?}",
            vol.objects()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Names in the mount's root.
fn names(dir: &std::path::Path) -> std::collections::BTreeSet<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

/// Namespace changes of a mount alone on its SQLite volume share commits (grouped commits):
/// an operation that fails undoes only itself, not the others of its group; what an fsync of
/// the directory covered survives a kill -9; a clean unmount keeps everything.
#[test]
fn grouped_changes_keep_every_success_and_survive_as_promised() {
    let vol = Volume::new();
    let mut want = std::collections::BTreeSet::new();
    let work = |m: &Mount, from: usize, want: &mut std::collections::BTreeSet<String>| {
        for i in from..from + 250 {
            let name = format!("n{i}");
            let errno = |r: std::io::Result<()>| r.unwrap_err().raw_os_error();
            match i % 5 {
                0 => {
                    std::fs::create_dir(m.p(&name)).unwrap();
                    assert_eq!(errno(std::fs::create_dir(m.p(&name))), Some(libc::EEXIST));
                    want.insert(name);
                }
                1 => {
                    std::fs::write(m.p(&name), b"x").unwrap();
                    assert_eq!(errno(std::fs::remove_file(m.p("none"))), Some(libc::ENOENT));
                    want.insert(name);
                }
                2 => {
                    std::os::unix::fs::symlink("target", m.p(&name)).unwrap();
                    let moved = format!("m{i}");
                    std::fs::rename(m.p(&name), m.p(&moved)).unwrap();
                    assert_eq!(
                        errno(std::fs::rename(m.p(&name), m.p("other"))),
                        Some(libc::ENOENT)
                    );
                    want.insert(moved);
                }
                3 => {
                    std::fs::write(m.p(&name), b"y").unwrap();
                    std::fs::remove_file(m.p(&name)).unwrap();
                }
                _ => {
                    std::fs::File::create(m.p(&name)).unwrap();
                    let linked = format!("l{i}");
                    std::fs::hard_link(m.p(&name), m.p(&linked)).unwrap();
                    assert_eq!(
                        errno(std::fs::hard_link(m.p(&name), m.p(&linked))),
                        Some(libc::EEXIST)
                    );
                    want.insert(name);
                    want.insert(linked);
                }
            }
        }
        assert_eq!(names(&m.path), *want);
    };
    let m = vol.mount();
    work(&m, 0, &mut want);
    // fsync of the directory: everything before it is durable, kill -9 or not.
    std::fs::File::open(&m.path).unwrap().sync_all().unwrap();
    m.kill9();
    let m = vol.mount();
    assert_eq!(names(&m.path), want);
    work(&m, 250, &mut want);
    m.unmount();
    let m = vol.mount();
    assert_eq!(names(&m.path), want);
    m.unmount();
    let (ok, out, err) = vol.cmd("fsck", &[]);
    assert!(ok, "{out}{err}");
}
