//! unkai's network servers (`unkai webdav`, `unkai gateway`) as the tests run them: started on
//! a free port of 127.0.0.1 with a volume and flags, their address read from their log,
//! stopped with SIGTERM (killed if they do not stop) on drop; and the clients the tests drive
//! them with: curl, and boto3.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{Volume, unkai};

/// The password of the WebDAV server's users.
pub const DAV_PASSWORD: &str = "correct horse battery";
/// The S3 gateway's access key and secret.
pub const S3_KEY: &str = "gatewaytester";
pub const S3_SECRET: &str = "secret-of-the-gateway-test";

/// A running unkai server.
pub struct Front {
    child: Option<Child>,
    /// `HOST:PORT` it serves at.
    pub addr: String,
    /// Its standard output and error.
    pub log: PathBuf,
}

impl Front {
    /// Starts `unkai CMD META-URL --listen 127.0.0.1:0 EXTRA` (`webdav` or `gateway`), with
    /// the WebDAV password and the S3 keys in its environment, and waits until it serves.
    pub fn start(vol: &Volume, cmd: &str, extra: &[&str]) -> Front {
        let log = vol.dir.path().join(format!(
            "{cmd}-{}.log",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        let logf = std::fs::File::create(&log).unwrap();
        let child = unkai()
            .arg(cmd)
            .arg(&vol.meta_url)
            .args(["--listen", "127.0.0.1:0"])
            .args(extra)
            .envs(vol.env.iter().cloned())
            .env("UNKAI_WEBDAV_PASSWORD", DAV_PASSWORD)
            .env("UNKAI_GATEWAY_ACCESS_KEY", S3_KEY)
            .env("UNKAI_GATEWAY_SECRET_KEY", S3_SECRET)
            .stdin(Stdio::null())
            .stdout(logf.try_clone().unwrap())
            .stderr(logf)
            .spawn()
            .expect("spawn unkai");
        let mut f = Front {
            child: Some(child),
            addr: String::new(),
            log,
        };
        let marker = format!(" serving volume '{}' at ", vol.name);
        let start = Instant::now();
        loop {
            let text = f.log_text();
            if let Some(at) = text.lines().find_map(|l| l.split_once(&marker)) {
                f.addr = at.1.trim().to_string();
                return f;
            }
            if let Ok(Some(st)) = f.child.as_mut().unwrap().try_wait() {
                panic!("unkai {cmd} exited ({st}) before serving:\n{text}");
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "unkai {cmd} did not serve in 60 s:\n{text}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn pid(&self) -> nix::unistd::Pid {
        nix::unistd::Pid::from_raw(self.child.as_ref().unwrap().id() as i32)
    }

    pub fn alive(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Stops it as SIGTERM does and checks it exits cleanly (everything flushed).
    pub fn stop(mut self) {
        let mut child = self.child.take().unwrap();
        let _ = nix::sys::signal::kill(self.pid_of(&child), nix::sys::signal::Signal::SIGTERM);
        let st = child.wait().unwrap();
        assert!(st.success(), "exited with {st}:\n{}", self.log_text());
    }

    fn pid_of(&self, c: &Child) -> nix::unistd::Pid {
        nix::unistd::Pid::from_raw(c.id() as i32)
    }
}

impl Drop for Front {
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let _ = nix::sys::signal::kill(self.pid_of(&child), nix::sys::signal::Signal::SIGTERM);
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

/// Whether `bin` is on the PATH; if not, the test is skipped loudly, unless
/// UNKAI_REQUIRE_CLIENTS is set (scripts/test.sh sets it: CI never skips).
pub fn have(bin: &str) -> bool {
    let found = std::env::var_os("PATH").is_some_and(|p| {
        std::env::split_paths(&p).any(|d| d.join(bin).is_file())
            || Path::new("/sbin").join(bin).is_file()
            || Path::new("/usr/sbin").join(bin).is_file()
    });
    if !found {
        assert!(
            std::env::var_os("UNKAI_REQUIRE_CLIENTS").is_none(),
            "{bin} is missing and UNKAI_REQUIRE_CLIENTS is set"
        );
        eprintln!("!!! SKIPPED: {bin} is not installed");
    }
    found
}

/// A curl request as `user` of the WebDAV server (its password), `args` being curl's
/// (method, headers, `--data-binary`...): the status.
pub fn dav(user: &str, args: &[&str], url: &str) -> u16 {
    let out = Command::new("curl")
        .args([
            "-sS",
            "--path-as-is",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
        ])
        .args(["-u", &format!("{user}:{DAV_PASSWORD}")])
        .args(args)
        .arg(url)
        .output()
        .expect("run curl");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(0)
}

/// The Debian python with its boto3 (the `python3` on PATH may be another), or None when it
/// is missing and clients may be skipped.
pub fn boto3() -> Option<&'static str> {
    let py = "/usr/bin/python3";
    let ok = Command::new(py)
        .args(["-c", "import boto3"])
        .output()
        .is_ok_and(|o| o.status.success());
    if ok {
        return Some(py);
    }
    assert!(
        std::env::var_os("UNKAI_REQUIRE_CLIENTS").is_none(),
        "boto3 is missing (apt-get install python3-boto3) and UNKAI_REQUIRE_CLIENTS is set"
    );
    eprintln!(
        "!!! SKIPPED: /usr/bin/python3 with boto3 is missing (apt-get install python3-boto3)"
    );
    None
}

/// Runs `script` with boto3 against the gateway at `endpoint` (`s3`: a client with the
/// gateway's keys; `code(f)`: `OK`, or the S3 error code `f()` raised); its stdout,
/// panicking with its stderr if it fails.
pub fn s3(py: &str, endpoint: &str, script: &str) -> String {
    let prelude = "import boto3, botocore, os\n\
        from botocore.config import Config\n\
        s3 = boto3.client('s3', endpoint_url=os.environ['ENDPOINT'], \
        aws_access_key_id=os.environ['AK'], aws_secret_access_key=os.environ['SK'], \
        region_name='us-east-1', \
        config=Config(s3={'addressing_style': 'path'}, retries={'max_attempts': 1}))\n\
        def code(f):\n    try:\n        f()\n        return 'OK'\n    except botocore.exceptions.ClientError as e:\n        return e.response['Error']['Code']\n";
    let out = Command::new(py)
        .args(["-c", &format!("{prelude}{script}")])
        .env("ENDPOINT", endpoint)
        .env("AK", S3_KEY)
        .env("SK", S3_SECRET)
        .output()
        .unwrap();
    let (o, e) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "python failed:\n{o}\n{e}");
    o
}
