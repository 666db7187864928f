//! `unkai nfs`: serve a volume over NFSv3 (one TCP port for NFS and MOUNT) with its export
//! options, named as exports(5) names them: client networks, root_squash / no_root_squash /
//! all_squash, anonuid / anongid (as flags, or as an `-o` list).
//!
//! Not for: the protocol (`crate::nfs`), or the flags every server shares (`cli::front`).

use anyhow::bail;

use super::front::{self, VolumeArgs};
use crate::nfs::export::{Export, Net, Squash};

/// Serve a volume over NFSv3 (NFS and MOUNT on one TCP port, no portmapper needed).
///
/// Each call acts as the uid, gid and groups of its AUTH_UNIX credentials, checked against
/// mode bits and ACLs as for a local user; as exports(5) says, uid 0 is mapped to
/// --anonuid/--anongid (default 65534) unless --no-root-squash, every caller is with
/// --all-squash, and AUTH_NONE calls act as the anonymous identity. Only the networks in
/// --allow may connect (default: this machine); nothing else listens. WRITEs are buffered
/// until the client's COMMIT (or made durable at once when it asks for FILE_SYNC). The
/// volume's trash, quotas and write-back work as on a mount. Stop it with Ctrl-C or
/// SIGTERM: everything written is flushed first.
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  unkai nfs --listen 127.0.0.1:2049                              # the default volume, this machine only\n  unkai nfs sqlite:///var/lib/unkai/vol.db --listen 10.0.0.5:2049 --allow 10.0.0.0/24\n  unkai nfs postgres://unkai@db/unkai --subdir /projects/a --read-only --listen 10.0.0.5:2049 --allow 10.0.0.0/8\n  unkai nfs --listen 10.0.0.5:2049 --allow 10.0.0.0/24 -o all_squash,anonuid=1000,anongid=1000\n\n  mount -t nfs -o vers=3,proto=tcp,port=2049,mountport=2049,nolock 10.0.0.5:/ /mnt/a\n  nfs-ls 'nfs://127.0.0.1/?nfsport=2049&mountport=2049'"
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
    /// Map uid 0 (and gid 0) to --anonuid/--anongid: exports(5)'s root_squash, the default.
    #[arg(long, overrides_with_all = ["no_root_squash", "all_squash"])]
    root_squash: bool,
    /// The client's root is root on the volume (exports(5)'s no_root_squash).
    #[arg(long, overrides_with_all = ["root_squash", "all_squash"])]
    no_root_squash: bool,
    /// Every call acts as --anonuid/--anongid, whatever uid it sends (all_squash).
    #[arg(long, overrides_with_all = ["root_squash", "no_root_squash"])]
    all_squash: bool,
    /// The anonymous uid: what squashed calls and AUTH_NONE calls act as.
    #[arg(long, default_value_t = 65534, value_name = "UID")]
    anonuid: u32,
    /// The anonymous gid.
    #[arg(long, default_value_t = 65534, value_name = "GID")]
    anongid: u32,
    /// Export options as exports(5) writes them, comma-separated: root_squash,
    /// no_root_squash, all_squash, no_all_squash, anonuid=UID, anongid=GID. They win over
    /// the flags.
    #[arg(
        short = 'o',
        long = "options",
        value_delimiter = ',',
        value_name = "OPTS"
    )]
    options: Vec<String>,
}

/// Applies exports(5) options to `e`.
fn apply_options(e: &mut Export, opts: &[String]) -> anyhow::Result<()> {
    for o in opts.iter().map(|o| o.trim()).filter(|o| !o.is_empty()) {
        let id = |v: &str| -> anyhow::Result<u32> {
            v.parse()
                .map_err(|_| anyhow::anyhow!("-o {o}: give a number, e.g. {}=65534", &o[..7]))
        };
        match o.split_once('=') {
            None => match o {
                "root_squash" | "no_all_squash" => e.squash = Squash::Root,
                "no_root_squash" => e.squash = Squash::None,
                "all_squash" => e.squash = Squash::All,
                _ => bail!(
                    "unknown export option '{o}': use root_squash, no_root_squash, all_squash, \
                     no_all_squash, anonuid=UID or anongid=GID"
                ),
            },
            Some(("anonuid", v)) => e.anon_uid = id(v)?,
            Some(("anongid", v)) => e.anon_gid = id(v)?,
            Some(_) => bail!(
                "unknown export option '{o}': use root_squash, no_root_squash, all_squash, \
                 no_all_squash, anonuid=UID or anongid=GID"
            ),
        }
    }
    Ok(())
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
    export.squash = if args.all_squash {
        Squash::All
    } else if args.no_root_squash {
        Squash::None
    } else {
        Squash::Root
    };
    export.anon_uid = args.anonuid;
    export.anon_gid = args.anongid;
    apply_options(&mut export, &args.options)?;
    front::run(&args.volume, "nfs", move |ex| {
        crate::nfs::serve(crate::volume::front::Front::of(&ex), listen, export)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn export_options_read_as_exports_5_writes_them() {
        let mut e = Export::local();
        let o = |s: &str| s.split(',').map(str::to_string).collect::<Vec<_>>();
        apply_options(&mut e, &o("all_squash,anonuid=1000,anongid=100")).unwrap();
        assert_eq!((e.squash, e.anon_uid, e.anon_gid), (Squash::All, 1000, 100));
        apply_options(&mut e, &o("no_root_squash")).unwrap();
        assert_eq!(e.squash, Squash::None);
        let bad = apply_options(&mut e, &o("secure")).unwrap_err();
        assert!(
            bad.to_string().contains("unknown export option 'secure'"),
            "{bad}"
        );
        assert!(apply_options(&mut e, &o("anonuid=x")).is_err());
    }
}
