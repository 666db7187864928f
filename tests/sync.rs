//! `unkai sync` as a user runs it: between directories, a `file://` bucket, a real S3
//! server (versitygw) and volumes (META-URL[:/path], opened without a mount and checked
//! through one), compared byte for byte; incremental reruns, --dry-run, --delete-dst,
//! --delete-src, --dirs/--perms/--links, --bwlimit, --exclude/--include, bad input, and
//! runs killed half-way then resumed.

use crate::common::*;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

/// A source tree: nested directories, an empty file, small files and a larger one.
fn make_source(dir: &Path) {
    let files: &[(&str, usize)] = &[
        ("top.txt", 100),
        ("empty", 0),
        ("a/one.bin", 4096),
        ("a/b/c/deep.bin", 70_000),
        ("a/b/big.bin", 3 << 20),
        ("notes/x y.txt", 17),
        ("logs/run.tmp", 50),
        ("cache/blob", 300),
    ];
    for (i, (name, len)) in files.iter().enumerate() {
        let p = dir.join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, pattern(*len, i as u64 + 1)).unwrap();
    }
}

/// (copied, skipped, deleted, failed) from the closing line.
fn counts(stdout: &str) -> (u64, u64, u64, u64) {
    let line = stdout
        .lines()
        .find(|l| l.contains("copied ") && l.contains("failed "))
        .unwrap_or_else(|| panic!("no summary line in {stdout:?}"));
    let n = |what: &str| -> u64 {
        let at = line.find(&format!("{what} ")).unwrap() + what.len() + 1;
        line[at..]
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    (n("copied"), n("skipped"), n("deleted"), n("failed"))
}

fn sync_ok(args: &[&str], env: &[(String, String)]) -> (u64, u64, u64, u64) {
    let mut all = vec!["sync", "--quiet"];
    all.extend_from_slice(args);
    let (ok, out, err) = run_env(&all, env);
    assert!(ok, "unkai {all:?} failed: {out}\n{err}");
    counts(&out)
}

fn s(p: &Path) -> String {
    p.display().to_string()
}

#[test]
fn dir_to_bucket_to_dir_byte_for_byte_then_incremental() {
    let t = tempfile::tempdir().unwrap();
    let (src, back) = (t.path().join("src"), t.path().join("back"));
    make_source(&src);
    let bucket = format!("file://{}/bucket", s(t.path()));
    let want = contents_under(&src);
    assert_eq!(sync_ok(&[&s(&src), &bucket], &[]), (8, 0, 0, 0));
    assert_eq!(contents_under(&t.path().join("bucket")), want);
    assert_eq!(sync_ok(&[&bucket, &s(&back)], &[]), (8, 0, 0, 0));
    assert_eq!(
        contents_under(&back),
        want,
        "bucket to directory, byte for byte"
    );
    // A rerun with nothing changed copies nothing, either way.
    assert_eq!(sync_ok(&[&s(&src), &bucket], &[]), (0, 8, 0, 0));
    assert_eq!(sync_ok(&[&bucket, &s(&back)], &[]), (0, 8, 0, 0));
    // One file grows, one is new: only those two are copied.
    std::fs::write(src.join("top.txt"), pattern(101, 99)).unwrap();
    std::fs::write(src.join("a/new.txt"), b"new").unwrap();
    assert_eq!(sync_ok(&[&s(&src), &bucket], &[]), (2, 7, 0, 0));
    assert_eq!(sync_ok(&[&bucket, &s(&back)], &[]), (2, 7, 0, 0));
    assert_eq!(contents_under(&back), contents_under(&src));
}

#[test]
fn dir_to_dir_keeps_mtimes_and_check_all_finds_same_size_changes() {
    let t = tempfile::tempdir().unwrap();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    make_source(&src);
    assert_eq!(sync_ok(&[&s(&src), &s(&dst)], &[]), (8, 0, 0, 0));
    assert_eq!(contents_under(&dst), contents_under(&src));
    let m = |p: &Path| std::fs::metadata(p).unwrap().modified().unwrap();
    assert_eq!(m(&dst.join("a/one.bin")), m(&src.join("a/one.bin")));
    assert_eq!(sync_ok(&[&s(&src), &s(&dst)], &[]), (0, 8, 0, 0));
    // Same size, same mtime, other bytes: only --check-all sees it.
    let f = dst.join("a/one.bin");
    std::fs::write(&f, pattern(4096, 1234)).unwrap();
    std::fs::File::options()
        .write(true)
        .open(&f)
        .unwrap()
        .set_modified(m(&src.join("a/one.bin")))
        .unwrap();
    assert_eq!(sync_ok(&[&s(&src), &s(&dst)], &[]), (0, 8, 0, 0));
    assert_eq!(
        sync_ok(&["--check-all", &s(&src), &s(&dst)], &[]),
        (1, 7, 0, 0)
    );
    assert_eq!(contents_under(&dst), contents_under(&src));
    // --force-update copies everything; --check-new reads it back.
    assert_eq!(
        sync_ok(&["--force-update", "--check-new", &s(&src), &s(&dst)], &[]),
        (8, 0, 0, 0)
    );
    assert_eq!(contents_under(&dst), contents_under(&src));
}

#[test]
fn dry_run_changes_nothing() {
    let t = tempfile::tempdir().unwrap();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    make_source(&src);
    // To a destination that does not exist: it is not made.
    assert_eq!(
        sync_ok(&["--dry-run", &s(&src), &s(&dst)], &[]),
        (8, 0, 0, 0)
    );
    assert!(!dst.exists(), "a dry run made the destination");
    sync_ok(&[&s(&src), &s(&dst)], &[]);
    std::fs::write(src.join("top.txt"), b"changed").unwrap();
    std::fs::write(dst.join("extra"), b"extra").unwrap();
    let before = contents_under(&dst);
    assert_eq!(
        sync_ok(&["--dry-run", "--delete-dst", &s(&src), &s(&dst)], &[]),
        (1, 7, 1, 0)
    );
    assert_eq!(
        contents_under(&dst),
        before,
        "a dry run changed the destination"
    );
}

#[test]
fn delete_dst_removes_extra_files_but_not_excluded_ones() {
    let t = tempfile::tempdir().unwrap();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    make_source(&src);
    sync_ok(&[&s(&src), &s(&dst)], &[]);
    std::fs::write(dst.join("extra"), b"x").unwrap();
    std::fs::write(dst.join("a/b/extra2"), b"x").unwrap();
    std::fs::write(dst.join("keep.tmp"), b"x").unwrap();
    // Without --delete-dst nothing goes.
    assert_eq!(sync_ok(&[&s(&src), &s(&dst)], &[]), (0, 8, 0, 0));
    assert!(dst.join("extra").exists());
    assert_eq!(
        sync_ok(
            &["--delete-dst", "--exclude", "*.tmp", &s(&src), &s(&dst)],
            &[]
        ),
        (0, 7, 2, 0)
    );
    let mut want = contents_under(&src);
    want.remove("logs/run.tmp");
    want.insert("keep.tmp".into(), b"x".to_vec());
    // logs/run.tmp was copied by the first run and is excluded now: kept too.
    want.insert(
        "logs/run.tmp".into(),
        std::fs::read(src.join("logs/run.tmp")).unwrap(),
    );
    assert_eq!(contents_under(&dst), want);
}

#[test]
fn excludes_and_includes_follow_rsync() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    make_source(&src);
    let dst = t.path().join("d1");
    assert_eq!(
        sync_ok(
            &[
                "--exclude",
                "*.tmp",
                "--exclude",
                "cache/",
                &s(&src),
                &s(&dst)
            ],
            &[]
        ),
        (6, 0, 0, 0)
    );
    let got = contents_under(&dst);
    assert!(!got.contains_key("logs/run.tmp") && !got.contains_key("cache/blob"));
    assert_eq!(
        got.get("a/b/c/deep.bin"),
        contents_under(&src).get("a/b/c/deep.bin")
    );
    // The first matching rule decides: only .bin files, at any depth.
    let dst = t.path().join("d2");
    sync_ok(
        &[
            "--include",
            "*/",
            "--include",
            "*.bin",
            "--exclude",
            "*",
            &s(&src),
            &s(&dst),
        ],
        &[],
    );
    let names: Vec<String> = contents_under(&dst).into_keys().collect();
    assert_eq!(names, ["a/b/big.bin", "a/b/c/deep.bin", "a/one.bin"]);
    // An anchored pattern matches at the top only.
    let dst = t.path().join("d3");
    sync_ok(&["--exclude", "/a", &s(&src), &s(&dst)], &[]);
    assert!(contents_under(&dst).keys().all(|k| !k.starts_with("a/")));
    assert!(contents_under(&dst).contains_key("top.txt"));
}

#[test]
fn bad_input_is_one_line_naming_the_fix_and_changes_nothing() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    make_source(&src);
    let dst = t.path().join("dst");
    let cases: &[(&[&str], &str)] = &[
        (
            &[&s(&t.path().join("missing")), &s(&dst)],
            "give an existing directory",
        ),
        (&[&s(&src.join("top.txt")), &s(&dst)], "give a directory"),
        (&["ftp://host/x", &s(&dst)], "unknown scheme"),
        (
            &[&s(&src), &s(&src.join("inside"))],
            "give separate directories",
        ),
        (&["--exclude", "[", &s(&src), &s(&dst)], "invalid pattern"),
        (&["--threads", "0", &s(&src), &s(&dst)], "use 1 to 1024"),
    ];
    let before = contents_under(&src);
    for (args, fix) in cases {
        let mut all = vec!["sync"];
        all.extend_from_slice(args);
        let (ok, _, err) = run(&all);
        assert!(!ok, "{all:?} succeeded");
        let err = err.trim();
        assert_eq!(err.lines().count(), 1, "{all:?}: not one line: {err}");
        assert!(err.contains(fix), "{all:?}: {err} does not say {fix:?}");
        assert!(!dst.exists(), "{all:?} made the destination");
        assert!(!src.join("inside").exists(), "{all:?} made a directory");
    }
    assert_eq!(contents_under(&src), before);
}

/// A sync killed with SIGKILL once `done` is true, run with every store request 20 ms late.
fn kill_mid_run(args: &[&str], env: &[(String, String)], done: impl FnMut() -> bool) {
    let mut child = unkai()
        .arg("sync")
        .arg("--quiet")
        .args(args)
        .envs(env.iter().cloned())
        .env("UNKAI_FAULTS", "latency_ms=20")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    eventually(Duration::from_secs(60), done);
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn killed_half_way_then_rerun_completes() {
    let server = servers::s3("killbucket");
    let env = &server.env;
    let t = tempfile::tempdir().unwrap();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    for i in 0..300 {
        let p = src.join(format!("d{}/f{i}", i % 7));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, pattern(20_000 + i, i as u64)).unwrap();
    }
    let url = "s3://killbucket/tree".to_string();
    let objects = server.dir.path().join("root/killbucket/tree");
    // Directory to bucket, killed once some objects are there.
    kill_mid_run(&["--threads", "1", &s(&src), &url], env, || {
        files_under(&objects).len() >= 5
    });
    let before = files_under(&objects).len() as u64;
    assert!(before < 300, "the run finished before it was killed");
    let (copied, skipped, _, failed) = sync_ok(&[&s(&src), &url], env);
    assert_eq!((copied + skipped, failed), (300, 0));
    assert!(
        skipped + 1 >= before,
        "{skipped} skipped, {before} were there"
    );
    // Bucket to directory, killed likewise: no partial file is taken as done.
    kill_mid_run(&["--threads", "1", &url, &s(&dst)], env, || {
        dst.exists() && files_under(&dst).len() >= 5
    });
    let before = files_under(&dst).len() as u64;
    assert!(before < 300, "the run finished before it was killed");
    let (copied, skipped, _, failed) = sync_ok(&[&url, &s(&dst)], env);
    assert_eq!((copied + skipped, failed), (300, 0));
    assert_eq!(
        contents_under(&dst),
        contents_under(&src),
        "no partial file was left behind as done"
    );
}

#[test]
fn dir_to_s3_and_back() {
    let server = servers::s3("syncbucket");
    let env = &server.env;
    let t = tempfile::tempdir().unwrap();
    let (src, back) = (t.path().join("src"), t.path().join("back"));
    make_source(&src);
    // The endpoint and credentials come from the environment (AWS_ENDPOINT_URL, ...).
    let url = "s3://syncbucket/some/prefix".to_string();
    // The bucket does not exist yet: sync makes it, as juicefs sync does.
    assert_eq!(sync_ok(&[&s(&src), &url], env), (8, 0, 0, 0));
    assert_eq!(sync_ok(&[&url, &s(&back)], env), (8, 0, 0, 0));
    assert_eq!(
        contents_under(&back),
        contents_under(&src),
        "through S3, byte for byte"
    );
    assert_eq!(sync_ok(&[&s(&src), &url], env), (0, 8, 0, 0));
    assert_eq!(sync_ok(&[&url, &s(&back)], env), (0, 8, 0, 0));
    // --delete-dst on the bucket.
    std::fs::remove_file(src.join("a/one.bin")).unwrap();
    assert_eq!(
        sync_ok(&["--delete-dst", &s(&src), &url], env),
        (0, 7, 1, 0)
    );
    assert_eq!(
        sync_ok(&["--delete-dst", &url, &s(&back)], env),
        (0, 7, 1, 0)
    );
    assert_eq!(contents_under(&back), contents_under(&src));
    // A bucket that does not exist as a source: one line, naming the fix.
    let missing = "s3://nosuchbucket".to_string();
    let (ok, _, err) = run_env(&["sync", &missing, &s(&t.path().join("x"))], env);
    assert!(!ok);
    // (The retry layer's warning may come first: it is the log, not the error.)
    let errors: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("unkai: error:"))
        .collect();
    assert_eq!(errors.len(), 1, "{err}");
    assert!(errors[0].contains("check its name"), "{err}");
    assert!(!t.path().join("x").exists());
}

#[test]
fn a_failed_file_is_counted_named_and_the_exit_code_says_so() {
    let t = tempfile::tempdir().unwrap();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    make_source(&src);
    // A file where the destination needs the directory `a`: the three files under it fail.
    std::fs::create_dir_all(&dst).unwrap();
    std::fs::write(dst.join("a"), b"in the way").unwrap();
    let (ok, out, err) = run(&["sync", "--quiet", &s(&src), &s(&dst)]);
    assert!(!ok, "a sync with failed files exited 0: {out}");
    assert_eq!(counts(&out), (5, 0, 0, 3), "{out}");
    assert!(
        err.contains("3 files failed") && err.contains("a/"),
        "{err}"
    );
    // The others were copied whole.
    assert_eq!(
        std::fs::read(dst.join("top.txt")).unwrap(),
        std::fs::read(src.join("top.txt")).unwrap()
    );
}

#[test]
fn names_with_percent_hash_backslash_and_unicode_survive_the_round_trip() {
    let t = tempfile::tempdir().unwrap();
    let (src, back) = (t.path().join("src"), t.path().join("back"));
    let names = ["50% off.txt", "x#1", "a\\b", "é ü [x] {y}.txt", "d/%41"];
    for (i, n) in names.iter().enumerate() {
        let p = src.join(n);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, pattern(10 + i, i as u64)).unwrap();
    }
    let bucket = format!("file://{}/bucket", s(t.path()));
    assert_eq!(sync_ok(&[&s(&src), &bucket], &[]), (5, 0, 0, 0));
    assert_eq!(sync_ok(&[&bucket, &s(&back)], &[]), (5, 0, 0, 0));
    assert_eq!(contents_under(&back), contents_under(&src));
    assert_eq!(sync_ok(&[&bucket, &s(&back)], &[]), (0, 5, 0, 0));
}

/// The environment of a volume's commands plus `more` (a store's credentials).
fn env_of(vol: &Volume, more: &[(String, String)]) -> Vec<(String, String)> {
    let mut env = vol.env.clone();
    env.extend(more.iter().cloned());
    env
}

/// What a mount of `vol` shows under `sub`, byte for byte (the mount is gone after).
fn through_mount(vol: &Volume, sub: &str) -> BTreeMap<String, Vec<u8>> {
    let m = vol.mount();
    let t = contents_under(&m.p(sub));
    m.unmount();
    t
}

#[test]
fn dir_to_volume_to_s3_to_volume_byte_for_byte_then_incremental() {
    let server = servers::s3("volsync");
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    make_source(&src);
    let want = contents_under(&src);
    let vol = Volume::new();
    let env = env_of(&vol, &server.env);
    let at = format!("{}:/in/here", vol.meta_url);
    // Directory to volume: no mount needed; the directory in the volume is made.
    assert_eq!(sync_ok(&[&s(&src), &at], &env), (8, 0, 0, 0));
    assert_eq!(sync_ok(&[&s(&src), &at], &env), (0, 8, 0, 0), "rerun");
    assert_eq!(through_mount(&vol, "in/here"), want, "dir -> volume");
    // Volume to bucket, on a real S3 server: the objects as versitygw stores them.
    let url = "s3://volsync/copy".to_string();
    assert_eq!(sync_ok(&[&at, &url], &env), (8, 0, 0, 0));
    assert_eq!(sync_ok(&[&at, &url], &env), (0, 8, 0, 0), "rerun");
    assert_eq!(
        contents_under(&server.dir.path().join("root/volsync/copy")),
        want,
        "volume -> bucket"
    );
    // Bucket to another volume (its root).
    let vol2 = Volume::new();
    let env2 = env_of(&vol2, &server.env);
    assert_eq!(sync_ok(&[&url, &vol2.meta_url], &env2), (8, 0, 0, 0));
    assert_eq!(sync_ok(&[&url, &vol2.meta_url], &env2), (0, 8, 0, 0));
    assert_eq!(through_mount(&vol2, ""), want, "bucket -> volume");
    // Volume to directory keeps mtimes: the rerun from the directory copies nothing, and
    // the mtimes a mount shows are the source's.
    let back = t.path().join("back");
    assert_eq!(sync_ok(&[&at, &s(&back)], &env), (8, 0, 0, 0));
    assert_eq!(contents_under(&back), want);
    assert_eq!(sync_ok(&[&s(&back), &at], &env), (0, 8, 0, 0));
    let m = vol.mount();
    let mt = |p: &Path| std::fs::metadata(p).unwrap().modified().unwrap();
    assert_eq!(
        mt(&m.p("in/here/a/b/big.bin")),
        mt(&src.join("a/b/big.bin"))
    );
    m.unmount();
    // A change in the source and --check-all with the same size: both found.
    std::fs::write(src.join("top.txt"), pattern(100, 77)).unwrap();
    assert_eq!(
        sync_ok(&["--check-all", "--check-new", &s(&src), &at], &env),
        (1, 7, 0, 0)
    );
    assert_eq!(through_mount(&vol, "in/here"), contents_under(&src));
}

#[test]
fn a_volume_keeps_dirs_perms_and_links_and_delete_src_moves() {
    use std::os::unix::fs::PermissionsExt;
    let t = tempfile::tempdir().unwrap();
    let (src, back) = (t.path().join("src"), t.path().join("back"));
    make_source(&src);
    std::fs::create_dir_all(src.join("hollow/dir")).unwrap();
    std::fs::set_permissions(src.join("top.txt"), std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::set_permissions(src.join("a"), std::fs::Permissions::from_mode(0o750)).unwrap();
    std::os::unix::fs::symlink("a/one.bin", src.join("link")).unwrap();
    // A trash kept (tests turn it off by default).
    let vol = Volume::with_args(&["--trash-days", "1"]);
    let env = vol.env.clone();
    let flags = ["--dirs", "--perms", "--links"];
    let mut args: Vec<&str> = flags.to_vec();
    let (s1, v1) = (s(&src), vol.meta_url.clone());
    args.extend([s1.as_str(), v1.as_str()]);
    let (copied, _, _, failed) = sync_ok(&args, &env);
    assert_eq!(failed, 0);
    assert!(copied >= 8 + 1 + 2, "{copied}");
    // Nothing changed: nothing copied.
    let (copied, _, _, _) = sync_ok(&args, &env);
    assert_eq!(copied, 0, "rerun copied");
    let m = vol.mount();
    let mode = |p: &Path| std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode(&m.p("top.txt")), 0o600);
    assert_eq!(mode(&m.p("a")), 0o750);
    assert!(m.p("hollow/dir").is_dir(), "an empty directory");
    assert_eq!(
        std::fs::read_link(m.p("link")).unwrap(),
        Path::new("a/one.bin")
    );
    m.unmount();
    // And back out the same way.
    let (b1,) = (s(&back),);
    let mut args: Vec<&str> = flags.to_vec();
    args.extend([v1.as_str(), b1.as_str()]);
    sync_ok(&args, &env);
    assert_eq!(mode(&back.join("top.txt")), 0o600);
    assert!(back.join("hollow/dir").is_dir());
    assert_eq!(
        std::fs::read_link(back.join("link")).unwrap(),
        Path::new("a/one.bin")
    );
    // --delete-src: a move. The volume's files go to its trash, not away.
    let moved = t.path().join("moved");
    assert_eq!(
        sync_ok(&["--delete-src", &v1, &s(&moved)], &env).0,
        8,
        "files moved"
    );
    let mut want = contents_under(&src);
    want.remove("link"); // a link, left out without --links
    assert!(contents_under(&moved) == want, "moved, byte for byte");
    let m = vol.mount();
    assert!(!m.p("top.txt").exists(), "moved out of the volume");
    m.unmount();
    // Into its trash: read through a sync of /.trash.
    let trash = t.path().join("trash");
    sync_ok(&[&format!("{v1}:/.trash"), &s(&trash)], &env);
    assert!(
        files_under(&trash)
            .iter()
            .any(|p| p.to_string_lossy().ends_with("-top.txt")),
        "not in the trash: {:?}",
        files_under(&trash)
    );
}

#[test]
fn a_large_file_is_streamed_and_bwlimit_holds() {
    let t = tempfile::tempdir().unwrap();
    let (src, back) = (t.path().join("src"), t.path().join("back"));
    std::fs::create_dir_all(&src).unwrap();
    // Several 8 MiB pieces, the last one partial.
    std::fs::write(src.join("big"), pattern((20 << 20) + 12345, 5)).unwrap();
    let vol = Volume::new();
    let env = vol.env.clone();
    assert_eq!(
        sync_ok(&["--check-new", &s(&src), &vol.meta_url], &env),
        (1, 0, 0, 0)
    );
    let started = std::time::Instant::now();
    // 32 Mbit/s = 4 MB/s: 21 MB takes 5.2 s at least (a quarter second's burst aside);
    // unlimited, well under a second.
    assert_eq!(
        sync_ok(&["--bwlimit", "32", &vol.meta_url, &s(&back)], &env),
        (1, 0, 0, 0)
    );
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(4500),
        "--bwlimit 32 took {took:?}"
    );
    assert_eq!(contents_under(&back), contents_under(&src));
}

#[test]
fn a_volume_killed_half_way_then_rerun_completes() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    for i in 0..300 {
        let p = src.join(format!("d{}/f{i}", i % 7));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, pattern(20_000 + i, i as u64)).unwrap();
    }
    let vol = Volume::new();
    let env = vol.env.clone();
    // Directory to volume, every store request 20 ms late, killed once some blocks are in.
    kill_mid_run(&["--threads", "1", &s(&src), &vol.meta_url], &env, || {
        vol.objects().len() >= 5
    });
    let before = vol.objects().len();
    assert!(before < 300, "the run finished before it was killed");
    let (copied, skipped, _, failed) = sync_ok(&[&s(&src), &vol.meta_url], &env);
    assert_eq!((copied + skipped, failed), (300, 0));
    assert!(skipped >= 1, "nothing of the killed run was kept");
    let m = vol.mount();
    assert_eq!(
        contents_under(&m.p("")),
        contents_under(&src),
        "no partial file left as done"
    );
    m.unmount();
    // Volume to volume, killed likewise.
    let vol2 = Volume::new();
    let env2 = vol2.env.clone();
    kill_mid_run(
        &["--threads", "1", &vol.meta_url, &vol2.meta_url],
        &env2,
        || vol2.objects().len() >= 5,
    );
    let (copied, skipped, _, failed) = sync_ok(&[&vol.meta_url, &vol2.meta_url], &env2);
    assert_eq!((copied + skipped, failed), (300, 0));
    assert_eq!(through_mount(&vol2, ""), contents_under(&src));
}

#[test]
fn bad_volume_input_is_one_line_and_changes_nothing() {
    let server = servers::s3("badvol");
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    make_source(&src);
    let vol = Volume::new();
    let m = vol.mount();
    std::fs::create_dir_all(m.p("in/sub")).unwrap();
    std::fs::write(m.p("in/f"), b"x").unwrap();
    m.unmount();
    let at = |p: &str| format!("{}:{p}", vol.meta_url);
    let bad_keys: Vec<(String, String)> = server
        .env
        .iter()
        .map(|(k, v)| {
            if k == "AWS_SECRET_ACCESS_KEY" {
                (k.clone(), "wrong".into())
            } else {
                (k.clone(), v.clone())
            }
        })
        .collect();
    // The bucket exists (bad credentials must be told from a missing bucket).
    assert_eq!(sync_ok(&[&s(&src), "s3://badvol/x"], &server.env).0, 8);
    let unreachable = vec![(
        "AWS_ENDPOINT_URL".to_string(),
        "http://127.0.0.1:9".to_string(),
    )];
    type Env = Vec<(String, String)>;
    let cases: Vec<(Vec<String>, Env, &str)> = vec![
        (
            vec![at("/../x"), s(&t.path().join("d1"))],
            vec![],
            "leaves the volume",
        ),
        (vec![s(&src), at("/../x")], vec![], "leaves the volume"),
        (
            vec![at("/nothing"), s(&t.path().join("d2"))],
            vec![],
            "give an existing directory",
        ),
        (
            vec![at("/in/f"), s(&t.path().join("d3"))],
            vec![],
            "not a directory",
        ),
        (
            vec![at("/in"), at("/in/sub/x")],
            vec![],
            "give separate directories",
        ),
        (
            vec![
                format!("sqlite://{}/none.db", s(t.path())),
                s(&t.path().join("d4")),
            ],
            vec![],
            "",
        ),
        (
            vec!["s3://nosuch".into(), at("/new")],
            server.env.clone(),
            "check its name",
        ),
        (
            vec!["s3://badvol".into(), at("/new")],
            bad_keys,
            "credentials",
        ),
        (
            vec!["s3://badvol".into(), at("/new")],
            unreachable
                .into_iter()
                .chain(
                    server
                        .env
                        .iter()
                        .filter(|(k, _)| k != "AWS_ENDPOINT_URL")
                        .cloned(),
                )
                .collect(),
            "",
        ),
    ];
    for (args, env, fix) in cases {
        let mut all = vec!["sync".to_string(), "--quiet".into()];
        all.extend(args);
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        let (ok, _, err) = run_env(&all, &env_of(&vol, &env));
        assert!(!ok, "{all:?} succeeded");
        let errors: Vec<&str> = err
            .lines()
            .filter(|l| l.starts_with("unkai: error:"))
            .collect();
        assert_eq!(errors.len(), 1, "{all:?}: {err}");
        assert!(
            errors[0].contains(fix),
            "{all:?}: {err} does not say {fix:?}"
        );
        assert!(
            ["give", "check", "run"]
                .iter()
                .any(|w| errors[0].contains(w)),
            "{all:?}: names no fix: {err}"
        );
    }
    assert!(!t.path().join("none.db").exists(), "a volume was made");
    let m = vol.mount();
    let visible: Vec<String> = names(&m.p(""))
        .into_iter()
        .filter(|n| !n.starts_with('.'))
        .collect();
    assert_eq!(visible, ["in"], "the volume changed");
    assert_eq!(
        names(&m.p("in")),
        ["f", "sub"].iter().map(|s| s.to_string()).collect()
    );
    m.unmount();
    for d in ["d1", "d2", "d3", "d4"] {
        assert!(!t.path().join(d).exists(), "{d} was made");
    }
}
