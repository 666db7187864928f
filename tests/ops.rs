//! Running unkai as an operator does: a directory of a volume mounted on its own
//! (`--subdir`), fstab options through the mount helper, commands given a mountpoint, the
//! mount's log lines, the systemd unit, shell completions and the man page.

use crate::common::*;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

fn mounted(path: &Path) -> bool {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let p = path.to_string_lossy().replace(' ', "\\040");
    info.lines()
        .any(|l| l.split(' ').nth(4) == Some(p.as_str()))
}

/// The per-mount flags of the mount at `path` (rw, nosuid, noatime...).
fn mount_flags(path: &Path) -> Vec<String> {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let p = path.to_string_lossy().replace(' ', "\\040");
    info.lines()
        .rfind(|l| l.split(' ').nth(4) == Some(p.as_str()))
        .and_then(|l| l.split(' ').nth(5))
        .map(|o| o.split(',').map(str::to_string).collect())
        .unwrap_or_default()
}

/// Asserts a failure with one line on stderr, an "unkai: error:" line; returns it.
#[track_caller]
fn one_line_error(res: &(bool, String, String)) -> String {
    let (ok, out, err) = res;
    assert!(!ok, "expected failure; stdout: {out} stderr: {err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "expected one line on stderr:\n{err}");
    assert!(lines[0].starts_with("unkai: error:"), "{err}");
    lines[0].to_string()
}

/// Names in directory `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// A background mount at `path`, unmounted (and its server waited for) on drop.
struct Background {
    path: PathBuf,
}

impl Drop for Background {
    fn drop(&mut self) {
        if mounted(&self.path) {
            let ok = eventually(Duration::from_secs(30), || {
                run(&["umount", self.path.to_str().unwrap()]).0 || !mounted(&self.path)
            });
            if !ok {
                let _ = nix::mount::umount2(&self.path, nix::mount::MntFlags::MNT_DETACH);
            }
        }
    }
}

/// `unkai mount -d --log DIR/d.log` of `vol` at DIR/mp (DIR a new temporary directory, `mp`
/// canonical): DIR, mp, the log, the guard unmounting it, and what the command printed.
fn mount_in_background(vol: &Volume) -> (tempfile::TempDir, PathBuf, PathBuf, Background, String) {
    let dir = tempfile::tempdir().unwrap();
    let mp = fs::canonicalize(dir.path()).unwrap().join("mp");
    fs::create_dir(&mp).unwrap();
    let log = dir.path().join("d.log");
    let (ok, out, err) = run_env(
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
    let guard = Background { path: mp.clone() };
    assert!(ok, "{out}{err}");
    (dir, mp, log, guard, out)
}

/// The pid in the output of `mount -d` ("... (pid N, log ...)").
fn daemon_pid(out: &str) -> u32 {
    out.split("(pid ")
        .nth(1)
        .and_then(|s| s.split([',', ')']).next())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| panic!("no pid in: {out}"))
}

// ---------------------------------------------------------------------------------------------
// --subdir
// ---------------------------------------------------------------------------------------------

#[test]
fn a_subdir_mount_shows_only_that_directory_and_deletions_go_to_the_volumes_trash() {
    let vol = Volume::with_args(&["--trash-days", "1"]);
    let whole = vol.mount();
    fs::create_dir_all(whole.p("a/b")).unwrap();
    fs::write(whole.p("top"), b"outside").unwrap();
    fs::write(whole.p("a/in"), b"inside").unwrap();
    fs::write(whole.p("a/b/deep"), b"deeper").unwrap();

    let sub = vol.mount_with(&["--subdir", "/a"]);
    // Only changes after the first mount noticed the second are promised to show at once.
    whole.wait_noticed_another_client("the subdir mount");
    assert_eq!(names(&sub.path), ["b", "in"]);
    assert_eq!(fs::read(sub.p("in")).unwrap(), b"inside");
    assert_eq!(fs::read(sub.p("b/deep")).unwrap(), b"deeper");
    // The same files, numbered as the volume numbers them; the mount's root is the kernel's 1.
    assert_eq!(
        fs::metadata(sub.p("in")).unwrap().ino(),
        fs::metadata(whole.p("a/in")).unwrap().ino()
    );
    assert_eq!(fs::metadata(&sub.path).unwrap().ino(), 1);
    // Nothing above it: not the volume's root, not its trash; `..` of the mountpoint is the
    // directory it is mounted on.
    for outside in ["top", ".trash", "a", "b/../../top"] {
        assert!(
            !sub.p(outside).exists(),
            "{outside} reachable from the subdir mount"
        );
    }
    assert!(!sub.path.join("../top").exists());
    // A deletion there goes to the volume's trash, seen from a mount of the whole volume.
    fs::remove_file(sub.p("in")).unwrap();
    assert!(!sub.p("in").exists());
    let trashed = || {
        fs::read_dir(whole.p(".trash"))
            .into_iter()
            .flatten()
            .flatten()
            .flat_map(|hour| fs::read_dir(hour.path()).into_iter().flatten().flatten())
            .any(|e| e.file_name().to_string_lossy().ends_with("-in"))
    };
    assert!(
        eventually(Duration::from_secs(30), trashed),
        "the file deleted in the subdir mount is not in the volume's trash"
    );
    // Created there, seen at /a of the volume.
    fs::write(sub.p("new"), b"made in the subdir").unwrap();
    assert!(eventually(Duration::from_secs(30), || fs::read(
        whole.p("a/new")
    )
    .is_ok_and(|d| d == b"made in the subdir")));
    sub.unmount();
    whole.unmount();
}

/// On a volume whose changes are pushed (PostgreSQL), another mount's change in the directory
/// a subdir mount serves reaches its kernel as a change of the mount's root (the kernel's 1),
/// long before its cache's TTL.
#[test]
fn pushed_changes_reach_a_subdir_mounts_root() {
    let Some(vol) = Volume::postgres(&[], |u| u.to_string(), Vec::new()) else {
        eprintln!("skipped: UNKAI_TEST_POSTGRES is unset");
        return;
    };
    let long = [
        "--attr-ttl",
        "120",
        "--entry-ttl",
        "120",
        "--negative-ttl",
        "120",
    ];
    let whole = vol.mount_with(&long);
    fs::create_dir(whole.p("a")).unwrap();
    // Another client finds a change once it is committed (10 ms at most after it was
    // answered); a mount starting sooner would find no /a. fsyncdir commits it now.
    fs::File::open(whole.p("a")).unwrap().sync_all().unwrap();
    let mut args = long.to_vec();
    args.extend(["--subdir", "/a"]);
    let sub = vol.mount_with(&args);
    // The subdir's kernel remembers that "new" is absent (for 120 s, unless told).
    assert!(
        eventually(Duration::from_secs(30), || {
            fs::write(whole.p("a/probe"), b"p").unwrap();
            let seen = sub.p("probe").exists();
            fs::remove_file(whole.p("a/probe")).unwrap();
            seen
        }),
        "the subdir mount never listened"
    );
    assert!(!sub.p("new").exists());
    fs::write(whole.p("a/new"), b"pushed").unwrap();
    assert!(
        eventually(Duration::from_secs(60), || sub.p("new").exists()),
        "a create in /a is not pushed to the subdir mount (its TTLs are 120 s)"
    );
    assert_eq!(fs::read(sub.p("new")).unwrap(), b"pushed");
    sub.unmount();
    whole.unmount();
}

#[test]
fn a_subdir_that_is_missing_or_climbs_out_is_a_one_line_error() {
    let vol = Volume::new();
    let m = vol.mount();
    fs::write(m.p("file"), b"x").unwrap();
    m.unmount();
    let mp = tempfile::tempdir().unwrap();
    let mp = mp.path().to_str().unwrap();
    for (subdir, says) in [
        ("/nope", "no directory /nope"),
        ("/file", "not a directory"),
        ("/a/../..", "without '..'"),
        ("/.trash", "trash"),
    ] {
        let res = run_env(&["mount", "--subdir", subdir, &vol.meta_url, mp], &vol.env);
        let line = one_line_error(&res);
        assert!(line.contains(says), "--subdir {subdir}: {line}");
        assert!(!mounted(Path::new(mp)));
    }
}

// ---------------------------------------------------------------------------------------------
// -o options: fstab and the mount helper
// ---------------------------------------------------------------------------------------------

#[test]
fn fstab_options_through_the_mount_helper_take_effect() {
    let vol = Volume::new();
    let m = vol.mount();
    fs::create_dir_all(m.p("a/b")).unwrap();
    fs::write(m.p("top"), b"outside").unwrap();
    m.unmount();

    let dir = tempfile::tempdir().unwrap();
    let mp = fs::canonicalize(dir.path()).unwrap().join("mp");
    fs::create_dir(&mp).unwrap();
    let log = dir.path().join("helper.log");
    // What mount(8) runs for an fstab line
    //   META-URL  MP  fuse.unkai  _netdev,nofail,cache_size=64M,subdir=/a,noatime,log=...  0 0
    // (through mount.fuse3, which runs `unkai SOURCE MP -o OPTS`).
    let opts = format!(
        "rw,_netdev,nofail,nosuid,noatime,cache_size=64M,subdir=/a,writeback=off,log={}",
        log.display()
    );
    let (ok, out, err) = run_env(
        &[&vol.meta_url, mp.to_str().unwrap(), "-o", &opts],
        &vol.env,
    );
    let _guard = Background { path: mp.clone() };
    assert!(ok, "helper mount failed: {out}{err}");
    assert!(out.is_empty(), "mount(8) expects nothing on stdout: {out}");
    assert!(mounted(&mp));
    // subdir=/a: the directory alone.
    assert_eq!(names(&mp), ["b"]);
    // nosuid, noatime: the kernel's flags.
    let flags = mount_flags(&mp);
    assert!(flags.contains(&"nosuid".to_string()), "{flags:?}");
    assert!(flags.contains(&"noatime".to_string()), "{flags:?}");
    // log=, cache_size=, writeback=: the mount's own flags.
    let text = fs::read_to_string(&log).unwrap_or_default();
    assert!(
        text.contains("disk cache on") && text.contains(&format!("up to {} bytes", 64 << 20)),
        "cache_size=64M not applied: {text}"
    );
    assert!(
        text.contains("write-back off"),
        "writeback=off not applied: {text}"
    );
    assert!(text.contains("(its directory /a)"), "{text}");
}

#[test]
fn an_unknown_or_bad_mount_option_fails_in_one_line_naming_it() {
    let vol = Volume::new();
    let dir = tempfile::tempdir().unwrap();
    let mp = dir.path().to_str().unwrap();
    // Through the helper, as mount(8) and fstab run it.
    for (opts, says) in [
        ("rw,cache_sise=1G", "cache_sise"),
        ("writeback=sometimes", "sometimes"),
        ("threads", "threads=VALUE"),
        ("read_only=yes", "takes no value"),
    ] {
        let res = run_env(&[&vol.meta_url, mp, "-o", opts], &vol.env);
        let line = one_line_error(&res);
        assert!(line.contains(says), "-o {opts}: {line}");
    }
    // And through `unkai mount -o`.
    let line = one_line_error(&run_env(
        &["mount", "-o", "noatime,bogus_option=1", &vol.meta_url, mp],
        &vol.env,
    ));
    assert!(line.contains("bogus_option"), "{line}");
    assert!(!mounted(dir.path()));
}

// ---------------------------------------------------------------------------------------------
// Commands given a mountpoint; the mount's log
// ---------------------------------------------------------------------------------------------

#[test]
fn status_fsck_gc_and_config_take_a_mountpoint() {
    let vol = Volume::new();
    let (_dir, mp, _log, guard, _out) = mount_in_background(&vol);
    fs::create_dir(mp.join("d")).unwrap();
    fs::write(mp.join("d/f"), b"hello").unwrap();
    let m = mp.to_str().unwrap();
    let (ok, out, err) = run_env(&["status", m], &vol.env);
    assert!(ok, "status MOUNTPOINT: {err}");
    assert!(out.contains("volume 'testvol'"), "{out}");
    assert!(out.contains(&vol.meta_url), "{out}");
    assert!(out.contains(&format!("at {m}")), "{out}");
    // A path inside the mount names the same volume.
    let (ok, inside, err) = run_env(
        &["status", "--json", mp.join("d").to_str().unwrap()],
        &vol.env,
    );
    assert!(ok, "{err}");
    assert!(inside.contains("\"name\": \"testvol\""), "{inside}");
    let (ok, out, err) = run_env(&["gc", m], &vol.env);
    assert!(
        ok && out.contains("leaked objects"),
        "gc MOUNTPOINT: {out}{err}"
    );
    let (ok, out, err) = run_env(&["config", m], &vol.env);
    assert!(
        ok && out.contains("testvol"),
        "config MOUNTPOINT: {out}{err}"
    );
    let (ok, out, err) = run_env(&["fsck", "--skip-objects", m], &vol.env);
    assert!(ok, "fsck MOUNTPOINT: {out}{err}");
    drop(guard);
    assert!(!mounted(&mp));
    // Unmounted: no volume there any more.
    let line = one_line_error(&run_env(&["status", m], &vol.env));
    assert!(line.contains("not in an unkai mount"), "{line}");
    let line = one_line_error(&run_env(&["status", "/no/such/place"], &vol.env));
    assert!(line.contains("neither a META-URL"), "{line}");
}

#[test]
fn the_meta_url_a_mount_keeps_is_readable_by_its_owner_only() {
    // The file `status MOUNTPOINT` reads may hold a PostgreSQL password.
    let vol = Volume::new();
    let m = vol.mount();
    let hex: String = m
        .path
        .as_os_str()
        .as_encoded_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let file = PathBuf::from("/run/unkai/mounts").join(format!("{hex}.url"));
    assert!(
        eventually(Duration::from_secs(30), || file.exists()),
        "no {}",
        file.display()
    );
    assert_eq!(
        fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert_eq!(fs::read_to_string(&file).unwrap().trim(), vol.meta_url);
    m.unmount();
    assert!(!file.exists(), "the META-URL is kept after the unmount");
}

#[test]
fn every_log_line_of_a_mount_names_the_volume_and_the_pid() {
    let vol = Volume::new();
    let (_dir, mp, log, guard, out) = mount_in_background(&vol);
    let pid = daemon_pid(&out);
    fs::write(mp.join("f"), b"x").unwrap();
    drop(guard);
    let text = fs::read_to_string(&log).unwrap();
    let tag = format!("testvol[{pid}] ");
    assert!(text.contains("unmounted"), "{text}");
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(lines.len() > 3, "{text}");
    for l in lines {
        assert!(l.starts_with(&tag), "a log line without {tag:?}: {l}");
    }
}

#[test]
fn a_background_mount_by_root_logs_to_a_file_of_its_own() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: the per-mount log directory /var/log/unkai is root's");
        return;
    }
    let vol = Volume::new();
    let dir = tempfile::tempdir().unwrap();
    let mp = fs::canonicalize(dir.path()).unwrap().join("mp");
    fs::create_dir(&mp).unwrap();
    let env: Vec<(String, String)> = vol
        .env
        .iter()
        .filter(|(k, _)| k != "UNKAI_LOG_FILE")
        .cloned()
        .collect();
    let mut cmd = unkai();
    cmd.args(["mount", "-d", &vol.meta_url, mp.to_str().unwrap()])
        .envs(env)
        .env_remove("UNKAI_LOG_FILE");
    let out = cmd.output().unwrap();
    let guard = Background { path: mp.clone() };
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let escaped = mp.to_str().unwrap().trim_matches('/').replace('/', "-");
    let want = PathBuf::from(format!("/var/log/unkai/testvol@{escaped}.log"));
    assert!(stdout.contains(want.to_str().unwrap()), "{stdout}");
    drop(guard);
    let text = fs::read_to_string(&want).unwrap();
    let _ = fs::remove_file(&want);
    assert!(
        text.contains(&format!("mounted at {}", mp.display())),
        "{text}"
    );
}

// ---------------------------------------------------------------------------------------------
// The systemd unit
// ---------------------------------------------------------------------------------------------

fn unit_text() -> String {
    fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("contrib/unkai@.service"))
        .unwrap()
}

/// The unit's `KEY=` command line, with what systemd would substitute: the unit's binary is
/// ours, `%f` the mountpoint, `$UNKAI_MOUNT_OPTIONS` split into words.
fn unit_command(key: &str, mountpoint: &Path, meta_url: &str, options: &[&str]) -> Vec<String> {
    let text = unit_text();
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key} in the unit"));
    let mut words = Vec::new();
    for w in line.split_whitespace() {
        match w {
            "$UNKAI_MOUNT_OPTIONS" => words.extend(options.iter().map(|o| o.to_string())),
            "${UNKAI_META_URL}" => words.push(meta_url.to_string()),
            "%f" => words.push(mountpoint.display().to_string()),
            "/usr/local/bin/unkai" => words.push(env!("CARGO_BIN_EXE_unkai").to_string()),
            w => words.push(w.to_string()),
        }
    }
    assert!(
        !words.iter().any(|w| w.contains('%') || w.contains('$')),
        "unsubstituted words in {key}: {words:?}"
    );
    words
}

#[test]
fn the_systemd_unit_verifies() {
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("skipped: systemd-analyze is not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // As installed, but with this binary (verify checks that ExecStart's program exists).
    let text = unit_text().replace("/usr/local/bin/unkai", env!("CARGO_BIN_EXE_unkai"));
    fs::write(dir.path().join("unkai@.service"), text).unwrap();
    std::os::unix::fs::symlink("unkai@.service", dir.path().join("unkai@mnt-vol.service")).unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(dir.path().join("unkai@mnt-vol.service"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "systemd-analyze verify: {err}");
    assert!(
        !err.contains("unkai@"),
        "systemd-analyze verify complains: {err}"
    );
}

#[test]
fn the_units_commands_mount_tell_systemd_and_unmount() {
    use std::os::unix::net::UnixDatagram;
    let vol = Volume::new();
    let dir = tempfile::tempdir().unwrap();
    let mp = fs::canonicalize(dir.path()).unwrap().join("mnt-vol");
    fs::create_dir(&mp).unwrap();
    // What systemd gives a Type=notify service: a socket to say READY=1 on.
    let sock_path = dir.path().join("notify");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let start = unit_command(
        "ExecStart",
        &mp,
        &vol.meta_url,
        &["--cache-size", "32M", "--writeback", "off"],
    );
    assert_eq!(start[1], "mount");
    let log = dir.path().join("journal");
    let mut child = Command::new(&start[0])
        .args(&start[1..])
        .envs(vol.env.iter().cloned())
        .env("NOTIFY_SOCKET", &sock_path)
        .stdin(Stdio::null())
        .stdout(fs::File::create(&log).unwrap())
        .stderr(fs::File::create(dir.path().join("journal.err")).unwrap())
        .spawn()
        .unwrap();
    let _guard = Background { path: mp.clone() };
    let mut buf = [0u8; 256];
    let n = sock.recv(&mut buf).unwrap_or_else(|e| {
        let _ = child.kill();
        panic!(
            "no READY=1 from ExecStart ({e}): {}",
            fs::read_to_string(dir.path().join("journal.err")).unwrap_or_default()
        )
    });
    assert!(
        String::from_utf8_lossy(&buf[..n]).contains("READY=1"),
        "{:?}",
        &buf[..n]
    );
    // Ready means mounted.
    assert!(mounted(&mp));
    fs::write(mp.join("f"), b"from a service").unwrap();
    let stop = unit_command("ExecStop", &mp, &vol.meta_url, &[]);
    assert_eq!(stop[1], "umount");
    let out = Command::new(&stop[0]).args(&stop[1..]).output().unwrap();
    assert!(
        out.status.success(),
        "ExecStop: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let st = child.wait().unwrap();
    assert!(st.success(), "the service exited {st}");
    assert!(!mounted(&mp));
    let m = vol.mount();
    assert_eq!(fs::read(m.p("f")).unwrap(), b"from a service");
    m.unmount();
}

// ---------------------------------------------------------------------------------------------
// Completions and the man page
// ---------------------------------------------------------------------------------------------

/// The subcommands `unkai --help` lists.
fn subcommands() -> Vec<String> {
    let (ok, out, _) = run(&["--help"]);
    assert!(ok);
    let list: Vec<String> = out
        .split("Commands:")
        .nth(1)
        .unwrap()
        .lines()
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter(|l| !l.starts_with("   "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .filter(|c| c != "help")
        .collect();
    assert!(list.len() > 10, "{out}");
    list
}

#[test]
fn the_bash_completion_loads_and_the_others_are_generated() {
    let exe = env!("CARGO_BIN_EXE_unkai");
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "source <('{exe}' completion bash) && complete -p unkai"
        ))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("complete") && text.trim_end().ends_with(" unkai"),
        "{text}"
    );
    // Its words are this binary's: every subcommand, and mount's flags.
    let (_, script, _) = run(&["completion", "bash"]);
    for c in subcommands() {
        assert!(script.contains(&c), "bash completion lacks {c}");
    }
    assert!(script.contains("--subdir") && script.contains("--cache-size"));
    for shell in ["zsh", "fish"] {
        let (ok, script, err) = run(&["completion", shell]);
        assert!(ok, "{err}");
        assert!(
            script.contains("subdir") && script.contains("cache-size"),
            "{shell}: {script}"
        );
    }
    let (ok, _, err) = run(&["completion", "tcsh"]);
    assert!(!ok && err.contains("tcsh"), "{err}");
}

#[test]
fn the_man_page_renders_and_names_every_subcommand() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, out, err) = run(&["manpage", dir.path().to_str().unwrap()]);
    assert!(ok, "{out}{err}");
    let subs = subcommands();
    for c in &subs {
        assert!(
            dir.path().join(format!("unkai-{c}.1")).is_file(),
            "no unkai-{c}.1"
        );
    }
    let (ok, page, _) = run(&["manpage"]);
    assert!(ok);
    for c in &subs {
        assert!(
            page.contains(&format!("unkai\\-{c}(1)")),
            "unkai(1) lacks {c}"
        );
    }
    if Command::new("man").arg("--version").output().is_err() {
        eprintln!("skipped rendering: man is not installed");
        return;
    }
    let out = Command::new("man")
        .args(["-P", "cat", "-l"])
        .arg(dir.path().join("unkai.1"))
        .env("MANWIDTH", "100")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "man -l: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("SUBCOMMANDS"), "{text}");
    for c in &subs {
        assert!(
            text.contains(&format!("unkai-{c}(1)")),
            "man page lacks {c}:\n{text}"
        );
    }
    let out = Command::new("man")
        .args(["-P", "cat", "-l"])
        .arg(dir.path().join("unkai-mount.1"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("--subdir"), "{text}");
}
