//! fsck finds exactly the corruption put into a volume, repairs what is safe, and gc deletes
//! leaked objects.

use crate::common::*;

fn db(vol: &Volume) -> rusqlite::Connection {
    rusqlite::Connection::open(vol.dir.path().join("meta.db")).unwrap()
}

/// A volume with a little tree, unmounted.
fn populated() -> Volume {
    let vol = Volume::new();
    let m = vol.mount();
    std::fs::create_dir_all(m.p("a/b")).unwrap();
    std::fs::write(m.p("a/b/big"), pattern(5 << 20, 7)).unwrap();
    std::fs::write(m.p("a/small"), b"small").unwrap();
    std::fs::hard_link(m.p("a/small"), m.p("link")).unwrap();
    m.unmount();
    vol
}

/// Sets a column of the inode named `name` behind the volume's back (`set`: `nlink = 7`).
fn set_node(vol: &Volume, name: &str, set: &str) {
    let sql = format!(
        "UPDATE node SET {set} WHERE ino = (SELECT ino FROM edge WHERE name = CAST(?1 AS BLOB))"
    );
    assert_eq!(db(vol).execute(&sql, [name]).unwrap(), 1, "{sql}");
}

/// The one error fsck reports.
fn one_error(vol: &Volume) -> String {
    let (ok, out) = fsck(vol, &[]);
    assert!(!ok, "{out}");
    let errs = errors(&out);
    assert_eq!(errs.len(), 1, "{out}");
    errs[0].to_string()
}

fn fsck(vol: &Volume, extra: &[&str]) -> (bool, String) {
    let mut args = vec!["-q"];
    args.extend_from_slice(extra);
    let (ok, out, err) = vol.cmd("fsck", &args);
    (ok, out + &err)
}

fn errors(out: &str) -> Vec<&str> {
    out.lines().filter(|l| l.starts_with("ERROR")).collect()
}

#[test]
fn clean_volume_is_consistent() {
    let vol = populated();
    let (ok, out) = fsck(&vol, &[]);
    assert!(ok, "{out}");
    assert!(out.contains("volume is consistent"), "{out}");
    assert!(errors(&out).is_empty(), "{out}");
}

#[test]
fn finds_a_deleted_object_with_its_path() {
    let vol = populated();
    let objs = vol.objects();
    // The largest object belongs to the big file. (How many slices it has depends on how
    // often its descriptor was closed while being written: every close, even of a copy
    // inherited by a process another test spawned, commits what was written so far.)
    let victim = objs
        .iter()
        .max_by_key(|p| std::fs::metadata(p).unwrap().len())
        .unwrap();
    std::fs::remove_file(victim).unwrap();
    let (ok, out) = fsck(&vol, &[]);
    assert!(!ok, "{out}");
    let errs = errors(&out);
    assert_eq!(errs.len(), 1, "{out}");
    assert!(
        errs[0].contains("is missing") && errs[0].contains("/a/b/big"),
        "{out}"
    );
}

#[test]
fn finds_and_repairs_a_broken_link_count() {
    let vol = populated();
    set_node(&vol, "small", "nlink = 7");
    let err = one_error(&vol);
    // Either name of the hard-linked file identifies it.
    assert!(
        (err.contains("/a/small") || err.contains("/link")) && err.contains("is 7, should be 2"),
        "{err}"
    );
    let (ok, out) = fsck(&vol, &["--repair"]);
    assert!(ok, "{out}");
    let m = vol.mount();
    use std::os::unix::fs::MetadataExt;
    assert_eq!(std::fs::metadata(m.p("a/small")).unwrap().nlink(), 2);
    assert_eq!(std::fs::read(m.p("link")).unwrap(), b"small");
}

/// A file's count of bytes stored (its st_blocks) that drifted from its chunks is named and
/// recounted by --repair.
#[test]
fn finds_and_repairs_a_wrong_count_of_bytes_stored() {
    let vol = populated();
    set_node(&vol, "big", "stored = 1");
    let err = one_error(&vol);
    assert!(
        err.contains("/a/b/big") && err.contains("counts 1 bytes stored; its chunks hold 5242880"),
        "{err}"
    );
    let (ok, out) = fsck(&vol, &["--repair"]);
    assert!(ok, "{out}");
    let (ok, out) = fsck(&vol, &[]);
    assert!(ok && errors(&out).is_empty(), "{out}");
    let m = vol.mount();
    use std::os::unix::fs::MetadataExt;
    assert_eq!(std::fs::metadata(m.p("a/b/big")).unwrap().blocks(), 5 << 11);
}

#[test]
fn finds_dangling_entries_and_orphans() {
    let vol = populated();
    let c = db(&vol);
    c.execute(
        "INSERT INTO edge (parent, name, ino, kind) VALUES (1, CAST('ghost' AS BLOB), 99999, 1)",
        [],
    )
    .unwrap();
    // An inode no directory reaches, with a link count: goes to lost+found.
    c.execute(
        "INSERT INTO node (ino, kind, mode, uid, gid, nlink, length, rdev, atime, mtime, ctime, parent)
         VALUES (88888, 1, 420, 0, 0, 1, 0, 0, 0, 0, 0, 0)",
        [],
    )
    .unwrap();
    c.execute(
        "UPDATE counter SET value = value + 1 WHERE name = 'totalInodes'",
        [],
    )
    .unwrap();
    drop(c);
    let (ok, out) = fsck(&vol, &[]);
    assert!(!ok);
    let errs = errors(&out);
    assert_eq!(errs.len(), 2, "{out}");
    assert!(
        errs.iter()
            .any(|e| e.contains("/ghost points to inode 99999")),
        "{out}"
    );
    assert!(
        errs.iter()
            .any(|e| e.contains("inode 88888") && e.contains("no directory")),
        "{out}"
    );
    let (ok, out) = fsck(&vol, &["--repair"]);
    assert!(ok, "{out}");
    let m = vol.mount();
    assert!(!m.p("ghost").exists());
    assert!(m.p("lost+found/inode-88888").exists());
}

#[test]
fn leaked_objects_are_garbage_and_gc_deletes_them() {
    let vol = populated();
    let before = vol.objects().len();
    let leak = vol.objects()[0].parent().unwrap().join("999999_0_100");
    std::fs::write(&leak, vec![0u8; 100]).unwrap();
    let (ok, out) = fsck(&vol, &[]);
    assert!(ok, "leaks alone leave the volume consistent: {out}");
    assert!(
        out.contains("LEAKED") && out.contains("999999_0_100"),
        "{out}"
    );
    let (ok, out, err) = vol.cmd("gc", &["-q"]);
    assert!(ok, "{out}{err}");
    assert!(leak.exists(), "gc without --delete must not delete");
    let (ok, out, err) = vol.cmd("gc", &["-q", "--delete"]);
    assert!(ok, "{out}{err}");
    assert!(!leak.exists());
    assert_eq!(vol.objects().len(), before);
    let (ok, out) = fsck(&vol, &[]);
    assert!(ok && !out.contains("LEAKED"), "{out}");
}

#[test]
fn repair_refused_while_mounted() {
    let vol = populated();
    let _m = vol.mount();
    let (ok, out) = fsck(&vol, &["--repair"]);
    assert!(!ok);
    assert!(out.contains("unmount it before"), "{out}");
}

/// Two volumes of one name in one bucket (issue 11 item 1): `format` refuses the second unless
/// --force, and then neither ever reads, overwrites or deletes the other's blocks — writes,
/// gc --delete and fsck of one leave the other whole.
#[test]
fn two_volumes_of_one_name_in_one_bucket_never_touch_each_other() {
    let a = Volume::new();
    let data_a = pattern(3 << 20, 41);
    let m = a.mount();
    std::fs::write(m.p("f"), &data_a).unwrap();
    m.unmount();

    let dir = tempfile::Builder::new()
        .prefix("unkai-test-")
        .tempdir()
        .unwrap();
    let storage = format!("file://{}", a.bucket().display());
    let b = Volume {
        meta_url: format!("sqlite://{}/meta.db", dir.path().display()),
        dir,
        name: a.name.clone(),
        env: Vec::new(),
        db: None,
    };
    let (ok, out, err) = run(&["format", "--storage", &storage, &b.meta_url, &b.name]);
    assert!(!ok, "a second volume of the same name was formatted: {out}");
    assert!(
        err.contains("already holds objects") && err.contains("--force"),
        "{err}"
    );
    let (ok, _, err) = run(&[
        "format",
        "--force",
        "--storage",
        &storage,
        &b.meta_url,
        &b.name,
    ]);
    assert!(ok, "format --force beside the other volume failed: {err}");

    // The same slice ids in both volumes: the keys must still differ.
    let data_b = pattern(3 << 20, 42);
    let m = b.mount();
    std::fs::write(m.p("f"), &data_b).unwrap();
    std::fs::write(m.p("g"), b"only in b").unwrap();
    m.unmount();
    for vol in [&b, &a] {
        let (ok, out, err) = vol.cmd("gc", &["--delete", "--min-age", "0"]);
        assert!(ok, "gc failed: {out}{err}");
    }
    for (vol, want) in [(&a, &data_a), (&b, &data_b)] {
        let (ok, out, err) = vol.cmd("fsck", &[]);
        assert!(ok, "fsck found problems: {out}{err}");
        let m = vol.mount();
        let got = std::fs::read(m.p("f")).unwrap();
        assert!(got == *want, "a volume's file changed through the other");
        m.unmount();
    }
}

/// Two block objects swapped in the bucket (issue 11 item 4): each read fails with EIO instead
/// of returning the other's bytes, plain fsck (sizes only) still passes, and `fsck --verify`
/// reads the objects and names both.
#[test]
fn swapped_objects_read_as_eio_and_fsck_verify_names_them() {
    let vol = Volume::new();
    // One object per file, which the swap needs: without the kernel's writeback cache, each
    // 600,000-byte write(2) reaches the mount whole. With it, a FLUSH that comes mid-write (a
    // child of this test process closing its inherited descriptor at exec: the other tests
    // here start commands) commits what the kernel handed over so far, and the file goes up
    // as two slices (docs/design.md, "Writes refused or dropped after `write` returned").
    let m = vol.mount_with(&["--writeback-cache", "off"]);
    // Larger than an eighth of a block, so that neither is packed with the other.
    std::fs::write(m.p("one"), pattern(600_000, 51)).unwrap();
    std::fs::write(m.p("two"), pattern(600_000, 52)).unwrap();
    m.unmount();
    let objects = vol.objects();
    assert_eq!(objects.len(), 2, "{objects:?}");
    let (x, y) = (
        std::fs::read(&objects[0]).unwrap(),
        std::fs::read(&objects[1]).unwrap(),
    );
    assert_eq!(x.len(), y.len());
    std::fs::write(&objects[0], &y).unwrap();
    std::fs::write(&objects[1], &x).unwrap();

    let m = vol.mount();
    for name in ["one", "two"] {
        let e = std::fs::read(m.p(name)).expect_err("a swapped block was read back");
        assert_eq!(errno(&e), libc::EIO, "{name}: {e}");
    }
    m.unmount();
    let (ok, out, err) = vol.cmd("fsck", &[]);
    assert!(ok, "plain fsck checks sizes only: {out}{err}");
    let (ok, out, err) = vol.cmd("fsck", &["--verify"]);
    assert!(!ok, "fsck --verify passed swapped objects: {out}{err}");
    for o in &objects {
        let key = o
            .strip_prefix(vol.bucket())
            .unwrap()
            .to_string_lossy()
            .into_owned();
        assert!(out.contains(&key), "{key} not named:\n{out}{err}");
    }
    assert!(out.contains("fails verification"), "{out}");
}
