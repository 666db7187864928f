//! Compression and encryption at rest, through real mounts on the S3 backend (versitygw, one
//! server per test), the bucket's bytes inspected on the server's side (its posix directory):
//! compressed volumes store clearly fewer bytes than were written and read them back after a
//! remount with the caches cleared; encrypted volumes hold no plaintext in any object (nor in
//! the metadata database or the local cache), refuse to mount without the right passphrase or
//! key file in one line, and read a tampered object as EIO.

use crate::common::*;
use std::fs::{self, File};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BUCKET: &str = "unkai-test";
const MARKER: &str = "UNKAI-AT-REST-MARKER-q7Zx";

/// A volume formatted on `server` with `extra` format flags; `env` goes with every command
/// and mount (after the server's).
fn s3_volume(server: &servers::Server, extra: &[&str], env: &[(&str, &str)]) -> Volume {
    let dir = tempfile::Builder::new()
        .prefix("unkai-test-")
        .tempdir()
        .expect("tempdir");
    let meta_url = format!("sqlite://{}/meta.db", dir.path().display());
    let mut all = server.env.clone();
    all.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let all = with_cache_dir(all, dir.path());
    let mut args = vec!["format", "--storage", &server.storage];
    args.extend_from_slice(extra);
    args.push(&meta_url);
    args.push("testvol");
    let (ok, out, err) = run_env(&args, &all);
    assert!(
        ok,
        "format failed: {out}{err}\nserver log:\n{}",
        server.log()
    );
    Volume {
        dir,
        meta_url,
        name: "testvol".into(),
        env: all,
        db: None,
    }
}

/// Every file under the server's directory for BUCKET (the objects as stored), with size.
fn stored_objects(server: &servers::Server) -> Vec<(PathBuf, u64)> {
    let root = server.dir.path().join("root").join(BUCKET);
    files_under(&root)
        .into_iter()
        .filter(|p| p.to_string_lossy().contains("/chunks/"))
        .map(|p| {
            let n = fs::metadata(&p).unwrap().len();
            (p, n)
        })
        .collect()
}

/// Whether `needle` occurs in the file at `p`.
fn contains(p: &Path, needle: &[u8]) -> bool {
    let b = fs::read(p).unwrap_or_default();
    b.windows(needle.len()).any(|w| w == needle)
}

/// Every file under `dir`, dot files included.
fn all_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(all_files(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// Source-like text: compresses well, as a tree of code or logs does.
fn text(len: usize, seed: u64, marker: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 200);
    let mut i = seed;
    while out.len() < len {
        let line = match i % 5 {
            0 => format!(
                "    let {marker}{i} = store.read(&mut buf[{}..], {})?;\n",
                i % 97,
                i % 13
            ),
            1 => format!(
                "2026-11-26T17:{:02}:{:02}Z INFO request {i} served in {} us\n",
                i % 60,
                i % 59,
                i % 1000
            ),
            2 => "    }\n}\n\n/// A documented item that says what it is for.\n".to_string(),
            3 => format!(
                "    fn step_{}(&self, x: u64) -> u64 {{ x.wrapping_mul({}) }}\n",
                i % 31,
                i % 7 + 1
            ),
            _ => format!(
                "        assert_eq!(got[{}], want[{}], \"{marker} at {i}\");\n",
                i % 50,
                i % 50
            ),
        };
        out.extend_from_slice(line.as_bytes());
        i += 1;
    }
    out.truncate(len);
    out
}

/// The files a workload writes: a few large ones and many small ones (packed), all text.
fn workload(marker: &str) -> Vec<(String, Vec<u8>)> {
    let mut files = vec![
        ("big.log".to_string(), text(9 << 20, 1, marker)),
        ("mid.rs".to_string(), text(700_000, 2, marker)),
    ];
    for i in 0..40u64 {
        files.push((
            format!("tree/d{}/f{i}.rs", i % 4),
            text(500 + i as usize * 997, 10 + i, marker),
        ));
    }
    files
}

fn write_all(m: &Mount, files: &[(String, Vec<u8>)]) {
    for (name, data) in files {
        let p = m.p(name);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(&p, data).unwrap_or_else(|e| panic!("write {name}: {e}"));
    }
}

/// Reads every file back from the file system (not the page cache) and compares.
fn check_all(m: &Mount, files: &[(String, Vec<u8>)]) {
    for (name, want) in files {
        let f = File::open(m.p(name)).unwrap_or_else(|e| panic!("open {name}: {e}"));
        drop_cache(&f);
        let mut got = Vec::new();
        (&f).read_to_end(&mut got)
            .unwrap_or_else(|e| panic!("read {name}: {e}"));
        assert!(
            got == *want,
            "{name}: {} bytes read, {} written, contents differ",
            got.len(),
            want.len()
        );
    }
}

/// Removes the volume's local cache directory (staging area and disk cache; the volume is
/// unmounted, so nothing is staged), so that reads come from the bucket.
fn clear_cache(vol: &Volume) {
    let _ = fs::remove_dir_all(vol.dir.path().join("cache"));
}

/// Runs `unkai mount -d` with `env` and `extra` flags, expecting it to fail; returns its
/// error, which must be one line. A mount that succeeds is unmounted, then the test fails.
fn mount_fails(vol: &Volume, env: &[(String, String)], extra: &[&str]) -> String {
    let mp = tempfile::tempdir().unwrap();
    let log = vol.dir.path().join("failed-mount.log");
    let mut args: Vec<&str> = vec!["mount", "-d", "--log", log.to_str().unwrap()];
    args.extend_from_slice(extra);
    args.push(&vol.meta_url);
    args.push(mp.path().to_str().unwrap());
    let out_dir = tempfile::tempdir().unwrap();
    let (o, e) = (out_dir.path().join("out"), out_dir.path().join("err"));
    let mut child = unkai()
        .args(&args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", std::env::var("HOME").unwrap_or_default())
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
        if start.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            let _ = child.wait();
            break child.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let err = fs::read_to_string(&e).unwrap();
    if status.success() {
        let _ = run(&["umount", mp.path().to_str().unwrap()]);
        let _ = nix::mount::umount2(mp.path(), nix::mount::MntFlags::MNT_DETACH);
        panic!("mount {extra:?} succeeded where it must fail: {err}");
    }
    let lines: Vec<&str> = err.trim_end().lines().collect();
    assert_eq!(lines.len(), 1, "the error should be one line:\n{err}");
    assert!(lines[0].starts_with("unkai: error: "), "{err}");
    lines[0].to_string()
}

/// `env` without the variables named.
fn without(env: &[(String, String)], names: &[&str]) -> Vec<(String, String)> {
    env.iter()
        .filter(|(k, _)| !names.contains(&k.as_str()))
        .cloned()
        .collect()
}

fn compressed(codec: &str) {
    let server = servers::s3(BUCKET);
    let vol = s3_volume(&server, &["--compress", codec], &[]);
    let (ok, out, err) = vol.cmd("status", &[]);
    assert!(
        ok && out.contains(&format!("compression: {codec}")),
        "{out}{err}"
    );
    let files = workload("x");
    let written: u64 = files.iter().map(|(_, d)| d.len() as u64).sum();
    let m = vol.mount();
    write_all(&m, &files);
    check_all(&m, &files);
    m.unmount();
    let objects = stored_objects(&server);
    let stored: u64 = objects.iter().map(|(_, n)| n).sum();
    assert!(objects.len() >= 4, "{codec}: {} objects", objects.len());
    assert!(
        stored * 2 < written,
        "{codec}: {stored} bytes stored in {} objects for {written} written",
        objects.len()
    );
    eprintln!(
        "{codec}: {written} bytes written, {stored} stored in {} objects",
        objects.len()
    );
    clear_cache(&vol);
    let m = vol.mount();
    check_all(&m, &files);
    m.unmount();
    let (ok, out, err) = vol.cmd("fsck", &["--verify", "-q"]);
    assert!(
        ok && out.contains("volume is consistent"),
        "fsck --verify: {out}{err}"
    );
}

/// A volume formatted `--compress zstd` stores clearly fewer bytes than were written, and
/// reads them back after a remount with its caches cleared.
#[test]
fn s3_zstd_stores_fewer_bytes() {
    compressed("zstd");
}

/// The same with lz4.
#[test]
fn s3_lz4_stores_fewer_bytes() {
    compressed("lz4");
}

/// A passphrase-protected RSA key as `openssl genrsa -aes256` makes it on OpenSSL 3 (PKCS#8,
/// encrypted); None when openssl is not installed.
fn openssl_key(dir: &Path, pass: &str) -> Option<PathBuf> {
    let path = dir.join("key.pem");
    let out = Command::new("openssl")
        .args(["genrsa", "-aes256", "-passout"])
        .arg(format!("pass:{pass}"))
        .arg("-out")
        .arg(&path)
        .arg("2048")
        .output()
        .ok()?;
    assert!(
        out.status.success(),
        "openssl genrsa: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(path)
}

/// Asserts that MARKER is in no object of the bucket, and in no file of the volume's
/// directory (the metadata database and its journal, the staging area, the disk cache).
fn no_plaintext(server: &servers::Server, vol: &Volume) {
    let objects = stored_objects(server);
    assert!(!objects.is_empty(), "no objects in the bucket");
    let root = server.dir.path().join("root").join(BUCKET);
    for p in all_files(&root) {
        assert!(
            !contains(&p, MARKER.as_bytes()),
            "plaintext in the object {}",
            p.display()
        );
    }
    let local: Vec<PathBuf> = all_files(vol.dir.path())
        .into_iter()
        .filter(|p| !p.to_string_lossy().ends_with(".log"))
        .collect();
    assert!(local.iter().any(|p| p.ends_with("meta.db")), "{local:?}");
    for p in local {
        assert!(
            !contains(&p, MARKER.as_bytes()),
            "plaintext in {}",
            p.display()
        );
    }
}

/// An encrypted volume (RSA key with a passphrase): no plaintext anywhere in the bucket or
/// the metadata; data reads back after a remount with the caches cleared; a missing or wrong
/// passphrase fails the mount in one line; a byte flipped in a stored object is EIO on read.
#[test]
fn s3_rsa_encrypted_volume_holds_no_plaintext() {
    let keys = tempfile::tempdir().unwrap();
    let pass = "correct horse battery";
    let Some(pem) = openssl_key(keys.path(), pass) else {
        eprintln!("skipped: openssl is not installed");
        return;
    };
    assert!(
        fs::read_to_string(&pem)
            .unwrap()
            .contains("BEGIN ENCRYPTED PRIVATE KEY")
    );
    let server = servers::s3(BUCKET);
    let vol = s3_volume(
        &server,
        &["--encrypt-rsa-key", pem.to_str().unwrap()],
        &[("UNKAI_RSA_PASSPHRASE", pass)],
    );
    let (ok, out, err) = vol.cmd("status", &["--json"]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("\"cipher\": \"aes-256-gcm\""), "{out}");
    assert!(
        !out.contains("PRIVATE KEY") && !out.contains("wrapped_key"),
        "key material shown: {out}"
    );
    let files = workload(MARKER);
    let m = vol.mount();
    write_all(&m, &files);
    check_all(&m, &files);
    m.unmount();
    no_plaintext(&server, &vol);
    clear_cache(&vol);
    let m = vol.mount();
    check_all(&m, &files);
    m.unmount();

    // Missing or wrong passphrase: one line, naming the variable to set; nothing mounted.
    let line = mount_fails(&vol, &without(&vol.env, &["UNKAI_RSA_PASSPHRASE"]), &[]);
    assert!(line.contains("UNKAI_RSA_PASSPHRASE"), "{line}");
    let mut wrong = without(&vol.env, &["UNKAI_RSA_PASSPHRASE"]);
    wrong.push(("UNKAI_RSA_PASSPHRASE".into(), "wrong horse".into()));
    let line = mount_fails(&vol, &wrong, &[]);
    assert!(
        line.contains("does not decrypt") && !line.contains("wrong horse"),
        "{line}"
    );
    // JuiceFS's variable works too; so do the other commands that read data.
    let mut jfs = without(&vol.env, &["UNKAI_RSA_PASSPHRASE"]);
    jfs.push(("JFS_RSA_PASSPHRASE".into(), pass.into()));
    let mut args = vec!["fsck", "--verify", "-q"];
    args.push(&vol.meta_url);
    let (ok, out, err) = run_env(&args, &jfs);
    assert!(
        ok && out.contains("volume is consistent"),
        "fsck with JFS_RSA_PASSPHRASE: {out}{err}"
    );
    let (ok, out, err) = run_env(
        &["gc", &vol.meta_url],
        &without(&vol.env, &["UNKAI_RSA_PASSPHRASE"]),
    );
    assert!(
        !ok && err.trim().lines().count() == 1,
        "gc without the passphrase: {out}{err}"
    );

    // One byte flipped in the largest object (a block of big.log): EIO, not other data.
    let (victim, _) = stored_objects(&server)
        .into_iter()
        .max_by_key(|(_, n)| *n)
        .unwrap();
    let mut b = fs::read(&victim).unwrap();
    let at = b.len() / 3;
    b[at] ^= 0x20;
    fs::write(&victim, b).unwrap();
    clear_cache(&vol);
    let m = vol.mount();
    let f = File::open(m.p("big.log")).unwrap();
    drop_cache(&f);
    let mut got = Vec::new();
    let res = (&f).read_to_end(&mut got);
    let e = res.expect_err("a tampered object read without error");
    assert_eq!(errno(&e), libc::EIO, "{e}");
    drop(f);
    // The other files are intact.
    check_all(&m, &files[1..]);
    m.unmount();
}

/// A volume encrypted with a key file (and compressed): the file is needed by every mount, by
/// flag or environment, and recorded nowhere; a missing or wrong one fails in one line.
#[test]
fn s3_key_file_encrypted_volume() {
    let keys = tempfile::tempdir().unwrap();
    let (key, other) = (keys.path().join("vol.key"), keys.path().join("other.key"));
    let hex: String = (0..32u8)
        .map(|i| format!("{:02x}", i.wrapping_mul(37).wrapping_add(11)))
        .collect();
    fs::write(&key, format!("{hex}\n")).unwrap();
    fs::write(&other, [0x5au8; 32]).unwrap();
    let server = servers::s3(BUCKET);
    let key_s = key.to_str().unwrap();
    let vol = s3_volume(
        &server,
        &["--compress", "zstd", "--encrypt-key-file", key_s],
        &[("UNKAI_ENCRYPT_KEY_FILE", key_s)],
    );
    let files = workload(MARKER);
    let m = vol.mount();
    write_all(&m, &files);
    m.unmount();
    no_plaintext(&server, &vol);
    for p in all_files(vol.dir.path()) {
        assert!(
            !contains(&p, hex.as_bytes()),
            "the key file's key in {}",
            p.display()
        );
    }
    let bare = without(&vol.env, &["UNKAI_ENCRYPT_KEY_FILE"]);
    let line = mount_fails(&vol, &bare, &[]);
    assert!(line.contains("--encrypt-key-file"), "{line}");
    let line = mount_fails(
        &vol,
        &bare,
        &["--encrypt-key-file", other.to_str().unwrap()],
    );
    assert!(line.contains("does not unlock"), "{line}");
    // By flag, the caches cleared: everything reads back.
    clear_cache(&vol);
    let mut vol = vol;
    vol.env = bare;
    let m = vol.mount_with(&["--encrypt-key-file", key_s]);
    check_all(&m, &files);
    m.unmount();
}

/// Encryption on a PostgreSQL volume (nothing of it is engine-specific, and this proves it):
/// the wrapped key lives in the database's settings, the bucket holds no plaintext, a mount
/// without the key fails in one line, and the data reads back with the caches cleared.
#[test]
fn postgres_key_file_encrypted_volume() {
    let keys = tempfile::tempdir().unwrap();
    let key = keys.path().join("vol.key");
    fs::write(&key, [0x42u8; 32]).unwrap();
    let key_s = key.to_str().unwrap();
    let Some(vol) = Volume::postgres(
        &["--compress", "lz4", "--encrypt-key-file", key_s],
        |u| u.to_string(),
        vec![("UNKAI_ENCRYPT_KEY_FILE".into(), key_s.into())],
    ) else {
        eprintln!("skipped: UNKAI_TEST_POSTGRES is unset");
        return;
    };
    let (ok, out, err) = vol.cmd("status", &["--json"]);
    assert!(
        ok && out.contains("\"cipher\": \"aes-256-gcm\""),
        "{out}{err}"
    );
    let files = workload(MARKER);
    let m = vol.mount();
    write_all(&m, &files);
    m.unmount();
    let objects = files_under(&vol.bucket());
    assert!(!objects.is_empty(), "no objects in the bucket");
    for p in objects {
        assert!(
            !contains(&p, MARKER.as_bytes()),
            "plaintext in the object {}",
            p.display()
        );
    }
    let line = mount_fails(&vol, &without(&vol.env, &["UNKAI_ENCRYPT_KEY_FILE"]), &[]);
    assert!(line.contains("--encrypt-key-file"), "{line}");
    clear_cache(&vol);
    let m = vol.mount();
    check_all(&m, &files);
    m.unmount();
}

/// The private key's material, in every form that could be written of it: each line of its
/// PEM body, a stretch of its DER (PKCS#1 and PKCS#8), and of its private exponent and primes
/// (big-endian bytes, and hex).
fn key_material(clear_pem: &str) -> Vec<(String, Vec<u8>)> {
    use rsa::pkcs1::EncodeRsaPrivateKey;
    use rsa::pkcs8::{DecodePrivateKey, EncodePrivateKey};
    use rsa::traits::PrivateKeyParts;
    let k = rsa::RsaPrivateKey::from_pkcs8_pem(clear_pem).expect("a PKCS#8 PEM");
    let mut out: Vec<(String, Vec<u8>)> = clear_pem
        .lines()
        .filter(|l| !l.starts_with("-----") && l.len() >= 40)
        .enumerate()
        .map(|(i, l)| (format!("line {i} of the PEM"), l.as_bytes().to_vec()))
        .collect();
    assert!(out.len() >= 20, "{clear_pem}");
    let (pkcs1, pkcs8) = (k.to_pkcs1_der().unwrap(), k.to_pkcs8_der().unwrap());
    for (name, der) in [
        ("PKCS#1 DER", pkcs1.as_bytes()),
        ("PKCS#8 DER", pkcs8.as_bytes()),
    ] {
        let mid = der.len() / 2;
        out.push((name.into(), der[mid..mid + 48].to_vec()));
    }
    let primes = k.primes();
    for (name, n) in [("d", k.d()), ("p", &primes[0]), ("q", &primes[1])] {
        let b = n.to_bytes_be();
        out.push((name.into(), b[8..56].to_vec()));
        out.push((
            format!("{name} in hex"),
            hex::encode(&b[8..56]).into_bytes(),
        ));
    }
    out
}

/// Asserts that no piece of `material` is in the file at `p` (`what` names it).
fn holds_no_key(p: &Path, what: &str, material: &[(String, Vec<u8>)]) {
    let b = fs::read(p).unwrap_or_default();
    for (name, needle) in material {
        assert!(
            !b.windows(needle.len()).any(|w| w == &needle[..]),
            "the private key ({name}) is in {what} {}",
            p.display()
        );
    }
}

/// Formats a volume with a `file://` bucket, `extra` flags and `env`; returns it and what
/// `format` printed.
fn file_volume(extra: &[&str], env: &[(&str, &str)]) -> (Volume, String) {
    let dir = tempfile::Builder::new()
        .prefix("unkai-test-")
        .tempdir()
        .unwrap();
    let meta_url = format!("sqlite://{}/meta.db", dir.path().display());
    let env = with_cache_dir(
        env.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        dir.path(),
    );
    let mut args = vec!["format"];
    args.extend_from_slice(extra);
    args.extend([meta_url.as_str(), "testvol"]);
    let (ok, out, err) = run_env(&args, &env);
    assert!(ok, "format failed: {out}{err}");
    let vol = Volume {
        dir,
        meta_url,
        name: "testvol".into(),
        env,
        db: None,
    };
    (vol, out)
}

/// Writes files through a mount that backs its metadata up into the bucket every 2 s, waits
/// for a backup, dumps the volume, reads the files back with the caches cleared; then
/// searches every byte the volume has on disk (meta.db and its WAL, the staging area and
/// cache, the bucket and the backups in it, decompressed too) and the dump for `material`.
fn no_private_key_anywhere(vol: &Volume, material: &[(String, Vec<u8>)]) {
    let files = workload("k");
    let backups = |vol: &Volume| -> Vec<PathBuf> {
        files_under(&vol.bucket().join(&vol.name))
            .into_iter()
            .filter(|p| p.to_string_lossy().contains("/meta/dump-"))
            .collect()
    };
    let m = vol.mount_with(&["--backup-meta", "2s"]);
    write_all(&m, &files[..6]);
    assert!(
        eventually(Duration::from_secs(120), || !backups(vol).is_empty()),
        "no backup in the bucket; log:\n{}",
        m.log_text()
    );
    // meta.db and its WAL as a mount leaves them (searched again after the unmount).
    for p in all_files(vol.dir.path()) {
        holds_no_key(&p, "the mounted volume's file", material);
    }
    m.unmount();
    let dump = vol.dir.path().join("vol.json");
    let (ok, out, err) = run_env(
        &["dump", "-q", &vol.meta_url, dump.to_str().unwrap()],
        &vol.env,
    );
    assert!(ok, "dump: {out}{err}");
    assert!(
        fs::read_to_string(&dump)
            .unwrap()
            .contains("\"encryption\""),
        "the dump holds no encryption settings"
    );
    holds_no_key(&dump, "the dump", material);
    let made = backups(vol);
    assert!(!made.is_empty());
    for b in &made {
        let plain = zstd::decode_all(File::open(b).unwrap()).unwrap();
        let p = vol.dir.path().join("backup.json");
        fs::write(&p, &plain).unwrap();
        assert!(
            String::from_utf8_lossy(&plain).contains("\"encryption\""),
            "the backup {} holds no encryption settings",
            b.display()
        );
        holds_no_key(&p, "the backup", material);
    }
    let local: Vec<PathBuf> = all_files(vol.dir.path());
    assert!(local.iter().any(|p| p.ends_with("meta.db")), "{local:?}");
    for p in local {
        holds_no_key(&p, "the volume's file", material);
    }
    clear_cache(vol);
    let m = vol.mount();
    check_all(&m, &files[..6]);
    m.unmount();
}

/// An RSA private key is never recorded in the clear (issue 34): a key protected by a
/// passphrase is recorded only encrypted; one without a passphrase is refused in one line
/// naming the fix, or with --allow-unencrypted-rsa-key recorded nowhere (every mount gives
/// its PEM file). Neither the metadata database (WAL included), a dump nor a backup in the
/// bucket holds the key's material, and `format` says truly what a mount needs. A volume of
/// older binaries with its key in the clear still opens, warns in one line, and
/// `config --protect-rsa-key` encrypts its key.
#[test]
fn rsa_private_key_is_never_recorded_in_the_clear() {
    let keys = tempfile::tempdir().unwrap();
    let pass = "correct horse battery";
    let Some(locked) = openssl_key(keys.path(), pass) else {
        eprintln!("skipped: openssl is not installed");
        return;
    };
    // The same key without a passphrase, as `openssl genrsa` without -aes256 makes it.
    let open = keys.path().join("open.pem");
    let out = Command::new("openssl")
        .args(["pkey", "-passin"])
        .arg(format!("pass:{pass}"))
        .arg("-in")
        .arg(&locked)
        .arg("-out")
        .arg(&open)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let clear = fs::read_to_string(&open).unwrap();
    assert!(clear.contains("BEGIN PRIVATE KEY"), "{clear}");
    let material = key_material(&clear);
    let (locked_s, open_s) = (locked.to_str().unwrap(), open.to_str().unwrap());

    // Without a passphrase and without the flag: refused in one line naming the fix, before
    // anything is written.
    let dir = tempfile::tempdir().unwrap();
    let meta_url = format!("sqlite://{}/meta.db", dir.path().display());
    for env in [
        vec![],
        vec![("UNKAI_RSA_PASSPHRASE".to_string(), pass.to_string())],
    ] {
        let env = with_cache_dir(env, dir.path());
        let (ok, out, err) = run_env(
            &["format", "--encrypt-rsa-key", open_s, &meta_url, "testvol"],
            &env,
        );
        assert!(!ok, "a key without a passphrase was taken: {out}{err}");
        let lines: Vec<&str> = err.trim_end().lines().collect();
        assert_eq!(lines.len(), 1, "{err}");
        assert!(
            lines[0].contains("no passphrase")
                && lines[0].contains("openssl pkcs8 -topk8")
                && lines[0].contains("--allow-unencrypted-rsa-key"),
            "{err}"
        );
    }
    for p in all_files(dir.path()) {
        holds_no_key(&p, "the refused volume's file", &material);
    }

    // A key protected by its passphrase: recorded encrypted; mounts need the passphrase.
    let (vol, out) = file_volume(
        &["--encrypt-rsa-key", locked_s],
        &[("UNKAI_RSA_PASSPHRASE", pass)],
    );
    assert!(
        out.contains("recorded encrypted by its passphrase, the passphrase needed"),
        "{out}"
    );
    no_private_key_anywhere(&vol, &material);
    let line = mount_fails(&vol, &without(&vol.env, &["UNKAI_RSA_PASSPHRASE"]), &[]);
    assert!(line.contains("UNKAI_RSA_PASSPHRASE"), "{line}");

    // Without a passphrase, the risk named: recorded nowhere; every mount gives the PEM.
    let (mut vol, out) = file_volume(
        &["--encrypt-rsa-key", open_s, "--allow-unencrypted-rsa-key"],
        &[],
    );
    assert!(
        out.contains("recorded nowhere, its PEM file needed (--encrypt-key-file)"),
        "{out}"
    );
    let line = mount_fails(&vol, &vol.env, &[]);
    assert!(line.contains("--encrypt-key-file"), "{line}");
    let other = keys.path().join("other.pem");
    let made = Command::new("openssl")
        .args(["genpkey", "-algorithm", "RSA", "-out"])
        .arg(&other)
        .output()
        .unwrap();
    assert!(made.status.success());
    let line = mount_fails(
        &vol,
        &vol.env,
        &["--encrypt-key-file", other.to_str().unwrap()],
    );
    assert!(line.contains("does not unlock"), "{line}");
    vol.env
        .push(("UNKAI_ENCRYPT_KEY_FILE".into(), open_s.to_string()));
    no_private_key_anywhere(&vol, &material);
    let (ok, out, err) = vol.cmd("status", &[]);
    assert!(ok && out.contains("recorded nowhere"), "{out}{err}");
}

/// A volume formatted before unprotected keys were refused (its settings hold the PEM in the
/// clear, made here by writing them so): it still opens without a passphrase, with a warning
/// of one line naming the fix; `config --protect-rsa-key` encrypts the key in place, after
/// which the passphrase is needed and the data reads back.
#[test]
fn rsa_key_recorded_in_the_clear_by_older_binaries_is_protected_in_place() {
    let keys = tempfile::tempdir().unwrap();
    let pass = "correct horse battery";
    let Some(locked) = openssl_key(keys.path(), pass) else {
        eprintln!("skipped: openssl is not installed");
        return;
    };
    let out = Command::new("openssl")
        .args(["pkey", "-passin"])
        .arg(format!("pass:{pass}"))
        .arg("-in")
        .arg(&locked)
        .output()
        .unwrap();
    assert!(out.status.success());
    let clear = String::from_utf8(out.stdout).unwrap();
    let (vol, _) = file_volume(
        &["--encrypt-rsa-key", locked.to_str().unwrap()],
        &[("UNKAI_RSA_PASSPHRASE", pass)],
    );
    let files = workload("old");
    let m = vol.mount();
    write_all(&m, &files[..4]);
    m.unmount();
    // What an older unkai recorded for a key without a passphrase: the PEM as it was.
    let db = rusqlite::Connection::open(vol.dir.path().join("meta.db")).unwrap();
    let json: String = db
        .query_row("SELECT value FROM setting WHERE name='format'", [], |r| {
            r.get(0)
        })
        .unwrap();
    let mut fmt: serde_json::Value = serde_json::from_str(&json).unwrap();
    fmt["encryption"]["rsa_key"] = serde_json::Value::String(clear.clone());
    db.execute(
        "UPDATE setting SET value=?1 WHERE name='format'",
        [fmt.to_string()],
    )
    .unwrap();
    drop(db);

    let bare = without(&vol.env, &["UNKAI_RSA_PASSPHRASE"]);
    let mut args = vec!["fsck", "--verify", "-q"];
    args.push(&vol.meta_url);
    let (ok, out, err) = run_env(&args, &bare);
    assert!(ok && out.contains("volume is consistent"), "{out}{err}");
    let warnings: Vec<&str> = err.lines().filter(|l| l.contains("warning")).collect();
    assert_eq!(warnings.len(), 1, "{err}");
    assert!(
        warnings[0].contains("in the clear") && warnings[0].contains("config --protect-rsa-key"),
        "{err}"
    );
    let (ok, out, err) = run_env(&["status", &vol.meta_url], &bare);
    assert!(ok && out.contains("UNPROTECTED"), "{out}{err}");

    let mut new_pass = bare.clone();
    new_pass.push(("UNKAI_RSA_PASSPHRASE".into(), "a new passphrase".into()));
    let (ok, out, err) = run_env(&["config", "--protect-rsa-key", &vol.meta_url], &new_pass);
    assert!(ok, "{out}{err}");
    assert!(err.contains("delete them"), "{err}");
    let db = rusqlite::Connection::open(vol.dir.path().join("meta.db")).unwrap();
    let json: String = db
        .query_row("SELECT value FROM setting WHERE name='format'", [], |r| {
            r.get(0)
        })
        .unwrap();
    drop(db);
    let material = key_material(&clear);
    for (name, needle) in &material {
        let needle = String::from_utf8_lossy(needle).into_owned();
        assert!(
            !json.contains(&needle),
            "the key ({name}) in the settings: {json}"
        );
    }
    // Nor is it left in the database's file or its WAL.
    for p in all_files(vol.dir.path()) {
        if p.to_string_lossy().contains("meta.db") {
            holds_no_key(&p, "the protected volume's file", &material);
        }
    }
    let (ok, out, err) = run_env(&["status", &vol.meta_url], &bare);
    assert!(ok && !out.contains("UNPROTECTED"), "{out}{err}");
    let line = mount_fails(&vol, &bare, &[]);
    assert!(line.contains("UNKAI_RSA_PASSPHRASE"), "{line}");
    let mut vol = vol;
    vol.env = new_pass;
    clear_cache(&vol);
    let m = vol.mount();
    check_all(&m, &files[..4]);
    m.unmount();
    let (ok, out, err) = run_env(&["config", "--protect-rsa-key", &vol.meta_url], &vol.env);
    assert!(!ok && err.contains("nothing to protect"), "{out}{err}");
}
