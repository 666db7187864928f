//! `unkai import` against a real S3 server (versitygw): reads pinned to the version of an
//! object that was imported (`object::get_pinned`), which must never return bytes of another
//! version; then the command as a user runs it: objects imported as files without copying a
//! byte, read through a real mount (bytes compared), a file overwritten (copy on write: the
//! object unchanged), an object changed behind unkai (EIO and a log line naming it), deleted
//! behind it, `--refresh`, then fsck, gc and destroy leaving every imported object alone.

use crate::common;

use std::io::{Seek, SeekFrom, Write};
use std::path::Path;
use std::time::Duration;

use crate::common::*;
use bytes::Bytes;
use unkai::object::{Error, ObjectStorage, Pin};

#[test]
fn pinned_reads_on_s3_never_return_another_version() {
    // The store reads its endpoint and keys from the environment, which is the process's:
    // set only in a process of this test's own (other tests' programs would inherit them).
    if common::in_own_process("import::pinned_reads_on_s3_never_return_another_version") {
        return;
    }
    let server = servers::s3("pinned");
    for (k, v) in &server.env {
        unsafe { std::env::set_var(k, v) };
    }
    let s = ObjectStorage::open("s3://pinned", false).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        s.create_bucket().await.unwrap();
        let (one, two) = (pattern(100_000, 1), pattern(100_000, 2));
        s.put("data/obj", Bytes::from(one.clone())).await.unwrap();
        let listed = s.list("data").await.unwrap();
        assert_eq!(
            (listed[0].key.as_str(), listed[0].size),
            ("data/obj", 100_000)
        );
        let etag = listed[0].etag.clone().expect("S3 lists ETags");
        let pin = Pin {
            etag,
            size: 100_000,
        };
        let got = s.get_pinned("data/obj", 1000..5000, &pin).await.unwrap();
        assert_eq!(&got[..], &one[1000..5000]);
        // Replaced behind the reader with the same size and other bytes: the ETag tells.
        s.put("data/obj", Bytes::from(two)).await.unwrap();
        let e = s
            .get_pinned("data/obj", 1000..5000, &pin)
            .await
            .unwrap_err();
        assert!(
            matches!(&e, Error::Changed { key, .. } if key == "data/obj"),
            "{e}"
        );
        assert_eq!(e.errno(), libc::EIO);
        assert!(e.to_string().contains("changed behind unkai"), "{e}");
        // Gone.
        s.delete("data/obj").await.unwrap();
        let e = s.get_pinned("data/obj", 0..10, &pin).await.unwrap_err();
        assert!(e.to_string().contains("deleted"), "{e}");
        // An unpinned read of a missing object is still NotFound.
        assert!(matches!(
            s.get_range("data/obj", 0..10).await,
            Err(Error::NotFound(_))
        ));
    });
}

/// The count before `what` in the closing summary line ("3 imported").
fn count(out: &str, what: &str) -> u64 {
    let line = out
        .lines()
        .find(|l| l.contains("objects listed"))
        .unwrap_or_else(|| panic!("no summary line in {out:?}"));
    let at = line
        .find(&format!(" {what}"))
        .unwrap_or_else(|| panic!("no '{what}' in {line}"));
    let digits: String = line[..at]
        .chars()
        .rev()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    digits.chars().rev().collect::<String>().parse().unwrap()
}

/// Writes `files` (name, length; patterns seeded from `seed` on) under `src` and syncs them
/// into the bucket `url` (the server's, through `vol`'s environment).
fn put_source(src: &Path, files: &[(&str, usize)], seed: u64, vol: &Volume, url: &str) {
    for (i, (name, len)) in files.iter().enumerate() {
        let p = src.join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, pattern(*len, i as u64 + seed)).unwrap();
    }
    let (ok, out, err) = run_env(&["sync", "--quiet", src.to_str().unwrap(), url], &vol.env);
    assert!(ok, "sync into the bucket: {out}{err}");
}

fn import(vol: &Volume, extra: &[&str]) -> String {
    let mut args = vec!["import", "--quiet"];
    args.extend_from_slice(extra);
    let (ok, out, err) = run_env(&args, &vol.env);
    assert!(ok, "unkai {args:?} failed: {out}\n{err}");
    out
}

#[test]
fn import_read_copy_on_write_changed_behind_refresh_then_gc_leaves_objects() {
    let server = servers::s3("imports");
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    let files: &[(&str, usize)] = &[
        ("a.txt", 100),
        ("dir/b.bin", (3 << 20) + 7),
        ("dir/sub/c.bin", 200_000),
        ("gone.txt", 5000),
        ("empty", 0),
    ];
    // Blocks of 256 KiB: the larger object is many blocks, read ahead.
    let vol = Volume::with_env(&["--block-size", "256K"], server.env.clone());
    put_source(&src, files, 1, &vol, "s3://imports/data");
    let objects = server.dir.path().join("root/imports/data");
    let original = contents_under(&objects);
    assert_eq!(original, contents_under(&src));

    // Bad input: one line naming the fix, and nothing changed.
    let bad = |args: &[&str], env: &[(String, String)], says: &str| {
        let mut all = vec!["import", "--quiet"];
        all.extend_from_slice(args);
        let (ok, out, err) = run_env(&all, env);
        assert!(!ok, "{all:?} succeeded: {out}");
        let line = err.trim().lines().last().unwrap_or("").to_string();
        assert!(line.contains(says), "{all:?}: {err}");
    };
    let meta = vol.meta_url.as_str();
    bad(
        &[meta, "s3://nosuchbucket/x", "--at", "/data"],
        &vol.env,
        "the bucket does not exist",
    );
    bad(
        &[meta, "s3://imports/data", "--at", "/data/../../x"],
        &vol.env,
        "stays inside it",
    );
    let mut wrong = vol.env.clone();
    for (k, v) in wrong.iter_mut() {
        if k == "AWS_SECRET_ACCESS_KEY" {
            *v = "not-the-secret".into();
        }
    }
    bad(
        &[meta, "s3://imports/data", "--at", "/data"],
        &wrong,
        "credentials",
    );

    let mut unreachable = vol.env.clone();
    for (k, v) in unreachable.iter_mut() {
        if k == "AWS_ENDPOINT_URL" {
            // Nothing listens on port 1 of the loopback (binding it needs root).
            *v = "http://127.0.0.1:1".into();
        }
    }
    bad(
        &[meta, "s3://imports/data", "--at", "/data"],
        &unreachable,
        "the endpoint (reachable?)",
    );
    // None of it made the directory.
    let m = vol.mount();
    assert!(!m.p("data").exists(), "bad input changed the volume");
    m.unmount();

    // The import: every object a file, no byte copied into the volume's bucket.
    let out = import(&vol, &[meta, "s3://imports/data", "--at", "/data"]);
    assert_eq!(count(&out, "imported"), 5, "{out}");
    assert_eq!(count(&out, "failed"), 0, "{out}");
    // Again: nothing new.
    let out = import(&vol, &[meta, "s3://imports/data", "--at", "/data"]);
    assert_eq!(
        (count(&out, "imported"), count(&out, "kept")),
        (0, 5),
        "{out}"
    );
    assert!(
        vol.objects().is_empty(),
        "bytes were copied: {:?}",
        vol.objects()
    );

    let m = vol.mount();
    // c.bin is not read before it changes behind unkai (no cached block of it).
    for (name, _) in files.iter().filter(|(n, _)| *n != "dir/sub/c.bin") {
        let got = std::fs::read(m.p(&format!("data/{name}"))).unwrap();
        assert!(
            got == src_bytes(&src, name),
            "{name} read through the mount"
        );
    }
    assert_eq!(
        std::fs::metadata(m.p("data/dir/sub/c.bin")).unwrap().len(),
        200_000
    );
    // A random read in the middle of the large file.
    {
        use std::io::Read;
        let mut f = std::fs::File::open(m.p("data/dir/b.bin")).unwrap();
        f.seek(SeekFrom::Start(1_000_003)).unwrap();
        let mut buf = vec![0u8; 70_000];
        f.read_exact(&mut buf).unwrap();
        assert_eq!(buf, src_bytes(&src, "dir/b.bin")[1_000_003..1_070_003]);
    }
    assert!(vol.objects().is_empty(), "a read copied bytes");
    // `unkai info` shows where the bytes are.
    let (ok, out, err) = run(&["info", m.p("data/dir/b.bin").to_str().unwrap()]);
    assert!(ok, "{out}{err}");
    assert!(
        out.contains("imported at 0") && out.contains("s3://imports/data/dir/b.bin"),
        "{out}"
    );

    // Copy on write: the file changes, the object does not.
    {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(m.p("data/a.txt"))
            .unwrap();
        f.seek(SeekFrom::Start(10)).unwrap();
        f.write_all(b"HELLO").unwrap();
        f.sync_all().unwrap();
    }
    let mut a = src_bytes(&src, "a.txt");
    a[10..15].copy_from_slice(b"HELLO");
    assert_eq!(std::fs::read(m.p("data/a.txt")).unwrap(), a);
    assert_eq!(
        contents_under(&objects),
        original,
        "the write reached the bucket"
    );

    // Changed behind unkai (another size), and one deleted: EIO, and the log names it.
    let change = t.path().join("change");
    std::fs::create_dir_all(change.join("dir/sub")).unwrap();
    let c_new = pattern(210_000, 99);
    std::fs::write(change.join("dir/sub/c.bin"), &c_new).unwrap();
    let (ok, out, err) = run_env(
        &[
            "sync",
            "--quiet",
            change.to_str().unwrap(),
            "s3://imports/data",
        ],
        &vol.env,
    );
    assert!(ok, "{out}{err}");
    std::fs::remove_file(objects.join("gone.txt")).unwrap();
    let e = std::fs::read(m.p("data/dir/sub/c.bin")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    assert!(
        m.logs(
            "imported object s3://imports/data/dir/sub/c.bin changed behind unkai",
            Duration::from_secs(30)
        ),
        "no log line naming the object: {}",
        tail(&m.log_text(), 20)
    );
    m.unmount();
    // The written bytes are the volume's own (uploaded by the time the mount ends).
    assert!(
        !vol.objects().is_empty(),
        "the written bytes are not in the volume"
    );
    // fsck names them, and the volume is consistent.
    let (ok, out, err) = vol.cmd("fsck", &["--quiet"]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("external slices"), "{out}");
    assert!(
        out.contains("CHANGED imported object s3://imports/data/dir/sub/c.bin"),
        "{out}"
    );
    assert!(
        out.contains("CHANGED imported object s3://imports/data/gone.txt"),
        "{out}"
    );

    // Refresh: c.bin re-pointed, gone.txt unlinked, a.txt (written) kept, the rest unchanged.
    let out = import(
        &vol,
        &["--refresh", meta, "s3://imports/data", "--at", "/data"],
    );
    assert_eq!(count(&out, "changed"), 1, "{out}");
    assert_eq!(count(&out, "deleted"), 1, "{out}");
    assert_eq!(count(&out, "kept"), 1, "{out}");
    assert_eq!(count(&out, "unchanged"), 2, "{out}");
    let m = vol.mount();
    assert_eq!(std::fs::read(m.p("data/dir/sub/c.bin")).unwrap(), c_new);
    assert!(!m.p("data/gone.txt").exists());
    assert_eq!(std::fs::read(m.p("data/a.txt")).unwrap(), a);
    m.unmount();

    // gc, fsck and destroy leave every imported object alone.
    let now = contents_under(&objects);
    assert!(now.contains_key("a.txt") && now.contains_key("dir/b.bin"));
    let (ok, out, err) = vol.cmd("gc", &["--delete", "--quiet"]);
    assert!(ok, "{out}{err}");
    let (ok, out, err) = vol.cmd("fsck", &["--quiet"]);
    assert!(ok && out.contains("volume is consistent"), "{out}{err}");
    assert!(!out.contains("CHANGED"), "{out}");
    assert_eq!(
        contents_under(&objects),
        now,
        "gc or fsck touched an imported object"
    );
    let (ok, out, err) = vol.cmd("status", &["--json"]);
    assert!(ok, "{out}{err}");
    let st: serde_json::Value = serde_json::from_str(&out).unwrap();
    let uuid = st["format"]["uuid"].as_str().unwrap().to_string();
    let (ok, out, err) = run_env(&["destroy", "--yes", "--quiet", meta, &uuid], &vol.env);
    assert!(ok, "{out}{err}");
    assert!(
        vol.objects().is_empty(),
        "destroy left the volume's own objects"
    );
    assert_eq!(
        contents_under(&objects),
        now,
        "destroy touched an imported object"
    );
}

fn src_bytes(src: &Path, rel: &str) -> Vec<u8> {
    std::fs::read(src.join(rel)).unwrap()
}

/// A dump carries the rows of imported objects' slices: a volume loaded from it reads the
/// same bytes, from the same objects, and fsck finds them.
#[test]
fn dump_and_load_carry_imported_files() {
    let server = servers::s3("dumped");
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    let files: &[(&str, usize)] = &[("one.txt", 1000), ("dir/two.bin", (1 << 20) + 3)];
    let vol = Volume::with_env(&["--block-size", "256K"], server.env.clone());
    put_source(&src, files, 7, &vol, "s3://dumped/in");
    let objects = server.dir.path().join("root/dumped/in");
    let original = contents_under(&objects);
    let meta = vol.meta_url.as_str();
    let out = import(&vol, &[meta, "s3://dumped/in", "--at", "/imp"]);
    assert_eq!(count(&out, "imported"), 2, "{out}");

    let dump = t.path().join("vol.dump");
    let (ok, out, err) = run_env(&["dump", meta, dump.to_str().unwrap()], &vol.env);
    assert!(ok, "dump: {out}{err}");
    let text = std::fs::read_to_string(&dump).unwrap();
    assert_eq!(
        text.lines()
            .filter(|l| l.starts_with("{\"external\""))
            .count(),
        2,
        "one external row per imported object (each under a chunk)"
    );
    // Into a new database: the same bucket, the same objects.
    let dir2 = tempfile::tempdir().unwrap();
    let loaded = Volume {
        meta_url: format!("sqlite://{}/meta.db", dir2.path().display()),
        name: vol.name.clone(),
        env: with_cache_dir(
            vol.env
                .iter()
                .filter(|(k, _)| k != "UNKAI_CACHE_DIR")
                .cloned()
                .collect(),
            dir2.path(),
        ),
        dir: dir2,
        db: None,
    };
    let (ok, out, err) = run_env(
        &["load", &loaded.meta_url, dump.to_str().unwrap()],
        &loaded.env,
    );
    assert!(ok, "load: {out}{err}");
    let m = loaded.mount();
    for (name, _) in files {
        let got = std::fs::read(m.p(&format!("imp/{name}"))).unwrap();
        assert!(got == src_bytes(&src, name), "{name} read after the load");
    }
    m.unmount();
    let (ok, out, err) = loaded.cmd("fsck", &["-q"]);
    assert!(ok && out.contains("volume is consistent"), "{out}{err}");
    assert_eq!(
        contents_under(&objects),
        original,
        "an imported object changed"
    );
}
