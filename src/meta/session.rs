//! Sessions: when a client of the volume counts as gone (its process ended on this host, or
//! its heartbeat stopped), and how often a live one says it is alive.
//!
//! Not for: storing sessions (the engines) or cleaning up after dead ones (`ops`).

use std::time::Duration;

use super::{Nanos, SessionInfo};

/// A session whose heartbeat is older than this is dead (unless `UNKAI_SESSION_TIMEOUT`, in
/// seconds, says otherwise: tests shorten it).
pub(crate) const SESSION_TIMEOUT: Duration = Duration::from_secs(300);

/// The session timeout in force: [`SESSION_TIMEOUT`] or `UNKAI_SESSION_TIMEOUT` (seconds).
pub fn session_timeout() -> Duration {
    static T: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *T.get_or_init(|| {
        std::env::var("UNKAI_SESSION_TIMEOUT")
            .ok()
            .and_then(|v| v.trim().parse::<f64>().ok())
            .filter(|s| s.is_finite() && *s > 0.0)
            .map_or(SESSION_TIMEOUT, Duration::from_secs_f64)
    })
}

/// How often a mount heartbeats (and looks for dead sessions): 15 beats per timeout.
pub fn heartbeat_interval() -> Duration {
    session_timeout() / 15
}
pub(crate) fn host_name() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_default()
}

/// Whether a session row (its info as stored, its last heartbeat) belongs to a client known to
/// be gone; an unreadable row counts as gone.
pub(crate) fn row_dead(info: &str, heartbeat: Nanos, now: Nanos) -> bool {
    match serde_json::from_str::<SessionInfo>(info) {
        Ok(info) => session_dead(&info, heartbeat, now),
        Err(_) => true,
    }
}

/// Whether a session's process is known to be gone (same host, pid no longer an unkai).
pub fn session_dead(info: &SessionInfo, heartbeat: Nanos, now: Nanos) -> bool {
    if now - heartbeat > session_timeout().as_nanos() as i64 {
        return true;
    }
    if info.host != host_name() {
        return false;
    }
    if info.pid == std::process::id() {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{}/comm", info.pid)) {
        Ok(comm) => !comm.trim().starts_with("unkai") || exited(info.pid),
        Err(_) => true,
    }
}

/// Whether process `pid` has exited but is not reaped yet (a zombie, or one being torn down):
/// it keeps its /proc entry, but serves nothing any more.
fn exited(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z') || rest.starts_with('X'))
    })
}
