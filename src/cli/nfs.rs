//! `unkai nfs`: serve a volume over NFSv3 (one TCP port for NFS and MOUNT) with its export
//! options: client networks and the one identity every call acts as.
//!
//! Not for: the protocol (`crate::nfs`), or the flags every server shares (`cli::front`).

use anyhow::bail;

use super::front::{self, VolumeArgs};
use crate::nfs::export::{Export, Net};

/// Serve a volume over NFSv3 (NFS and MOUNT on one TCP port, no portmapper needed).
///
/// Every call acts as one identity, --anonuid/--anongid (default 65534:65534), checked
/// against the mode bits as a mount checks them: the NFS library unkai uses does not hand
/// the server the caller's AUTH_UNIX credentials, so clients' uids are not honoured (as
/// all_squash). Only the networks in --allow may connect (default: this machine). Each
/// WRITE is durable before it is answered. The volume's trash, quotas and write-back work
/// as on a mount. Stop it with Ctrl-C or SIGTERM: everything written is flushed first.
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  unkai nfs --listen 127.0.0.1:2049                              # the default volume, this machine only\n  unkai nfs sqlite:///var/lib/unkai/vol.db --listen 10.0.0.5:2049 --allow 10.0.0.0/24\n  unkai nfs postgres://unkai@db/unkai --subdir /projects/a --read-only --listen 10.0.0.5:2049 --allow 10.0.0.0/8\n\n  mount -t nfs -o vers=3,proto=tcp,port=2049,mountport=2049,nolock 10.0.0.5:/ /mnt/a\n  nfs-ls 'nfs://127.0.0.1/?nfsport=2049&mountport=2049'"
)]
pub struct Args {
    #[command(flatten)]
    volume: VolumeArgs,
    /// Where to listen (IP:PORT or [IPv6]:PORT; the port serves NFS and MOUNT alike).
    #[arg(long, default_value = "127.0.0.1:2049", value_name = "ADDR")]
    listen: String,
    /// Client networks allowed to connect, e.g. 10.0.0.0/8,192.168.1.7 (others are
    /// disconnected before any request). Default: 127.0.0.1 and ::1 only.
    #[arg(long, value_name = "NET[,NET...]", value_delimiter = ',')]
    allow: Vec<String>,
    /// The uid every call acts as (whatever uid the client sends).
    #[arg(long, default_value_t = 65534, value_name = "UID")]
    anonuid: u32,
    /// The gid every call acts as.
    #[arg(long, default_value_t = 65534, value_name = "GID")]
    anongid: u32,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let listen: std::net::SocketAddr = match args.listen.parse() {
        Ok(a) => a,
        Err(_) => bail!(
            "invalid --listen '{}': give IP:PORT, e.g. 127.0.0.1:2049 or [::1]:2049",
            args.listen
        ),
    };
    let mut export = Export::local();
    if !args.allow.is_empty() {
        export.allow = args
            .allow
            .iter()
            .map(|n| {
                n.parse::<Net>()
                    .map_err(|e| anyhow::anyhow!("--allow: {e}"))
            })
            .collect::<anyhow::Result<_>>()?;
    }
    export.anon_uid = args.anonuid;
    export.anon_gid = args.anongid;
    front::run(&args.volume, "nfs", move |ex| {
        crate::nfs::serve(crate::volume::front::Front::of(&ex), listen, export)
    })
}
