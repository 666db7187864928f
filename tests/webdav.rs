//! `unkai webdav` with real WebDAV clients: davfs2 (a kernel file system over WebDAV, mounted
//! with mount.davfs) and curl; what they did checked through a FUSE mount of the same volume
//! after the server stops. Bad input: wrong credentials, paths above the export, malformed
//! XML, plain HTTP to an HTTPS port.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{Volume, pattern, unkai};

const USER: &str = "alice";
const PASSWORD: &str = "correct horse battery";

/// Whether `bin` is on the PATH; if not, the test is skipped loudly, unless
/// UNKAI_REQUIRE_CLIENTS is set (scripts/test.sh sets it: CI never skips).
fn have(bin: &str) -> bool {
    let found = std::env::var_os("PATH").is_some_and(|p| {
        std::env::split_paths(&p).any(|d| d.join(bin).is_file())
            || Path::new("/sbin").join(bin).is_file()
            || Path::new("/usr/sbin").join(bin).is_file()
    });
    if !found {
        assert!(
            std::env::var_os("UNKAI_REQUIRE_CLIENTS").is_none(),
            "{bin} is missing (apt-get install davfs2 curl openssl) and UNKAI_REQUIRE_CLIENTS is set"
        );
        eprintln!("!!! SKIPPED: {bin} is not installed (apt-get install davfs2 curl openssl)");
    }
    found
}

/// A running `unkai webdav`; stopped (SIGTERM, then SIGKILL) on drop.
struct Server {
    child: Option<Child>,
    addr: String,
    log: PathBuf,
}

impl Server {
    /// Starts the server of `vol` on a free port of 127.0.0.1 with `extra` flags (the
    /// password in its environment) and waits until it listens.
    fn start(vol: &Volume, extra: &[&str]) -> Server {
        let log = vol.dir.path().join(format!(
            "webdav-{}.log",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        let logf = std::fs::File::create(&log).unwrap();
        let child = unkai()
            .arg("webdav")
            .arg(&vol.meta_url)
            .args(["--listen", "127.0.0.1:0"])
            .args(extra)
            .envs(vol.env.iter().cloned())
            .env("UNKAI_WEBDAV_PASSWORD", PASSWORD)
            .stdin(Stdio::null())
            .stdout(logf.try_clone().unwrap())
            .stderr(logf)
            .spawn()
            .expect("spawn unkai webdav");
        let mut s = Server {
            child: Some(child),
            addr: String::new(),
            log,
        };
        let start = Instant::now();
        let marker = format!("webdav serving volume '{}' at ", vol.name);
        loop {
            let text = s.log_text();
            if let Some(at) = text.lines().find_map(|l| l.split_once(&marker)) {
                s.addr = at.1.trim().to_string();
                return s;
            }
            if let Ok(Some(st)) = s.child.as_mut().unwrap().try_wait() {
                panic!("unkai webdav exited ({st}) before listening:\n{text}");
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "unkai webdav did not listen in 60 s:\n{text}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Stops the server as SIGTERM does and checks it exits cleanly (everything flushed).
    fn stop(mut self) {
        let mut child = self.child.take().unwrap();
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        let st = child.wait().unwrap();
        assert!(
            st.success(),
            "webdav exited with {st}:\n{}",
            self.log_text()
        );
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(30) {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// A curl request: its status and body. `args` are curl's (method, headers, -T FILE...).
fn curl(args: &[&str], url: &str) -> (u16, Vec<u8>) {
    let out = tempfile::NamedTempFile::new().unwrap();
    let res = Command::new("curl")
        .args(["-sS", "--path-as-is", "-o"])
        .arg(out.path())
        .args(["-w", "%{http_code}"])
        .args(args)
        .arg(url)
        .output()
        .expect("run curl");
    let code = String::from_utf8_lossy(&res.stdout)
        .trim()
        .parse()
        .unwrap_or(0);
    (code, std::fs::read(out.path()).unwrap())
}

fn authed<'a>(mut args: Vec<&'a str>, creds: &'a str) -> Vec<&'a str> {
    args.extend(["-u", creds]);
    args
}

fn creds() -> String {
    format!("{USER}:{PASSWORD}")
}

/// A davfs2 mount of a WebDAV URL (mount.davfs, a FUSE client of its own), credentials
/// from a secrets file; unmounted on drop.
struct DavMount {
    path: PathBuf,
    _dir: tempfile::TempDir,
    mounted: bool,
}

impl DavMount {
    fn mount(url: &str, user: &str, password: &str) -> DavMount {
        let dir = tempfile::Builder::new()
            .prefix("unkai-davfs-")
            .tempdir()
            .unwrap();
        let path = dir.path().join("mnt");
        let cache = dir.path().join("cache");
        std::fs::create_dir(&path).unwrap();
        std::fs::create_dir(&cache).unwrap();
        use std::os::unix::fs::PermissionsExt;
        // mount.davfs works as the user davfs2 in its cache.
        std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o777)).unwrap();
        let secrets = dir.path().join("secrets");
        std::fs::write(&secrets, format!("{url} {user} \"{password}\"\n")).unwrap();
        std::fs::set_permissions(&secrets, std::fs::Permissions::from_mode(0o600)).unwrap();
        let conf = dir.path().join("davfs2.conf");
        // buf_size 64: davfs2 1.6's directory reads fail with EINVAL on Linux 6.16 and
        // later with its default buffer (alisarctl/davfs2#22). delay_upload 0: a closed
        // file goes up at once.
        std::fs::write(
            &conf,
            format!(
                "secrets {}\ncache_dir {}\nbuf_size 64\ndelay_upload 0\n",
                secrets.display(),
                cache.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&conf, std::fs::Permissions::from_mode(0o600)).unwrap();
        let out = Command::new("mount")
            .args(["-t", "davfs", "-o"])
            .arg(format!("conf={}", conf.display()))
            .arg(url)
            .arg(&path)
            .stdin(Stdio::null())
            .output()
            .expect("run mount -t davfs");
        assert!(
            out.status.success(),
            "mount -t davfs failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        DavMount {
            path,
            _dir: dir,
            mounted: true,
        }
    }

    fn p(&self, rel: &str) -> PathBuf {
        self.path.join(rel)
    }

    /// Unmounts: umount.davfs waits until mount.davfs has uploaded every changed file.
    fn unmount(mut self) {
        let out = Command::new("umount").arg(&self.path).output().unwrap();
        assert!(
            out.status.success(),
            "umount of the davfs mount failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        self.mounted = false;
    }
}

impl Drop for DavMount {
    fn drop(&mut self) {
        if self.mounted {
            let ok = Command::new("umount")
                .arg(&self.path)
                .output()
                .is_ok_and(|o| o.status.success());
            if !ok {
                let _ = Command::new("umount").arg("-l").arg(&self.path).output();
            }
        }
    }
}

/// The davfs2 round trip: a multi-MiB file and small ones written, listed, read back,
/// renamed and removed through the kernel client; then the same bytes read through curl
/// and, once the server has stopped, through a FUSE mount of the volume.
#[test]
fn davfs2_round_trip_through_the_kernel_client() {
    if !have("mount.davfs") || !have("curl") {
        return;
    }
    let vol = Volume::new();
    let server = Server::start(&vol, &["--user", USER]);
    let dav = DavMount::mount(&server.url("/"), USER, PASSWORD);
    let big = pattern(9 << 20 | 12345, 1);
    std::fs::write(dav.p("big.bin"), &big).unwrap();
    std::fs::create_dir(dav.p("docs")).unwrap();
    let mut small = Vec::new();
    for i in 0..20 {
        let data = pattern(100 + i * 997, 10 + i as u64);
        std::fs::write(dav.p(&format!("docs/f{i:02}.txt")), &data).unwrap();
        small.push(data);
    }
    let mut names: Vec<String> = std::fs::read_dir(dav.p("docs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    let want: Vec<String> = (0..20).map(|i| format!("f{i:02}.txt")).collect();
    assert_eq!(names, want);
    assert!(
        std::fs::read(dav.p("big.bin")).unwrap() == big,
        "big.bin read back differs"
    );
    std::fs::rename(dav.p("docs/f00.txt"), dav.p("renamed.txt")).unwrap();
    std::fs::remove_file(dav.p("docs/f01.txt")).unwrap();
    dav.unmount();

    // A fresh davfs2 mount (an empty cache): what it lists and reads came from the server.
    let dav = DavMount::mount(&server.url("/"), USER, PASSWORD);
    assert!(
        std::fs::read(dav.p("big.bin")).unwrap() == big,
        "big.bin differs on remount"
    );
    assert_eq!(std::fs::read(dav.p("renamed.txt")).unwrap(), small[0]);
    assert!(!dav.p("docs/f00.txt").exists() && !dav.p("docs/f01.txt").exists());
    assert_eq!(std::fs::read(dav.p("docs/f19.txt")).unwrap(), small[19]);
    dav.unmount();

    // curl (no client cache at all).
    let c = creds();
    let (code, body) = curl(&authed(vec![], &c), &server.url("/big.bin"));
    assert_eq!(code, 200);
    assert!(body == big, "GET big.bin returned other bytes");
    server.stop();

    // The volume itself, through FUSE.
    let m = vol.mount();
    assert!(
        std::fs::read(m.p("big.bin")).unwrap() == big,
        "big.bin differs on the volume"
    );
    assert_eq!(std::fs::read(m.p("renamed.txt")).unwrap(), small[0]);
    for (i, data) in small.iter().enumerate().skip(2) {
        assert_eq!(
            &std::fs::read(m.p(&format!("docs/f{i:02}.txt"))).unwrap(),
            data
        );
    }
    assert!(!m.p("docs/f00.txt").exists() && !m.p("docs/f01.txt").exists());
    m.unmount();
}

/// curl's methods one by one: PUT, GET (and a range), MKCOL, COPY, MOVE, PROPFIND, DELETE;
/// then the volume through FUSE.
#[test]
fn curl_methods_map_to_the_volume() {
    if !have("curl") {
        return;
    }
    let vol = Volume::new();
    let server = Server::start(&vol, &["--user", USER]);
    let c = creds();
    let src = tempfile::NamedTempFile::new().unwrap();
    let data = pattern(3 << 20 | 777, 5);
    std::fs::write(src.path(), &data).unwrap();
    let file = src.path().to_str().unwrap();
    assert_eq!(
        curl(&authed(vec!["-T", file], &c), &server.url("/a.bin")).0,
        201
    );
    assert_eq!(
        curl(&authed(vec!["-X", "MKCOL"], &c), &server.url("/d")).0,
        201
    );
    let dest = format!("Destination: {}", server.url("/d/copy.bin"));
    assert_eq!(
        curl(
            &authed(vec!["-X", "COPY", "-H", &dest], &c),
            &server.url("/a.bin")
        )
        .0,
        201
    );
    let dest = format!("Destination: {}", server.url("/d/moved.bin"));
    assert_eq!(
        curl(
            &authed(vec!["-X", "MOVE", "-H", &dest], &c),
            &server.url("/a.bin")
        )
        .0,
        201
    );
    assert_eq!(curl(&authed(vec![], &c), &server.url("/a.bin")).0, 404);
    let (code, body) = curl(
        &authed(vec!["-r", "1000-1999"], &c),
        &server.url("/d/copy.bin"),
    );
    assert_eq!(code, 206);
    assert_eq!(body, &data[1000..2000]);
    let (code, body) = curl(
        &authed(vec!["-X", "PROPFIND", "-H", "Depth: 1"], &c),
        &server.url("/d/"),
    );
    assert_eq!(code, 207);
    let text = String::from_utf8_lossy(&body);
    assert!(
        text.contains("/d/copy.bin") && text.contains("/d/moved.bin"),
        "{text}"
    );
    // A file to delete, and its deletion.
    assert_eq!(
        curl(&authed(vec!["-T", file], &c), &server.url("/gone.bin")).0,
        201
    );
    assert_eq!(
        curl(&authed(vec!["-X", "DELETE"], &c), &server.url("/gone.bin")).0,
        204
    );
    server.stop();

    let m = vol.mount();
    assert!(std::fs::read(m.p("d/copy.bin")).unwrap() == data);
    assert!(std::fs::read(m.p("d/moved.bin")).unwrap() == data);
    assert!(!m.p("a.bin").exists() && !m.p("gone.bin").exists());
    m.unmount();
}

/// Wrong or missing credentials: 401 with the Basic challenge, and nothing created.
#[test]
fn wrong_credentials_get_401_and_change_nothing() {
    if !have("curl") {
        return;
    }
    let vol = Volume::new();
    let server = Server::start(&vol, &["--user", USER]);
    let src = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(src.path(), b"intruder").unwrap();
    let file = src.path().to_str().unwrap();
    let bad = format!("{USER}:{PASSWORD}x");
    let other = format!("mallory:{PASSWORD}");
    for creds in [Some(bad.as_str()), Some(other.as_str()), None] {
        // The response's head on stdout (-D -), its body thrown away.
        let out = Command::new("curl")
            .args(["-sS", "-o", "/dev/null", "-D", "-", "-T", file])
            .args(creds.map(|c| vec!["-u", c]).unwrap_or_default())
            .arg(server.url("/intruder.txt"))
            .output()
            .unwrap();
        let head = String::from_utf8_lossy(&out.stdout).to_lowercase();
        assert!(head.starts_with("http/1.1 401"), "{head}");
        assert!(
            head.contains("www-authenticate: basic realm=\"unkai\""),
            "{head}"
        );
        let (code, _) = curl(
            &creds
                .map(|c| vec!["-X", "MKCOL", "-u", c])
                .unwrap_or(vec!["-X", "MKCOL"]),
            &server.url("/newdir"),
        );
        assert_eq!(code, 401);
    }
    let c = creds();
    assert_eq!(
        curl(&authed(vec![], &c), &server.url("/intruder.txt")).0,
        404
    );
    assert_eq!(curl(&authed(vec![], &c), &server.url("/newdir/")).0, 404);
    assert!(
        !server.log_text().contains(PASSWORD),
        "the password is in the log"
    );
    server.stop();
    let m = vol.mount();
    assert!(!m.p("intruder.txt").exists() && !m.p("newdir").exists());
    m.unmount();
}

/// `..`, plain or percent-encoded, never leaves the exported directory (--subdir): what is
/// above is neither read nor written, and MOVE/COPY cannot aim there either.
#[test]
fn paths_never_leave_the_export() {
    if !have("curl") {
        return;
    }
    let vol = Volume::new();
    {
        let m = vol.mount();
        std::fs::create_dir(m.p("exp")).unwrap();
        std::fs::write(m.p("secret.txt"), b"top secret").unwrap();
        std::fs::write(m.p("exp/inside.txt"), b"inside").unwrap();
        m.unmount();
    }
    let server = Server::start(&vol, &["--user", USER, "--subdir", "/exp"]);
    let c = creds();
    let src = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(src.path(), b"escaped").unwrap();
    let file = src.path().to_str().unwrap();
    for p in [
        "/../secret.txt",
        "/%2e%2e/secret.txt",
        "/%2E%2E/secret.txt",
        "/a/../../secret.txt",
        "/%2e%2e%2fsecret.txt",
        "/..%2fsecret.txt",
    ] {
        let (code, body) = curl(&authed(vec![], &c), &server.url(p));
        assert!(
            !String::from_utf8_lossy(&body).contains("top secret"),
            "GET {p} read the file above the export ({code})"
        );
        let (code, _) = curl(
            &authed(vec!["-T", file], &c),
            &server.url(&p.replace("secret", "escape")),
        );
        assert!((400..500).contains(&code), "PUT {p}: {code}");
    }
    // A Destination above the export is taken as the URL's own normalization makes it
    // (inside the export) or refused: never above.
    for (i, dest) in [
        "/../escape.txt",
        "/%2e%2e/escape.txt",
        "/a/../../escape.txt",
    ]
    .iter()
    .enumerate()
    {
        let h = format!("Destination: {}", server.url(dest));
        let (code, _) = curl(
            &authed(vec!["-X", "COPY", "-H", &h], &c),
            &server.url("/inside.txt"),
        );
        assert!(code < 500, "COPY to {dest}: {code}");
        let mv = format!("/mv{i}.txt");
        assert_eq!(curl(&authed(vec!["-T", file], &c), &server.url(&mv)).0, 201);
        let (code, _) = curl(&authed(vec!["-X", "MOVE", "-H", &h], &c), &server.url(&mv));
        assert!(code < 500, "MOVE to {dest}: {code}");
    }
    // Inside still works.
    let (code, body) = curl(&authed(vec![], &c), &server.url("/inside.txt"));
    assert_eq!((code, body.as_slice()), (200, &b"inside"[..]));
    server.stop();
    let m = vol.mount();
    assert_eq!(std::fs::read(m.p("secret.txt")).unwrap(), b"top secret");
    assert_eq!(std::fs::read(m.p("exp/inside.txt")).unwrap(), b"inside");
    let mut names = common::names(&m.path);
    names.remove(".trash");
    assert_eq!(
        names,
        ["exp", "secret.txt"]
            .iter()
            .map(|s| s.to_string())
            .collect()
    );
    assert!(common::names(&m.p("exp")).contains("inside.txt"));
    m.unmount();
}

/// A malformed PROPFIND body is a 400; the server goes on answering.
#[test]
fn malformed_xml_is_a_400_and_the_server_goes_on() {
    if !have("curl") {
        return;
    }
    let vol = Volume::new();
    let server = Server::start(&vol, &["--user", USER]);
    let c = creds();
    for body in [
        "<D:propfind xmlns:D=",
        "<?xml version=\"1.0\"?><D:propfind xmlns:D=\"DAV:\"><D:prop></D:propfind>",
        "garbage",
    ] {
        let (code, _) = curl(
            &authed(
                vec!["-X", "PROPFIND", "-H", "Depth: 1", "--data-binary", body],
                &c,
            ),
            &server.url("/"),
        );
        assert!((400..500).contains(&code), "PROPFIND with {body:?}: {code}");
    }
    let patch = "<D:propertyupdate xmlns:D=\"DAV:\"><D:set>";
    let (code, _) = curl(
        &authed(vec!["-X", "PROPPATCH", "--data-binary", patch], &c),
        &server.url("/"),
    );
    assert!((400..500).contains(&code), "PROPPATCH: {code}");
    let (code, _) = curl(
        &authed(vec!["-X", "PROPFIND", "-H", "Depth: 1"], &c),
        &server.url("/"),
    );
    assert_eq!(code, 207);
    server.stop();
}

/// Without credentials configured the server refuses to start (one line), unless --no-auth.
#[test]
fn no_credentials_no_server() {
    let vol = Volume::new();
    let out = unkai()
        .args(["webdav", &vol.meta_url, "--listen", "127.0.0.1:0"])
        .envs(vol.env.iter().cloned())
        .env_remove("UNKAI_WEBDAV_PASSWORD")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("--user") && err.contains("--no-auth"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    // A user without a password.
    let out = unkai()
        .args([
            "webdav",
            &vol.meta_url,
            "--listen",
            "127.0.0.1:0",
            "--user",
            "bob",
        ])
        .envs(vol.env.iter().cloned())
        .env_remove("UNKAI_WEBDAV_PASSWORD")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("UNKAI_WEBDAV_PASSWORD"));
    // --no-auth serves, and says so.
    if have("curl") {
        let server = Server::start(&vol, &["--no-auth"]);
        assert!(server.log_text().contains("authentication is off"));
        assert_eq!(curl(&["-X", "MKCOL"], &server.url("/open")).0, 201);
        server.stop();
    }
}

/// HTTPS with a self-signed certificate made here (openssl): a PUT and a GET round trip
/// with curl trusting it; plain HTTP to the port gets no answer from the volume.
#[test]
fn https_round_trip_with_a_self_signed_certificate() {
    if !have("curl") || !have("openssl") {
        return;
    }
    let vol = Volume::new();
    let dir = vol.dir.path();
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let out = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
        ])
        .args(["-nodes", "-days", "2", "-subj", "/CN=127.0.0.1"])
        .args(["-addext", "subjectAltName=IP:127.0.0.1"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let server = Server::start(
        &vol,
        &[
            "--user",
            USER,
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
        ],
    );
    let https = |p: &str| format!("https://{}{p}", server.addr);
    let c = creds();
    let ca = cert.to_str().unwrap();
    let data = pattern(2 << 20 | 99, 7);
    let src = dir.join("src.bin");
    std::fs::write(&src, &data).unwrap();
    let (code, _) = curl(
        &authed(vec!["--cacert", ca, "-T", src.to_str().unwrap()], &c),
        &https("/tls.bin"),
    );
    assert_eq!(code, 201);
    let (code, body) = curl(&authed(vec!["--cacert", ca], &c), &https("/tls.bin"));
    assert_eq!(code, 200);
    assert!(body == data, "GET over TLS returned other bytes");
    // Not trusted without the certificate; plain HTTP gets no WebDAV answer.
    assert_eq!(curl(&authed(vec![], &c), &https("/tls.bin")).0, 0);
    assert_ne!(curl(&authed(vec![], &c), &server.url("/tls.bin")).0, 200);
    server.stop();
    let m = vol.mount();
    assert!(std::fs::read(m.p("tls.bin")).unwrap() == data);
    m.unmount();
}

/// The server acts as --uid/--gid: the volume's permissions apply to it (a directory it may
/// not write refuses a PUT with 403), and what it creates is theirs.
#[test]
fn the_server_acts_as_its_uid_and_gid() {
    if !have("curl") {
        return;
    }
    let vol = Volume::new();
    {
        let m = vol.mount();
        std::fs::create_dir(m.p("locked")).unwrap();
        std::fs::write(m.p("locked/mine.txt"), b"root's").unwrap();
        std::fs::create_dir(m.p("open")).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(m.p("open"), std::fs::Permissions::from_mode(0o777)).unwrap();
        std::fs::set_permissions(
            m.p("locked/mine.txt"),
            std::fs::Permissions::from_mode(0o600),
        )
        .unwrap();
        // A directory it may not search: its readable file is out of reach.
        std::fs::create_dir(m.p("private")).unwrap();
        std::fs::write(m.p("private/readable.txt"), b"private").unwrap();
        std::fs::set_permissions(m.p("private"), std::fs::Permissions::from_mode(0o700)).unwrap();
        m.unmount();
    }
    let server = Server::start(&vol, &["--user", USER, "--uid", "4242", "--gid", "4343"]);
    let c = creds();
    let src = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(src.path(), b"from webdav").unwrap();
    let file = src.path().to_str().unwrap();
    let (code, body) = curl(&authed(vec![], &c), &server.url("/private/readable.txt"));
    assert_eq!(code, 403, "{}", String::from_utf8_lossy(&body));
    assert_eq!(
        curl(&authed(vec!["-T", file], &c), &server.url("/locked/x.txt")).0,
        403
    );
    assert_eq!(
        curl(
            &authed(vec!["-X", "DELETE"], &c),
            &server.url("/locked/mine.txt")
        )
        .0,
        403
    );
    assert_eq!(
        curl(&authed(vec![], &c), &server.url("/locked/mine.txt")).0,
        403
    );
    assert_eq!(
        curl(&authed(vec!["-T", file], &c), &server.url("/open/x.txt")).0,
        201
    );
    server.stop();
    let m = vol.mount();
    assert!(!m.p("locked/x.txt").exists());
    assert_eq!(std::fs::read(m.p("locked/mine.txt")).unwrap(), b"root's");
    use std::os::unix::fs::MetadataExt;
    let md = std::fs::metadata(m.p("open/x.txt")).unwrap();
    assert_eq!((md.uid(), md.gid(), md.mode() & 0o777), (4242, 4343, 0o644));
    m.unmount();
}

/// On a PostgreSQL volume, the server and a FUSE mount of the volume at the same time: what
/// one writes, the other reads once it is closed (PUT answered, file closed).
#[test]
fn a_fuse_mount_and_the_server_share_a_postgresql_volume() {
    if !have("curl") {
        return;
    }
    let Some(vol) = Volume::postgres(&[], |u| u.to_string(), Vec::new()) else {
        eprintln!("skipped: PostgreSQL tests are off (UNKAI_TEST_POSTGRES)");
        return;
    };
    let server = Server::start(&vol, &["--user", USER]);
    let m = vol.mount();
    let c = creds();
    let data = pattern(5 << 20 | 3, 11);
    let src = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(src.path(), &data).unwrap();
    assert_eq!(
        curl(
            &authed(vec!["-T", src.path().to_str().unwrap()], &c),
            &server.url("/put.bin")
        )
        .0,
        201
    );
    assert!(
        common::eventually(Duration::from_secs(60), || std::fs::read(m.p("put.bin"))
            .is_ok_and(|b| b == data)),
        "the FUSE mount does not read what the PUT wrote"
    );
    let other = pattern(3 << 20 | 5, 12);
    std::fs::write(m.p("fuse.bin"), &other).unwrap();
    let (code, body) = curl(&authed(vec![], &c), &server.url("/fuse.bin"));
    assert_eq!(code, 200);
    assert!(
        body == other,
        "GET returns other bytes than the FUSE mount wrote"
    );
    m.unmount();
    server.stop();
}

/// --read-only: reads are served, every change is refused and nothing changes.
#[test]
fn a_read_only_server_changes_nothing() {
    if !have("curl") {
        return;
    }
    let vol = Volume::new();
    {
        let m = vol.mount();
        std::fs::write(m.p("kept.txt"), b"kept").unwrap();
        m.unmount();
    }
    let server = Server::start(&vol, &["--user", USER, "--read-only"]);
    let c = creds();
    let src = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(src.path(), b"new").unwrap();
    let file = src.path().to_str().unwrap();
    let dest = format!("Destination: {}", server.url("/moved.txt"));
    for (args, path) in [
        (vec!["-T", file], "/kept.txt"),
        (vec!["-T", file], "/new.txt"),
        (vec!["-X", "MKCOL"], "/dir"),
        (vec!["-X", "DELETE"], "/kept.txt"),
        (vec!["-X", "MOVE", "-H", &dest], "/kept.txt"),
        (vec!["-X", "COPY", "-H", &dest], "/kept.txt"),
    ] {
        let (code, _) = curl(&authed(args.clone(), &c), &server.url(path));
        assert!((400..500).contains(&code), "{args:?} {path}: {code}");
    }
    let (code, body) = curl(&authed(vec![], &c), &server.url("/kept.txt"));
    assert_eq!((code, body.as_slice()), (200, &b"kept"[..]));
    server.stop();
    let m = vol.mount();
    let mut names = common::names(&m.path);
    names.remove(".trash");
    assert_eq!(names, ["kept.txt".to_string()].into_iter().collect());
    assert_eq!(std::fs::read(m.p("kept.txt")).unwrap(), b"kept");
    m.unmount();
}
