//! `unkai webdav`: serve a volume over WebDAV (HTTP Basic authentication on by default,
//! optionally HTTPS).
//!
//! Not for: the protocol (`webdav`) or opening the volume (`cli::front`).

use std::path::PathBuf;

use anyhow::bail;

use super::front::VolumeArgs;
use crate::meta::Ctx;
use crate::webdav::{self, Auth};

/// The environment variable that holds the password of the `--user`s.
const PASSWORD_ENV: &str = "UNKAI_WEBDAV_PASSWORD";

/// Serve a volume over WebDAV (HTTP Basic authentication, optionally HTTPS).
///
/// For WebDAV clients (RFC 4918): davfs2, cadaver, curl, rclone, macOS Finder, Windows
/// Explorer, file managers. Clients sign in with HTTP Basic authentication as one of the
/// --user names and the password in UNKAI_WEBDAV_PASSWORD; the server acts on the volume as
/// one identity (the uid and gid it runs as, or --uid/--gid), whose permissions apply.
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  export UNKAI_WEBDAV_PASSWORD='correct horse battery'\n  unkai webdav --user alice                    # the default volume, http://127.0.0.1:9007/\n  unkai webdav sqlite:///var/lib/unkai/vol.db --user alice --user bob \\\n      --listen 0.0.0.0:8443 --tls-cert cert.pem --tls-key key.pem\n  unkai webdav --no-auth --read-only --subdir /public\n  curl -u alice -T report.pdf http://127.0.0.1:9007/report.pdf\n  mount -t davfs http://127.0.0.1:9007/ /mnt/dav"
)]
pub struct Args {
    #[command(flatten)]
    volume: VolumeArgs,
    /// The address and port to listen on (0.0.0.0:PORT for every interface: then give
    /// --tls-cert, or the password crosses the network in clear).
    #[arg(long, default_value = "127.0.0.1:9007", value_name = "ADDR")]
    listen: String,
    /// A user who may sign in (repeat for more); the password is read from the
    /// environment variable UNKAI_WEBDAV_PASSWORD, never from the command line.
    #[arg(long = "user", value_name = "NAME")]
    users: Vec<String>,
    /// Serve without authentication: anyone who can reach --listen may read and change the
    /// volume as the server's identity.
    #[arg(long, conflicts_with = "users")]
    no_auth: bool,
    /// Serve HTTPS with this certificate (PEM, the chain from the server's certificate up).
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM: PKCS#8, PKCS#1 or SEC1).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// The uid the server acts as on the volume (default: its own).
    #[arg(long)]
    uid: Option<u32>,
    /// The gid the server acts as on the volume (default: its own).
    #[arg(long)]
    gid: Option<u32>,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let auth = if a.no_auth {
        Auth::Off
    } else {
        if a.users.is_empty() {
            bail!(
                "unkai webdav needs credentials: give --user NAME and the password in \
                 {PASSWORD_ENV}, or --no-auth to let anyone who can reach --listen in"
            );
        }
        if let Some(u) = a.users.iter().find(|u| u.is_empty() || u.contains(':')) {
            bail!("invalid --user '{u}': a user name is not empty and has no ':'");
        }
        let password = match std::env::var_os(PASSWORD_ENV) {
            Some(p) if !p.is_empty() => p,
            _ => bail!(
                "the password of --user is missing: put it in the environment variable \
                 {PASSWORD_ENV}"
            ),
        };
        use std::os::unix::ffi::OsStrExt;
        Auth::basic(&a.users, password.as_bytes())
    };
    let tls = match (&a.tls_cert, &a.tls_key) {
        (Some(cert), Some(key)) => Some(webdav::tls_config(cert, key)?),
        _ => None,
    };
    let ctx = Ctx {
        uid: a.uid.unwrap_or_else(|| nix::unistd::geteuid().as_raw()),
        gid: a.gid.unwrap_or_else(|| nix::unistd::getegid().as_raw()),
        pid: 0,
        umask: 0o022,
    };
    let opts = webdav::Options {
        listen: a.listen,
        auth,
        tls,
        ctx,
    };
    super::front::run(&a.volume, "webdav", move |front| webdav::serve(front, opts))
}
