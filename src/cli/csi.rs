//! `unkai csi`: run the Kubernetes CSI driver (Identity, Controller and Node services on a
//! Unix socket).
//!
//! Not for: the services themselves (`csi`).

use std::path::PathBuf;

/// Serve the Container Storage Interface (Kubernetes' CSI driver) on a Unix socket.
///
/// A volume is a directory of a shared unkai volume (/csi/NAME) with a directory quota of
/// its capacity; a pod's volume is a mount of that directory, each mount a process of its
/// own that outlives the driver (a restarted driver finds its mounts again). The META-URL
/// and the storage's credentials come with each request, from the Kubernetes Secret the
/// StorageClass names (key `metaurl`, and environment variables such as
/// AWS_SECRET_ACCESS_KEY for the mounts): never from the command line, never logged.
/// contrib/kubernetes/ has the manifests.
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  unkai csi --endpoint unix:///csi/csi.sock --node-id \"$NODE_NAME\"                # the node plugin (DaemonSet)\n  unkai csi --endpoint unix:///csi/csi.sock --node-id \"$NODE_NAME\" --no-node      # the controller (Deployment)\n  UNKAI_META_URL=sqlite:///var/lib/unkai/vol.db unkai csi --endpoint unix:///tmp/csi.sock --node-id test  # a volume for every request without secrets"
)]
pub struct Args {
    /// The gRPC endpoint: a Unix socket, unix:///PATH (made afresh, mode 0600).
    #[arg(long, env = "CSI_ENDPOINT", value_name = "unix:///PATH")]
    endpoint: String,
    /// This node's name (Kubernetes' node name: NodeGetInfo).
    #[arg(long, env = "NODE_NAME", value_name = "NAME")]
    node_id: String,
    /// Where the node service records which volume it mounted at which target path.
    #[arg(long, default_value = "/var/lib/unkai/csi", value_name = "DIR")]
    state_dir: PathBuf,
    /// Serve no Controller service (a node plugin only).
    #[arg(long, conflicts_with = "no_node")]
    no_controller: bool,
    /// Serve no Node service (the controller only).
    #[arg(long)]
    no_node: bool,
    /// Words run before `unkai mount` and `unkai umount` (split at spaces), e.g. `nsenter
    /// --target 1 --mount -- systemd-run --scope --collect --quiet` for mounts that live in
    /// scopes of the host's, outside the plugin's container (contrib/kubernetes/node.yaml).
    #[arg(long, value_name = "CMD", default_value = "")]
    mount_prefix: String,
    /// The unkai binary the mounts run [default: this one]; with --mount-prefix entering the
    /// host, a copy of it on the host (the DaemonSet copies it to /var/lib/unkai/bin).
    #[arg(long, value_name = "PATH")]
    mount_exe: Option<PathBuf>,
}

#[cfg(unkai_csi)]
pub fn run(a: Args) -> anyhow::Result<()> {
    if a.node_id.trim().is_empty() {
        anyhow::bail!("--node-id is empty: give this node's name, e.g. --node-id \"$NODE_NAME\"");
    }
    crate::csi::socket_path(&a.endpoint)?;
    let cfg = crate::csi::Config {
        endpoint: a.endpoint,
        node_id: a.node_id,
        state_dir: a.state_dir,
        exe: crate::csi::node::Exe {
            prefix: a
                .mount_prefix
                .split_whitespace()
                .map(String::from)
                .collect(),
            unkai: match a.mount_exe {
                Some(p) => p,
                None => std::env::current_exe()?,
            },
        },
        controller: !a.no_controller,
        node: !a.no_node,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(crate::csi::serve(cfg))
}

#[cfg(not(unkai_csi))]
pub fn run(_: Args) -> anyhow::Result<()> {
    anyhow::bail!(
        "this unkai was built without the CSI driver (the CSI spec's csi.proto was not found at \
         build time): install Go (apt install golang-go) and rebuild, or set UNKAI_CSI_PROTO to \
         a csi.proto"
    )
}
