//! Data survives unmount and remount, lives as objects in the bucket, and deleting files
//! removes their objects.

mod common;

use common::*;
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
    let vol = Volume::new();
    let m = vol.mount();
    assert!(vol.objects().is_empty());
    let data = pattern(10 << 20, 2);
    std::fs::write(m.p("f"), &data).unwrap();
    let objs = vol.objects();
    // 10 MiB in 4 MiB blocks: 3 objects whose sizes add up to the file.
    assert_eq!(objs.len(), 3, "{objs:?}");
    let total: u64 = objs
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum();
    assert_eq!(total, data.len() as u64);
    // The objects hold the file's bytes.
    let mut concat = Vec::new();
    let mut sorted = objs.clone();
    sorted.sort_by_key(|p| {
        let n = p.file_name().unwrap().to_string_lossy().into_owned();
        n.split('_').nth(1).unwrap().parse::<u32>().unwrap()
    });
    for p in &sorted {
        concat.extend(std::fs::read(p).unwrap());
    }
    assert_eq!(concat, data);

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
