//! The command line: one binary, one subcommand per job.
//!
//! Not for: logic a subcommand could share with another front end (that lives in `volume`,
//! `vfs` and below).

mod bench;
mod clone;
mod completion;
mod config;
mod csi;
mod destroy;
mod dump;
mod format;
pub mod front;
mod fsck;
mod gateway;
mod gc;
mod helper;
mod import;
mod info;
mod load;
mod mount;
mod nfs;
mod objbench;
mod options;
mod profile;
mod quota;
mod restore;
mod scan;
mod stats;
mod status;
mod sync;
mod umount;
mod warmup;
mod webdav;

pub(crate) use mount::META_URL_ENV;

use clap::{CommandFactory, Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "unkai",
    version,
    about = "A shared POSIX file system: data in object storage, metadata in a database, mounted with FUSE.",
    long_about = "A shared POSIX file system for cloud machines. A volume's file data lives as \
immutable blocks in object storage (a local directory by default), its metadata in a \
transactional database (an embedded SQLite file by default), and it is mounted with FUSE.\n\n\
Zero configuration: `unkai mount -d /mnt/unkai` creates and mounts the default volume.",
    after_help = "Examples:\n  unkai mount -d /mnt/unkai                                  # the default volume\n  unkai format sqlite:///var/lib/unkai/vol.db myvol          # a new volume\n  unkai mount -d sqlite:///var/lib/unkai/vol.db /mnt/myvol\n  unkai status sqlite:///var/lib/unkai/vol.db\n  unkai umount /mnt/myvol"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Command,
    /// Log level or filter (error, warn, info, debug, trace, or a tracing filter such as
    /// `unkai=debug`).
    #[arg(long, global = true, env = "UNKAI_LOG", default_value = "info")]
    log_level: String,
}

// Parsed once per process: the size of the largest variant (mount's flags) costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    Format(format::Args),
    Config(config::Args),
    Clone(clone::Args),
    Destroy(destroy::Args),
    Dump(dump::Args),
    Load(load::Args),
    Restore(restore::Args),
    Quota(quota::Args),
    Info(info::InfoArgs),
    Profile(profile::Args),
    Summary(info::SummaryArgs),
    Mount(mount::Args),
    Nfs(nfs::Args),
    Umount(umount::Args),
    Status(status::Args),
    Stats(stats::Args),
    Fsck(fsck::Args),
    Gc(gc::Args),
    Gateway(gateway::Args),
    Objbench(objbench::Args),
    Bench(bench::Args),
    Warmup(warmup::Args),
    Sync(sync::Args),
    Import(import::Args),
    Webdav(webdav::Args),
    Csi(csi::Args),
    Completion(completion::Args),
    Manpage(completion::ManArgs),
}

fn init_logging(filter: &str) {
    use std::io::IsTerminal;
    // fuser warns when its own unmount at exit finds the mount already gone (after umount(8)
    // or `unkai umount`: "Failed to umount filesystem: Invalid argument"): not news.
    let filter = tracing_subscriber::EnvFilter::try_new(format!(
        "{filter},fuser::mnt=error,fuser::session=error"
    ))
    .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(StaleReplies)
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(std::io::stderr().is_terminal())
                .event_format(Tagged(tracing_subscriber::fmt::format().with_target(false))),
        )
        .try_init();
}

/// What starts every log line of a mount once it knows its volume: `NAME[PID]`.
static LOG_TAG: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Set by `mount -d` for its daemon: the volume's name, so that the daemon's first log line
/// names it already.
pub(crate) const LOG_VOLUME_ENV: &str = "UNKAI_LOG_VOLUME";

/// From now on every log line of this process starts with `volume[pid]` (several mounts may
/// log to one file or journal: each line says whose it is). The first call wins.
pub(crate) fn tag_log(volume: &str) {
    let _ = LOG_TAG.set(format!("{volume}[{}]", std::process::id()));
}

/// The log's lines, tagged with [`LOG_TAG`] once it is set.
struct Tagged<F>(F);

impl<S, N, F> tracing_subscriber::fmt::FormatEvent<S, N> for Tagged<F>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
    F: tracing_subscriber::fmt::FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
        mut writer: tracing_subscriber::fmt::format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        if let Some(tag) = LOG_TAG.get() {
            write!(writer, "{tag} ")?;
        }
        self.0.format_event(ctx, writer, event)
    }
}

impl Cli {
    /// The whole command line's definition, for `unkai sync` to read its rules' order.
    fn command_for_sync() -> clap::Command {
        Cli::command()
    }
}

/// The definition of `unkai mount` (its flags are the options of `-o`: `options`).
fn mount_command() -> clap::Command {
    Cli::command()
        .find_subcommand("mount")
        .cloned()
        .expect("unkai mount is defined")
}

/// The META-URL a command was given in `target`: a META-URL as it is; the mountpoint of an
/// unkai mount on this machine (or a path inside one) as the META-URL that mount was made
/// with; none, the default volume's.
pub(crate) fn meta_url_of(target: Option<String>) -> anyhow::Result<String> {
    let Some(t) = target else {
        return Ok(crate::volume::default_meta_url());
    };
    if t.contains("://") {
        return Ok(t);
    }
    let path = std::path::Path::new(&t);
    if !path.exists() {
        anyhow::bail!(
            "'{t}' is neither a META-URL (e.g. sqlite:///var/lib/unkai/vol.db) nor a \
             mountpoint"
        );
    }
    let Some(m) = crate::fuse::mounts::containing(path).filter(crate::fuse::mounts::is_unkai)
    else {
        anyhow::bail!(
            "{t} is not in an unkai mount: give the volume's META-URL (e.g. \
             sqlite:///var/lib/unkai/vol.db) or the mountpoint of a mounted volume"
        );
    };
    let file = crate::volume::serve::meta_url_file(&pid_file(&m.mountpoint));
    // Mounts by root keep theirs under /run/unkai, others under their own runtime dir.
    let root_file =
        crate::volume::serve::meta_url_file(&pid_file_in("/run/unkai".as_ref(), &m.mountpoint));
    for f in [&file, &root_file] {
        match std::fs::read_to_string(f) {
            Ok(url) if !url.trim().is_empty() => return Ok(url.trim().to_string()),
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => anyhow::bail!(
                "cannot read the META-URL of the mount at {} ({}: {e}): run as the user who \
                 mounted it, or give the META-URL",
                m.mountpoint.display(),
                f.display()
            ),
            _ => {}
        }
    }
    anyhow::bail!(
        "the mount at {} ({}) left no record of its META-URL ({}): give the META-URL",
        m.mountpoint.display(),
        m.source,
        file.display()
    )
}

/// Drops fuser's error for a reply the kernel no longer waits for ("Failed to send FUSE
/// reply: No such file or directory"): the request was interrupted, or the connection is
/// closing at unmount. Nothing is lost, and libfuse ignores ENOENT there too.
struct StaleReplies;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for StaleReplies {
    fn event_enabled(
        &self,
        event: &tracing::Event<'_>,
        _: tracing_subscriber::layer::Context<'_, S>,
    ) -> bool {
        struct Stale(bool);
        impl tracing::field::Visit for Stale {
            fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
                if f.name() == "message" {
                    self.0 = is_stale_reply(&format!("{v:?}"));
                }
            }
        }
        if *event.metadata().level() != tracing::Level::ERROR {
            return true;
        }
        let mut stale = Stale(false);
        event.record(&mut stale);
        !stale.0
    }
}

fn is_stale_reply(msg: &str) -> bool {
    msg.starts_with("Failed to send FUSE reply")
        && msg.ends_with(&format!("(os error {})", libc::ENOENT))
}

/// `s` as a C string for a system call on a path or an xattr name (EINVAL if it holds NUL).
fn cstr(s: &std::ffi::OsStr) -> std::io::Result<std::ffi::CString> {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(s.as_bytes())
        .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))
}

/// Runs the command line; returns the process exit code.
pub fn main() -> i32 {
    let args: Vec<String> = std::env::args().collect();
    if let Some((source, mountpoint, opts)) = helper::parse(&args) {
        init_logging("info");
        return finish(helper::run(&source, &mountpoint, &opts));
    }
    // `unkai mount -o cache_size=...`: the options as the flags they name.
    let args = match options::expand_mount_args(args) {
        Ok(a) => a,
        Err(e) => return finish(Err(e)),
    };
    let cli = Cli::parse_from(args);
    init_logging(&cli.log_level);
    let res = match cli.cmd {
        Command::Format(a) => format::run(a),
        Command::Config(a) => config::run(a),
        Command::Clone(a) => clone::run(a),
        Command::Destroy(a) => destroy::run(a),
        Command::Dump(a) => dump::run(a),
        Command::Load(a) => load::run(a),
        Command::Restore(a) => restore::run(a),
        Command::Quota(a) => quota::run(a),
        Command::Nfs(a) => nfs::run(a),
        Command::Info(a) => info::info(a),
        Command::Profile(a) => profile::run(a),
        Command::Summary(a) => info::summary(a),
        Command::Mount(a) => mount::run(a),
        Command::Umount(a) => umount::run(a),
        Command::Status(a) => status::run(a),
        Command::Stats(a) => stats::run(a),
        Command::Fsck(a) => fsck::run(a),
        Command::Gc(a) => gc::run(a),
        Command::Gateway(a) => gateway::run(a),
        Command::Objbench(a) => objbench::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Warmup(a) => warmup::run(a),
        Command::Sync(a) => sync::run(a),
        Command::Import(a) => import::run(a),
        Command::Webdav(a) => webdav::run(a),
        Command::Csi(a) => csi::run(a),
        Command::Completion(a) => completion::run(a, Cli::command()),
        Command::Manpage(a) => completion::manpage(a, Cli::command()),
    };
    finish(res)
}

/// The exit code of a command; an error is reported on one line.
fn finish(res: anyhow::Result<()>) -> i32 {
    match res {
        Ok(()) => 0,
        Err(e) => {
            // One line, whatever a server answered.
            let msg = crate::object::one_line(&format!("{e:#}"));
            eprintln!("unkai: error: {msg}");
            1
        }
    }
}

/// For long-running commands that clean up after themselves: the first SIGINT, SIGTERM or
/// SIGHUP prints `first` and sets the returned flag (the command stops and cleans up); a
/// second one prints `again` and quits at once. Call before starting any other thread, so
/// that every thread inherits the blocked signal mask.
pub(crate) fn catch_interrupts(
    first: &'static str,
    again: &'static str,
) -> anyhow::Result<std::sync::Arc<std::sync::atomic::AtomicBool>> {
    use nix::sys::signal::{SigSet, Signal};
    use std::sync::atomic::{AtomicBool, Ordering};
    let mut sigs = SigSet::empty();
    for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        sigs.add(s);
    }
    sigs.thread_block()?;
    let flag = std::sync::Arc::new(AtomicBool::new(false));
    let seen = flag.clone();
    std::thread::spawn(move || {
        while sigs.wait().is_ok() {
            if seen.swap(true, Ordering::Relaxed) {
                eprintln!("{again}");
                std::process::exit(130);
            }
            eprintln!("{first}");
        }
    });
    Ok(flag)
}

/// Human-readable byte counts: 1.5 GiB.
/// The line of `fsck` and `gc` about objects a live client uploaded and may still commit
/// (nothing when there are none); `tail` ends it.
pub(crate) fn print_in_flight(objects: &[crate::object::ObjectInfo], tail: &str) {
    if !objects.is_empty() {
        let bytes: u64 = objects.iter().map(|o| o.size).sum();
        println!(
            "{} objects ({}) in flight: uploaded by a live client, not committed yet{tail}",
            objects.len(),
            human_bytes(bytes)
        );
    }
}

pub(crate) fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// A count of days as people write it: "1 day", "7 days", "0 days".
pub(crate) fn days(n: u32) -> String {
    if n == 1 {
        "1 day".into()
    } else {
        format!("{n} days")
    }
}

/// Directory for runtime files (pid files of mounts).
pub(crate) fn runtime_dir() -> std::path::PathBuf {
    if nix::unistd::geteuid().is_root() {
        return "/run/unkai".into();
    }
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) => std::path::PathBuf::from(d).join("unkai"),
        None => std::env::temp_dir().join(format!("unkai-{}", nix::unistd::geteuid())),
    }
}

/// The pid file of the mount at `mountpoint` (canonical path).
pub(crate) fn pid_file(mountpoint: &std::path::Path) -> std::path::PathBuf {
    pid_file_in(&runtime_dir(), mountpoint)
}

/// The pid file of the mount at `mountpoint` in the runtime directory `dir`.
fn pid_file_in(dir: &std::path::Path, mountpoint: &std::path::Path) -> std::path::PathBuf {
    let hex: String = mountpoint
        .as_os_str()
        .as_encoded_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    dir.join("mounts").join(format!("{hex}.pid"))
}

/// A progress bar of `len` steps labelled `what` (hidden with `quiet`).
pub(crate) fn progress_bar(len: u64, what: &str, quiet: bool) -> indicatif::ProgressBar {
    if quiet {
        return indicatif::ProgressBar::hidden();
    }
    let pb = indicatif::ProgressBar::new(len);
    let style = format!("{what} {{bar:30}} {{pos}}/{{len}} {{eta}}");
    if let Ok(s) = indicatif::ProgressStyle::with_template(&style) {
        pb.set_style(s);
    }
    pb
}

/// A spinner counting `what` is done, for work of unknown length (hidden with `quiet`).
pub(crate) fn progress_spinner(what: &str, quiet: bool) -> indicatif::ProgressBar {
    if quiet {
        return indicatif::ProgressBar::hidden();
    }
    let pb = indicatif::ProgressBar::new_spinner();
    let style = format!("{{spinner}} {what} {{pos}} records ({{per_sec}}, {{elapsed}})");
    if let Ok(s) = indicatif::ProgressStyle::with_template(&style) {
        pb.set_style(s);
    }
    pb.enable_steady_tick(std::time::Duration::from_millis(200));
    pb
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::layer::SubscriberExt;

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn replies_to_interrupted_requests_are_not_errors() {
        let out = Captured::default();
        let writer = out.clone();
        let sub = tracing_subscriber::registry()
            .with(super::StaleReplies)
            .with(
                tracing_subscriber::fmt::layer()
                    .with_writer(move || writer.clone())
                    .with_ansi(false),
            );
        tracing::subscriber::with_default(sub, || {
            tracing::error!("Failed to send FUSE reply: No such file or directory (os error 2)");
            tracing::error!("Failed to send FUSE reply: Broken pipe (os error 32)");
            tracing::warn!("Failed to send FUSE reply: No such file or directory (os error 2)");
        });
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(
            lines[0].contains("ERROR") && lines[0].contains("os error 32"),
            "{text}"
        );
        assert!(lines[1].contains("WARN"), "{text}");
    }
}
