//! The core file-system operations on each real object store: S3 (versitygw), GCS
//! (fake-gcs-server), Azure Blob (Azurite).
//!
//! Every case runs once per backend (`s3::CASE`, `gcs::CASE`, `azure::CASE`), each on a server
//! of its own. Objects are checked through the server's own view of the bucket (versitygw's
//! posix directory, fake-gcs-server's JSON API, Azure's SDK against Azurite), not through
//! unkai: after every case the volume's objects in the store are exactly those its metadata
//! references (`status --json`), and `fsck` finds the volume consistent with nothing leaked.
//!
//! Then what only some backends do: format creates a missing bucket (S3, GCS) or refuses a
//! missing container (Azure); bad S3 credentials fail at once with one line; hashed key
//! prefixes; volumes sharing one bucket.

use crate::common;

use crate::common::rng::XorShift;
use crate::common::*;
use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const CHUNK: u64 = 64 * MIB;
const BUCKET: &str = "unkai-test";

// ---------------------------------------------------------------------------------------------
// The stores and their own view of the bucket.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    S3,
    Gcs,
    Azure,
}

/// A running storage server with the bucket `BUCKET` (created by format on S3 and GCS, by the
/// harness on Azure). Volumes use the storage URL `<scheme>://BUCKET/vols`.
struct Store {
    kind: Kind,
    server: servers::Server,
    /// Azure: an account SAS query (read, list), made once, for listing over plain HTTP.
    sas: std::sync::OnceLock<String>,
}

impl Store {
    fn start(kind: Kind) -> Store {
        let server = match kind {
            Kind::S3 => servers::s3(BUCKET),
            Kind::Gcs => servers::gcs(BUCKET),
            Kind::Azure => servers::azure(BUCKET),
        };
        Store {
            kind,
            server,
            sas: std::sync::OnceLock::new(),
        }
    }

    fn env(&self) -> Vec<(String, String)> {
        self.server.env.clone()
    }

    /// Formats a volume NAME on this store (extra `format` flags in `extra`).
    fn format(&self, name: &str, extra: &[&str]) -> Volume {
        let dir = tempfile::Builder::new()
            .prefix("unkai-test-")
            .tempdir()
            .expect("tempdir");
        let meta_url = format!("sqlite://{}/meta.db", dir.path().display());
        let mut args = vec!["format", "--storage", &self.server.storage];
        args.extend_from_slice(extra);
        args.push(&meta_url);
        args.push(name);
        let (ok, out, err) = run_env(&args, &self.server.env);
        assert!(
            ok,
            "format of {name} on {:?} failed: {out}{err}\nserver log:\n{}",
            self.kind,
            self.server.log()
        );
        let env = common::with_cache_dir(self.env(), dir.path());
        Volume {
            dir,
            meta_url,
            name: name.to_string(),
            env,
            db: None,
        }
    }

    /// Every object key in BUCKET, as the server itself lists it.
    fn keys(&self) -> Vec<String> {
        self.keys_of(BUCKET)
            .unwrap_or_else(|| panic!("bucket {BUCKET} does not exist on {:?}", self.kind))
    }

    /// Every object key of a bucket as the server lists it; None if the bucket does not exist.
    fn keys_of(&self, bucket: &str) -> Option<Vec<String>> {
        let mut keys = match self.kind {
            Kind::S3 => s3_keys(&self.server.dir.path().join("root").join(bucket))?,
            Kind::Gcs => gcs_keys(self.server.port, bucket)?,
            Kind::Azure => azure_keys(self.server.port, self.sas(), bucket)?,
        };
        keys.sort();
        Some(keys)
    }

    fn sas(&self) -> &str {
        self.sas.get_or_init(|| {
            let (ok, out, err) = azure_node(
                self.server.port,
                r#"console.log(svc.generateAccountSasUrl(new Date(Date.now() + 86400000),
  AccountSASPermissions.parse("rl"), "sco").split("?")[1]);"#,
                "",
            );
            assert!(ok, "making a SAS: {err}");
            out.trim().to_string()
        })
    }

    /// The block objects of volume `name` (plain or hashed keys) in the server's listing.
    fn blocks(&self, name: &str) -> Vec<String> {
        self.keys()
            .into_iter()
            .filter(|k| block_of(k, name).is_some())
            .collect()
    }
}

/// Whether `key` (relative to the bucket) is a block object of volume `name`: Some(hashed).
fn block_of(key: &str, name: &str) -> Option<bool> {
    let rest = key.strip_prefix("vols/")?;
    let (hashed, rest) = match rest.split_once('/') {
        Some((h, r))
            if h.len() == 2
                && h.bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
                && r.starts_with(&format!("{name}/")) =>
        {
            (true, r)
        }
        _ => (false, rest),
    };
    // NAME/chunks/... (layout 0) or NAME/UUID/chunks/... (layout 1).
    let rest = rest.strip_prefix(&format!("{name}/"))?;
    let rest = match rest.strip_prefix("chunks/") {
        Some(r) => r,
        None => rest.split_once('/')?.1.strip_prefix("chunks/")?,
    };
    let file = rest.rsplit('/').next()?;
    let parts: Vec<&str> = file.split('_').collect();
    if parts.len() == 3 && parts.iter().all(|p| p.parse::<u64>().is_ok()) {
        Some(hashed)
    } else {
        None
    }
}

/// versitygw's posix backend: a bucket is a directory, an object a file.
fn s3_keys(bucket_dir: &Path) -> Option<Vec<String>> {
    fn walk(root: &Path, d: &Path, out: &mut Vec<String>) {
        for e in fs::read_dir(d).unwrap().flatten() {
            let p = e.path();
            let t = e.file_type().unwrap();
            if t.is_dir() {
                walk(root, &p, out);
            } else if t.is_file() {
                out.push(p.strip_prefix(root).unwrap().to_string_lossy().into_owned());
            }
        }
    }
    if !bucket_dir.is_dir() {
        return None;
    }
    let mut out = Vec::new();
    walk(bucket_dir, bucket_dir, &mut out);
    Some(out)
}

/// A plain HTTP/1.0 GET to 127.0.0.1:port: (status, body).
fn http_get(port: u16, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n").unwrap();
    let mut buf = String::new();
    s.read_to_string(&mut buf).unwrap();
    let (head, body) = buf.split_once("\r\n\r\n").unwrap_or((&buf, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("bad HTTP answer to GET {path}: {head}"));
    (status, body.to_string())
}

/// fake-gcs-server's JSON API: `GET /storage/v1/b/BUCKET/o`, page by page.
fn gcs_keys(port: u16, bucket: &str) -> Option<Vec<String>> {
    let (status, _) = http_get(port, &format!("/storage/v1/b/{bucket}"));
    if status == 404 {
        return None;
    }
    assert_eq!(status, 200, "GET bucket {bucket}");
    let mut out = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let mut path = format!("/storage/v1/b/{bucket}/o?maxResults=1000");
        if let Some(t) = &token {
            path.push_str(&format!("&pageToken={t}"));
        }
        let (status, body) = http_get(port, &path);
        assert_eq!(status, 200, "listing {bucket}: {body}");
        let v: serde_json::Value = serde_json::from_str(&body).expect("listing JSON");
        for item in v["items"].as_array().into_iter().flatten() {
            out.push(item["name"].as_str().unwrap().to_string());
        }
        match v["nextPageToken"].as_str() {
            Some(t) if !t.is_empty() => token = Some(t.to_string()),
            _ => break,
        }
    }
    Some(out)
}

/// Azurite's well-known development account, for listing through Azure's own SDK.
const AZURITE_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

/// Runs a node script with Azure's SDK against the Azurite on `port`.
fn azure_node(port: u16, script: &str, arg: &str) -> (bool, String, String) {
    let prelude = format!(
        r#"const {{ BlobServiceClient, AccountSASPermissions }} = require("@azure/storage-blob");
const url = "http://127.0.0.1:{port}/devstoreaccount1";
const conn = `DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={AZURITE_KEY};BlobEndpoint=${{url}};`;
const svc = BlobServiceClient.fromConnectionString(conn);
const arg = process.argv[1];
"#
    );
    let out = Command::new("node")
        .arg("-e")
        .arg(format!("{prelude}{script}"))
        .arg(arg)
        .env("NODE_PATH", servers::tools_dir().join("node_modules"))
        .output()
        .expect("run node");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Azurite's List Blobs over plain HTTP with an account SAS, page by page.
fn azure_keys(port: u16, sas: &str, container: &str) -> Option<Vec<String>> {
    let mut out = Vec::new();
    let mut marker = String::new();
    loop {
        let (status, body) = http_get(
            port,
            &format!("/devstoreaccount1/{container}?restype=container&comp=list&{sas}{marker}"),
        );
        if status == 404 && body.contains("ContainerNotFound") {
            return None;
        }
        assert_eq!(status, 200, "listing container {container}: {body}");
        for piece in body.split("<Name>").skip(1) {
            let name = piece.split("</Name>").next().unwrap();
            out.push(
                name.replace("&lt;", "<")
                    .replace("&gt;", ">")
                    .replace("&quot;", "\"")
                    .replace("&apos;", "'")
                    .replace("&amp;", "&"),
            );
        }
        match body
            .split("<NextMarker>")
            .nth(1)
            .and_then(|m| m.split("</NextMarker>").next())
        {
            Some(m) if !m.is_empty() => marker = format!("&marker={m}"),
            _ => break,
        }
    }
    Some(out)
}

fn azure_create_container(port: u16, container: &str) {
    let (ok, _, err) = azure_node(
        port,
        r#"svc.getContainerClient(arg).createIfNotExists()
  .catch((e) => { console.error(e.message); process.exit(1); });"#,
        container,
    );
    assert!(ok, "creating container {container}: {err}");
}

// ---------------------------------------------------------------------------------------------
// Checks shared by every case.

/// `unkai status --json` of a volume.
fn status(vol: &Volume) -> serde_json::Value {
    let (ok, out, err) = vol.cmd("status", &["--json"]);
    assert!(ok, "status failed: {out}{err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("status --json: {e}: {out}"))
}

/// Objects the volume's metadata references, and slices awaiting deletion.
fn meta_objects(vol: &Volume) -> (u64, u64) {
    let s = status(vol);
    (
        s["usage"]["objects"].as_u64().expect("usage.objects"),
        s["usage"]["pending_delete_slices"]
            .as_u64()
            .expect("usage.pending_delete_slices"),
    )
}

/// `unkai fsck -q`: succeeds, says consistent, finds nothing leaked; returns the object count
/// fsck listed.
fn fsck_clean(st: &Store, vol: &Volume) -> u64 {
    let (ok, out, err) = vol.cmd("fsck", &["-q"]);
    assert!(
        ok,
        "fsck of {} failed:\n{out}{err}\nserver log:\n{}",
        vol.name,
        st.server.log()
    );
    assert!(
        out.contains("volume is consistent"),
        "fsck of {}:\n{out}{err}",
        vol.name
    );
    assert!(
        !out.contains("LEAKED") && !out.contains("leaked objects"),
        "fsck of {} found leaked objects:\n{out}",
        vol.name
    );
    let line = out
        .lines()
        .find(|l| l.starts_with("checked "))
        .unwrap_or_else(|| panic!("no 'checked' line in fsck output:\n{out}"));
    line.trim_end_matches(" objects")
        .rsplit(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no object count in '{line}'"))
}

/// On an unmounted volume: nothing awaits deletion, the store holds exactly the objects the
/// metadata references (in the server's own listing and in fsck's), and fsck is clean.
/// Returns that number of objects.
fn check_clean(st: &Store, vol: &Volume) -> u64 {
    let (objects, pending) = meta_objects(vol);
    assert_eq!(
        pending, 0,
        "{}: slices still await deletion after unmount",
        vol.name
    );
    let in_store = st.blocks(&vol.name);
    assert_eq!(
        in_store.len() as u64,
        objects,
        "{}: the store holds {} block objects, the metadata references {objects}: {in_store:?}",
        vol.name,
        in_store.len()
    );
    let listed = fsck_clean(st, vol);
    assert_eq!(
        listed, objects,
        "{}: fsck listed {listed} objects, the metadata references {objects}",
        vol.name
    );
    objects
}

/// Waits (while mounted) until the store holds exactly the objects the metadata references,
/// nothing awaits deletion, and `done` holds of the block keys: background deletion runs every
/// half second, and the kernel releases a closed file asynchronously. A failure shows the end
/// of `m`'s log.
fn wait_store(
    st: &Store,
    vol: &Volume,
    m: &Mount,
    what: &str,
    done: impl Fn(&[String]) -> bool,
) -> Vec<String> {
    let start = Instant::now();
    loop {
        let (objects, pending) = meta_objects(vol);
        let keys = st.blocks(&vol.name);
        if pending == 0 && keys.len() as u64 == objects && done(&keys) {
            return keys;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{}: {what}: not so after 60 s: {} objects in the store, {objects} referenced, \
             {pending} slices awaiting deletion: {keys:?}\nmount log:\n{}",
            vol.name,
            keys.len(),
            tail(&m.log_text(), 40)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

// ---------------------------------------------------------------------------------------------
// File helpers.

/// Reads a whole file from the file system (not the page cache).
fn read_uncached(p: &Path) -> Vec<u8> {
    let f = File::open(p).unwrap_or_else(|e| panic!("open {}: {e}", p.display()));
    drop_cache(&f);
    let mut buf = Vec::new();
    (&f).read_to_end(&mut buf).unwrap();
    buf
}

/// Compares contents without printing megabytes: the first difference and the sizes.
#[track_caller]
fn assert_same(what: &str, got: &[u8], want: &[u8]) {
    if got == want {
        return;
    }
    let first = got
        .iter()
        .zip(want)
        .position(|(a, b)| a != b)
        .unwrap_or(got.len().min(want.len()));
    let end = |v: &[u8]| v[first..(first + 16).min(v.len())].to_vec();
    panic!(
        "{what}: contents differ: got {} bytes, want {}; first difference at byte {first} \
         (0x{first:x}): got {:02x?}, want {:02x?}",
        got.len(),
        want.len(),
        end(got),
        end(want)
    );
}

/// Checks a file's size and contents against `want`, reading from the file system.
#[track_caller]
fn check_file(p: &Path, want: &[u8]) {
    let len = fs::metadata(p)
        .unwrap_or_else(|e| panic!("stat {}: {e}", p.display()))
        .len();
    assert_eq!(len, want.len() as u64, "size of {}", p.display());
    assert_same(&p.display().to_string(), &read_uncached(p), want);
}

fn set(v: &[&str]) -> BTreeSet<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn last_err() -> std::io::Error {
    std::io::Error::last_os_error()
}

/// copy_file_range until `len` bytes are copied (or the source ends).
fn copy_range(src: &File, src_off: u64, dst: &File, dst_off: u64, len: u64) -> u64 {
    let mut done = 0;
    while done < len {
        let mut si = (src_off + done) as i64;
        let mut di = (dst_off + done) as i64;
        let r = unsafe {
            libc::copy_file_range(
                src.as_raw_fd(),
                &mut si,
                dst.as_raw_fd(),
                &mut di,
                (len - done) as usize,
                0,
            )
        };
        assert!(r >= 0, "copy_file_range: {}", last_err());
        if r == 0 {
            break;
        }
        done += r as u64;
    }
    done
}

/// Applies a write to the in-memory model.
fn model_write(model: &mut Vec<u8>, off: u64, data: &[u8]) {
    let end = off as usize + data.len();
    if model.len() < end {
        model.resize(end, 0);
    }
    model[off as usize..end].copy_from_slice(data);
}

// ---------------------------------------------------------------------------------------------
// The core cases, run on every backend.

/// create, write, read, append, overwrite, rename, unlink; directories; hard links; symlinks.
fn namespace(kind: Kind) {
    let st = Store::start(kind);
    let vol = st.format("testvol", &[]);
    let m = vol.mount();

    // Files.
    let a = pattern(300 * KIB as usize + 17, 1);
    fs::write(m.p("a"), &a).unwrap();
    check_file(&m.p("a"), &a);
    let mut f = OpenOptions::new().append(true).open(m.p("a")).unwrap();
    f.write_all(b"appended").unwrap();
    drop(f);
    let mut a2 = a.clone();
    a2.extend_from_slice(b"appended");
    check_file(&m.p("a"), &a2);
    let f = OpenOptions::new().write(true).open(m.p("a")).unwrap();
    f.write_all_at(b"OVERWRITTEN", 1000).unwrap();
    drop(f);
    a2[1000..1011].copy_from_slice(b"OVERWRITTEN");
    check_file(&m.p("a"), &a2);
    File::create(m.p("empty")).unwrap();
    check_file(&m.p("empty"), b"");

    // Rename: within a directory, over an existing file, into a subdirectory.
    let b = pattern(5 * MIB as usize + 3, 2);
    fs::write(m.p("b"), &b).unwrap();
    fs::rename(m.p("a"), m.p("a-renamed")).unwrap();
    assert_eq!(
        errno(&fs::metadata(m.p("a")).unwrap_err()),
        libc::ENOENT,
        "old name of a renamed file"
    );
    check_file(&m.p("a-renamed"), &a2);
    fs::rename(m.p("b"), m.p("a-renamed")).unwrap();
    check_file(&m.p("a-renamed"), &b);
    assert!(!m.p("b").exists());

    // Directories.
    fs::create_dir_all(m.p("d1/d2/d3")).unwrap();
    fs::write(m.p("d1/d2/d3/deep"), b"deep file").unwrap();
    fs::write(m.p("d1/one"), b"1").unwrap();
    fs::rename(m.p("a-renamed"), m.p("d1/d2/moved")).unwrap();
    check_file(&m.p("d1/d2/moved"), &b);
    assert_eq!(names(&m.p("d1")), set(&["d2", "one"]));
    assert_eq!(names(&m.p("d1/d2")), set(&["d3", "moved"]));
    assert!(fs::metadata(m.p("d1/d2")).unwrap().is_dir());
    assert_eq!(
        errno(&fs::remove_dir(m.p("d1/d2")).unwrap_err()),
        libc::ENOTEMPTY,
        "rmdir of a non-empty directory"
    );
    fs::create_dir(m.p("gone-dir")).unwrap();
    fs::remove_dir(m.p("gone-dir")).unwrap();
    assert!(!m.p("gone-dir").exists());
    fs::rename(m.p("d1/d2"), m.p("d2-top")).unwrap();
    check_file(&m.p("d2-top/d3/deep"), b"deep file");
    assert_eq!(names(&m.p("d1")), set(&["one"]));

    // Unlink.
    fs::write(m.p("doomed"), pattern(2 * MIB as usize, 3)).unwrap();
    fs::remove_file(m.p("doomed")).unwrap();
    assert_eq!(errno(&File::open(m.p("doomed")).unwrap_err()), libc::ENOENT);

    // Hard links: one inode, two names.
    let h = pattern(64 * KIB as usize, 4);
    fs::write(m.p("h1"), &h).unwrap();
    fs::hard_link(m.p("h1"), m.p("d1/h2")).unwrap();
    let (m1, m2) = (
        fs::metadata(m.p("h1")).unwrap(),
        fs::metadata(m.p("d1/h2")).unwrap(),
    );
    assert_eq!(m1.ino(), m2.ino());
    assert_eq!(m1.nlink(), 2);
    let f = OpenOptions::new().write(true).open(m.p("d1/h2")).unwrap();
    f.write_all_at(b"via h2", 10).unwrap();
    drop(f);
    let mut h2 = h.clone();
    h2[10..16].copy_from_slice(b"via h2");
    check_file(&m.p("h1"), &h2);
    fs::remove_file(m.p("h1")).unwrap();
    assert_eq!(fs::metadata(m.p("d1/h2")).unwrap().nlink(), 1);
    check_file(&m.p("d1/h2"), &h2);
    fs::hard_link(m.p("d1/h2"), m.p("h3")).unwrap();

    // Symlinks: relative, absolute inside, to a directory, dangling.
    std::os::unix::fs::symlink("d1/h2", m.p("ln")).unwrap();
    assert_eq!(fs::read_link(m.p("ln")).unwrap(), PathBuf::from("d1/h2"));
    assert!(fs::symlink_metadata(m.p("ln")).unwrap().is_symlink());
    check_file(&m.p("ln"), &h2);
    std::os::unix::fs::symlink("d2-top/d3", m.p("ln-dir")).unwrap();
    assert_eq!(names(&m.p("ln-dir")), set(&["deep"]));
    std::os::unix::fs::symlink("nowhere", m.p("dangling")).unwrap();
    assert_eq!(
        errno(&File::open(m.p("dangling")).unwrap_err()),
        libc::ENOENT
    );
    let long_target = "x/".repeat(400) + "end";
    std::os::unix::fs::symlink(&long_target, m.p("long-ln")).unwrap();

    let check = |m: &Mount| {
        assert_eq!(
            names(&m.path),
            set(&[
                "d1", "d2-top", "dangling", "empty", "h3", "ln", "ln-dir", "long-ln"
            ])
        );
        check_file(&m.p("empty"), b"");
        check_file(&m.p("d1/one"), b"1");
        check_file(&m.p("d2-top/moved"), &b);
        check_file(&m.p("d2-top/d3/deep"), b"deep file");
        check_file(&m.p("d1/h2"), &h2);
        check_file(&m.p("h3"), &h2);
        assert_eq!(fs::metadata(m.p("h3")).unwrap().nlink(), 2);
        assert_eq!(
            fs::metadata(m.p("h3")).unwrap().ino(),
            fs::metadata(m.p("d1/h2")).unwrap().ino()
        );
        assert_eq!(fs::read_link(m.p("ln")).unwrap(), PathBuf::from("d1/h2"));
        check_file(&m.p("ln"), &h2);
        assert_eq!(names(&m.p("ln-dir")), set(&["deep"]));
        assert_eq!(
            fs::read_link(m.p("dangling")).unwrap(),
            PathBuf::from("nowhere")
        );
        assert_eq!(
            fs::read_link(m.p("long-ln")).unwrap(),
            PathBuf::from(&long_target)
        );
    };
    check(&m);
    m.unmount();
    let m = vol.mount();
    check(&m);
    m.unmount();
    assert!(check_clean(&st, &vol) > 0);
}

/// Random writes and overwrites at random offsets (some across the 64 MiB chunk boundary),
/// checked against an in-memory model: through the page cache, after dropping it, after a
/// remount; then more overwrites on top of the persisted data, checked again.
fn random_writes(kind: Kind) {
    let st = Store::start(kind);
    let vol = st.format("testvol", &[]);
    let mut rng = XorShift(0x2545_f491_4f6c_dd1d ^ kind as u64);
    let mut model = Vec::new();
    let mut seed = 100;
    let mut round = |m: &Mount, model: &mut Vec<u8>, rng: &mut XorShift, ops: usize| {
        let open = || {
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(m.p("rand"))
                .unwrap()
        };
        let mut f = open();
        for i in 0..ops {
            let off = match rng.below(10) {
                // Around the chunk boundary.
                0 | 1 => CHUNK - 2 * MIB + rng.below(4 * MIB),
                // Straddling a 4 MiB block boundary.
                2 => (1 + rng.below(2)) * 4 * MIB - rng.below(64 * KIB),
                _ => rng.below(10 * MIB),
            };
            let len = match rng.below(4) {
                0 => 1 + rng.below(100),
                _ => 1 + rng.below(256 * KIB),
            };
            seed += 1;
            let data = pattern(len as usize, seed);
            f.write_all_at(&data, off).unwrap();
            model_write(model, off, &data);
            if i % 8 == 0 {
                // A random range, through whatever the kernel caches.
                let off = rng.below(model.len() as u64);
                let len = (1 + rng.below(512 * KIB)).min(model.len() as u64 - off);
                let mut buf = vec![0; len as usize];
                f.read_exact_at(&mut buf, off).unwrap();
                assert_same(
                    &format!("read of {len} bytes at {off} after write {i}"),
                    &buf,
                    &model[off as usize..(off + len) as usize],
                );
            }
            match i % 25 {
                12 => f.sync_all().unwrap(),
                24 => {
                    drop(f);
                    f = open();
                }
                _ => {}
            }
        }
        f.sync_all().unwrap();
        assert_eq!(f.metadata().unwrap().len(), model.len() as u64);
        drop_cache(&f);
        let mut got = vec![0; model.len()];
        f.read_exact_at(&mut got, 0).unwrap();
        assert_same(
            "whole file after fsync and dropping the page cache",
            &got,
            model,
        );
        drop(f);
    };
    let m = vol.mount();
    round(&m, &mut model, &mut rng, 120);
    m.unmount();
    let m = vol.mount();
    check_file(&m.p("rand"), &model);
    round(&m, &mut model, &mut rng, 60);
    m.unmount();
    let m = vol.mount();
    check_file(&m.p("rand"), &model);
    m.unmount();
    assert!(check_clean(&st, &vol) > 0);
}

/// A 70 MiB file crossing the 64 MiB chunk boundary, mostly holes; and a sequential 20 MiB
/// file. Checked after dropping the page cache and after a remount.
fn large_files(kind: Kind) {
    let st = Store::start(kind);
    let vol = st.format("testvol", &[]);
    let m = vol.mount();
    let size = 70 * MIB;
    let mut model = vec![0u8; size as usize];
    let f = File::create(m.p("sparse")).unwrap();
    for (i, off) in [0, CHUNK - MIB / 2, 69 * MIB].into_iter().enumerate() {
        let data = pattern(MIB as usize, 10 + i as u64);
        f.write_all_at(&data, off).unwrap();
        model_write(&mut model, off, &data);
    }
    drop(f);
    let seq = pattern(20 * MIB as usize, 20);
    let mut f = File::create(m.p("seq")).unwrap();
    for piece in seq.chunks(128 * KIB as usize) {
        f.write_all(piece).unwrap();
    }
    drop(f);

    let check = |m: &Mount| {
        assert_eq!(fs::metadata(m.p("sparse")).unwrap().len(), size);
        check_file(&m.p("sparse"), &model);
        // Ranges of interest on their own: a hole, across the chunk boundary, the tail.
        let f = File::open(m.p("sparse")).unwrap();
        drop_cache(&f);
        for (off, len) in [
            (MIB, 10 * MIB),
            (CHUNK - MIB, 2 * MIB),
            (CHUNK - 1, 2),
            (68 * MIB + 5, 2 * MIB - 5),
        ] {
            let mut buf = vec![0xaa; len as usize];
            f.read_exact_at(&mut buf, off).unwrap();
            assert_same(
                &format!("sparse file, {len} bytes at {off}"),
                &buf,
                &model[off as usize..(off + len) as usize],
            );
        }
        // Reading at the end returns nothing.
        let mut buf = [0u8; 10];
        assert_eq!(f.read_at(&mut buf, size).unwrap(), 0);
        check_file(&m.p("seq"), &seq);
    };
    check(&m);
    m.unmount();
    let m = vol.mount();
    check(&m);
    m.unmount();
    // The sparse file's writes go up at close packed per chunk (two chunks: at least 2
    // objects, more if a flush came between the writes), and the 20 MiB file is 5 more at the
    // default 4 MiB block size.
    assert!(check_clean(&st, &vol) >= 7);
}

/// truncate shrink and grow, fallocate (punch hole, allocate beyond the end), copy_file_range
/// between files and inside one.
fn truncate_punch_copy(kind: Kind) {
    let st = Store::start(kind);
    let vol = st.format("testvol", &[]);
    let m = vol.mount();
    let open = |name: &str| {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(m.p(name))
            .unwrap()
    };

    // Truncate.
    let mut t = pattern(6 * MIB as usize, 30);
    fs::write(m.p("t"), &t).unwrap();
    let f = open("t");
    f.set_len(5 * MIB + 123).unwrap();
    t.truncate((5 * MIB + 123) as usize);
    check_file(&m.p("t"), &t);
    f.set_len(9 * MIB).unwrap();
    t.resize(9 * MIB as usize, 0);
    check_file(&m.p("t"), &t);
    // Shrink then grow: the old bytes must not come back.
    f.set_len(1000).unwrap();
    f.set_len(3 * MIB).unwrap();
    t.truncate(1000);
    t.resize(3 * MIB as usize, 0);
    check_file(&m.p("t"), &t);
    let w = pattern(10_000, 31);
    f.write_all_at(&w, 2 * MIB).unwrap();
    model_write(&mut t, 2 * MIB, &w);
    drop(f);
    check_file(&m.p("t"), &t);
    // Truncate to zero through open(O_TRUNC), then rewrite.
    let z = pattern(100_000, 32);
    fs::write(m.p("z"), pattern(3 * MIB as usize, 33)).unwrap();
    fs::write(m.p("z"), &z).unwrap();
    check_file(&m.p("z"), &z);

    // fallocate: punch holes (inside, and to past the end), allocate beyond the end.
    let mut p = pattern(8 * MIB as usize, 34);
    fs::write(m.p("p"), &p).unwrap();
    let f = open("p");
    let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    fallocate(&f, punch, MIB + 7, 3 * MIB).unwrap_or_else(|e| panic!("fallocate PUNCH_HOLE: {e}"));
    p[(MIB + 7) as usize..(4 * MIB + 7) as usize].fill(0);
    check_file(&m.p("p"), &p);
    fallocate(&f, punch, 7 * MIB + MIB / 2, 2 * MIB).unwrap();
    p[(7 * MIB + MIB / 2) as usize..].fill(0);
    check_file(&m.p("p"), &p);
    fallocate(&f, 0, 8 * MIB, MIB).unwrap_or_else(|e| panic!("fallocate: {e}"));
    p.resize(9 * MIB as usize, 0);
    check_file(&m.p("p"), &p);
    drop(f);

    // copy_file_range: a whole file into a new one, then ranges into and inside `p`.
    let src = open("t");
    let dst = open("c");
    assert_eq!(copy_range(&src, 0, &dst, 0, t.len() as u64), t.len() as u64);
    let c = t.clone();
    drop((src, dst));
    check_file(&m.p("c"), &c);
    let src = open("t");
    let dst = open("p");
    let n = copy_range(&src, 2 * MIB - 10, &dst, 100_000, MIB + 5);
    assert_eq!(n, MIB + 5);
    let piece = t[(2 * MIB - 10) as usize..(3 * MIB - 5) as usize].to_vec();
    model_write(&mut p, 100_000, &piece);
    // Inside one file, non-overlapping ranges; the copy ends past the old end.
    let n = copy_range(&dst, 0, &dst, 8 * MIB + MIB / 2, MIB);
    assert_eq!(n, MIB);
    let piece = p[..MIB as usize].to_vec();
    model_write(&mut p, 8 * MIB + MIB / 2, &piece);
    drop((src, dst));
    check_file(&m.p("p"), &p);

    let check = |m: &Mount| {
        check_file(&m.p("t"), &t);
        check_file(&m.p("z"), &z);
        check_file(&m.p("p"), &p);
        check_file(&m.p("c"), &c);
    };
    check(&m);
    m.unmount();
    let m = vol.mount();
    check(&m);
    m.unmount();
    assert!(check_clean(&st, &vol) > 0);
}

/// What a tree walk sees of one entry.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Entry {
    kind: char,
    size: u64,
    /// FNV-1a of a file's contents; a symlink's target.
    content: String,
    mode: u32,
    nlink: u64,
    mtime: (i64, i64),
}

fn fnv(data: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in data {
        h ^= *b as u64;
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    format!("{h:016x}")
}

/// Every entry under `root`: names, kinds, sizes, contents, modes, link counts, mtimes.
fn snapshot(root: &Path) -> BTreeMap<String, Entry> {
    fn walk(root: &Path, d: &Path, out: &mut BTreeMap<String, Entry>) {
        for e in fs::read_dir(d).unwrap() {
            let p = e.unwrap().path();
            let md = fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            let (kind, content) = if md.is_dir() {
                ('d', String::new())
            } else if md.is_symlink() {
                (
                    'l',
                    fs::read_link(&p).unwrap().to_string_lossy().into_owned(),
                )
            } else {
                ('f', fnv(&read_uncached(&p)))
            };
            out.insert(
                rel,
                Entry {
                    kind,
                    size: if kind == 'd' { 0 } else { md.len() },
                    content,
                    mode: md.mode(),
                    nlink: if kind == 'd' { 0 } else { md.nlink() },
                    mtime: (md.mtime(), md.mtime_nsec()),
                },
            );
            if md.is_dir() {
                walk(root, &p, out);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

/// A tree of directories, files of many sizes, symlinks and a hard link; the whole tree
/// (names, sizes, contents, modes, mtimes) is the same after unmount and remount, and the same
/// as the model it was built from.
fn remount_tree(kind: Kind) {
    let st = Store::start(kind);
    let vol = st.format("testvol", &[]);
    let m = vol.mount();
    // Model: path -> (kind, contents or target).
    let mut model: BTreeMap<String, (char, Vec<u8>)> = BTreeMap::new();
    let dirs = [
        "a",
        "a/b",
        "a/b/c",
        "a/b/c/d",
        "empty-dir",
        "with space",
        "ünïcødé",
        "many",
    ];
    for d in dirs {
        fs::create_dir(m.p(d)).unwrap();
        model.insert(d.to_string(), ('d', Vec::new()));
    }
    let sizes = [
        0,
        1,
        4095,
        4096,
        4097,
        100_000,
        (4 * MIB) as usize,
        (4 * MIB + 1) as usize,
        (9 * MIB + 3) as usize,
    ];
    let mut n = 0u64;
    for (i, size) in sizes.iter().enumerate() {
        for d in ["", "a/", "a/b/c/d/", "with space/", "ünïcødé/"] {
            if *size > MIB as usize && !d.is_empty() && d != "a/" {
                continue;
            }
            n += 1;
            let path = format!("{d}f{i}-{size}");
            let data = pattern(*size, 40 + n);
            fs::write(m.p(&path), &data).unwrap();
            model.insert(path, ('f', data));
        }
    }
    for i in 0..40 {
        let path = format!("many/{i:03}");
        let data = format!("file number {i}\n").into_bytes();
        fs::write(m.p(&path), &data).unwrap();
        model.insert(path, ('f', data));
    }
    let long = "L".repeat(255);
    fs::write(m.p(&format!("a/{long}")), b"long name").unwrap();
    model.insert(format!("a/{long}"), ('f', b"long name".to_vec()));
    for (link, target) in [
        ("a/b/up", "../f1-1"),
        ("to-dir", "a/b/c"),
        ("dangling", "does/not/exist"),
    ] {
        std::os::unix::fs::symlink(target, m.p(link)).unwrap();
        model.insert(link.to_string(), ('l', target.as_bytes().to_vec()));
    }
    fs::hard_link(m.p("f5-100000"), m.p("a/b/c/hard")).unwrap();
    model.insert("a/b/c/hard".into(), model["f5-100000"].clone());
    fs::set_permissions(m.p("a/b"), fs::Permissions::from_mode(0o700)).unwrap();
    fs::set_permissions(m.p("f2-4095"), fs::Permissions::from_mode(0o640)).unwrap();
    // A renamed and a removed entry leave nothing behind.
    fs::rename(m.p("f3-4096"), m.p("a/b/c/d/renamed")).unwrap();
    let moved = model.remove("f3-4096").unwrap();
    model.insert("a/b/c/d/renamed".into(), moved);
    fs::remove_file(m.p("f4-4097")).unwrap();
    model.remove("f4-4097");

    let before = snapshot(&m.path);
    let want: BTreeMap<String, (char, u64, String)> = model
        .iter()
        .map(|(p, (k, c))| {
            let content = match k {
                'f' => fnv(c),
                'l' => String::from_utf8(c.clone()).unwrap(),
                _ => String::new(),
            };
            let size = if *k == 'd' { 0 } else { c.len() as u64 };
            (p.clone(), (*k, size, content))
        })
        .collect();
    let seen: BTreeMap<String, (char, u64, String)> = before
        .iter()
        .map(|(p, e)| (p.clone(), (e.kind, e.size, e.content.clone())))
        .collect();
    assert_eq!(seen, want, "the tree differs from its model");
    assert_eq!(before["a/b"].mode & 0o7777, 0o700);
    assert_eq!(before["f2-4095"].mode & 0o7777, 0o640);
    assert_eq!(before["a/b/c/hard"].nlink, 2);
    m.unmount();

    let m = vol.mount();
    let after = snapshot(&m.path);
    for (p, e) in &before {
        assert_eq!(after.get(p), Some(e), "{p} after remount");
    }
    assert_eq!(
        after.keys().collect::<Vec<_>>(),
        before.keys().collect::<Vec<_>>(),
        "names after remount"
    );
    m.unmount();
    assert!(check_clean(&st, &vol) > 0);
}

/// Deleting, overwriting and truncating files deletes their objects from the store (the
/// server's own listing), including a file unlinked while open, once it is closed.
fn delete_removes_objects(kind: Kind) {
    let st = Store::start(kind);
    let vol = st.format("testvol", &[]);
    let m = vol.mount();
    let files: Vec<(String, Vec<u8>)> = [5 * MIB, 9 * MIB, 100 * KIB, 4 * MIB, 6 * MIB]
        .iter()
        .enumerate()
        .map(|(i, s)| (format!("f{i}"), pattern(*s as usize, 50 + i as u64)))
        .collect();
    for (name, data) in &files {
        fs::write(m.p(name), data).unwrap();
    }
    // Data is in the bucket once close returns: 2 + 3 + 1 + 1 + 2 blocks of 4 MiB at least.
    let all = wait_store(&st, &vol, &m, "objects of the files written", |k| {
        k.len() >= 9
    });

    // Unlink two files (14 MiB: 5 blocks): their objects go, nothing else does.
    fs::remove_file(m.p("f0")).unwrap();
    fs::remove_file(m.p("f1")).unwrap();
    let left = wait_store(&st, &vol, &m, "objects of 2 unlinked files deleted", |k| {
        k.len() <= all.len() - 5
    });
    assert!(
        left.iter().all(|k| all.contains(k)),
        "objects appeared after unlinking: before {all:?}, after {left:?}"
    );

    // Overwrite one (O_TRUNC): its old object goes.
    let new2 = pattern(50 * KIB as usize, 60);
    fs::write(m.p("f2"), &new2).unwrap();
    // Shrink one: 6 MiB to 1 MiB.
    let f = OpenOptions::new().write(true).open(m.p("f4")).unwrap();
    f.set_len(MIB).unwrap();
    drop(f);
    let after = wait_store(
        &st,
        &vol,
        &m,
        "old object of an overwritten file deleted",
        |k| left.iter().any(|x| !k.contains(x)),
    );
    check_file(&m.p("f2"), &new2);
    check_file(&m.p("f4"), &files[4].1[..MIB as usize]);
    check_file(&m.p("f3"), &files[3].1);

    // Unlinked while open: its objects stay and it reads back through the descriptor; they
    // go once it is closed.
    let f = File::open(m.p("f3")).unwrap();
    fs::remove_file(m.p("f3")).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        st.blocks(&vol.name),
        after,
        "objects changed while an unlinked file was still open"
    );
    drop_cache(&f);
    let mut buf = Vec::new();
    (&f).read_to_end(&mut buf).unwrap();
    assert_same(
        "a file unlinked while open, read through its descriptor",
        &buf,
        &files[3].1,
    );
    drop(f);
    wait_store(
        &st,
        &vol,
        &m,
        "objects of an unlinked file deleted once closed",
        |k| k.len() < after.len(),
    );

    // Everything else.
    fs::remove_file(m.p("f2")).unwrap();
    fs::remove_file(m.p("f4")).unwrap();
    wait_store(
        &st,
        &vol,
        &m,
        "no object left once every file is deleted",
        |k| k.is_empty(),
    );
    m.unmount();
    assert_eq!(check_clean(&st, &vol), 0);
    // Nothing else of the volume is left in the bucket either (the probe included).
    let stray: Vec<String> = st
        .keys()
        .into_iter()
        .filter(|k| k.starts_with("vols/testvol/") && !k.ends_with('/'))
        .collect();
    assert!(stray.is_empty(), "objects left in the bucket: {stray:?}");
}

/// `--hash-prefix`: every block key starts with a hashed `XX/` (2 hex digits), spread over
/// many prefixes; the volume works, deletes its objects and checks clean.
fn hash_prefix(kind: Kind) {
    let st = Store::start(kind);
    let vol = st.format("hashed", &["--hash-prefix"]);
    // Write-through: each file a slice of its own (with write-back, small files share packs),
    // so that 24 slices show how keys spread.
    let m = vol.mount_with(&["--writeback", "off"]);
    let files: Vec<(String, Vec<u8>)> = (0..24)
        .map(|i| {
            let size = if i == 0 { 9 * MIB } else { 64 * KIB + i };
            (format!("f{i}"), pattern(size as usize, 70 + i))
        })
        .collect();
    for (name, data) in &files {
        fs::write(m.p(name), data).unwrap();
    }
    m.unmount();

    let keys = st.blocks("hashed");
    assert!(keys.len() >= 26, "block objects: {keys:?}");
    let prefixes: BTreeSet<&str> = keys.iter().map(|k| &k["vols/".len()..][..2]).collect();
    assert!(
        keys.iter().all(|k| block_of(k, "hashed") == Some(true)),
        "keys without a hashed prefix: {keys:?}"
    );
    assert!(
        prefixes.len() >= 8,
        "24 slices spread over only {} prefixes: {prefixes:?}",
        prefixes.len()
    );
    assert!(
        !st.keys().iter().any(|k| k.starts_with("vols/hashed/")),
        "objects under the unhashed prefix: {:?}",
        st.keys()
    );
    check_clean(&st, &vol);

    let m = vol.mount();
    for (name, data) in &files {
        check_file(&m.p(name), data);
    }
    for (name, _) in files.iter().step_by(2) {
        fs::remove_file(m.p(name)).unwrap();
    }
    m.unmount();
    let left = check_clean(&st, &vol);
    assert!(
        left > 0 && left < keys.len() as u64,
        "{left} objects after deleting half the files (of {})",
        keys.len()
    );
    let m = vol.mount();
    for (name, data) in files.iter().skip(1).step_by(2) {
        check_file(&m.p(name), data);
    }
    m.unmount();
}

/// Three volumes in one bucket and prefix — "shared", "shared-2" (whose name extends the
/// first's) and a hashed "hashed-3" — mounted at once; none sees another's objects: each
/// one's fsck counts only its own, finds nothing leaked, and `gc --delete` of one leaves the
/// others' objects alone; deleting one's files leaves the others' intact.
fn shared_bucket(kind: Kind) {
    let st = Store::start(kind);
    let vols = [
        st.format("shared", &[]),
        st.format("shared-2", &[]),
        st.format("hashed-3", &["--hash-prefix"]),
    ];
    let data =
        |v: usize, i: u64| pattern((MIB + 1000 * i + v as u64) as usize, 80 + 10 * v as u64 + i);
    {
        let mounts: Vec<Mount> = vols.iter().map(|v| v.mount()).collect();
        for (v, m) in mounts.iter().enumerate() {
            for i in 0..3 {
                fs::write(m.p(&format!("v{v}-f{i}")), data(v, i)).unwrap();
            }
            fs::write(m.p("same-name"), data(v, 9)).unwrap();
        }
        for (v, m) in mounts.iter().enumerate() {
            assert_eq!(
                names(&m.path),
                set(&[
                    &format!("v{v}-f0"),
                    &format!("v{v}-f1"),
                    &format!("v{v}-f2"),
                    "same-name"
                ])
            );
            check_file(&m.p("same-name"), &data(v, 9));
        }
        for m in mounts {
            m.unmount();
        }
    }
    let mut own = Vec::new();
    for v in &vols {
        // Four files of about 1 MiB: at least one object each.
        assert!(check_clean(&st, v) >= 4, "{}", v.name);
        own.push(st.blocks(&v.name));
    }
    // Every block object in the bucket belongs to exactly one of them.
    let all: Vec<String> = st
        .keys()
        .into_iter()
        .filter(|k| vols.iter().any(|v| block_of(k, &v.name).is_some()))
        .collect();
    assert_eq!(
        all.len(),
        own.iter().map(Vec::len).sum::<usize>(),
        "{all:?}"
    );
    for (i, a) in own.iter().enumerate() {
        for b in &own[i + 1..] {
            assert!(a.iter().all(|k| !b.contains(k)), "{a:?} vs {b:?}");
        }
    }
    // gc --delete of one volume deletes nothing of the others.
    for v in &vols {
        let (ok, out, err) = v.cmd("gc", &["-q", "--delete"]);
        assert!(ok, "gc of {}: {out}{err}", v.name);
        assert!(out.contains("0 leaked objects"), "gc of {}: {out}", v.name);
    }
    for (v, keys) in vols.iter().zip(&own) {
        assert_eq!(&st.blocks(&v.name), keys, "{} after gc", v.name);
    }

    // Deleting every file of "shared" leaves "shared-2" and "hashed-3" intact.
    let m = vols[0].mount();
    for e in fs::read_dir(&m.path).unwrap() {
        fs::remove_file(e.unwrap().path()).unwrap();
    }
    m.unmount();
    assert_eq!(check_clean(&st, &vols[0]), 0);
    for (v, vol) in vols.iter().enumerate().skip(1) {
        assert_eq!(
            st.blocks(&vol.name),
            own[v],
            "{} after deletes in shared",
            vol.name
        );
        assert_eq!(check_clean(&st, vol), own[v].len() as u64);
        let m = vol.mount();
        for i in 0..3 {
            check_file(&m.p(&format!("v{v}-f{i}")), &data(v, i));
        }
        check_file(&m.p("same-name"), &data(v, 9));
        m.unmount();
    }
}

macro_rules! on_backend {
    ($module:ident, $kind:expr, [$($case:ident),* $(,)?]) => {
        mod $module {
            $(
                #[test]
                fn $case() {
                    super::$case($kind);
                }
            )*
        }
    };
}

macro_rules! on_every_backend {
    ($($case:ident),* $(,)?) => {
        on_backend!(s3, super::Kind::S3, [$($case),*]);
        on_backend!(gcs, super::Kind::Gcs, [$($case),*]);
        on_backend!(azure, super::Kind::Azure, [$($case),*]);
    };
}

on_every_backend!(
    namespace,
    random_writes,
    large_files,
    truncate_punch_copy,
    remount_tree,
    delete_removes_objects,
    hash_prefix,
    shared_bucket,
);

// ---------------------------------------------------------------------------------------------
// Format: missing buckets, missing containers, bad credentials.

/// Runs unkai with a generous limit against hangs (endless retries): the process is killed and
/// the test fails if it is still running after `limit`. Returns (success, stdout, stderr).
fn run_limited(args: &[&str], env: &[(String, String)], limit: Duration) -> (bool, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let (o, e) = (dir.path().join("out"), dir.path().join("err"));
    let mut child = unkai()
        .args(args)
        .envs(env.iter().cloned())
        .stdin(Stdio::null())
        .stdout(File::create(&o).unwrap())
        .stderr(File::create(&e).unwrap())
        .spawn()
        .expect("spawn unkai");
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "`unkai {}` still running after {limit:?} (endless retry?); stderr so far:\n{}",
                args.join(" "),
                fs::read_to_string(&e).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (
        status.success(),
        fs::read_to_string(&o).unwrap(),
        fs::read_to_string(&e).unwrap(),
    )
}

/// A command's error: one line, `unkai: error: ...`.
#[track_caller]
fn one_line_error(what: &str, stderr: &str) -> String {
    let lines: Vec<&str> = stderr.trim_end().lines().collect();
    assert_eq!(
        lines.len(),
        1,
        "{what}: the error should be one line, got {} lines:\n{stderr}",
        lines.len()
    );
    assert!(
        lines[0].len() <= 1000,
        "{what}: the error line is {} characters; a server's raw answer should be reduced to \
         its code and message:\n{stderr}",
        lines[0].len()
    );
    assert!(lines[0].starts_with("unkai: error: "), "{what}: {stderr}");
    lines[0].to_string()
}

fn format_creates_bucket(kind: Kind) {
    let st = Store::start(kind);
    assert!(
        st.keys_of(BUCKET).is_none(),
        "the bucket exists before format"
    );
    let dir = tempfile::tempdir().unwrap();
    let meta = format!("sqlite://{}/meta.db", dir.path().display());
    let (ok, out, err) = run_env(
        &["format", "--storage", &st.server.storage, &meta, "testvol"],
        &st.server.env,
    );
    assert!(ok, "format: {out}{err}\nserver log:\n{}", st.server.log());
    assert!(
        err.contains("created the bucket"),
        "format said: {out}{err}"
    );
    let keys = st
        .keys_of(BUCKET)
        .expect("format did not create the bucket");
    assert!(
        !keys.iter().any(|k| k.contains(".probe")),
        "probe object left behind: {keys:?}"
    );
    // A second volume in the existing bucket: nothing to create.
    let v2 = st.format("second", &[]);
    let (ok, out, err) = v2.cmd("status", &[]);
    assert!(ok, "{out}{err}");
    // Both work.
    let v1 = Volume {
        env: common::with_cache_dir(st.env(), dir.path()),
        dir,
        meta_url: meta,
        name: "testvol".into(),
        db: None,
    };
    for v in [&v1, &v2] {
        let m = v.mount();
        fs::write(m.p("x"), pattern(100_000, 90)).unwrap();
        m.unmount();
        assert!(check_clean(&st, v) >= 1);
    }
}

#[test]
fn s3_format_creates_missing_bucket() {
    format_creates_bucket(Kind::S3);
}

#[test]
fn gcs_format_creates_missing_bucket() {
    format_creates_bucket(Kind::Gcs);
}

/// unkai does not create Azure containers: format refuses with one line naming the container
/// and how to create it, creates no volume; once the container exists, format works.
#[test]
fn azure_format_refuses_missing_container() {
    let st = Store::start(Kind::Azure);
    let container = "no-such-container";
    assert!(st.keys_of(container).is_none());
    let storage = format!("az://{container}/vols?emulator=true");
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("meta.db");
    let meta = format!("sqlite://{}", db.display());
    let (ok, out, err) = run_limited(
        &["format", "--storage", &storage, &meta, "testvol"],
        &st.server.env,
        Duration::from_secs(120),
    );
    assert!(!ok, "format on a missing container succeeded: {out}{err}");
    let line = one_line_error("format on a missing Azure container", &err);
    assert!(line.contains(&format!("'{container}'")), "{line}");
    assert!(
        line.contains(&format!("az storage container create --name {container}")),
        "the error should say how to create the container: {line}"
    );
    assert!(!db.exists(), "a failed format left a volume behind");
    assert!(
        st.keys_of(container).is_none(),
        "format created the container"
    );

    azure_create_container(st.server.port, container);
    let (ok, out, err) = run_env(
        &["format", "--storage", &storage, &meta, "testvol"],
        &st.server.env,
    );
    assert!(ok, "format once the container exists: {out}{err}");
}

/// Wrong S3 secret: format fails at once (no endless retry) with one line naming the URL and
/// the failing step, without printing the secret; the bucket is not created. On a volume
/// formatted with the right secret, mount and fsck with the wrong one fail the same way.
#[test]
fn s3_bad_credentials() {
    let st = Store::start(Kind::S3);
    let secret = "not-the-right-secret";
    let bad_env: Vec<(String, String)> = st
        .env()
        .into_iter()
        .map(|(k, v)| {
            if k == "AWS_SECRET_ACCESS_KEY" {
                (k, secret.to_string())
            } else {
                (k, v)
            }
        })
        .collect();
    let steps = [
        "writing a probe object",
        "reading the probe object",
        "listing",
        "deleting the probe object",
    ];
    let check_line = |what: &str, err: &str| {
        let line = one_line_error(what, err);
        assert!(
            line.contains(&st.server.storage),
            "{what}: the error should name {}: {line}",
            st.server.storage
        );
        assert!(
            steps.iter().any(|s| line.contains(&format!("{s} failed"))),
            "{what}: the error should name the failing step: {line}"
        );
        assert!(
            !err.contains(secret),
            "{what}: the secret was printed: {err}"
        );
    };
    let limit = Duration::from_secs(120);

    let dir = tempfile::tempdir().unwrap();
    let meta = format!("sqlite://{}/meta.db", dir.path().display());
    let (ok, out, err) = run_limited(
        &["format", "--storage", &st.server.storage, &meta, "testvol"],
        &bad_env,
        limit,
    );
    assert!(!ok, "format with a wrong secret succeeded: {out}{err}");
    check_line("format with a wrong secret", &err);
    assert!(st.keys_of(BUCKET).is_none(), "the bucket was created");

    // A good volume, then the wrong secret on mount and fsck.
    let vol = st.format("testvol", &[]);
    let m = vol.mount();
    fs::write(m.p("f"), b"data").unwrap();
    m.unmount();
    let (ok, out, err) = run_limited(&["fsck", "-q", &vol.meta_url], &bad_env, limit);
    assert!(!ok, "fsck with a wrong secret succeeded: {out}{err}");
    check_line("fsck with a wrong secret", &err);
    let mp = tempfile::tempdir().unwrap();
    let mp_path = mp.path().to_str().unwrap().to_string();
    let res = std::panic::catch_unwind(|| {
        run_limited(&["mount", &vol.meta_url, &mp_path], &bad_env, limit)
    });
    // Whatever happened, leave no mount behind.
    let _ = nix::mount::umount2(mp.path(), nix::mount::MntFlags::MNT_DETACH);
    let (ok, out, err) = res.unwrap_or_else(|e| std::panic::resume_unwind(e));
    assert!(!ok, "mount with a wrong secret succeeded: {out}{err}");
    check_line("mount with a wrong secret", &err);
    assert!(check_clean(&st, &vol) >= 1);
}
