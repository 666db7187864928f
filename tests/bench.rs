//! `unkai bench` against a real mount and a plain directory: the table compares both, the
//! JSON holds every figure, nothing is left behind, and bad directories are one-line errors.

use crate::common::*;
use std::fs;
use std::path::Path;

fn leftovers(dir: &Path) -> Vec<String> {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("unkai-bench") || n.starts_with(".unkai-bench"))
        .collect()
}

#[test]
fn metadata_and_fileserver_on_a_mount_and_a_local_dir() {
    let vol = Volume::new();
    let m = vol.mount();
    let local = tempfile::tempdir().unwrap();
    let json = local.path().join("out.json");
    let svg = local.path().join("chart.svg");
    let local_dir = local.path().join("dir");
    fs::create_dir(&local_dir).unwrap();
    let (ok, out, err) = run(&[
        "bench",
        "--quick",
        "--quiet",
        "--workload",
        "m,s3",
        "--duration",
        "1",
        "--json",
        json.to_str().unwrap(),
        "--plot",
        svg.to_str().unwrap(),
        m.path.to_str().unwrap(),
        local_dir.to_str().unwrap(),
    ]);
    assert!(ok, "bench failed:\n{out}{err}");
    // The table: a header naming both directories, the ratio column, and the rows.
    let header = out.lines().next().unwrap_or_default();
    assert!(header.contains(m.path.to_str().unwrap()), "{out}");
    assert!(header.contains(local_dir.to_str().unwrap()), "{out}");
    assert!(header.contains("[2]/[1]"), "{out}");
    for row in [
        "create 4KiB (one dir)",
        "ls -l 10000",
        "tar -x 500 files",
        "fileserver ops",
    ] {
        let line = out
            .lines()
            .find(|l| l.contains(row))
            .unwrap_or_else(|| panic!("no row {row}:\n{out}"));
        // Two medians and one ratio, all positive numbers.
        let nums: Vec<f64> = line
            .split_whitespace()
            .rev()
            .take(3)
            .map(|x| x.parse().unwrap_or(-1.0))
            .collect();
        assert!(nums.iter().all(|x| *x > 0.0), "row {row}: {line}");
    }
    // The JSON: the same figures, one value per run and directory, all positive.
    let v: serde_json::Value = serde_json::from_slice(&fs::read(&json).unwrap()).unwrap();
    assert_eq!(v["dirs"].as_array().unwrap().len(), 2);
    let figures = v["figures"].as_array().unwrap();
    assert!(figures.len() >= 12, "{v}");
    for f in figures {
        let values = f["values"].as_array().unwrap();
        assert_eq!(values.len(), 2, "{f}");
        for per_dir in values {
            let runs = per_dir.as_array().unwrap();
            assert_eq!(runs.len(), 1, "{f}");
            assert!(runs[0].as_f64().unwrap() > 0.0, "{f}");
        }
    }
    assert!(
        figures
            .iter()
            .any(|f| f["workload"] == "S3" && f["unit"] == "ops/s"),
        "{v}"
    );
    // The chart: an SVG document with a bar per directory and figure, and the names.
    let chart = fs::read_to_string(&svg).unwrap();
    assert!(chart.starts_with("<svg") && chart.trim_end().ends_with("</svg>"));
    assert!(chart.matches("<rect").count() >= 2 * 12, "{chart}");
    assert!(chart.contains("fileserver ops"));
    // No S0 ran: no latency chart.
    assert!(!local.path().join("chart-s0-latency.svg").exists());
    // The saved report printed and drawn again, without running anything.
    let png = local.path().join("again.png");
    let (ok, again, err) = run(&[
        "bench",
        "--from-json",
        json.to_str().unwrap(),
        "--plot",
        png.to_str().unwrap(),
    ]);
    assert!(ok, "bench --from-json failed:\n{again}{err}");
    assert_eq!(again, out, "the saved report prints the same table");
    assert_eq!(&fs::read(&png).unwrap()[..8], b"\x89PNG\r\n\x1a\n");
    let (ok, _, err) = run(&["bench", "--from-json", svg.to_str().unwrap()]);
    assert!(!ok);
    assert!(err.contains("not a report"), "{err}");
    // Nothing left behind in either directory.
    assert!(leftovers(&m.path).is_empty(), "{:?}", leftovers(&m.path));
    assert!(leftovers(&local_dir).is_empty());
    m.unmount();
    // And the volume is consistent afterwards.
    let (ok, out, err) = vol.cmd("fsck", &["-q"]);
    assert!(ok, "fsck after bench:\n{out}{err}");
}

#[test]
fn bad_directories_are_one_line_errors() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope");
    let (ok, _, err) = run(&["bench", "--quick", "-w", "m", missing.to_str().unwrap()]);
    assert!(!ok);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.contains("nope") && err.contains("existing directory"),
        "{err}"
    );
    let file = dir.path().join("file");
    fs::write(&file, b"x").unwrap();
    let (ok, _, err) = run(&["bench", "-w", "m", file.to_str().unwrap()]);
    assert!(!ok);
    assert!(err.contains("is not a directory"), "{err}");
    let (ok, _, err) = run(&[
        "bench",
        "--runs",
        "0",
        "-w",
        "m",
        dir.path().to_str().unwrap(),
    ]);
    assert!(!ok);
    assert!(err.contains("--runs"), "{err}");
    assert!(leftovers(dir.path()).is_empty());
}

/// Unmounts (lazily) the tmpfs of a test on drop, failure included.
struct TmpfsGuard(std::path::PathBuf);

impl Drop for TmpfsGuard {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

#[test]
fn a_directory_that_fails_a_workload_gets_blanks_and_a_note() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good");
    let full = dir.path().join("full");
    fs::create_dir(&good).unwrap();
    fs::create_dir(&full).unwrap();
    // 64 KiB of tmpfs: the fileserver personality runs out of space there.
    let st = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"])
        .arg(&full)
        .status()
        .unwrap();
    assert!(st.success(), "mount tmpfs");
    let _guard = TmpfsGuard(full.clone());
    let json = dir.path().join("out.json");
    let png = dir.path().join("chart.png");
    let (ok, out, err) = run(&[
        "bench",
        "--quick",
        "--quiet",
        "--workload",
        "s3",
        "--duration",
        "1",
        "--json",
        json.to_str().unwrap(),
        "--plot",
        png.to_str().unwrap(),
        good.to_str().unwrap(),
        full.to_str().unwrap(),
    ]);
    assert!(ok, "bench failed:\n{out}{err}");
    let v: serde_json::Value = serde_json::from_slice(&fs::read(&json).unwrap()).unwrap();
    let notes = v["notes"].to_string();
    assert!(
        notes.contains(&format!("on {} failed", full.display())),
        "{notes}"
    );
    assert!(err.contains("failed"), "{err}");
    let ops = v["figures"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == "fileserver ops")
        .unwrap_or_else(|| panic!("{v}"));
    assert!(ops["median"][0].as_f64().unwrap() > 0.0, "{ops}");
    assert!(ops["median"][1].is_null(), "{ops}");
    // The chart as PNG.
    assert_eq!(&fs::read(&png).unwrap()[..8], b"\x89PNG\r\n\x1a\n");
    assert!(leftovers(&good).is_empty());
    assert!(leftovers(&full).is_empty(), "{:?}", leftovers(&full));
}

/// S2m: two mounts of one volume as one client group (`A,B`) beside one mount alone: every
/// phase has its files/s and p99 figures for both columns, nothing is left on either mount,
/// and the volume is consistent; mountpoints of two different volumes are refused in one line.
#[test]
fn s2m_runs_clients_on_mounts_of_one_volume() {
    let vol = Volume::new();
    let (a, b) = (vol.mount(), vol.mount());
    let local = tempfile::tempdir().unwrap();
    let json = local.path().join("out.json");
    let group = format!("{},{}", a.path.display(), b.path.display());
    let (ok, out, err) = run(&[
        "bench",
        "--quick",
        "--quiet",
        "--workload",
        "s2m",
        "--json",
        json.to_str().unwrap(),
        a.path.to_str().unwrap(),
        &group,
    ]);
    assert!(ok, "bench failed:\n{out}{err}");
    let v: serde_json::Value = serde_json::from_slice(&fs::read(&json).unwrap()).unwrap();
    let figures = v["figures"].as_array().unwrap();
    for phase in [
        "own dir, extract",
        "own dir, remove",
        "shared dir, extract",
        "shared dir, remove",
    ] {
        for what in ["files/s", "p99 create", "p99 unlink"] {
            let want = format!("{phase}: {what}");
            if (what == "p99 create") != phase.ends_with("extract") {
                continue;
            }
            let f = figures
                .iter()
                .find(|f| f["workload"] == "S2m" && f["name"] == want.as_str())
                .unwrap_or_else(|| panic!("no figure {want}: {v}"));
            for per_dir in f["values"].as_array().unwrap() {
                assert!(per_dir[0].as_f64().unwrap() > 0.0, "{f}");
            }
        }
    }
    assert!(leftovers(&a.path).is_empty(), "{:?}", leftovers(&a.path));
    assert!(leftovers(&b.path).is_empty(), "{:?}", leftovers(&b.path));
    // A mount of another volume is no client of this one.
    let other = Volume::new();
    let c = other.mount();
    let group = format!("{},{}", a.path.display(), c.path.display());
    let (ok, _, err) = run(&["bench", "--quick", "--quiet", "-w", "s2m", &group]);
    // The workload fails (a blank and a note, as any failed workload), saying why.
    let _ = ok;
    assert!(err.contains("mountpoints of one volume"), "{err}");
    c.unmount();
    a.unmount();
    b.unmount();
    let (ok, out, err) = vol.cmd("fsck", &["-q"]);
    assert!(ok, "fsck after bench:\n{out}{err}");
}
