//! `unkai gateway`: serve a volume as S3 (`crate::gateway`): its flags, the access keys read
//! from the environment, and refusing to start without keys unless told.
//!
//! Not for: the S3 protocol or its operations (`crate::gateway`), the volume's flags
//! (`cli::front`).

use std::net::SocketAddr;

use anyhow::{Context, bail};

use super::front::VolumeArgs;
use crate::gateway::{self, ACCESS_KEY_ENV, Keys, SECRET_KEY_ENV};

/// Serve a volume through the S3 API: buckets are its top-level directories, objects its
/// files (a key's '/' are directories).
#[derive(clap::Args)]
#[command(
    after_help = "The access key and its secret come from the environment: \
UNKAI_GATEWAY_ACCESS_KEY and UNKAI_GATEWAY_SECRET_KEY (or MINIO_ROOT_USER and \
MINIO_ROOT_PASSWORD). Requests are checked with Signature V4; use path-style URLs.\n\n\
Examples:\n  UNKAI_GATEWAY_ACCESS_KEY=admin UNKAI_GATEWAY_SECRET_KEY=12345678 unkai gateway sqlite:///var/lib/unkai/vol.db\n  \
unkai gateway --listen 127.0.0.1:9000 --subdir /projects/a sqlite:///var/lib/unkai/vol.db\n  \
aws --endpoint-url http://127.0.0.1:9000 s3 cp big.iso s3://mybucket/iso/big.iso"
)]
pub struct Args {
    #[command(flatten)]
    volume: VolumeArgs,
    /// The address to serve S3 at (HOST:PORT; port 0: any free port, logged).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9000")]
    listen: String,
    /// Serve requests without checking any signature: anyone who reaches the address may
    /// read and change the volume as the gateway's user.
    #[arg(long)]
    no_auth: bool,
    /// Act on the volume as this user id (default: the gateway's own).
    #[arg(long, value_name = "UID")]
    uid: Option<u32>,
    /// Act on the volume as this group id (default: the gateway's own).
    #[arg(long, value_name = "GID")]
    gid: Option<u32>,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let listen: SocketAddr = a
        .listen
        .parse()
        .with_context(|| format!("--listen {}: give HOST:PORT, e.g. 127.0.0.1:9000", a.listen))?;
    let keys = Keys::from_env();
    let keys = match (keys, a.no_auth) {
        (Some(k), false) => Some(k),
        (None, false) => bail!(
            "no access key: set {} and {} (or {} and {}), or give --no-auth to serve \
             without authentication",
            ACCESS_KEY_ENV[0],
            SECRET_KEY_ENV[0],
            ACCESS_KEY_ENV[1],
            SECRET_KEY_ENV[1]
        ),
        (_, true) => {
            tracing::warn!("--no-auth: S3 requests at {listen} are served without authentication");
            None
        }
    };
    let opts = gateway::Options {
        listen,
        keys,
        uid: a.uid.unwrap_or_else(|| nix::unistd::getuid().as_raw()),
        gid: a.gid.unwrap_or_else(|| nix::unistd::getgid().as_raw()),
    };
    super::front::run(&a.volume, "gateway", move |front| {
        gateway::serve(front, opts)
    })
}
