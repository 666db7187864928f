//! `unkai umount`: flush everything and unmount, waiting until the server has exited.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::bail;

use crate::fuse::mounts;

/// Unmount a volume: the server flushes every pending write, then exits. Returns once it has.
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  unkai umount /mnt/unkai\n  unkai umount --lazy /mnt/unkai    # detach now; finish when the last open file is closed"
)]
pub struct Args {
    /// Where the volume is mounted.
    mountpoint: PathBuf,
    /// Detach even if busy: open files keep working, the server exits once they are closed.
    #[arg(short = 'l', long)]
    lazy: bool,
    /// Seconds to wait for the server to finish flushing.
    #[arg(long, default_value_t = 600)]
    timeout: u64,
}

fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name in parentheses; a zombie has exited.
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z')),
        Err(_) => false,
    }
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let stale = mounts::is_stale(&a.mountpoint);
    let mp = std::fs::canonicalize(&a.mountpoint).unwrap_or_else(|_| a.mountpoint.clone());
    let Some(entry) = mounts::find(&mp) else {
        bail!("{} is not mounted", mp.display());
    };
    if !mounts::is_unkai(&entry) {
        bail!(
            "{} is not an unkai mount (it is {} {}); use umount(8) for it",
            mp.display(),
            entry.fstype,
            entry.source
        );
    }
    let pid_path = super::pid_file(&mp);
    let pid: Option<i32> = std::fs::read_to_string(&pid_path)
        .ok()
        .and_then(|s| s.trim().parse().ok());
    if stale {
        mounts::unmount(&mp, true)?;
        let _ = std::fs::remove_file(&pid_path);
        println!(
            "unkai: removed the stale mount at {} (its server had died)",
            mp.display()
        );
        return Ok(());
    }
    if let Err(e) = mounts::unmount(&mp, a.lazy) {
        if e.raw_os_error() == Some(libc::EBUSY) {
            bail!(
                "{} is busy: a process has files open or its working directory there \
                 (see `fuser -vm {}`); close them, or use --lazy",
                mp.display(),
                mp.display()
            );
        }
        bail!("cannot unmount {}: {e}", mp.display());
    }
    if let Some(pid) = pid {
        let start = Instant::now();
        let mut told = false;
        let mut shown = String::new();
        while alive(pid) {
            if start.elapsed() > Duration::from_secs(a.timeout) {
                bail!(
                    "unmounted {}, but its server (pid {pid}) is still flushing after {}s; \
                     it will exit when done",
                    mp.display(),
                    a.timeout
                );
            }
            if !told && start.elapsed() > Duration::from_secs(2) {
                eprintln!("unkai: waiting for the server (pid {pid}) to finish flushing...");
                told = true;
            }
            // What the server has left to upload (write-back), and why uploads fail while
            // they do, as it writes them once a second.
            if let Ok(left) = std::fs::read_to_string(pid_path.with_extension("staged")) {
                if left != shown {
                    let mut lines = left.lines();
                    let counts = lines.next().and_then(|l| l.trim().split_once(' '));
                    if let Some((blocks, bytes)) = counts {
                        let bytes = bytes.parse().unwrap_or(0);
                        match lines.next().map(str::trim).filter(|t| !t.is_empty()) {
                            None => eprintln!(
                                "unkai: uploading what is staged: {blocks} blocks ({}) left",
                                super::human_bytes(bytes)
                            ),
                            Some(why) => eprintln!(
                                "unkai: uploading what is staged: {blocks} blocks ({}) left; \
                                 the store refuses them ({why}): they stay staged on local \
                                 disk and are retried; stopping the server (kill -9 {pid}) loses \
                                 nothing, the next mount or `unkai fsck --repair` uploads them",
                                super::human_bytes(bytes)
                            ),
                        }
                    }
                    shown = left;
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    println!("unkai: unmounted {}", mp.display());
    Ok(())
}
