//! `unkai nfs` with the real user-space NFS client of Debian's libnfs-utils (`nfs-cp`,
//! `nfs-ls`, `nfs-cat`): big and small files in and out, byte for byte, beside a FUSE mount of
//! the same volume; a directory of 1000 entries listed; the trash and directory quotas
//! through NFS; export options (`--allow`, `--read-only`, root_squash and its kin, per-call
//! identities, `--subdir`); no socket of the server that lets a local user past `--allow`;
//! UNSTABLE writes, COMMIT and the write verifier; handles and READDIR cookies across a
//! restart; garbage on the port. libnfs-utils has no tool for remove, rename, or the exact
//! status of a call: those calls are made by a few lines of ONC RPC here ([`Rpc`]).

use crate::common::*;
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

/// The few NFS calls libnfs-utils has no tool for (REMOVE, RENAME, LOOKUP of `..`, WRITE
/// and COMMIT with their verifiers, READDIR by cookie), over ONC RPC on TCP with AUTH_UNIX
/// credentials (uid, gid, groups) or AUTH_NONE.
struct Rpc {
    s: TcpStream,
    xid: u32,
    /// (uid, gid, supplementary groups); None: AUTH_NONE.
    cred: Option<(u32, u32, Vec<u32>)>,
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
    fn u64(&mut self) -> u64 {
        (self.u32() as u64) << 32 | self.u32() as u64
    }
    fn verf(&mut self) -> [u8; 8] {
        let v = self.0[self.1..self.1 + 8].try_into().unwrap();
        self.1 += 8;
        v
    }
    /// A fattr3: (size, uid, gid).
    fn fattr(&mut self) -> (u64, u32, u32) {
        self.u32(); // type
        self.u32(); // mode
        self.u32(); // nlink
        let (uid, gid) = (self.u32(), self.u32());
        let size = self.u64();
        self.1 += 84 - 28;
        (size, uid, gid)
    }
    fn post_op_attr(&mut self) {
        if self.u32() == 1 {
            self.fattr();
        }
    }
    /// wcc_data: pre_op_attr (wcc_attr, 24 bytes) and post_op_attr.
    fn wcc(&mut self) {
        if self.u32() == 1 {
            self.1 += 24;
        }
        self.post_op_attr();
    }
}

impl Rpc {
    fn connect(port: u16, uid: u32) -> Rpc {
        Rpc::connect_as(port, Some((uid, uid, Vec::new())))
    }

    fn connect_as(port: u16, cred: Option<(u32, u32, Vec<u32>)>) -> Rpc {
        let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        Rpc { s, xid: 1, cred }
    }

    /// Calls `proc` of `prog` v3 with `args`; the reply from its accept_stat on.
    fn call_raw(&mut self, prog: u32, proc_: u32, args: &[u8]) -> Reply {
        self.xid += 1;
        let mut m = Vec::new();
        for v in [self.xid, 0, 2, prog, 3, proc_] {
            put_u32(&mut m, v);
        }
        match &self.cred {
            Some((uid, gid, groups)) => {
                let mut cred = Vec::new();
                put_u32(&mut cred, 0); // stamp
                put_opaque(&mut cred, b"test");
                put_u32(&mut cred, *uid);
                put_u32(&mut cred, *gid);
                put_u32(&mut cred, groups.len() as u32);
                for g in groups {
                    put_u32(&mut cred, *g);
                }
                put_u32(&mut m, 1); // AUTH_UNIX
                put_opaque(&mut m, &cred);
            }
            None => {
                put_u32(&mut m, 0); // AUTH_NONE
                put_u32(&mut m, 0);
            }
        }
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
        r
    }

    /// Calls `proc` of `prog` v3 with `args`; the reply's results (after accept_stat).
    fn call(&mut self, prog: u32, proc_: u32, args: &[u8]) -> Reply {
        let mut r = self.call_raw(prog, proc_, args);
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
        self.write_how(fh, off, data, 2).map_or_else(|e| e, |_| 0)
    }

    /// WRITE with `stable` (0 UNSTABLE, 1 DATA_SYNC, 2 FILE_SYNC): how committed the
    /// server says the data is, and its write verifier; or the NFS status.
    fn write_how(
        &mut self,
        fh: &[u8],
        off: u64,
        data: &[u8],
        stable: u32,
    ) -> Result<(u32, [u8; 8]), u32> {
        let mut a = Vec::new();
        put_opaque(&mut a, fh);
        a.extend_from_slice(&off.to_be_bytes());
        put_u32(&mut a, data.len() as u32);
        put_u32(&mut a, stable);
        put_opaque(&mut a, data);
        let mut r = self.call(100003, 7, &a);
        match r.u32() {
            0 => {
                r.wcc();
                assert_eq!(r.u32(), data.len() as u32, "count written");
                let committed = r.u32();
                Ok((committed, r.verf()))
            }
            e => Err(e),
        }
    }

    /// COMMIT of the whole file: the write verifier, or the NFS status.
    fn commit(&mut self, fh: &[u8]) -> Result<[u8; 8], u32> {
        let mut a = Vec::new();
        put_opaque(&mut a, fh);
        a.extend_from_slice(&0u64.to_be_bytes());
        put_u32(&mut a, 0);
        let mut r = self.call(100003, 21, &a);
        match r.u32() {
            0 => {
                r.wcc();
                Ok(r.verf())
            }
            e => Err(e),
        }
    }

    /// READ: the bytes, or the NFS status.
    fn read(&mut self, fh: &[u8], off: u64, count: u32) -> Result<Vec<u8>, u32> {
        let mut a = Vec::new();
        put_opaque(&mut a, fh);
        a.extend_from_slice(&off.to_be_bytes());
        put_u32(&mut a, count);
        let mut r = self.call(100003, 6, &a);
        match r.u32() {
            0 => {
                r.post_op_attr();
                r.u32(); // count
                r.u32(); // eof
                Ok(r.opaque())
            }
            e => Err(e),
        }
    }

    /// GETATTR: (size, uid, gid), or the NFS status.
    fn getattr(&mut self, fh: &[u8]) -> Result<(u64, u32, u32), u32> {
        let mut a = Vec::new();
        put_opaque(&mut a, fh);
        let mut r = self.call(100003, 1, &a);
        match r.u32() {
            0 => Ok(r.fattr()),
            e => Err(e),
        }
    }

    /// READDIR of `dir` from `cookie` with replies of at most `count` bytes: the entries'
    /// (name, cookie), and whether the listing ended; or the NFS status.
    #[allow(clippy::type_complexity)]
    fn readdir(
        &mut self,
        dir: &[u8],
        cookie: u64,
        count: u32,
    ) -> Result<(Vec<(String, u64)>, bool), u32> {
        let mut a = Vec::new();
        put_opaque(&mut a, dir);
        a.extend_from_slice(&cookie.to_be_bytes());
        a.extend_from_slice(&[0u8; 8]);
        put_u32(&mut a, count);
        let mut r = self.call(100003, 16, &a);
        match r.u32() {
            0 => {
                r.post_op_attr();
                r.verf();
                let mut out = Vec::new();
                while r.u32() == 1 {
                    r.u64(); // fileid
                    let name = String::from_utf8(r.opaque()).unwrap();
                    out.push((name, r.u64()));
                }
                Ok((out, r.u32() == 1))
            }
            e => Err(e),
        }
    }

    /// SETATTR of the mode alone: the NFS status.
    fn setattr_mode(&mut self, fh: &[u8], mode: u32) -> u32 {
        let mut a = Vec::new();
        put_opaque(&mut a, fh);
        for v in [1, mode, 0, 0, 0, 0, 0, 0] {
            // mode set; uid, gid, size unset; atime, mtime DONT_CHANGE; no guard.
            put_u32(&mut a, v);
        }
        self.call(100003, 2, &a).u32()
    }

    /// SETATTR of the group alone: the NFS status.
    fn setattr_gid(&mut self, fh: &[u8], gid: u32) -> u32 {
        let mut a = Vec::new();
        put_opaque(&mut a, fh);
        for v in [0, 0, 1, gid, 0, 0, 0, 0] {
            put_u32(&mut a, v);
        }
        self.call(100003, 2, &a).u32()
    }

    fn rename(&mut self, dir: &[u8], name: &str, to: &[u8], new: &str) -> u32 {
        let mut a = Self::dirop(dir, name);
        a.extend_from_slice(&Self::dirop(to, new));
        self.call(100003, 14, &a).u32()
    }
}

const NFS3ERR_PERM: u32 = 1;
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
    // Another client's listing shows the rename once it is committed and pushed (within
    // 100 ms; a rename alone may wait in the mount's group for 10 ms): seen failing once
    // when listed at once.
    let mut names = Vec::new();
    let renamed = eventually(Duration::from_secs(60), || {
        names = nfs_ls(&srv.url("", "")).unwrap();
        names.contains(&"renamed4".to_string()) && !names.contains(&"small4".to_string())
    });
    assert!(renamed, "{names:?}");
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
/// refuses a copy; root is squashed to --anonuid/--anongid by default; --subdir keeps `..`
/// and other handles out.
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

    // root_squash by default: uid 0 acts as 65534:65534: a copy into root's directory is
    // refused; into one open to all it belongs to 65534; a file it may not write is refused.
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
    // --anonuid/--anongid choose whom root is squashed to.
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
    // A forged handle: the export root's, with the volume root's inode (1) put in.
    let mut forged = root.clone();
    forged[8..16].copy_from_slice(&1u64.to_be_bytes());
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
/// bound) ends those connections only, the oversized ones at once (refused at their mark,
/// before anything is allocated for them): the next real client works.
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
    // A call whose arguments claim a 4 GiB handle, or a name past any bound: GARBAGE_ARGS
    // (4), and the connection goes on serving.
    let mut rpc = Rpc::connect(srv.port, 0);
    assert_eq!(rpc.call_raw(100003, 1, &[0xff; 4]).u32(), 4);
    let mut long_name = Vec::new();
    put_opaque(&mut long_name, &[0u8; 24]);
    put_u32(&mut long_name, 1 << 30);
    assert_eq!(rpc.call_raw(100003, 3, &long_name).u32(), 4);
    assert!(rpc.mount("/").is_ok());
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

/// The sockets process `pid` listens on, found from the kernel's tables (not from what the
/// server logs): TCP (v4 and v6) addresses, and Unix socket paths.
fn listening_sockets(pid: u32) -> (Vec<std::net::SocketAddr>, Vec<String>) {
    let mut inodes = std::collections::HashSet::new();
    for fd in std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap() {
        let Ok(link) = std::fs::read_link(fd.unwrap().path()) else {
            continue;
        };
        let link = link.to_string_lossy().into_owned();
        if let Some(n) = link
            .strip_prefix("socket:[")
            .and_then(|s| s.strip_suffix(']'))
        {
            inodes.insert(n.to_string());
        }
    }
    let mut tcp = Vec::new();
    for table in ["tcp", "tcp6"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // sl local rem st tx:rx tr:when retrnsmt uid timeout inode
            if f.len() < 10 || f[3] != "0A" || !inodes.contains(f[9]) {
                continue;
            }
            let (ip, port) = f[1].split_once(':').unwrap();
            let port = u16::from_str_radix(port, 16).unwrap();
            let words: Vec<u32> = (0..ip.len() / 8)
                .map(|i| u32::from_str_radix(&ip[i * 8..i * 8 + 8], 16).unwrap())
                .collect();
            // Each 32-bit word is in the host's (little-endian) order.
            let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
            let ip: std::net::IpAddr = if bytes.len() == 4 {
                std::net::Ipv4Addr::new(bytes[0], bytes[1], bytes[2], bytes[3]).into()
            } else {
                std::net::Ipv6Addr::from(<[u8; 16]>::try_from(bytes).unwrap()).into()
            };
            tcp.push(std::net::SocketAddr::new(ip, port));
        }
    }
    let mut unix = Vec::new();
    let text = std::fs::read_to_string(format!("/proc/{pid}/net/unix")).unwrap_or_default();
    for line in text.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        // Num RefCount Protocol Flags Type St Inode Path; flag 0x10000: listening.
        if f.len() < 7 || !inodes.contains(f[6]) {
            continue;
        }
        let flags = u32::from_str_radix(f[3], 16).unwrap_or(0);
        if flags & 0x10000 != 0 {
            unix.push(
                f.get(7)
                    .map_or_else(|| "(unnamed)".to_string(), |p| p.to_string()),
            );
        }
    }
    (tcp, unix)
}

/// Runs `cmd` as the unprivileged user nobody (65534:65534, no other groups).
fn as_nobody(cmd: &[&str]) -> (bool, String) {
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .args(cmd)
        .current_dir("/")
        .stdin(Stdio::null())
        .output()
        .expect("run setpriv");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// With --allow excluding this machine, every socket the server process listens on (found
/// from /proc, not from the server's log) is tried by the unprivileged user nobody with
/// libnfs (a listing and a copy in, on TCP; a connection, on a Unix socket): each is
/// refused, and nothing is written. (The server once relayed allowed clients to a second,
/// 127.0.0.1 port that anybody on the machine could reach, past --allow.)
#[test]
fn no_socket_of_the_server_lets_a_local_user_past_allow() {
    if !have_client() {
        return;
    }
    let vol = Volume::new();
    {
        let m = vol.mount();
        std::fs::create_dir(m.p("open")).unwrap();
        std::fs::set_permissions(
            m.p("open"),
            std::os::unix::fs::PermissionsExt::from_mode(0o777),
        )
        .unwrap();
    }
    let srv = Server::start(
        &vol,
        &["--allow", "10.9.9.9/32", "--anonuid", "0", "--anongid", "0"],
    );
    let pid = srv.child.as_ref().unwrap().id();
    let (tcp, unix) = listening_sockets(pid);
    assert!(
        tcp.iter().any(|a| a.port() == srv.port),
        "the --listen socket is not among {tcp:?}"
    );
    let src = std::env::temp_dir().join(format!("unkai-nfs-probe-{}", std::process::id()));
    std::fs::write(&src, b"from nobody").unwrap();
    std::fs::set_permissions(&src, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let src_s = src.to_str().unwrap();
    for addr in &tcp {
        let host = match addr.ip() {
            ip if ip.is_unspecified() && ip.is_ipv4() => "127.0.0.1".to_string(),
            ip if ip.is_unspecified() => "[::1]".to_string(),
            std::net::IpAddr::V4(ip) => ip.to_string(),
            std::net::IpAddr::V6(ip) => format!("[{ip}]"),
        };
        let p = addr.port();
        let q = format!("?nfsport={p}&mountport={p}&version=3");
        let (ok, out) = as_nobody(&["nfs-ls", &format!("nfs://{host}/{q}")]);
        assert!(!ok, "nobody listed the volume through {addr}: {out}");
        let (ok, out) = as_nobody(&["nfs-cp", src_s, &format!("nfs://{host}//open/pwned-{p}{q}")]);
        assert!(!ok, "nobody wrote into the volume through {addr}: {out}");
    }
    for path in &unix {
        let probe = "import socket,sys\ns=socket.socket(socket.AF_UNIX)\ns.connect(sys.argv[1])";
        let (ok, out) = as_nobody(&["/usr/bin/python3", "-c", probe, path]);
        assert!(
            !ok,
            "nobody connected to the server's Unix socket {path}: {out}"
        );
    }
    let _ = std::fs::remove_file(&src);
    let log = srv.stop();
    let m = vol.mount();
    let left: Vec<String> = std::fs::read_dir(m.p("open"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(left.is_empty(), "written past --allow: {left:?}\n{log}");
}

/// Per-call identities, as exports(5) maps them: libnfs's `uid=`/`gid=` reach the volume (a
/// FUSE mount shows the owner), root is squashed by default and not under
/// --no-root-squash, --all-squash maps everybody; a 0600 file of uid 1000 is refused to uid
/// 1001, a 0640 file to anybody outside its group (a supplementary group counts), and an
/// AUTH_NONE call acts as the anonymous identity.
#[test]
fn callers_act_as_themselves_with_root_squashed() {
    if !have_client() {
        return;
    }
    let vol = Volume::new();
    {
        let m = vol.mount();
        std::fs::create_dir(m.p("open")).unwrap();
        std::fs::set_permissions(
            m.p("open"),
            std::os::unix::fs::PermissionsExt::from_mode(0o777),
        )
        .unwrap();
    }
    let tmp = tempfile::tempdir().unwrap();
    let src = write_tmp(tmp.path(), "x", b"secret of 1000");
    let srv = Server::start(&vol, &[]);
    let (ok, out) = nfs_cp(&src, &srv.url("/open/by-1000", "&uid=1000&gid=1000"));
    assert!(ok, "{out}");
    let (ok, out) = nfs_cp(&src, &srv.url("/open/kept-1000", "&uid=1000&gid=1000"));
    assert!(ok, "{out}");
    let (ok, out) = nfs_cp(&src, &srv.url("/open/by-root", "&uid=0&gid=0"));
    assert!(ok, "{out}");
    // The copy made it 0600? nfs-cp creates 0660: make it 0600 and 0640 (group 500) over NFS
    // as its owner.
    let mut rpc = Rpc::connect_as(srv.port, Some((1000, 1000, vec![])));
    let root = rpc.mount("/").unwrap();
    let open = rpc.lookup(&root, "open").unwrap();
    let f = rpc.lookup(&open, "by-1000").unwrap();
    assert_eq!(rpc.setattr_mode(&f, 0o600), 0);
    assert_eq!(rpc.read(&f, 0, 100).unwrap(), b"secret of 1000");
    assert_eq!(
        nfs_cat(&srv.url("/open/by-1000", "&uid=1000&gid=1000")).unwrap(),
        b"secret of 1000"
    );
    assert!(
        nfs_cat(&srv.url("/open/by-1000", "&uid=1001&gid=1001")).is_none(),
        "uid 1001 read a 0600 file of uid 1000"
    );
    let mut other = Rpc::connect_as(srv.port, Some((1001, 1001, vec![])));
    assert_eq!(other.read(&f, 0, 100), Err(NFS3ERR_ACCES));
    assert_eq!(other.write(&f, 0, b"x"), NFS3ERR_ACCES);
    // Group 500 may read a 0640 file of group 500: by a supplementary group too.
    assert_eq!(rpc.setattr_mode(&f, 0o640), 0);
    assert_eq!(
        rpc.setattr_gid(&f, 500),
        NFS3ERR_PERM,
        "1000 is not in group 500"
    );
    let mut owner = Rpc::connect_as(srv.port, Some((1000, 1000, vec![500])));
    assert_eq!(owner.setattr_gid(&f, 500), 0);
    assert_eq!(other.read(&f, 0, 100), Err(NFS3ERR_ACCES));
    let mut member = Rpc::connect_as(srv.port, Some((1001, 1001, vec![7, 500])));
    assert_eq!(member.read(&f, 0, 100).unwrap(), b"secret of 1000");
    assert_eq!(member.write(&f, 0, b"x"), NFS3ERR_ACCES);
    // AUTH_NONE: the anonymous identity (65534), which may not read it either.
    let mut anon = Rpc::connect_as(srv.port, None);
    assert_eq!(anon.read(&f, 0, 100), Err(NFS3ERR_ACCES));
    // Root squashed: it may not read it.
    let mut root_rpc = Rpc::connect(srv.port, 0);
    assert_eq!(root_rpc.read(&f, 0, 100), Err(NFS3ERR_ACCES));
    drop(srv);
    // --no-root-squash: root is root.
    let srv = Server::start(&vol, &["--no-root-squash"]);
    let (ok, out) = nfs_cp(&src, &srv.url("/open/by-real-root", "&uid=0&gid=0"));
    assert!(ok, "{out}");
    let mut root_rpc = Rpc::connect(srv.port, 0);
    let root = root_rpc.mount("/").unwrap();
    let open = root_rpc.lookup(&root, "open").unwrap();
    let f = root_rpc.lookup(&open, "by-1000").unwrap();
    assert_eq!(root_rpc.read(&f, 0, 100).unwrap(), b"secret of 1000");
    drop(srv);
    // all_squash (as an -o list): everybody is anonuid/anongid.
    let srv = Server::start(&vol, &["-o", "all_squash,anonuid=2000,anongid=2001"]);
    let (ok, out) = nfs_cp(&src, &srv.url("/open/by-squashed", "&uid=1000&gid=1000"));
    assert!(ok, "{out}");
    drop(srv);

    let m = vol.mount();
    let owner = |name: &str| {
        let md = std::fs::metadata(m.p(&format!("open/{name}"))).unwrap();
        (md.uid(), md.gid())
    };
    assert_eq!(owner("kept-1000"), (1000, 1000));
    assert_eq!(owner("by-1000"), (1000, 500));
    assert_eq!(owner("by-root"), (65534, 65534));
    assert_eq!(owner("by-real-root"), (0, 0));
    assert_eq!(owner("by-squashed"), (2000, 2001));
}

/// UNSTABLE WRITEs are answered UNSTABLE with the server's write verifier, COMMIT returns
/// the same verifier and what was written reads back; FILE_SYNC is answered FILE_SYNC. After
/// a restart the verifier differs (a client then resends what it never saw committed), a
/// file handle taken before still works, and a READDIR resumed from a cookie taken before
/// continues where the listing stopped instead of starting over.
#[test]
fn unstable_writes_commit_and_handles_and_cookies_outlive_a_restart() {
    if !have_client() {
        return;
    }
    let vol = Volume::new();
    let n = 300;
    {
        let m = vol.mount();
        std::fs::create_dir(m.p("dir")).unwrap();
        for i in 0..n {
            std::fs::write(m.p(&format!("dir/entry-{i:04}")), b"").unwrap();
        }
        std::fs::write(m.p("f"), b"").unwrap();
    }
    let srv = Server::start(&vol, &["--no-root-squash"]);
    let mut rpc = Rpc::connect(srv.port, 0);
    let root = rpc.mount("/").unwrap();
    let f = rpc.lookup(&root, "f").unwrap();
    let dir = rpc.lookup(&root, "dir").unwrap();
    let data = pattern(3 * MIB + 100, 9);
    let mut verf = None;
    for (i, piece) in data.chunks(MIB).enumerate() {
        let (committed, v) = rpc
            .write_how(&f, (i * MIB) as u64, piece, 0)
            .expect("UNSTABLE WRITE");
        assert_eq!(committed, 0, "an UNSTABLE write answered as committed");
        assert!(
            verf.is_none_or(|w| w == v),
            "the verifier changed within a run"
        );
        verf = Some(v);
    }
    let verf = verf.unwrap();
    assert_eq!(rpc.commit(&f).unwrap(), verf);
    let mut back = Vec::new();
    while back.len() < data.len() {
        back.extend(rpc.read(&f, back.len() as u64, MIB as u32).unwrap());
    }
    assert!(
        back == data,
        "what was written and committed reads back different"
    );
    let (committed, v) = rpc.write_how(&f, 0, b"sync", 2).unwrap();
    assert_eq!(
        (committed, v),
        (2, verf),
        "FILE_SYNC asked, FILE_SYNC answered"
    );
    // A first page of the listing (small replies: several pages in all).
    let (page1, end) = rpc.readdir(&dir, 0, 2048).unwrap();
    assert!(
        !end && !page1.is_empty() && page1.len() < n,
        "{} entries",
        page1.len()
    );
    let resume = page1.last().unwrap().1;
    drop(rpc);

    let log = srv.stop();
    let m = vol.mount();
    assert!(
        std::fs::read(m.p("f")).unwrap()[4..] == data[4..],
        "committed data lost by a restart\n{log}"
    );
    drop(m);
    let srv = Server::start(&vol, &["--no-root-squash"]);
    let mut rpc = Rpc::connect(srv.port, 0);
    // The handles taken before the restart.
    assert_eq!(rpc.getattr(&f).unwrap().0, data.len() as u64);
    let (_, v2) = rpc.write_how(&f, 0, b"next", 0).unwrap();
    assert_ne!(v2, verf, "the write verifier survived a restart");
    // The listing goes on after page 1, across the restart: every entry once.
    let mut names: Vec<String> = page1.iter().map(|(n, _)| n.clone()).collect();
    let mut cookie = resume;
    loop {
        let (page, end) = rpc.readdir(&dir, cookie, 2048).unwrap();
        assert!(
            page.iter().all(|(n, _)| !page1.iter().any(|(p, _)| p == n)),
            "a READDIR from a cookie started over"
        );
        names.extend(page.iter().map(|(n, _)| n.clone()));
        match page.last() {
            Some((_, c)) if !end => cookie = *c,
            _ => break,
        }
    }
    names.sort();
    let want: Vec<String> = (0..n).map(|i| format!("entry-{i:04}")).collect();
    assert_eq!(names, want);
    // A handle of a file removed since is stale.
    let gone = rpc.lookup(&dir, "entry-0000").unwrap();
    assert_eq!(rpc.remove(&dir, "entry-0000"), 0);
    assert_eq!(rpc.getattr(&gone), Err(NFS3ERR_STALE));
    drop(srv);
}
