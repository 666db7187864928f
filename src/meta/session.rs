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

/// Whether a session's process is known to be gone (same host, and its pid no longer the
/// process that started when the session says, or, for a session that does not say, no
/// longer an unkai).
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
    if info.proc_start != 0 {
        // Any name: the Python package's client lives in the `python` process.
        return proc_start(info.pid) != Some(info.proc_start) || exited(info.pid);
    }
    match std::fs::read_to_string(format!("/proc/{}/comm", info.pid)) {
        Ok(comm) => !comm.trim().starts_with("unkai") || exited(info.pid),
        Err(_) => true,
    }
}

/// When process `pid` started (`/proc/PID/stat`'s 22nd field, clock ticks since boot), for
/// [`SessionInfo::proc_start`]; None if there is no such process.
pub fn proc_start(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the name (which may hold spaces and parentheses) start at the 3rd.
    let (_, rest) = stat.rsplit_once(") ")?;
    rest.split_whitespace().nth(22 - 3)?.parse().ok()
}

/// Whether process `pid` has exited but is not reaped yet (a zombie, or one being torn down):
/// it keeps its /proc entry, but serves nothing any more.
fn exited(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z') || rest.starts_with('X'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client in a process of any name (the Python package's, in `python`) is alive while
    /// its process runs, if its session records when that process started; dead once it
    /// exits, or if the pid is another process's.
    #[test]
    fn alive_by_start_time_whatever_the_name() {
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let pid = child.id();
        let now = crate::meta::now_nanos();
        let start = proc_start(pid).expect("the child's start time");
        let info = |proc_start| SessionInfo {
            host: host_name(),
            pid,
            mountpoint: "(python, pid 1)".into(),
            proc_start,
            ..Default::default()
        };
        assert!(
            !session_dead(&info(start), now, now),
            "a live `sleep` is alive"
        );
        assert!(
            session_dead(&info(0), now, now),
            "without a start time, only unkai counts"
        );
        assert!(
            session_dead(&info(start + 1), now, now),
            "another process on the pid"
        );
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(session_dead(&info(start), now, now), "gone once it exits");
    }
}
