//! Shared harness of the integration tests: real volumes in temporary directories, mounted
//! with the real binary, and always unmounted (a guard unmounts on drop, failure included).
#![allow(dead_code)]

pub mod clamd;
pub mod fronts;
pub mod postgres;
pub mod rng;
pub mod servers;
pub mod xattr;

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::CString;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The unkai binary under test. Volumes it formats keep no trash unless a test asks
/// (`--trash-days`, or its own `UNKAI_TRASH_DAYS`): most tests count what a deletion frees.
pub fn unkai() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_unkai"));
    c.env("UNKAI_TRASH_DAYS", "0");
    c
}

/// Set in a test process started by [`in_own_process`].
const OWN_PROCESS_ENV: &str = "UNKAI_TEST_OWN_PROCESS";

/// Runs test `name` (this test binary's) again in a process of its own, where no other test
/// runs, and says whether it did (the caller then returns): `false` in that process, which
/// runs the test's body. For a test that must not share its process with tests that start
/// programs: every fork copies the process's descriptors, and the child's exec or exit
/// closes them, a close the kernel passes on to a FUSE file (FLUSH, which commits what was
/// written so far) though the test's own descriptor stays open. Fails if the test fails
/// there, with its output.
pub fn in_own_process(name: &str) -> bool {
    if std::env::var_os(OWN_PROCESS_ENV).is_some() {
        return false;
    }
    let out = Command::new(std::env::current_exe().expect("the test binary"))
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(OWN_PROCESS_ENV, "1")
        .stdin(Stdio::null())
        .output()
        .expect("run the test in a process of its own");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "{name} in a process of its own ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    true
}

/// Runs unkai with `args`; returns (exit success, stdout, stderr).
pub fn run(args: &[&str]) -> (bool, String, String) {
    run_env(args, &[])
}

/// Runs unkai with `args` and extra environment variables.
pub fn run_env(args: &[&str], env: &[(String, String)]) -> (bool, String, String) {
    let out = unkai()
        .args(args)
        .envs(env.iter().cloned())
        .output()
        .expect("run unkai");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Instantiates each test body `name(&Volume)` once per engine (modules `on_sqlite` and
/// `on_postgres`; the latter skipped when PostgreSQL tests are off), on a volume whose
/// commands and mounts get the environment given: `both_engines!(name(Vec::new()), ...)`.
#[macro_export]
macro_rules! both_engines {
    ($($name:ident($env:expr)),* $(,)?) => {
        mod on_sqlite {
            $(
                #[test]
                fn $name() {
                    super::$name(&super::Volume::with_env(&[], $env))
                }
            )*
        }
        mod on_postgres {
            $(
                #[test]
                fn $name() {
                    match super::Volume::postgres(&[], |u| u.to_string(), $env) {
                        Some(vol) => super::$name(&vol),
                        None => eprintln!("skipped: UNKAI_TEST_POSTGRES is unset"),
                    }
                }
            )*
        }
    };
}

/// Every file under `dir`, at any depth, except those whose name starts with '.'.
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    fn walk(d: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else if !p.file_name().unwrap().to_string_lossy().starts_with('.') {
                out.push(p);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, &mut out);
    out
}

/// Every file under `dir` (hidden ones too) with its contents, by relative path.
pub fn contents_under(dir: &Path) -> BTreeMap<String, Vec<u8>> {
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

/// `env` with the volume's cache directory (staging) inside its own temporary directory.
pub fn with_cache_dir(mut env: Vec<(String, String)>, dir: &Path) -> Vec<(String, String)> {
    if !env.iter().any(|(k, _)| k == "UNKAI_CACHE_DIR") {
        env.push((
            "UNKAI_CACHE_DIR".into(),
            dir.join("cache").display().to_string(),
        ));
    }
    env
}

/// A formatted volume in its own temporary directory: `meta.db` and `bucket/`.
pub struct Volume {
    pub dir: tempfile::TempDir,
    pub meta_url: String,
    pub name: String,
    /// Environment of every command and mount of this volume (credentials, endpoints).
    pub env: Vec<(String, String)>,
    /// The PostgreSQL database holding the metadata, if any (dropped after the volume).
    pub db: Option<postgres::TestDb>,
}

impl Volume {
    /// Formats a volume with default settings: SQLite metadata, or PostgreSQL when
    /// UNKAI_TEST_ENGINE=postgres (scripts/test.sh runs the conformance suite both ways).
    pub fn new() -> Volume {
        if std::env::var("UNKAI_TEST_ENGINE").as_deref() == Ok("postgres") {
            return Self::postgres(&[], |u| u.to_string(), Vec::new())
                .expect("UNKAI_TEST_ENGINE=postgres needs UNKAI_TEST_POSTGRES");
        }
        Self::with_args(&[])
    }

    /// Formats a volume, passing extra `format` flags (e.g. `["--block-size", "64K"]`).
    pub fn with_args(extra: &[&str]) -> Volume {
        Self::with_env(extra, Vec::new())
    }

    /// Formats a volume with extra `format` flags and an environment for all its commands
    /// (e.g. a storage server's credentials: see `servers`).
    pub fn with_env(extra: &[&str], env: Vec<(String, String)>) -> Volume {
        let dir = tempfile::Builder::new()
            .prefix("unkai-test-")
            .tempdir()
            .expect("tempdir");
        let meta_url = format!("sqlite://{}/meta.db", dir.path().display());
        let name = "testvol".to_string();
        let env = with_cache_dir(env, dir.path());
        let mut args = vec!["format"];
        args.extend_from_slice(extra);
        args.push(&meta_url);
        args.push(&name);
        let (ok, out, err) = run_env(&args, &env);
        assert!(ok, "format failed: {out}{err}");
        Volume {
            dir,
            meta_url,
            name,
            env,
            db: None,
        }
    }

    /// Formats a volume whose metadata lives in a fresh PostgreSQL database (None when
    /// PostgreSQL tests are off) and whose data lives in `bucket/` of a temporary directory
    /// (unless `extra` gives a `--storage`).
    /// The URL given to every command is `meta_url(db URL)`; `env` goes with them too.
    pub fn postgres(
        extra: &[&str],
        meta_url: impl Fn(&str) -> String,
        env: Vec<(String, String)>,
    ) -> Option<Volume> {
        Some(Volume::postgres_in(
            postgres::database()?,
            extra,
            meta_url,
            env,
        ))
    }

    /// As [`Volume::postgres`], in the database `db` (e.g. on a server with TLS).
    pub fn postgres_in(
        db: postgres::TestDb,
        extra: &[&str],
        meta_url: impl Fn(&str) -> String,
        env: Vec<(String, String)>,
    ) -> Volume {
        let dir = tempfile::Builder::new()
            .prefix("unkai-test-")
            .tempdir()
            .expect("tempdir");
        let meta_url = meta_url(&db.url);
        let name = "testvol".to_string();
        let env = with_cache_dir(env, dir.path());
        let storage = format!("file://{}/bucket", dir.path().display());
        let mut args = vec!["format"];
        // Unless the test gives a bucket of its own.
        if !extra.contains(&"--storage") {
            args.extend(["--storage", &storage]);
        }
        args.extend_from_slice(extra);
        args.push(&meta_url);
        args.push(&name);
        let (ok, out, err) = run_env(&args, &env);
        assert!(ok, "format failed: {out}{err}");
        Volume {
            dir,
            meta_url,
            name,
            env,
            db: Some(db),
        }
    }

    pub fn bucket(&self) -> PathBuf {
        self.dir.path().join("bucket")
    }

    /// Every object file in the bucket (block objects only, the probe aside).
    pub fn objects(&self) -> Vec<PathBuf> {
        // NAME/chunks/... (layout 0) or NAME/UUID/chunks/... (layout 1).
        let mut out = files_under(&self.bucket().join(&self.name));
        out.sort();
        out
    }

    /// Mounts the volume (the server runs as a child process in the foreground).
    pub fn mount(&self) -> Mount {
        self.mount_with(&[])
    }

    /// Mounts with extra `mount` flags.
    pub fn mount_with(&self, extra: &[&str]) -> Mount {
        let mp = tempfile::Builder::new()
            .prefix("unkai-mnt-")
            .tempdir()
            .expect("tempdir");
        Mount::start(
            &self.meta_url,
            mp,
            extra,
            &self.dir.path().join("mount.log"),
            &self.env,
        )
    }

    /// Mounts with extra `mount` flags and extra environment (after the volume's), logging
    /// to `log` in the volume's directory (so that each mount of several has its own log).
    pub fn mount_as(&self, extra: &[&str], env: &[(&str, &str)], log: &str) -> Mount {
        let mp = tempfile::Builder::new()
            .prefix("unkai-mnt-")
            .tempdir()
            .expect("tempdir");
        let mut all = self.env.clone();
        all.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        Mount::start(&self.meta_url, mp, extra, &self.dir.path().join(log), &all)
    }

    /// `unkai <cmd> META-URL [args]`.
    pub fn cmd(&self, cmd: &str, extra: &[&str]) -> (bool, String, String) {
        let mut args = vec![cmd];
        args.extend_from_slice(extra);
        args.push(&self.meta_url);
        run_env(&args, &self.env)
    }
}

/// A mounted volume; unmounted (and its server stopped) on drop.
pub struct Mount {
    pub path: PathBuf,
    child: Option<Child>,
    _dir: Option<tempfile::TempDir>,
    pub log: PathBuf,
}

fn mounted(path: &Path) -> bool {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let p = path.to_string_lossy().replace(' ', "\\040");
    info.lines()
        .any(|l| l.split(' ').nth(4) == Some(p.as_str()))
}

impl Mount {
    fn start(
        meta_url: &str,
        dir: tempfile::TempDir,
        extra: &[&str],
        log: &Path,
        env: &[(String, String)],
    ) -> Mount {
        let path = std::fs::canonicalize(dir.path()).unwrap();
        let logf = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap();
        let mut cmd = unkai();
        cmd.arg("mount")
            .args(extra)
            .arg(meta_url)
            .arg(&path)
            .envs(env.iter().cloned());
        cmd.stdin(Stdio::null())
            .stdout(logf.try_clone().unwrap())
            .stderr(logf);
        let mut child = cmd.spawn().expect("spawn unkai mount");
        let start = Instant::now();
        while !mounted(&path) {
            if let Ok(Some(st)) = child.try_wait() {
                panic!(
                    "unkai mount exited ({st}) before mounting; log:\n{}",
                    std::fs::read_to_string(log).unwrap_or_default()
                );
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "mount did not appear in 30s"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        // In the table before it serves: flags set by a remount after the mount (strictatime,
        // nodiratime, nosymfollow) may not be there yet. Its root's attributes come from the
        // server, which answers only once the mount is complete.
        if let Err(e) = std::fs::metadata(&path) {
            let _ = child.kill();
            let _ = child.wait();
            let _ = nix::mount::umount2(&path, nix::mount::MntFlags::MNT_DETACH);
            panic!(
                "the new mount's root: {e}; log:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        Mount {
            path,
            child: Some(child),
            _dir: Some(dir),
            log: log.to_path_buf(),
        }
    }

    pub fn p(&self, rel: &str) -> PathBuf {
        self.path.join(rel)
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// Unmounts cleanly (as `unkai umount` does) and waits for the server to exit;
    /// panics if either fails. The directory is kept for a later mount.
    pub fn unmount(mut self) -> PathBuf {
        // Tests run in threads of one process: a child forked by another test holds copies
        // of this test's descriptors until it execs, so "busy" may pass in a moment.
        let start = Instant::now();
        loop {
            let (ok, out, err) = run(&["umount", self.path.to_str().unwrap()]);
            if ok {
                break;
            }
            let busy = err.contains("is busy");
            assert!(
                busy && start.elapsed() < Duration::from_secs(10),
                "umount failed: {out}{err}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let st = self.child.take().unwrap().wait().unwrap();
        assert!(
            st.success(),
            "server exited with {st}; log:\n{}",
            self.log_text()
        );
        self.path.clone()
    }

    /// Kills the server with SIGKILL (a crash) and clears the dead mount.
    pub fn kill9(mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = nix::mount::umount2(&self.path, nix::mount::MntFlags::MNT_DETACH);
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Whether a line this mount's process logged says `text` within `limit`. Only its own
    /// lines (each names the process): mounts of one volume may share a log file, and a wait
    /// answered by an earlier mount's line went on before this mount was ready.
    pub fn logs(&self, text: &str, limit: Duration) -> bool {
        let tag = format!("[{}]", self.pid());
        eventually(limit, || {
            self.log_text()
                .lines()
                .any(|l| l.contains(&tag) && l.contains(text))
        })
    }

    /// Waits (60 s at most) until this mount, which started alone on its SQLite volume, has
    /// noticed another mount (its check of sessions runs every 2 s): until then it answers from
    /// memory and gives its kernel a lone mount's 30 s, so only changes after it are promised
    /// to show within a second or two. `what` names the other mount in the failure.
    pub fn wait_noticed_another_client(&self, what: &str) {
        assert!(
            self.logs("another client mounted the volume", Duration::from_secs(60)),
            "{} never noticed {what}:\n{}",
            self.path.display(),
            self.log_text()
        );
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if mounted(&self.path)
            && nix::mount::umount2(&self.path, nix::mount::MntFlags::empty()).is_err()
        {
            let _ = nix::mount::umount2(&self.path, nix::mount::MntFlags::MNT_DETACH);
        }
        let start = Instant::now();
        loop {
            match child.try_wait() {
                Ok(Some(_)) => break,
                Ok(None) if start.elapsed() < Duration::from_secs(30) => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
            }
        }
        if mounted(&self.path) {
            let _ = nix::mount::umount2(&self.path, nix::mount::MntFlags::MNT_DETACH);
        }
    }
}

/// Mounts again at a fresh mountpoint (after `unmount` or `kill9`).
pub fn remount(vol: &Volume) -> Mount {
    vol.mount()
}

/// Deterministic pseudo-random bytes.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// Runs `f` in a child process with the given uid/gid (for permission tests: root bypasses
/// most checks). Returns the child's result: Ok(()) or Err(errno).
pub fn as_user(uid: u32, gid: u32, f: impl FnOnce() -> Result<(), i32>) -> Result<(), i32> {
    use nix::unistd::{ForkResult, fork};
    // SAFETY: the child only runs `f` and exits; tests call this from a single thread.
    match unsafe { fork() }.expect("fork") {
        ForkResult::Child => {
            let code = (|| {
                nix::unistd::setgroups(&[nix::unistd::Gid::from_raw(gid)]).ok();
                if nix::unistd::setgid(nix::unistd::Gid::from_raw(gid)).is_err()
                    || nix::unistd::setuid(nix::unistd::Uid::from_raw(uid)).is_err()
                {
                    return 255;
                }
                match f() {
                    Ok(()) => 0,
                    Err(e) => e.clamp(1, 254),
                }
            })();
            unsafe { libc::_exit(code) };
        }
        ForkResult::Parent { child } => {
            match nix::sys::wait::waitpid(child, None).expect("waitpid") {
                nix::sys::wait::WaitStatus::Exited(_, 0) => Ok(()),
                nix::sys::wait::WaitStatus::Exited(_, 255) => {
                    panic!("could not switch to uid {uid}")
                }
                nix::sys::wait::WaitStatus::Exited(_, c) => Err(c),
                other => panic!("child ended with {other:?}"),
            }
        }
    }
}

/// The errno of an io::Error.
pub fn errno(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(0)
}

/// A path as a C string, for libc calls.
pub fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("path with NUL")
}

/// Drops the kernel's clean page cache of a file, so that the next reads reach the file system.
pub fn drop_cache(f: &File) {
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
}

/// fallocate(2).
pub fn fallocate(f: &File, mode: i32, off: u64, len: u64) -> std::io::Result<()> {
    let r = unsafe { libc::fallocate(f.as_raw_fd(), mode, off as i64, len as i64) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The names in a directory, via std (which skips "." and ".."; invalid UTF-8 replaced).
pub fn names(p: &Path) -> BTreeSet<String> {
    std::fs::read_dir(p)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

/// The last `lines` lines of `s`.
pub fn tail(s: &str, lines: usize) -> String {
    let v: Vec<&str> = s.lines().collect();
    v[v.len().saturating_sub(lines)..].join("\n")
}

/// Waits (at most `limit`) until `f` holds, trying every 50 ms; returns whether it did. For
/// what another mount may show only once its kernel cache expires (the attr/entry TTLs, 1 s by
/// default).
pub fn eventually(limit: Duration, f: impl FnMut() -> bool) -> bool {
    eventually_every(limit, Duration::from_millis(50), f)
}

/// `eventually`, trying every `poll`.
pub fn eventually_every(limit: Duration, poll: Duration, mut f: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    loop {
        if f() {
            return true;
        }
        if start.elapsed() > limit {
            return false;
        }
        std::thread::sleep(poll);
    }
}

/// A small tmpfs, unmounted on drop.
pub struct SmallDisk {
    pub path: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl SmallDisk {
    pub fn new(size: &str) -> SmallDisk {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_path_buf();
        nix::mount::mount(
            Some("tmpfs"),
            &path,
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            Some(format!("size={size}").as_str()),
        )
        .expect("mount tmpfs");
        SmallDisk { path, _dir: dir }
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.path, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// An ext4 file system of `mib` MiB on a loop device, mounted in a temporary directory (no
/// blocks reserved for root, so that what `df` shows free is what anyone can write);
/// unmounted on drop, failure included (which frees the loop device: `mount -o loop` sets it
/// to clear itself).
pub struct LoopDisk {
    pub path: std::path::PathBuf,
    mounted: bool,
    _dir: tempfile::TempDir,
}

impl LoopDisk {
    /// None, said on stderr, where loop devices cannot be had (not root, or no loop driver).
    pub fn new(mib: u64) -> Option<LoopDisk> {
        if !nix::unistd::geteuid().is_root() || !Path::new("/dev/loop-control").exists() {
            eprintln!("skipped: a loop-mounted disk needs root and /dev/loop-control");
            return None;
        }
        let dir = tempfile::Builder::new()
            .prefix("unkai-disk-")
            .tempdir()
            .unwrap();
        let image = dir.path().join("disk.img");
        File::create(&image).unwrap().set_len(mib << 20).unwrap();
        let out = Command::new("mkfs.ext4")
            .args(["-q", "-F", "-m", "0"])
            .arg(&image)
            .output()
            .expect("run mkfs.ext4 (e2fsprogs)");
        assert!(out.status.success(), "mkfs.ext4: {out:?}");
        let path = dir.path().join("mnt");
        std::fs::create_dir(&path).unwrap();
        let mut disk = LoopDisk {
            path,
            mounted: false,
            _dir: dir,
        };
        let out = Command::new("mount")
            .args(["-t", "ext4", "-o", "loop"])
            .arg(&image)
            .arg(&disk.path)
            .output()
            .expect("run mount");
        assert!(out.status.success(), "mount -o loop: {out:?}");
        disk.mounted = true;
        Some(disk)
    }

    /// Bytes available on the disk.
    pub fn avail(&self) -> u64 {
        let st = nix::sys::statvfs::statvfs(&self.path).unwrap();
        st.blocks_available() * st.fragment_size()
    }
}

impl Drop for LoopDisk {
    fn drop(&mut self) {
        if self.mounted && nix::mount::umount2(&self.path, nix::mount::MntFlags::empty()).is_err() {
            let _ = nix::mount::umount2(&self.path, nix::mount::MntFlags::MNT_DETACH);
        }
    }
}
