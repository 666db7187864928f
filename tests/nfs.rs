//! `unkai nfs` with the real user-space NFS client of Debian's libnfs-utils (`nfs-cp`,
//! `nfs-ls`, `nfs-cat`): big and small files in and out, byte for byte, beside a FUSE mount of
//! the same volume; a directory of 1000 entries listed; the trash and directory quotas
//! through NFS; export options (`--allow`, `--read-only`, the one identity every call acts
//! as, `--subdir`); garbage on the port. libnfs-utils has no remove
//! or rename tool: those calls are made by a few lines of ONC RPC here ([`Rpc`]).

mod common;

use common::*;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const MIB: usize = 1 << 20;

/// Whether libnfs-utils is here; without it the test is skipped (loudly), unless
/// UNKAI_REQUIRE_CLIENTS is set (CI), where that fails.
fn have_client() -> bool {
    let ok = Command::new("nfs-ls")
        .arg("--help")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    if !ok {
        assert!(
            std::env::var_os("UNKAI_REQUIRE_CLIENTS").is_none(),
            "nfs-ls (libnfs-utils) is missing and UNKAI_REQUIRE_CLIENTS is set"
        );
        eprintln!("!!! SKIPPED: nfs-ls not found (apt-get install libnfs-utils) !!!");
    }
    ok
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A running `unkai nfs`, stopped (SIGTERM, then SIGKILL) when dropped.
struct Server {
    child: Option<Child>,
    port: u16,
    log: PathBuf,
}

impl Server {
    fn start(vol: &Volume, extra: &[&str]) -> Server {
        let port = free_port();
        let log = vol.dir.path().join(format!("nfs-{port}.log"));
        let logf = std::fs::File::create(&log).unwrap();
        let listen = format!("127.0.0.1:{port}");
        let child = unkai()
            .args(["nfs", &vol.meta_url, "--listen", &listen])
            .args(extra)
            .envs(vol.env.iter().cloned())
            .env("UNKAI_TRASH_DAYS", "1")
            .stdin(Stdio::null())
            .stdout(logf.try_clone().unwrap())
            .stderr(logf)
            .spawn()
            .expect("spawn unkai nfs");
        let mut s = Server {
            child: Some(child),
            port,
            log,
        };
        let up = eventually(Duration::from_secs(60), || {
            if let Ok(Some(st)) = s.child.as_mut().unwrap().try_wait() {
                panic!("unkai nfs exited ({st}):\n{}", s.log_text());
            }
            s.log_text().contains("nfs serving volume")
        });
        assert!(up, "unkai nfs did not start:\n{}", s.log_text());
        s
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// An nfs:// URL of `path` (from the export's root) for libnfs.
    fn url(&self, path: &str, extra: &str) -> String {
        // libnfs takes what comes before the last '/' as the export: "//x" mounts "/".
        let p = self.port;
        format!("nfs://127.0.0.1/{path}?nfsport={p}&mountport={p}{extra}")
    }

    /// Stops the server as SIGTERM does: returns its log.
    fn stop(mut self) -> String {
        self.halt();
        self.log_text()
    }

    fn halt(&mut self) {
        if let Some(mut c) = self.child.take() {
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(60) {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.halt();
    }
}

/// Runs a libnfs tool; (success, stdout, stderr).
fn tool(name: &str, args: &[&str]) -> (bool, Vec<u8>, String) {
    let out = Command::new(name)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run libnfs tool");
    (
        out.status.success(),
        out.stdout,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn nfs_cp(from: &str, to: &str) -> (bool, String) {
    let (ok, out, err) = tool("nfs-cp", &[from, to]);
    (ok, format!("{}{err}", String::from_utf8_lossy(&out)))
}

fn nfs_cat(url: &str) -> Option<Vec<u8>> {
    let (ok, out, _) = tool("nfs-cat", &[url]);
    ok.then_some(out)
}

/// The names `nfs-ls` shows in the directory of `url`.
fn nfs_ls(url: &str) -> Result<Vec<String>, String> {
    let (ok, out, err) = tool("nfs-ls", &[url]);
    if !ok {
        return Err(err);
    }
    let mut names: Vec<String> = String::from_utf8_lossy(&out)
        .lines()
        .filter_map(|l| l.split_whitespace().last().map(str::to_string))
        .filter(|n| n != "." && n != "..")
        .collect();
    names.sort();
    Ok(names)
}

fn write_tmp(dir: &Path, name: &str, data: &[u8]) -> String {
    let p = dir.join(name);
    std::fs::write(&p, data).unwrap();
    p.to_str().unwrap().to_string()
}

/// The few NFS calls libnfs-utils has no tool for (REMOVE, RENAME, LOOKUP of `..`), over
/// ONC RPC on TCP with AUTH_UNIX credentials (which the server does not honour: every call
/// acts as --anonuid/--anongid).
struct Rpc {
    s: TcpStream,
    xid: u32,
    uid: u32,
}

fn put_u32(b: &mut Vec<u8>, v: u32) {
    b.extend_from_slice(&v.to_be_bytes());
}

fn put_opaque(b: &mut Vec<u8>, v: &[u8]) {
    put_u32(b, v.len() as u32);
    b.extend_from_slice(v);
    b.resize(b.len() + (4 - v.len() % 4) % 4, 0);
}

struct Reply(Vec<u8>, usize);

impl Reply {
    fn u32(&mut self) -> u32 {
        let v = u32::from_be_bytes(self.0[self.1..self.1 + 4].try_into().unwrap());
        self.1 += 4;
        v
    }
    fn opaque(&mut self) -> Vec<u8> {
        let n = self.u32() as usize;
        let v = self.0[self.1..self.1 + n].to_vec();
        self.1 += n + (4 - n % 4) % 4;
        v
    }
}

impl Rpc {
    fn connect(port: u16, uid: u32) -> Rpc {
        let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        Rpc { s, xid: 1, uid }
    }

    /// Calls `proc` of `prog` v3 with `args`; the reply's results (after accept_stat).
    fn call(&mut self, prog: u32, proc_: u32, args: &[u8]) -> Reply {
        self.xid += 1;
        let mut m = Vec::new();
        for v in [self.xid, 0, 2, prog, 3, proc_] {
            put_u32(&mut m, v);
        }
        let mut cred = Vec::new();
        put_u32(&mut cred, 0); // stamp
        put_opaque(&mut cred, b"test");
        put_u32(&mut cred, self.uid);
        put_u32(&mut cred, self.uid);
        put_u32(&mut cred, 0); // no other groups
        put_u32(&mut m, 1); // AUTH_UNIX
        put_opaque(&mut m, &cred);
        put_u32(&mut m, 0); // verifier: AUTH_NULL
        put_u32(&mut m, 0);
        m.extend_from_slice(args);
        let mut rec = (0x8000_0000u32 | m.len() as u32).to_be_bytes().to_vec();
        rec.extend_from_slice(&m);
        self.s.write_all(&rec).unwrap();
        let mut hdr = [0u8; 4];
        self.s.read_exact(&mut hdr).unwrap();
        let len = (u32::from_be_bytes(hdr) & 0x7fff_ffff) as usize;
        let mut body = vec![0u8; len];
        self.s.read_exact(&mut body).unwrap();
        let mut r = Reply(body, 0);
        assert_eq!(r.u32(), self.xid);
        assert_eq!(r.u32(), 1, "a reply");
        assert_eq!(r.u32(), 0, "accepted");
        r.u32(); // verifier
        r.opaque();
        assert_eq!(r.u32(), 0, "accept_stat SUCCESS");
        r
    }

    /// MNT of `path`: the file handle.
    fn mount(&mut self, path: &str) -> Result<Vec<u8>, u32> {
        let mut a = Vec::new();
        put_opaque(&mut a, path.as_bytes());
        let mut r = self.call(100005, 1, &a);
        match r.u32() {
            0 => Ok(r.opaque()),
            e => Err(e),
        }
    }

    fn dirop(dir: &[u8], name: &str) -> Vec<u8> {
        let mut a = Vec::new();
        put_opaque(&mut a, dir);
        put_opaque(&mut a, name.as_bytes());
        a
    }

    /// LOOKUP: the handle, or the NFS status.
    fn lookup(&mut self, dir: &[u8], name: &str) -> Result<Vec<u8>, u32> {
        let mut r = self.call(100003, 3, &Self::dirop(dir, name));
        match r.u32() {
            0 => Ok(r.opaque()),
            e => Err(e),
        }
    }

    /// REMOVE (or RMDIR): the NFS status.
    fn remove(&mut self, dir: &[u8], name: &str) -> u32 {
        self.call(100003, 12, &Self::dirop(dir, name)).u32()
    }

    /// WRITE (FILE_SYNC): the NFS status.
    fn write(&mut self, fh: &[u8], off: u64, data: &[u8]) -> u32 {
        let mut a = Vec::new();
        put_opaque(&mut a, fh);
        a.extend_from_slice(&off.to_be_bytes());
        put_u32(&mut a, data.len() as u32);
        put_u32(&mut a, 2);
        put_opaque(&mut a, data);
        self.call(100003, 7, &a).u32()
    }

    fn rename(&mut self, dir: &[u8], name: &str, to: &[u8], new: &str) -> u32 {
        let mut a = Self::dirop(dir, name);
        a.extend_from_slice(&Self::dirop(to, new));
        self.call(100003, 14, &a).u32()
    }
}

const NFS3ERR_ACCES: u32 = 13;
const NFS3ERR_DQUOT: u32 = 69;
const NFS3ERR_STALE: u32 = 70;

/// Big and small files in and out, byte for byte; listed; renamed and removed over NFS; and
/// all of it seen the same through a FUSE mount of the volume, running beside the server. On
/// SQLite, and on PostgreSQL when UNKAI_TEST_POSTGRES is set (its engine blocks on its own
/// runtime: the server must call it off the runtime's threads).
#[test]
fn files_round_trip_beside_a_fuse_mount() {
    if !have_client() {
        return;
    }
    round_trip(&Volume::with_args(&["--trash-days", "1"]));
    match Volume::postgres(&["--trash-days", "1"], |u| u.to_string(), Vec::new()) {
        Some(vol) => round_trip(&vol),
        None => eprintln!("skipped on PostgreSQL: UNKAI_TEST_POSTGRES is unset"),
    }
}

fn round_trip(vol: &Volume) {
    let srv = Server::start(vol, &["--anonuid", "0", "--anongid", "0"]);
    let tmp = tempfile::tempdir().unwrap();
    let big = pattern(9 * MIB + 12345, 1);
    let src = write_tmp(tmp.path(), "big", &big);
    let (ok, out) = nfs_cp(&src, &srv.url("/big", ""));
    assert!(ok, "nfs-cp in: {out}\n{}", srv.log_text());
    let mut small = Vec::new();
    for i in 0..5 {
        let data = pattern(100 + i * 777, 10 + i as u64);
        let src = write_tmp(tmp.path(), &format!("s{i}"), &data);
        let (ok, out) = nfs_cp(&src, &srv.url(&format!("/small{i}"), ""));
        assert!(ok, "nfs-cp small{i}: {out}");
        small.push(data);
    }
    let names = nfs_ls(&srv.url("", "")).unwrap();
    assert_eq!(
        names,
        vec!["big", "small0", "small1", "small2", "small3", "small4"]
    );
    // Back out, both ways.
    assert!(nfs_cat(&srv.url("/big", "")).unwrap() == big, "nfs-cat big");
    let back = tmp.path().join("back");
    let (ok, out) = nfs_cp(&srv.url("/big", ""), back.to_str().unwrap());
    assert!(ok, "nfs-cp out: {out}");
    assert!(std::fs::read(&back).unwrap() == big, "nfs-cp big back");
    for (i, d) in small.iter().enumerate() {
        assert_eq!(&nfs_cat(&srv.url(&format!("/small{i}"), "")).unwrap(), d);
    }
    // A FUSE mount of the same volume sees the same bytes.
    let m = vol.mount();
    assert!(std::fs::read(m.p("big")).unwrap() == big, "big via FUSE");
    assert_eq!(&std::fs::read(m.p("small3")).unwrap(), &small[3]);
    // What the mount writes and renames, NFS sees.
    std::fs::write(m.p("from-fuse"), b"hello over nfs").unwrap();
    std::fs::rename(m.p("small4"), m.p("renamed4")).unwrap();
    assert_eq!(
        nfs_cat(&srv.url("/from-fuse", "")).unwrap(),
        b"hello over nfs"
    );
    let names = nfs_ls(&srv.url("", "")).unwrap();
    assert!(names.contains(&"renamed4".to_string()), "{names:?}");
    assert!(!names.contains(&"small4".to_string()), "{names:?}");
    // Rename and remove over NFS; the mount sees it, and the removed file is in the trash.
    let mut rpc = Rpc::connect(srv.port, 0);
    let root = rpc.mount("/").unwrap();
    assert_eq!(rpc.rename(&root, "small0", &root, "moved0"), 0);
    assert_eq!(rpc.remove(&root, "small1"), 0);
    assert!(eventually(Duration::from_secs(60), || {
        !m.p("small1").exists() && m.p("moved0").exists()
    }));
    assert_eq!(std::fs::read(m.p("moved0")).unwrap(), small[0]);
    let trashed: Vec<String> = std::fs::read_dir(m.p(".trash"))
        .unwrap()
        .flat_map(|h| std::fs::read_dir(h.unwrap().path()).unwrap())
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        trashed.iter().any(|n| n.contains("small1")),
        "small1 not in the trash: {trashed:?}"
    );
    let names = nfs_ls(&srv.url("", "")).unwrap();
    assert!(!names.contains(&"small1".to_string()), "{names:?}");
    drop(m);
    let log = srv.stop();
    assert!(log.contains("everything written is flushed"), "{log}");
}

/// 200 small files in, listed and read back; a directory quota refuses the file that
/// would pass it (NFS3ERR_DQUOT: nfs-cp fails) and what was accepted reads back whole.
#[test]
fn many_small_files_and_a_quota() {
    if !have_client() {
        return;
    }
    let vol = Volume::new();
    {
        let m = vol.mount();
        std::fs::create_dir(m.p("many")).unwrap();
        std::fs::create_dir(m.p("q")).unwrap();
    }
    let (ok, out, err) = vol.cmd("quota", &["set", "--path", "/q", "--capacity", "1M"]);
    assert!(ok, "quota set: {out}{err}");
    let srv = Server::start(&vol, &["--anonuid", "0", "--anongid", "0"]);
    let tmp = tempfile::tempdir().unwrap();
    let n = 200;
    for i in 0..n {
        let src = write_tmp(tmp.path(), "f", &pattern(64 + i * 13, i as u64));
        let (ok, out) = nfs_cp(&src, &srv.url(&format!("/many/f{i:03}"), ""));
        assert!(ok, "nfs-cp f{i}: {out}");
    }
    let names = nfs_ls(&srv.url("/many", "")).unwrap();
    let want: Vec<String> = (0..n).map(|i| format!("f{i:03}")).collect();
    assert_eq!(names, want);
    for i in (0..n).step_by(7) {
        let got = nfs_cat(&srv.url(&format!("/many/f{i:03}"), "")).unwrap();
        assert!(got == pattern(64 + i * 13, i as u64), "f{i:03} differs");
    }
    // The quota: 600 KiB fits, another 600 KiB does not.
    let a = pattern(600 << 10, 77);
    let (ok, out) = nfs_cp(&write_tmp(tmp.path(), "a", &a), &srv.url("/q/a", ""));
    assert!(ok, "within the quota: {out}");
    let (ok, out) = nfs_cp(
        &write_tmp(tmp.path(), "b", &pattern(600 << 10, 78)),
        &srv.url("/q/b", ""),
    );
    assert!(!ok, "a copy past the quota succeeded: {out}");
    // The error the client got: NFS3ERR_DQUOT (libnfs-utils prints no status, so asked here).
    let mut rpc = Rpc::connect(srv.port, 0);
    let root = rpc.mount("/").unwrap();
    let q = rpc.lookup(&root, "q").unwrap();
    let b = rpc.lookup(&q, "b").unwrap();
    assert_eq!(rpc.write(&b, 1 << 20, &[9u8; 512 << 10]), NFS3ERR_DQUOT);
    assert_eq!(nfs_cat(&srv.url("/q/a", "")).unwrap(), a);
    let log = srv.stop();
    let m = vol.mount();
    assert_eq!(std::fs::read(m.p("q/a")).unwrap(), a);
    // What the refused copy left holds no more than the quota allowed.
    let b_len = std::fs::metadata(m.p("q/b")).map(|m| m.len()).unwrap_or(0);
    assert!(
        (600 << 10) + b_len <= 1 << 20,
        "q holds {} bytes past its 1 MiB quota\n{log}",
        (600 << 10) + b_len
    );
}

/// Export options: a client outside --allow gets nothing (and creates nothing); --read-only
/// refuses a copy; every call acts as --anonuid/--anongid; --subdir keeps `..` and other
/// handles out.
#[test]
fn export_options_hold() {
    if !have_client() {
        return;
    }
    let vol = Volume::new();
    {
        let m = vol.mount();
        std::fs::create_dir_all(m.p("a/inner")).unwrap();
        std::fs::write(m.p("secret"), b"outside the export").unwrap();
        std::fs::write(m.p("a/inside"), b"inside").unwrap();
        std::fs::create_dir(m.p("open")).unwrap();
        std::fs::set_permissions(
            m.p("open"),
            std::os::unix::fs::PermissionsExt::from_mode(0o777),
        )
        .unwrap();
    }
    let tmp = tempfile::tempdir().unwrap();
    let src = write_tmp(tmp.path(), "x", b"x");

    // Not in --allow: refused at connection, nothing created.
    let srv = Server::start(
        &vol,
        &["--allow", "10.0.0.0/8", "--anonuid", "0", "--anongid", "0"],
    );
    let (ok, _) = nfs_cp(&src, &srv.url("/denied", ""));
    assert!(!ok, "a client outside --allow copied a file");
    assert!(
        nfs_ls(&srv.url("", "")).is_err(),
        "a client outside --allow listed"
    );
    let log = srv.stop();
    assert!(log.contains("not in --allow"), "{log}");

    // Read-only.
    let srv = Server::start(&vol, &["--read-only", "--anonuid", "0", "--anongid", "0"]);
    let (ok, _) = nfs_cp(&src, &srv.url("/ro", ""));
    assert!(!ok, "--read-only took a copy");
    assert_eq!(
        nfs_cat(&srv.url("/secret", "")).unwrap(),
        b"outside the export"
    );
    let mut rpc = Rpc::connect(srv.port, 0);
    let root = rpc.mount("/").unwrap();
    assert_eq!(rpc.remove(&root, "secret"), 30, "NFS3ERR_ROFS");
    drop(srv);

    // One identity, 65534:65534 by default, whatever the client sends (even uid 0): a copy
    // into root's directory is refused; into one open to all it belongs to 65534; a file
    // that identity may not write is refused.
    let srv = Server::start(&vol, &[]);
    let (ok, _) = nfs_cp(&src, &srv.url("/by-root", "&uid=0&gid=0"));
    assert!(!ok, "the anonymous identity wrote into /");
    let (ok, out) = nfs_cp(&src, &srv.url("/open/by-root", "&uid=0&gid=0"));
    assert!(ok, "{out}");
    let mut rpc = Rpc::connect(srv.port, 0);
    let root = rpc.mount("/").unwrap();
    assert_eq!(rpc.remove(&root, "secret"), NFS3ERR_ACCES);
    let secret = rpc.lookup(&root, "secret").unwrap();
    assert_eq!(rpc.write(&secret, 0, b"overwritten"), NFS3ERR_ACCES);
    drop(srv);
    // --anonuid/--anongid choose it.
    let srv = Server::start(&vol, &["--anonuid", "1000", "--anongid", "1000"]);
    let (ok, out) = nfs_cp(&src, &srv.url("/open/by-user", "&uid=0&gid=0"));
    assert!(ok, "{out}");
    drop(srv);

    // --subdir /a: `..` stays in it, and a handle of an inode outside is stale.
    let srv = Server::start(
        &vol,
        &["--subdir", "/a", "--anonuid", "0", "--anongid", "0"],
    );
    let names = nfs_ls(&srv.url("", "")).unwrap();
    assert_eq!(names, vec!["inner", "inside"]);
    assert!(
        nfs_cat(&srv.url("/../secret", "")).is_none(),
        "read past the export"
    );
    let mut rpc = Rpc::connect(srv.port, 0);
    let root = rpc.mount("/").unwrap();
    let up = rpc.lookup(&root, "..").unwrap();
    assert_eq!(up, root, "`..` of the export's root is itself");
    assert!(rpc.lookup(&up, "secret").is_err());
    assert!(rpc.mount("/../secret").is_err());
    // A forged handle: this run's generation with the volume root's inode (1).
    let mut forged = root.clone();
    forged[8..16].copy_from_slice(&1u64.to_le_bytes());
    assert_eq!(rpc.lookup(&forged, "secret"), Err(NFS3ERR_STALE));
    assert_eq!(rpc.remove(&forged, "secret"), NFS3ERR_STALE);
    drop(srv);

    let m = vol.mount();
    assert!(!m.p("denied").exists() && !m.p("ro").exists() && !m.p("by-root").exists());
    assert_eq!(std::fs::read(m.p("secret")).unwrap(), b"outside the export");
    let by_root = std::fs::metadata(m.p("open/by-root")).unwrap();
    assert_eq!((by_root.uid(), by_root.gid()), (65534, 65534));
    let by_user = std::fs::metadata(m.p("open/by-user")).unwrap();
    assert_eq!((by_user.uid(), by_user.gid()), (1000, 1000));
}

/// Garbage on the port (an HTTP request, records claiming 2 GiB, one fragment past the
/// bound) ends those connections only, the oversized ones at once (the relay closes them
/// before nfsserve sees the mark): the next real client works.
#[test]
fn garbage_leaves_the_server_serving() {
    if !have_client() {
        return;
    }
    let vol = Volume::new();
    let srv = Server::start(&vol, &["--anonuid", "0", "--anongid", "0"]);
    let past_bound = (0x8000_0000u32 | (5 << 20)).to_be_bytes().to_vec();
    for (junk, closed_by_server) in [
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(), false),
        (vec![0x7f, 0xff, 0xff, 0xff, 1, 2, 3], true),
        (vec![0xff; 4096], true),
        (past_bound, true),
    ] {
        let mut s = TcpStream::connect(("127.0.0.1", srv.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let _ = s.write_all(&junk);
        // An oversized mark: closed without the client closing its side.
        if !closed_by_server {
            let _ = s.shutdown(std::net::Shutdown::Write);
        }
        let t = Instant::now();
        let mut sink = Vec::new();
        let _ = s.read_to_end(&mut sink);
        assert!(
            t.elapsed() < Duration::from_secs(50),
            "a connection sending {junk:?} was left open"
        );
    }
    let tmp = tempfile::tempdir().unwrap();
    let data = pattern(300_000, 5);
    let (ok, out) = nfs_cp(&write_tmp(tmp.path(), "d", &data), &srv.url("/after", ""));
    assert!(ok, "after garbage: {out}\n{}", srv.log_text());
    assert_eq!(nfs_cat(&srv.url("/after", "")).unwrap(), data);
    let log = srv.stop();
    assert!(!log.contains("panicked"), "{log}");
}

/// A directory of 1200 entries (many READDIRPLUS pages, each resumed from the cookie of the
/// one before) lists over NFS exactly as through a FUSE mount.
#[test]
fn a_large_directory_lists_whole() {
    if !have_client() {
        return;
    }
    let vol = Volume::new();
    let n = 1200;
    let mut want: Vec<String> = (0..n)
        .map(|i| format!("entry-with-a-longer-name-{i:05}"))
        .collect();
    want.sort();
    {
        let m = vol.mount();
        std::fs::create_dir(m.p("big")).unwrap();
        for name in &want {
            std::fs::write(m.p(&format!("big/{name}")), b"").unwrap();
        }
    }
    let srv = Server::start(&vol, &[]);
    let names = nfs_ls(&srv.url("/big", "")).unwrap();
    assert_eq!(names.len(), n, "{} entries listed of {n}", names.len());
    assert_eq!(names, want);
    drop(srv);
    let m = vol.mount();
    let mut fuse: Vec<String> = std::fs::read_dir(m.p("big"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    fuse.sort();
    assert_eq!(names, fuse);
}
