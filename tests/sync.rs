//! `unkai sync` as a user runs it: between directories, a `file://` bucket and a real S3
//! server (versitygw), compared byte for byte; incremental reruns, --dry-run, --delete-dst,
//! --exclude/--include, bad input, and a run killed half-way then resumed.

mod common;

use common::*;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

/// Every file under `dir` (hidden ones too) with its contents, by relative path.
fn tree(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    fn walk(root: &Path, d: &Path, out: &mut BTreeMap<String, Vec<u8>>) {
        for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(root, &p, out);
            } else {
                let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
                out.insert(rel, std::fs::read(&p).unwrap());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

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
    let want = tree(&src);
    assert_eq!(sync_ok(&[&s(&src), &bucket], &[]), (8, 0, 0, 0));
    assert_eq!(tree(&t.path().join("bucket")), want);
    assert_eq!(sync_ok(&[&bucket, &s(&back)], &[]), (8, 0, 0, 0));
    assert_eq!(tree(&back), want, "bucket to directory, byte for byte");
    // A rerun with nothing changed copies nothing, either way.
    assert_eq!(sync_ok(&[&s(&src), &bucket], &[]), (0, 8, 0, 0));
    assert_eq!(sync_ok(&[&bucket, &s(&back)], &[]), (0, 8, 0, 0));
    // One file grows, one is new: only those two are copied.
    std::fs::write(src.join("top.txt"), pattern(101, 99)).unwrap();
    std::fs::write(src.join("a/new.txt"), b"new").unwrap();
    assert_eq!(sync_ok(&[&s(&src), &bucket], &[]), (2, 7, 0, 0));
    assert_eq!(sync_ok(&[&bucket, &s(&back)], &[]), (2, 7, 0, 0));
    assert_eq!(tree(&back), tree(&src));
}

#[test]
fn dir_to_dir_keeps_mtimes_and_check_all_finds_same_size_changes() {
    let t = tempfile::tempdir().unwrap();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    make_source(&src);
    assert_eq!(sync_ok(&[&s(&src), &s(&dst)], &[]), (8, 0, 0, 0));
    assert_eq!(tree(&dst), tree(&src));
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
    assert_eq!(tree(&dst), tree(&src));
    // --force-update copies everything; --check-new reads it back.
    assert_eq!(
        sync_ok(&["--force-update", "--check-new", &s(&src), &s(&dst)], &[]),
        (8, 0, 0, 0)
    );
    assert_eq!(tree(&dst), tree(&src));
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
    let before = tree(&dst);
    assert_eq!(
        sync_ok(&["--dry-run", "--delete-dst", &s(&src), &s(&dst)], &[]),
        (1, 7, 1, 0)
    );
    assert_eq!(tree(&dst), before, "a dry run changed the destination");
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
    let mut want = tree(&src);
    want.remove("logs/run.tmp");
    want.insert("keep.tmp".into(), b"x".to_vec());
    // logs/run.tmp was copied by the first run and is excluded now: kept too.
    want.insert(
        "logs/run.tmp".into(),
        std::fs::read(src.join("logs/run.tmp")).unwrap(),
    );
    assert_eq!(tree(&dst), want);
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
    let got = tree(&dst);
    assert!(!got.contains_key("logs/run.tmp") && !got.contains_key("cache/blob"));
    assert_eq!(got.get("a/b/c/deep.bin"), tree(&src).get("a/b/c/deep.bin"));
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
    let names: Vec<String> = tree(&dst).into_keys().collect();
    assert_eq!(names, ["a/b/big.bin", "a/b/c/deep.bin", "a/one.bin"]);
    // An anchored pattern matches at the top only.
    let dst = t.path().join("d3");
    sync_ok(&["--exclude", "/a", &s(&src), &s(&dst)], &[]);
    assert!(tree(&dst).keys().all(|k| !k.starts_with("a/")));
    assert!(tree(&dst).contains_key("top.txt"));
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
        (&["sqlite:///tmp/x.db", &s(&dst)], "mount the volume"),
        (&["ftp://host/x", &s(&dst)], "mount the volume"),
        (
            &[&s(&src), &s(&src.join("inside"))],
            "give separate directories",
        ),
        (&["--exclude", "[", &s(&src), &s(&dst)], "invalid pattern"),
        (&["--threads", "0", &s(&src), &s(&dst)], "use 1 to 1024"),
    ];
    let before = tree(&src);
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
    assert_eq!(tree(&src), before);
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
        tree(&dst),
        tree(&src),
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
    assert_eq!(tree(&back), tree(&src), "through S3, byte for byte");
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
    assert_eq!(tree(&back), tree(&src));
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
    assert_eq!(tree(&back), tree(&src));
    assert_eq!(sync_ok(&[&bucket, &s(&back)], &[]), (0, 5, 0, 0));
}
