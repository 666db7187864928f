//! The command line as a user meets it: one-line errors for bad input (and nothing changed),
//! `status`, background mounts, the default volume, `umount` of a busy mount, SIGTERM, help.

use crate::common;

use crate::common::*;
use std::fs::{self, File};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// How many mounts sit exactly at `path`.
fn mount_count(path: &Path) -> usize {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let p = path.to_string_lossy().replace(' ', "\\040");
    info.lines()
        .filter(|l| l.split(' ').nth(4) == Some(p.as_str()))
        .count()
}

fn is_mounted(path: &Path) -> bool {
    mount_count(path) > 0
}

/// Whether a process is running (a zombie has exited).
fn alive(pid: i32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z')),
        Err(_) => false,
    }
}

/// Asserts that a command failed with exactly one line on stderr, an "unkai: error:" line;
/// returns that line.
#[track_caller]
fn one_line_error(res: &(bool, String, String)) -> String {
    let (ok, out, err) = res;
    assert!(
        !ok,
        "expected failure, got success; stdout: {out} stderr: {err}"
    );
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(
        lines.len(),
        1,
        "expected exactly one line on stderr, got {}:\n{err}",
        lines.len()
    );
    assert!(
        lines[0].starts_with("unkai: error:"),
        "stderr line does not start with 'unkai: error:': {err}"
    );
    lines[0].to_string()
}

/// Runs unkai with extra environment variables.
fn run_env(args: &[&str], env: &[(&str, &Path)]) -> (bool, String, String) {
    let mut cmd = unkai();
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run unkai");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Every file under `dir` with its contents (to prove a directory untouched).
fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    fn walk(d: &Path, out: &mut Vec<(PathBuf, Vec<u8>)>) {
        let mut es: Vec<_> = fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        es.sort();
        for p in es {
            if p.is_dir() {
                out.push((p.clone(), Vec::new()));
                walk(&p, out);
            } else {
                out.push((p.clone(), fs::read(&p).unwrap_or_default()));
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, &mut out);
    out
}

fn status_json(vol: &Volume) -> serde_json::Value {
    let (ok, out, err) = vol.cmd("status", &["--json"]);
    assert!(ok, "status failed: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("status --json: {e}: {out}"))
}

/// A mount made by `unkai mount -d`: lazily unmounted, and its daemon ended, on drop.
struct Daemon {
    mp: PathBuf,
    pid: i32,
}

impl Daemon {
    /// Parses the daemon's pid from the output of `mount -d` ("... (pid N, log ...)").
    fn from_output(mp: &Path, stdout: &str) -> Daemon {
        let pid = stdout
            .split("(pid ")
            .nth(1)
            .and_then(|s| s.split([',', ')']).next())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or_else(|| panic!("no pid in the output of mount -d: {stdout}"));
        Daemon {
            mp: mp.to_path_buf(),
            pid,
        }
    }
}

/// `unkai mount -d --log DIR/daemon.log` of `vol` at `DIR/mp`: the daemon, the mountpoint
/// and the log file.
fn mount_daemon(vol: &Volume, dir: &Path) -> (Daemon, PathBuf, PathBuf) {
    let mp = dir.join("mp");
    fs::create_dir(&mp).unwrap();
    let log = dir.join("daemon.log");
    let (ok, out, err) = common::run_env(
        &[
            "mount",
            "-d",
            "--log",
            log.to_str().unwrap(),
            &vol.meta_url,
            mp.to_str().unwrap(),
        ],
        &vol.env,
    );
    assert!(ok, "mount -d failed: {out}{err}");
    (Daemon::from_output(&mp, &out), mp, log)
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if is_mounted(&self.mp) {
            let _ = nix::mount::umount2(&self.mp, nix::mount::MntFlags::MNT_DETACH);
        }
        let start = Instant::now();
        while alive(self.pid) && start.elapsed() < Duration::from_secs(15) {
            std::thread::sleep(Duration::from_millis(20));
        }
        if alive(self.pid) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// A foreground `unkai mount` we started ourselves (to signal it): unmounted and reaped on
/// drop.
struct Foreground {
    mp: PathBuf,
    child: Option<Child>,
    log: PathBuf,
}

impl Foreground {
    fn start(meta_url: &str, mp: &Path, log: &Path) -> Foreground {
        let logf = File::create(log).unwrap();
        let child = unkai()
            .args(["mount", meta_url, mp.to_str().unwrap()])
            .stdin(Stdio::null())
            .stdout(logf.try_clone().unwrap())
            .stderr(logf)
            .spawn()
            .unwrap();
        let mut fg = Foreground {
            mp: mp.to_path_buf(),
            child: Some(child),
            log: log.to_path_buf(),
        };
        let start = Instant::now();
        while !is_mounted(mp) {
            if let Ok(Some(st)) = fg.child.as_mut().unwrap().try_wait() {
                panic!("mount exited ({st}): {}", fg.log_text());
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "no mount in 30 s"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        fg
    }

    fn pid(&self) -> i32 {
        self.child.as_ref().unwrap().id() as i32
    }

    fn signal(&self, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid()), sig).unwrap();
    }

    /// Waits (up to 30 s) for the server to exit; returns its exit status.
    fn wait(&mut self) -> std::process::ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(st) = self.child.as_mut().unwrap().try_wait().unwrap() {
                self.child = None;
                return st;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "server did not exit in 30 s; log:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Foreground {
    fn drop(&mut self) {
        if is_mounted(&self.mp) {
            let _ = nix::mount::umount2(&self.mp, nix::mount::MntFlags::MNT_DETACH);
        }
        if let Some(mut c) = self.child.take() {
            let start = Instant::now();
            while c.try_wait().ok().flatten().is_none() {
                if start.elapsed() > Duration::from_secs(15) {
                    let _ = c.kill();
                    let _ = c.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("unkai-cli-")
        .tempdir()
        .unwrap()
}

// ---------------------------------------------------------------------------------------------
// Bad input: one line, non-zero exit, nothing changed
// ---------------------------------------------------------------------------------------------

#[test]
fn malformed_meta_url_is_a_one_line_error() {
    let tmp = tempdir();
    let mp = tmp.path().join("mp");
    fs::create_dir(&mp).unwrap();
    let mps = mp.to_str().unwrap();
    for bad in [
        "notaurl",
        "sqlite://relative/meta.db",
        "sqlite:///",
        "mysql://host/db",
        "",
    ] {
        for args in [
            vec!["format", bad, "myvol"],
            vec!["status", bad],
            vec!["mount", bad, mps],
            vec!["mount", "-d", "--log", "/dev/null", bad, mps],
        ] {
            let mut cmd = unkai();
            cmd.args(&args).current_dir(tmp.path());
            let out = cmd.output().unwrap();
            let res = (
                out.status.success(),
                String::from_utf8_lossy(&out.stdout).into_owned(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            );
            let line = one_line_error(&res);
            assert!(
                line.contains("META-URL"),
                "{args:?}: the error does not say what is wrong: {line}"
            );
            assert!(!is_mounted(&mp), "{args:?} mounted something");
        }
    }
    // Nothing was created (e.g. a relative database path in the working directory).
    assert_eq!(
        snapshot(tmp.path()),
        vec![(mp.clone(), Vec::new())],
        "bad META-URLs created files"
    );
}

#[test]
fn unformatted_volume_is_a_one_line_error_and_stays_absent() {
    let tmp = tempdir();
    let url = format!("sqlite://{}/vol/meta.db", tmp.path().display());
    let mp = tmp.path().join("mp");
    fs::create_dir(&mp).unwrap();
    let before = snapshot(tmp.path());
    let line = one_line_error(&run(&["status", &url]));
    assert!(line.contains("format"), "no hint to format: {line}");
    let line = one_line_error(&run(&["mount", &url, mp.to_str().unwrap()]));
    assert!(line.contains("format"), "no hint to format: {line}");
    let line = one_line_error(&run(&[
        "mount",
        "-d",
        "--log",
        tmp.path().join("log").to_str().unwrap(),
        &url,
        mp.to_str().unwrap(),
    ]));
    assert!(line.contains("format"), "no hint to format: {line}");
    assert!(!is_mounted(&mp));
    let mut after = snapshot(tmp.path());
    after.retain(|(p, _)| p != &tmp.path().join("log"));
    assert_eq!(
        after, before,
        "commands on an unformatted volume created files"
    );
}

#[test]
fn format_over_an_existing_volume_is_refused() {
    let vol = Volume::new();
    let m = vol.mount();
    fs::write(m.p("keep"), b"precious").unwrap();
    let uuid = status_json(&vol)["format"]["uuid"].clone();
    assert!(uuid.is_string());

    // While mounted, even --force is refused.
    let line = one_line_error(&run(&["format", "--force", &vol.meta_url, "testvol"]));
    assert!(line.contains("mounted"), "{line}");
    m.unmount();

    // Without --force: refused, with a hint, for the same or another name.
    for name in ["testvol", "othervol"] {
        let line = one_line_error(&run(&["format", &vol.meta_url, name]));
        assert!(line.contains("--force"), "no hint about --force: {line}");
    }
    let st = status_json(&vol);
    assert_eq!(st["format"]["uuid"], uuid, "the volume was re-created");
    assert_eq!(st["format"]["name"], "testvol");
    let m = vol.mount();
    assert_eq!(fs::read(m.p("keep")).unwrap(), b"precious");
    m.unmount();

    // With --force: a new, empty volume.
    let (ok, _, err) = run(&["format", "--force", &vol.meta_url, "testvol"]);
    assert!(ok, "format --force failed: {err}");
    assert_ne!(status_json(&vol)["format"]["uuid"], uuid);
    let m = vol.mount();
    assert!(fs::read_dir(&m.path).unwrap().next().is_none());
}

#[test]
fn block_size_out_of_range_names_what_was_given() {
    let dir = tempdir();
    let meta = format!("sqlite://{}/meta.db", dir.path().display());
    for bad in ["10T", "5G", "1K"] {
        let line = one_line_error(&run(&["format", "--block-size", bad, &meta, "vol"]));
        assert!(
            line.contains(&format!("invalid block size {bad}:")) && line.contains("64K and 16M"),
            "{bad}: {line}"
        );
    }
    assert!(
        !dir.path().join("meta.db").exists(),
        "a refused format left a database"
    );
}

#[test]
fn bad_mountpoints_are_one_line_errors() {
    let vol = Volume::new();
    let tmp = tempdir();
    let log = tmp.path().join("log");
    let logs = log.to_str().unwrap();

    let missing = tmp.path().join("missing");
    for bg in [false, true] {
        let mut args = vec!["mount"];
        if bg {
            args.extend(["-d", "--log", logs]);
        }
        args.extend([vol.meta_url.as_str(), missing.to_str().unwrap()]);
        let line = one_line_error(&run(&args));
        assert!(line.contains("does not exist"), "{line}");
        assert!(!missing.exists(), "the missing mountpoint was created");
    }

    let file = tmp.path().join("file");
    fs::write(&file, b"not a dir").unwrap();
    for bg in [false, true] {
        let mut args = vec!["mount"];
        if bg {
            args.extend(["-d", "--log", logs]);
        }
        args.extend([vol.meta_url.as_str(), file.to_str().unwrap()]);
        let line = one_line_error(&run(&args));
        assert!(line.contains("not a directory"), "{line}");
        assert!(!is_mounted(&file));
        assert_eq!(fs::read(&file).unwrap(), b"not a dir");
    }

    // The volume is untouched: no session left behind, nothing created.
    let j = status_json(&vol);
    assert_eq!(j["sessions"].as_array().unwrap().len(), 0);
    assert_eq!(j["usage"]["inodes"], 1);

    // Already mounted: refused, and the existing mount keeps working.
    let m = vol.mount();
    fs::write(m.p("f"), b"still here").unwrap();
    for bg in [false, true] {
        let mut args = vec!["mount"];
        if bg {
            args.extend(["-d", "--log", logs]);
        }
        args.extend([vol.meta_url.as_str(), m.path.to_str().unwrap()]);
        let line = one_line_error(&run(&args));
        assert!(line.contains("already mounted"), "{line}");
        assert_eq!(mount_count(&m.path), 1, "a second mount was stacked");
    }
    assert_eq!(fs::read(m.p("f")).unwrap(), b"still here");
    let j = status_json(&vol);
    assert_eq!(
        j["sessions"].as_array().unwrap().len(),
        1,
        "a failed mount left a session"
    );
    fs::write(m.p("g"), b"works").unwrap();
    assert_eq!(fs::read(m.p("g")).unwrap(), b"works");
    m.unmount();
}

#[test]
fn umount_errors() {
    let tmp = tempdir();
    // Not mounted.
    let line = one_line_error(&run(&["umount", tmp.path().to_str().unwrap()]));
    assert!(line.contains("not mounted"), "{line}");
    // Missing.
    let line = one_line_error(&run(&[
        "umount",
        tmp.path().join("missing").to_str().unwrap(),
    ]));
    assert!(line.contains("not mounted"), "{line}");
    // Another file system: refused, left mounted.
    let mp = tmp.path().join("tmpfs");
    fs::create_dir(&mp).unwrap();
    nix::mount::mount(
        Some("unkai-test-tmpfs"),
        &mp,
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        Some("size=1m"),
    )
    .unwrap();
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
        }
    }
    let _guard = Unmount(mp.clone());
    let line = one_line_error(&run(&["umount", mp.to_str().unwrap()]));
    assert!(line.contains("not an unkai mount"), "{line}");
    assert!(is_mounted(&mp), "unkai umount unmounted a tmpfs");
}

// ---------------------------------------------------------------------------------------------
// status
// ---------------------------------------------------------------------------------------------

#[test]
fn status_shows_name_usage_and_mounts() {
    let vol = Volume::new();
    let (ok, text, err) = vol.cmd("status", &[]);
    assert!(ok, "{err}");
    assert!(text.contains("volume 'testvol'"), "{text}");
    assert!(text.contains(&vol.meta_url), "{text}");
    assert!(text.contains("mounts: none"), "{text}");
    let usage_line = |t: &str| {
        t.lines()
            .find(|l| l.starts_with("usage:"))
            .unwrap_or_else(|| panic!("no usage line: {t}"))
            .to_string()
    };
    let usage0 = usage_line(&text);
    let j = status_json(&vol);
    assert_eq!(j["format"]["name"], "testvol");
    assert_eq!(j["usage"]["inodes"], 1);
    assert_eq!(j["usage"]["bytes"], 0);
    assert_eq!(j["usage"]["objects"], 0);
    assert_eq!(j["sessions"].as_array().unwrap().len(), 0);

    let m = vol.mount();
    let (ok, text, err) = vol.cmd("status", &[]);
    assert!(ok, "{err}");
    let mounts: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with("mounts:"))
        .collect();
    assert!(
        mounts.iter().any(
            |l| l.contains(m.path.to_str().unwrap()) && l.contains(&format!("pid {}", m.pid()))
        ),
        "the active mount is not listed: {text}"
    );
    let j = status_json(&vol);
    let sessions = j["sessions"].as_array().unwrap();
    assert_eq!(sessions.len(), 1);
    assert_eq!(sessions[0]["pid"], m.pid());
    assert_eq!(sessions[0]["mountpoint"], m.path.to_str().unwrap());

    // Usage after writing 5 MiB (two 4 MiB blocks).
    fs::write(m.p("f"), pattern(5 << 20, 1)).unwrap();
    let j = status_json(&vol);
    assert_eq!(j["usage"]["inodes"], 2);
    let bytes = j["usage"]["bytes"].as_u64().unwrap();
    assert!(
        (5 << 20..(5 << 20) + 65536).contains(&bytes),
        "usage bytes {bytes} after writing 5 MiB"
    );
    // Two 4 MiB blocks, or more if a close of an inherited descriptor (another test's child)
    // committed the file in two slices.
    assert!(j["usage"]["objects"].as_u64().unwrap() >= 2, "{j}");
    let (_, text, _) = vol.cmd("status", &[]);
    assert_ne!(usage_line(&text), usage0, "the usage line did not change");

    m.unmount();
    let (ok, text, _) = vol.cmd("status", &[]);
    assert!(ok);
    assert!(text.contains("mounts: none"), "mount still listed: {text}");
    assert_eq!(status_json(&vol)["usage"]["inodes"], 2);
}

// ---------------------------------------------------------------------------------------------
// Background mounts, the default volume, umount
// ---------------------------------------------------------------------------------------------

#[test]
fn background_mount_returns_ready_and_umount_stops_it() {
    let vol = Volume::new();
    let tmp = tempdir();
    let (d, mp, log) = mount_daemon(&vol, tmp.path());
    // Ready on return: no waiting.
    assert!(
        is_mounted(&mp),
        "mount -d returned before the mount was ready"
    );
    assert!(alive(d.pid));
    assert_ne!(d.pid as u32, std::process::id());
    fs::write(mp.join("f"), b"from the daemon mount").unwrap();
    assert_eq!(fs::read(mp.join("f")).unwrap(), b"from the daemon mount");
    let j = status_json(&vol);
    assert_eq!(j["sessions"][0]["pid"], d.pid);
    assert!(log.exists(), "no log file written");

    let (ok, out, err) = run(&["umount", mp.to_str().unwrap()]);
    assert!(ok, "umount failed: {out}{err}");
    assert!(!is_mounted(&mp), "still mounted after umount returned");
    assert!(!alive(d.pid), "server still running after umount returned");
    drop(d);

    let m = vol.mount();
    assert_eq!(fs::read(m.p("f")).unwrap(), b"from the daemon mount");
}

#[test]
fn default_volume_is_created_and_mounted() {
    let tmp = tempdir();
    let dd = tmp.path().join("default");
    fs::create_dir(&dd).unwrap();
    let log = tmp.path().join("unkai.log");
    let mp = tmp.path().join("mp");
    fs::create_dir(&mp).unwrap();
    let env = [
        ("UNKAI_DEFAULT_DIR", dd.as_path()),
        ("UNKAI_LOG_FILE", log.as_path()),
    ];

    let (ok, out, err) = run_env(&["mount", "-d", mp.to_str().unwrap()], &env);
    assert!(ok, "mount -d MOUNTPOINT failed: {out}{err}");
    let d = Daemon::from_output(&mp, &out);
    assert!(is_mounted(&mp));
    assert!(
        dd.join("meta.db").is_file(),
        "no default volume in {}",
        dd.display()
    );
    fs::write(mp.join("hello"), b"default volume").unwrap();
    let (ok, out, err) = run_env(&["umount", mp.to_str().unwrap()], &env);
    assert!(ok, "{out}{err}");
    assert!(!is_mounted(&mp));
    drop(d);
    // The data went to the default volume's own bucket.
    assert!(
        dd.join("bucket").is_dir(),
        "no bucket beside the default volume"
    );

    // status without META-URL shows the default volume.
    let (ok, out, err) = run_env(&["status"], &env);
    assert!(ok, "{err}");
    assert!(out.contains("volume 'default'"), "{out}");
    assert!(out.contains("mounts: none"), "{out}");

    // Mounting again uses the same volume (not a new one).
    let (ok, out, err) = run_env(&["mount", "-d", mp.to_str().unwrap()], &env);
    assert!(ok, "second mount -d failed: {out}{err}");
    let d = Daemon::from_output(&mp, &out);
    assert_eq!(fs::read(mp.join("hello")).unwrap(), b"default volume");
    let (ok, out, err) = run_env(&["umount", mp.to_str().unwrap()], &env);
    assert!(ok, "{out}{err}");
    drop(d);
}

#[test]
fn umount_of_a_busy_mountpoint_fails_until_files_are_closed() {
    let vol = Volume::new();
    let m = vol.mount();
    fs::write(m.p("f"), b"open me").unwrap();
    let f = File::open(m.p("f")).unwrap();
    let line = one_line_error(&run(&["umount", m.path.to_str().unwrap()]));
    assert!(line.contains("busy"), "{line}");
    assert!(is_mounted(&m.path), "a busy mount was unmounted");
    let mut buf = [0u8; 7];
    f.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(&buf, b"open me");
    // A working directory inside also keeps it busy: checked with a child process.
    let mut child = Command::new("sleep")
        .arg("30")
        .current_dir(&m.path)
        .spawn()
        .unwrap();
    drop(f);
    let res = run(&["umount", m.path.to_str().unwrap()]);
    let _ = child.kill();
    let _ = child.wait();
    let line = one_line_error(&res);
    assert!(line.contains("busy"), "{line}");
    // Nothing open any more: umount works (and the server exits cleanly).
    m.unmount();
}

#[test]
fn sigterm_unmounts_a_foreground_mount_cleanly() {
    let vol = Volume::new();
    let tmp = tempdir();
    let mp = tmp.path().join("mp");
    fs::create_dir(&mp).unwrap();
    let mut fg = Foreground::start(&vol.meta_url, &mp, &tmp.path().join("log"));
    let big = pattern(9 << 20, 5);
    fs::write(mp.join("big"), &big).unwrap();
    fs::create_dir(mp.join("d")).unwrap();
    for i in 0..20 {
        fs::write(mp.join(format!("d/small{i}")), format!("small {i}")).unwrap();
    }
    fg.signal(nix::sys::signal::Signal::SIGTERM);
    let st = fg.wait();
    assert!(
        st.success(),
        "server exited with {st}; log:\n{}",
        fg.log_text()
    );
    assert!(!is_mounted(&mp), "still mounted after SIGTERM");
    let log = fg.log_text();
    assert!(!log.contains("ERROR"), "errors at shutdown:\n{log}");

    let m = vol.mount();
    assert!(fs::read(m.p("big")).unwrap() == big, "data lost");
    for i in 0..20 {
        assert_eq!(
            fs::read_to_string(m.p(&format!("d/small{i}"))).unwrap(),
            format!("small {i}")
        );
    }
    assert!(status_json(&vol)["sessions"].as_array().unwrap().len() == 1);
}

#[test]
fn sigterm_with_a_file_still_open_loses_nothing() {
    let vol = Volume::new();
    let tmp = tempdir();
    let mp = tmp.path().join("mp");
    fs::create_dir(&mp).unwrap();
    let mut fg = Foreground::start(&vol.meta_url, &mp, &tmp.path().join("log"));
    let data = pattern(6 << 20, 6);
    let mut f = File::create(mp.join("open")).unwrap();
    f.write_all(&data).unwrap();
    fg.signal(nix::sys::signal::Signal::SIGTERM);
    // The mount is detached from the tree; the open file keeps working until closed.
    let start = Instant::now();
    while is_mounted(&mp) && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!is_mounted(&mp), "not detached after SIGTERM");
    f.write_all(b"written after SIGTERM").unwrap();
    drop(f);
    let st = fg.wait();
    assert!(
        st.success(),
        "server exited with {st}; log:\n{}",
        fg.log_text()
    );

    let m = vol.mount();
    let mut want = data.clone();
    want.extend_from_slice(b"written after SIGTERM");
    let got = fs::read(m.p("open")).unwrap();
    assert_eq!(got.len(), want.len(), "file length after SIGTERM");
    assert!(got == want, "data lost after SIGTERM");
}

// ---------------------------------------------------------------------------------------------
// Help
// ---------------------------------------------------------------------------------------------

#[test]
fn help_of_every_subcommand_has_an_example() {
    for sub in [
        "format", "mount", "umount", "status", "config", "destroy", "clone",
    ] {
        let (ok, out, err) = run(&[sub, "--help"]);
        assert!(ok, "{sub} --help failed: {err}");
        assert!(
            out.contains("Example"),
            "{sub} --help has no example:\n{out}"
        );
        assert!(
            out.lines()
                .any(|l| l.trim_start().starts_with(&format!("unkai {sub} "))),
            "{sub} --help has no example line `unkai {sub} ...`:\n{out}"
        );
    }
    let (ok, out, _) = run(&["--help"]);
    assert!(ok);
    assert!(out.contains("Example"), "{out}");
    // A mistyped subcommand or flag fails (clap's usage error, non-zero exit).
    let (ok, _, err) = run(&["mount", "--no-such-flag"]);
    assert!(!ok);
    assert!(err.contains("--no-such-flag"), "{err}");
}

// ---------------------------------------------------------------------------------------------
// Rough edges of issue 12: what a user reads on the way
// ---------------------------------------------------------------------------------------------

#[test]
fn mount_usage_names_the_mountpoint_as_required() {
    let (ok, out, err) = run(&["mount", "--help"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("[META-URL] <MOUNTPOINT>"),
        "usage does not show MOUNTPOINT as the required argument:\n{out}"
    );
    // A META-URL alone: the mountpoint was forgotten, not a directory named like a URL.
    let tmp = tempdir();
    let url = format!("sqlite://{}/vol.db", tmp.path().display());
    let line = one_line_error(&run(&["mount", &url]));
    assert!(line.contains("no MOUNTPOINT"), "{line}");
    assert!(!line.contains("mkdir"), "{line}");
    // Help of format lists the object stores, bench's points inside the repository.
    let (ok, out, _) = run(&["format", "--help"]);
    assert!(ok && out.contains("s3://") && out.contains("gs://") && out.contains("az://"));
    let (ok, out, _) = run(&["bench", "--help"]);
    assert!(ok && !out.contains("SUITE.md") && out.contains("docs/benchmarks.md"));
}

#[test]
fn quiet_clean_unmount_and_a_warning_over_a_non_empty_directory() {
    let vol = Volume::new();
    let tmp = tempdir();
    let mp = tmp.path().join("mp");
    fs::create_dir(&mp).unwrap();
    fs::write(mp.join("hidden"), b"under the mount").unwrap();
    let mut fg = Foreground::start(&vol.meta_url, &mp, &tmp.path().join("log"));
    assert!(!mp.join("hidden").exists(), "the mount is not over mp");
    // Unmounted from outside, as umount(8) does; nothing was written.
    nix::mount::umount(&mp).unwrap();
    let st = fg.wait();
    assert!(st.success(), "{st}; log:\n{}", fg.log_text());
    let log = fg.log_text();
    assert!(
        log.contains("is not empty"),
        "no warning about the non-empty mountpoint:\n{log}"
    );
    assert!(!log.contains("Failed to umount"), "{log}");
    assert!(
        !log.contains("write amplification"),
        "an amplification of nothing was reported:\n{log}"
    );
    assert_eq!(fs::read(mp.join("hidden")).unwrap(), b"under the mount");
}

#[test]
fn a_killed_client_not_yet_reaped_does_not_make_the_next_mount_shared() {
    let vol = Volume::new();
    let tmp = tempdir();
    let mp = tmp.path().join("mp");
    fs::create_dir(&mp).unwrap();
    let fg = Foreground::start(&vol.meta_url, &mp, &tmp.path().join("log"));
    fg.signal(nix::sys::signal::Signal::SIGKILL);
    // Not reaped (a zombie, as under a parent that has not waited yet): its /proc entry stays.
    assert!(
        eventually(Duration::from_secs(30), || !alive(fg.pid())),
        "the killed mount did not exit"
    );
    assert!(Path::new(&format!("/proc/{}", fg.pid())).exists());
    let m = vol.mount();
    let log = m.log_text();
    assert!(
        log.contains("this mount has the volume to itself"),
        "a dead client kept the next mount on shared TTLs:\n{log}"
    );
    drop(m);
    drop(fg);
}

/// A mount of an SQLite volume that started alone lowers its kernel TTLs when another mount
/// comes (a name the other creates shows within seconds, not after the 30 s of a lone
/// mount), and raises them again when it goes (or when a dead client is cleaned up later).
#[test]
fn kernel_ttls_follow_other_mounts_coming_and_going() {
    let vol = Volume::new();
    let a = vol.mount();
    assert!(a.log_text().contains("this mount has the volume to itself"));
    let b = vol.mount();
    a.wait_noticed_another_client("the second mount");
    // A miss now stays in the first kernel for a TTL: short, so the other's file shows.
    assert!(!a.p("n").exists());
    fs::write(b.p("n"), b"from b").unwrap();
    assert!(
        eventually(Duration::from_secs(15), || a.p("n").exists()),
        "a name created on the other mount stayed hidden (a lone mount's 30 s TTL)"
    );
    drop(b);
    assert!(
        a.logs(
            "this mount now has the volume to itself",
            Duration::from_secs(60)
        ),
        "TTLs stayed short after the other mount went:\n{}",
        a.log_text()
    );
}

#[test]
fn a_damaged_metadata_database_is_refused_at_mount_and_named_by_fsck() {
    let vol = Volume::with_args(&[]);
    let m = vol.mount();
    for d in 0..20 {
        fs::create_dir(m.p(&format!("d{d}"))).unwrap();
        for i in 0..100 {
            fs::write(m.p(&format!("d{d}/file-with-a-longish-name-{i}")), b"x").unwrap();
        }
    }
    m.unmount();
    // Garbage over the second half of the database file (its first pages, the header and
    // the settings, stay readable: the volume still opens).
    let db = vol.dir.path().join("meta.db");
    assert!(
        !vol.dir.path().join("meta.db-wal").exists() || {
            fs::metadata(vol.dir.path().join("meta.db-wal"))
                .unwrap()
                .len()
                == 0
        }
    );
    let len = fs::metadata(&db).unwrap().len();
    assert!(len > 64 << 10, "database of {len} bytes");
    let f = fs::OpenOptions::new().write(true).open(&db).unwrap();
    f.write_all_at(&vec![0xa5; (len / 2) as usize], len / 2)
        .unwrap();
    drop(f);

    let tmp = tempdir();
    let mp = tmp.path().join("mp");
    fs::create_dir(&mp).unwrap();
    let line = one_line_error(&run(&["mount", &vol.meta_url, mp.to_str().unwrap()]));
    assert!(
        line.contains("damaged") && line.contains("unkai fsck"),
        "{line}"
    );
    assert!(!is_mounted(&mp));
    let (ok, out, err) = vol.cmd("fsck", &[]);
    assert!(!ok, "fsck passed a damaged database: {out}{err}");
    assert!(out.contains("damaged database"), "{out}{err}");
}

/// The log of an unmount counts the FUSE requests served, by kind: a scripted sequence
/// moves each count by what it asked of the kernel.
#[test]
fn unmount_logs_the_fuse_requests_served() {
    let vol = Volume::new();
    let m = vol.mount();
    let log = m.log.clone();
    fs::create_dir(m.p("d")).unwrap();
    for i in 0..20 {
        fs::write(m.p(&format!("d/f{i}")), b"x").unwrap();
    }
    for i in 0..20 {
        fs::remove_file(m.p(&format!("d/f{i}"))).unwrap();
    }
    fs::remove_dir(m.p("d")).unwrap();
    m.unmount();
    let text = fs::read_to_string(&log).unwrap();
    let line = text
        .lines()
        .rfind(|l| l.contains("FUSE requests: "))
        .unwrap_or_else(|| panic!("no request summary:\n{}", tail(&text, 20)));
    // "... FUSE requests: N (kind n, kind n, ...)"
    let inner = line.rsplit_once('(').unwrap().1.trim_end_matches(')');
    let count = |kind: &str| -> u64 {
        inner
            .split(", ")
            .find_map(|kv| kv.strip_prefix(&format!("{kind} ")))
            .map_or(0, |n| n.parse().unwrap())
    };
    assert_eq!(
        (
            count("mkdir"),
            count("create"),
            count("unlink"),
            count("rmdir")
        ),
        (1, 20, 20, 1),
        "{line}"
    );
    assert!(count("write") >= 20 && count("release") >= 20, "{line}");
    let total: u64 = line
        .split("FUSE requests: ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap();
    let sum: u64 = inner
        .split(", ")
        .map(|kv| kv.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(total, sum, "{line}");
    // And the daemon's time answering them, by kind.
    let time = text
        .lines()
        .rfind(|l| l.contains("FUSE request time: "))
        .unwrap_or_else(|| panic!("no request time summary:\n{}", tail(&text, 20)));
    assert!(
        time.contains("create ") && time.contains(" µs each"),
        "{time}"
    );
}

// ---------------------------------------------------------------------------------------------
// Issue 16: config, destroy, sizes with units
// ---------------------------------------------------------------------------------------------

/// One day of trash is "1 day" wherever a command says it (was "trash: 1 days"), and a
/// mount of the volume runs with it.
#[test]
fn one_day_of_trash_is_said_in_the_singular() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/meta.db", dir.path().display());
    let env = with_cache_dir(Vec::new(), dir.path());
    let (ok, out, err) = common::run_env(&["format", "--trash-days", "1", &url, "one"], &env);
    assert!(ok, "{out}{err}");
    assert!(out.contains("trash: 1 day\n"), "format: {out}");
    let vol = Volume {
        dir,
        meta_url: url.clone(),
        name: "one".into(),
        env,
        db: None,
    };
    let m = vol.mount();
    fs::write(m.p("f"), b"x").unwrap();
    let (ok, out, err) = vol.cmd("status", &[]);
    assert!(
        ok && out.contains("trash: 1 day ") && !out.contains("1 days"),
        "status: {out}{err}"
    );
    let (ok, out, err) = vol.cmd("config", &[]);
    assert!(
        ok && out.contains("trash:      1 day\n"),
        "config: {out}{err}"
    );
    let (ok, _, err) = vol.cmd("config", &["--trash-days", "3"]);
    assert!(ok && err.contains("trash: 1 day -> 3 days"), "{err}");
    m.unmount();
}

#[test]
fn config_shows_and_changes_settings_and_refuses_fixed_ones() {
    let vol = Volume::with_args(&["--trash-days", "2"]);
    let fmt = |vol: &Volume| -> serde_json::Value {
        let (ok, out, err) = vol.cmd("config", &["--json"]);
        assert!(ok, "config --json: {out}{err}");
        serde_json::from_str(&out).unwrap()
    };
    let before = fmt(&vol);
    assert_eq!(before["trash_days"], 2);
    assert_eq!(before["capacity"], 0);
    let (ok, out, err) = vol.cmd(
        "config",
        &[
            "--trash-days",
            "7",
            "--capacity",
            "100G",
            "--inodes",
            "1000",
        ],
    );
    assert!(ok, "config: {out}{err}");
    assert!(err.contains("trash: 2 days -> 7 days"), "{err}");
    assert!(out.contains("100.0 GiB"), "{out}");
    let after = fmt(&vol);
    assert_eq!(after["trash_days"], 7);
    assert_eq!(after["capacity"], 100u64 << 30);
    assert_eq!(after["inodes"], 1000);
    assert_eq!(after["uuid"], before["uuid"], "the same volume");
    // Kept: status reads the same settings.
    let st = status_json(&vol);
    assert_eq!(st["format"]["capacity"], 100u64 << 30);

    // What cannot change is refused in one line, and nothing changes.
    let e = one_line_error(&vol.cmd("config", &["--block-size", "1M"]));
    assert!(e.contains("block size cannot change"), "{e}");
    // A bare number where JuiceFS means GiB is refused with a hint.
    let e = one_line_error(&vol.cmd("config", &["--capacity", "100"]));
    assert!(e.contains("--capacity 100G"), "{e}");
    assert_eq!(fmt(&vol), after);
    let e = one_line_error(&run(&[
        "format",
        "--block-size",
        "4096",
        "sqlite:///nonexistent-dir-for-unkai/m.db",
        "v",
    ]));
    assert!(e.contains("--block-size 4096K"), "{e}");
}

#[test]
fn destroy_refuses_while_mounted_then_removes_metadata_and_objects() {
    let vol = Volume::new();
    let uuid = status_json(&vol)["format"]["uuid"]
        .as_str()
        .unwrap()
        .to_string();
    let destroy = |vol: &Volume, uuid: &str, yes: bool| {
        let mut args = vec!["destroy"];
        if yes {
            args.push("--yes");
        }
        args.push(&vol.meta_url);
        args.push(uuid);
        common::run_env(&args, &vol.env)
    };
    let m = vol.mount();
    fs::write(m.p("f"), vec![1u8; 300_000]).unwrap();
    fs::create_dir(m.p("d")).unwrap();
    fs::write(m.p("d/g"), vec![2u8; 5_000_000]).unwrap();
    let e = one_line_error(&destroy(&vol, &uuid, true));
    assert!(e.contains("mounted by 1 client"), "{e}");
    assert_eq!(fs::read(m.p("f")).unwrap(), vec![1u8; 300_000], "untouched");
    m.unmount();
    assert!(!vol.objects().is_empty());

    let e = one_line_error(&destroy(&vol, "not-its-id", true));
    assert!(e.contains("not not-its-id"), "{e}");
    let e = one_line_error(&destroy(&vol, &uuid, false));
    assert!(e.contains("--yes"), "{e}");
    assert!(!vol.objects().is_empty(), "refused: nothing deleted");

    let (ok, out, err) = destroy(&vol, &uuid, true);
    assert!(ok, "destroy: {out}{err}");
    assert!(out.contains("objects deleted"), "{out}");
    assert!(
        vol.objects().is_empty(),
        "objects left: {:?}",
        vol.objects()
    );
    let e = one_line_error(&vol.cmd("status", &[]));
    assert!(e.contains("not formatted"), "{e}");
}

#[test]
fn clone_shares_data_and_diverges_on_write() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let vol = Volume::new();
    let m = vol.mount();
    fs::create_dir_all(m.p("t/sub")).unwrap();
    let big = pattern(5_000_000, 7);
    fs::write(m.p("t/big"), &big).unwrap();
    fs::write(m.p("t/sub/small"), b"hello").unwrap();
    fs::hard_link(m.p("t/big"), m.p("t/sub/link")).unwrap();
    std::os::unix::fs::symlink("../big", m.p("t/sub/sym")).unwrap();
    fs::set_permissions(m.p("t/sub/small"), fs::Permissions::from_mode(0o640)).unwrap();
    common::xattr::setxattr(&m.p("t/sub/small"), "user.k", b"v1", 0).unwrap();
    m.unmount();
    let before = vol.objects();

    let m = vol.mount();
    let src = m.p("t");
    let dst = m.p("t2");
    let (ok, out, err) = common::run_env(
        &["clone", src.to_str().unwrap(), dst.to_str().unwrap()],
        &vol.env,
    );
    assert!(ok, "clone: {out}{err}");
    assert_eq!(fs::read(m.p("t2/big")).unwrap(), big);
    assert_eq!(fs::read(m.p("t2/sub/small")).unwrap(), b"hello");
    assert_eq!(
        fs::read_link(m.p("t2/sub/sym")).unwrap(),
        Path::new("../big")
    );
    let (a, b) = (
        fs::metadata(m.p("t2/big")).unwrap(),
        fs::metadata(m.p("t2/sub/link")).unwrap(),
    );
    assert_eq!((a.ino(), a.nlink()), (b.ino(), 2), "hard links stay linked");
    assert_ne!(a.ino(), fs::metadata(m.p("t/big")).unwrap().ino());
    assert_eq!(
        fs::metadata(m.p("t2/sub/small")).unwrap().mode() & 0o777,
        0o640
    );
    assert_eq!(
        common::xattr::getxattr(&m.p("t2/sub/small"), "user.k").unwrap(),
        b"v1"
    );
    // Into itself, over an existing path, or off the mount: one-line errors.
    let e = one_line_error(&common::run_env(
        &[
            "clone",
            src.to_str().unwrap(),
            m.p("t/in").to_str().unwrap(),
        ],
        &vol.env,
    ));
    assert!(e.contains("into itself"), "{e}");
    let e = one_line_error(&common::run_env(
        &["clone", src.to_str().unwrap(), dst.to_str().unwrap()],
        &vol.env,
    ));
    assert!(e.contains("exists"), "{e}");
    let elsewhere = tempdir();
    let e = one_line_error(&common::run_env(
        &[
            "clone",
            src.to_str().unwrap(),
            elsewhere.path().join("x").to_str().unwrap(),
        ],
        &vol.env,
    ));
    assert!(e.contains("different file systems"), "{e}");
    m.unmount();
    assert_eq!(vol.objects(), before, "a clone stores no data of its own");

    // Written, the clone diverges; the source keeps its bytes.
    let m = vol.mount();
    let f = fs::OpenOptions::new()
        .write(true)
        .open(m.p("t2/big"))
        .unwrap();
    f.write_all_at(b"CHANGED", 1000).unwrap();
    drop(f);
    assert_eq!(fs::read(m.p("t/big")).unwrap(), big);
    let mut want = big.clone();
    want[1000..1007].copy_from_slice(b"CHANGED");
    assert_eq!(fs::read(m.p("t2/big")).unwrap(), want);
}

#[test]
fn sighup_reopens_a_daemons_log_and_the_volume_stays_mounted() {
    let vol = Volume::new();
    let tmp = tempdir();
    let (d, mp, log) = mount_daemon(&vol, tmp.path());
    // What logrotate does: move the file away, then SIGHUP.
    let rotated = tmp.path().join("daemon.log.1");
    fs::rename(&log, &rotated).unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(d.pid),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
    assert!(
        eventually(Duration::from_secs(30), || fs::read_to_string(&log)
            .is_ok_and(|t| t.contains("reopened"))),
        "no new log file after SIGHUP"
    );
    assert!(is_mounted(&mp), "SIGHUP unmounted the volume");
    assert!(alive(d.pid));
    fs::write(mp.join("f"), b"still here").unwrap();
    assert_eq!(fs::read(mp.join("f")).unwrap(), b"still here");
    let (ok, out, err) = run(&["umount", mp.to_str().unwrap()]);
    assert!(ok, "umount failed: {out}{err}");
    assert!(
        fs::read_to_string(&log).unwrap().contains("unmount"),
        "the daemon kept writing to the old file"
    );
    assert!(!fs::read_to_string(&rotated).unwrap().contains("SIGHUP"));
    drop(d);
}
