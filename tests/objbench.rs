//! `unkai objbench` as a user runs it: the table's rows and figures, the JSON file, and a
//! bucket left as it was found (after a complete run, a bad option, and Ctrl-C).

use crate::common::*;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// Small enough to run in a second or two.
const QUICK: &[&str] = &[
    "--small-count",
    "20",
    "--small-size",
    "1K",
    "--block-size",
    "256K",
    "--blocks",
    "6",
    "--parallel",
    "1,3",
];

/// The table rows of objbench's output: (operation, size, objects, parallel, figures), where
/// the figures are p50, p99 and mean (in seconds) and the rate with its unit.
#[derive(Debug)]
struct Row {
    op: String,
    size: String,
    objects: u64,
    parallel: u64,
    latency: [f64; 3],
    rate: f64,
    unit: String,
}

fn seconds(v: &str, unit: &str) -> f64 {
    let v: f64 = v.parse().unwrap_or_else(|_| panic!("not a number: {v}"));
    match unit {
        "s" => v,
        "ms" => v / 1e3,
        "µs" => v / 1e6,
        _ => panic!("unknown unit {unit}"),
    }
}

fn table(out: &str) -> Vec<Row> {
    let mut lines = out.lines();
    assert!(
        lines.next().is_some_and(|l| l.starts_with("storage ")),
        "{out}"
    );
    let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "OPERATION",
            "SIZE",
            "OBJECTS",
            "PARALLEL",
            "P50",
            "P99",
            "MEAN",
            "RATE"
        ],
        "{out}"
    );
    let mut rows = Vec::new();
    for l in lines {
        if l.contains("objects created and deleted") {
            break;
        }
        let t: Vec<&str> = l.split_whitespace().collect();
        assert_eq!(t.len(), 13, "bad row '{l}' in:\n{out}");
        rows.push(Row {
            op: t[0].into(),
            size: format!("{} {}", t[1], t[2]),
            objects: t[3].parse().unwrap(),
            parallel: t[4].parse().unwrap(),
            latency: [
                seconds(t[5], t[6]),
                seconds(t[7], t[8]),
                seconds(t[9], t[10]),
            ],
            rate: t[11].parse().unwrap(),
            unit: t[12].into(),
        });
    }
    rows
}

/// Checks the rows of a run with the `QUICK` options.
#[track_caller]
fn check_quick_table(out: &str) {
    let rows = table(out);
    let got: Vec<(&str, &str, u64, u64, &str)> = rows
        .iter()
        .map(|r| {
            (
                r.op.as_str(),
                r.size.as_str(),
                r.objects,
                r.parallel,
                r.unit.as_str(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("PUT", "1 KiB", 20, 1, "ops/s"),
            ("GET", "1 KiB", 20, 1, "ops/s"),
            ("PUT", "256 KiB", 6, 1, "MB/s"),
            ("GET", "256 KiB", 6, 1, "MB/s"),
            ("PUT", "256 KiB", 6, 3, "MB/s"),
            ("GET", "256 KiB", 6, 3, "MB/s"),
            ("LIST", "1 KiB", 20, 1, "objects/s"),
            ("DELETE", "1 KiB", 20, 3, "objects/s"),
        ],
        "{out}"
    );
    for r in &rows {
        assert!(r.latency.iter().all(|&s| s > 0.0), "{r:?} in:\n{out}");
        assert!(r.latency[0] <= r.latency[1], "p50 > p99: {r:?}");
        assert!(r.rate > 0.0, "{r:?} in:\n{out}");
    }
    // 20 small objects and 6 blocks per throughput run.
    assert!(
        out.contains("\n32 objects created and deleted in "),
        "{out}"
    );
}

/// Every entry under `dir` (recursively), dot-files included.
fn entries(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        out.push(p.display().to_string());
        if p.is_dir() {
            out.extend(entries(&p));
        }
    }
    out
}

#[test]
fn a_directory_bucket_is_measured_and_left_empty() {
    let dir = tempfile::tempdir().unwrap();
    let bucket = dir.path().join("bucket");
    std::fs::create_dir(&bucket).unwrap();
    std::fs::write(bucket.join("keep-me"), b"not ours").unwrap();
    let json = dir.path().join("figures.json");
    let url = format!("file://{}", bucket.display());
    let mut args = vec!["objbench"];
    args.extend_from_slice(QUICK);
    let json_arg = json.display().to_string();
    args.extend(["--json", &json_arg, &url]);
    let (ok, out, err) = run(&args);
    assert!(ok, "{out}{err}");
    check_quick_table(&out);
    // Only what was there before.
    assert_eq!(
        entries(&bucket),
        [bucket.join("keep-me").display().to_string()]
    );

    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).expect("valid JSON");
    assert_eq!(v["storage"], url.as_str());
    assert!(v["prefix"].as_str().unwrap().starts_with("objbench-"));
    assert_eq!(v["created"], 32);
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 8);
    for r in rows {
        let n = r["objects"].as_u64().unwrap() as usize;
        let samples = r["samples"].as_array().unwrap();
        // One sample per request (per listing for LIST).
        if r["op"] == "list" {
            assert_eq!(samples.len(), 3, "{r}");
        } else {
            assert_eq!(samples.len(), n, "{r}");
        }
        assert!(samples.iter().all(|s| s.as_f64().unwrap() > 0.0), "{r}");
        assert!(r["latency"]["p99"].as_f64().unwrap() >= r["latency"]["p50"].as_f64().unwrap());
        assert!(r["rate"].as_f64().unwrap() > 0.0);
    }
    assert_eq!(rows[2]["rate_unit"], "MB/s");
}

#[test]
fn memory_storage_is_measured() {
    let mut args = vec!["objbench", "-q"];
    args.extend_from_slice(QUICK);
    args.push("memory://");
    let (ok, out, err) = run(&args);
    assert!(ok, "{out}{err}");
    check_quick_table(&out);
}

#[test]
fn bad_options_fail_on_one_line_and_touch_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().display());
    for bad in [
        &["--parallel", "0"][..],
        &["--parallel", "1,x"],
        &["--small-count", "0"],
        &["--block-size", "4Q"],
        &["--blocks", "0"],
    ] {
        let mut args = vec!["objbench"];
        args.extend_from_slice(bad);
        args.push(&url);
        let (ok, out, err) = run(&args);
        assert!(!ok, "{bad:?} succeeded: {out}");
        assert!(
            err.starts_with("unkai: error:") || err.starts_with("error:"),
            "{err}"
        );
        assert!(entries(dir.path()).is_empty(), "{bad:?} left objects");
    }
    let (ok, _, err) = run(&["objbench", "ftp://example.com/x"]);
    assert!(!ok);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("invalid storage URL"), "{err}");
}

#[test]
fn ctrl_c_stops_the_run_and_deletes_its_objects() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().display());
    let child = unkai()
        .args(["objbench", "--small-count", "1000000", &url])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait for objects to exist (the run is under way).
    let start = Instant::now();
    while entries(dir.path()).len() < 3 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no objects appeared"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(200));
    assert!(!entries(dir.path()).is_empty());
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("unkai: error: interrupted"), "{err}");
    assert!(
        entries(dir.path()).is_empty(),
        "left: {:?}",
        entries(dir.path())
    );
}

#[test]
fn s3_bucket_is_created_measured_and_left_empty() {
    let server = servers::s3("unkai-test");
    let mut args = vec!["objbench"];
    args.extend_from_slice(QUICK);
    args.push(&server.storage);
    let (ok, out, err) = run_env(&args, &server.env);
    assert!(ok, "{out}{err}\nserver log:\n{}", server.log());
    assert!(err.contains("created the bucket"), "{err}");
    check_quick_table(&out);
    // A second run finds the bucket.
    let (ok, out, err) = run_env(&args, &server.env);
    assert!(ok, "{out}{err}");
    assert!(!err.contains("created the bucket"), "{err}");
    // versitygw's posix backend keeps a bucket as a directory; its own files start with '.'.
    let bucket = server.dir.path().join("root/unkai-test");
    let left: Vec<String> = std::fs::read_dir(&bucket)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.'))
        .collect();
    assert!(left.is_empty(), "left in the bucket: {left:?}");
}

/// `--sample DIR`: a tree written once per codec; the bytes the bucket holds are set against
/// the bytes written (compressible text: far fewer with lz4 and zstd), every object read back,
/// nothing left behind. A missing sample directory fails in one line, touching nothing.
#[test]
fn a_sample_tree_shows_what_compression_saves() {
    let dir = tempfile::tempdir().unwrap();
    let (bucket, tree) = (dir.path().join("bucket"), dir.path().join("tree"));
    std::fs::create_dir_all(tree.join("sub")).unwrap();
    std::fs::create_dir(&bucket).unwrap();
    let line = |i: usize| {
        format!(
            "fn item_{i}(x: u64) -> u64 {{ x.wrapping_mul({}) }}\n",
            i % 9
        )
    };
    let big: String = (0..40_000).map(line).collect();
    std::fs::write(tree.join("big.rs"), &big).unwrap();
    for f in 0..30 {
        let small: String = (f * 50..f * 50 + 50).map(line).collect();
        std::fs::write(tree.join("sub").join(format!("f{f}.rs")), small).unwrap();
    }
    let url = format!("file://{}", bucket.display());
    let json = dir.path().join("out.json");
    let (tree_s, json_s) = (tree.display().to_string(), json.display().to_string());
    let mut args = vec!["objbench", "-q"];
    args.extend_from_slice(QUICK);
    args.extend(["--sample", &tree_s, "--json", &json_s, &url]);
    let (ok, out, err) = run(&args);
    assert!(ok, "{out}{err}");
    assert!(
        out.contains("sample ") && out.contains("STORED/WRITTEN"),
        "{out}"
    );
    assert!(entries(&bucket).is_empty(), "left: {:?}", entries(&bucket));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["sample"]["files"], 31, "{}", v["sample"]);
    let codecs = v["codecs"].as_array().unwrap();
    let names: Vec<&str> = codecs
        .iter()
        .map(|c| c["codec"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["none", "lz4", "zstd", "zstd+aes-256-gcm"]);
    for c in codecs {
        let (written, stored) = (
            c["written"].as_u64().unwrap(),
            c["stored"].as_u64().unwrap(),
        );
        match c["codec"].as_str().unwrap() {
            "none" => assert!(stored >= written, "{c}"),
            _ => assert!(stored * 3 < written, "{c}"),
        }
    }
    let missing = dir.path().join("nope").display().to_string();
    let (ok, _, err) = run(&["objbench", "--sample", &missing, &url]);
    assert!(
        !ok && err.trim().lines().count() == 1 && err.contains("--sample"),
        "{err}"
    );
    assert!(entries(&bucket).is_empty());
}
