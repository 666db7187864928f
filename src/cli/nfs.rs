//! `unkai nfs`: serve a volume over NFSv3 (one TCP port for NFS and MOUNT) with its export
//! options: client networks, squashing, the anonymous identity.
//!
//! Not for: the protocol (`crate::nfs`), or the flags every server shares (`cli::front`).

use anyhow::bail;

use super::front::{self, VolumeArgs};
use crate::nfs::export::{Export, Net, Squash};

/// Serve a volume over NFSv3 (NFS and MOUNT on one TCP port, no portmapper needed).
///
/// Each call acts as the uid and gid its client sends (AUTH_UNIX), checked against the mode
/// bits as a mount checks them; uid 0 becomes the anonymous user unless --no-root-squash.
/// Only the networks in --allow may connect (default: this machine). The volume's trash,
/// quotas and write-back work as on a mount. Stop it with Ctrl-C or SIGTERM: everything
/// written is flushed first.
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  unkai nfs --listen 127.0.0.1:2049                              # the default volume, this machine only\n  unkai nfs sqlite:///var/lib/unkai/vol.db --listen 10.0.0.5:2049 --allow 10.0.0.0/24\n  unkai nfs postgres://unkai@db/unkai --subdir /projects/a --read-only --listen 10.0.0.5:2049 --allow 10.0.0.0/8\n\n  mount -t nfs -o vers=3,proto=tcp,port=2049,mountport=2049,nolock 10.0.0.5:/ /mnt/a\n  nfs-ls 'nfs://127.0.0.1/?nfsport=2049&mountport=2049'"
)]
pub struct Args {
    #[command(flatten)]
    volume: VolumeArgs,
    /// Where to listen (IP:PORT; the port serves NFS and MOUNT alike).
    #[arg(long, default_value = "127.0.0.1:2049", value_name = "ADDR")]
    listen: String,
    /// Client networks allowed to connect, e.g. 10.0.0.0/8,192.168.1.7 (others are
    /// disconnected before any request). Default: 127.0.0.1 and ::1 only.
    #[arg(long, value_name = "NET[,NET...]", value_delimiter = ',')]
    allow: Vec<String>,
    /// Map uid 0 (and gid 0) of clients to --anonuid/--anongid (the default).
    #[arg(long, overrides_with = "no_root_squash")]
    root_squash: bool,
    /// Let uid 0 of clients act as root on the volume.
    #[arg(long)]
    no_root_squash: bool,
    /// Map every client's uid and gid to --anonuid/--anongid.
    #[arg(long)]
    all_squash: bool,
    /// The uid squashed clients (and calls without AUTH_UNIX credentials) act as.
    #[arg(long, default_value_t = 65534, value_name = "UID")]
    anonuid: u32,
    /// The gid squashed clients act as.
    #[arg(long, default_value_t = 65534, value_name = "GID")]
    anongid: u32,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let listen: std::net::SocketAddr = match args.listen.parse() {
        Ok(a) => a,
        Err(_) => bail!(
            "invalid --listen '{}': give IP:PORT, e.g. 127.0.0.1:2049",
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
    export.squash = if args.all_squash {
        Squash::All
    } else if args.no_root_squash && !args.root_squash {
        Squash::None
    } else {
        Squash::Root
    };
    export.anon_uid = args.anonuid;
    export.anon_gid = args.anongid;
    // The crate's own form: "IP:PORT" with a bare IPv6 address.
    let listen = format!("{}:{}", listen.ip(), listen.port());
    front::run(&args.volume, "nfs", move |f| {
        crate::nfs::serve(f, listen, export)
    })
}
