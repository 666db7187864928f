//! Change notification between the clients of a PostgreSQL volume (LISTEN/NOTIFY).
//!
//! Each client publishes what its committed transactions changed: a thread of its own gathers
//! the changes, drops duplicates and sends them with `pg_notify` in one small transaction of
//! its own, right after the changing transactions committed (NOTIFY inside them would
//! serialize every commit of the cluster on PostgreSQL's notify lock, WAL flush included).
//! Another thread LISTENs on a dedicated connection and hands what the other clients changed
//! to the watcher's sink; it reconnects when the connection drops, saying `Down` and `Up`.
//!
//! A payload: `SESSION;ITEM;ITEM...` with items `iINO` (attributes changed), `dINO` (contents
//! too) and `ePARENT:HEXNAME` (an entry). Only digits, letters and `;:`, so it needs no quoting;
//! a batch too big for one payload (PostgreSQL allows 8000 bytes) is cut into several.
//!
//! Not for: what a change means to a cache (the watcher's business).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ::postgres::Client;
use parking_lot::Mutex;

use super::tls::Tls;
use crate::meta::engine::TxStats;
use crate::meta::{Change, ChangeSink, Ino};

/// The channel every client of a volume (one database) notifies and listens on.
const CHANNEL: &str = "unkai_changes";
/// Longest payload we send (PostgreSQL's limit is 8000 bytes).
const MAX_PAYLOAD: usize = 7900;
/// How long changes are gathered after the first before they are sent: one transaction of
/// notifications for a burst instead of one per change (each a commit the server makes on
/// the cores the mounts use), for at most this much more delay in what others see.
const GATHER: Duration = Duration::from_millis(3);
/// How often the listener checks its connection (and whether to stop) when nothing arrives.
const TICK: Duration = Duration::from_millis(500);
const PING_EVERY: Duration = Duration::from_secs(5);
const MAX_RECONNECT_DELAY: Duration = Duration::from_secs(2);

/// The publishing and listening threads of one client.
#[derive(Default)]
pub(crate) struct Watch {
    active: AtomicBool,
    tx: Mutex<Option<mpsc::Sender<Change>>>,
    sender: Mutex<Option<JoinHandle<()>>>,
    stop: Arc<AtomicBool>,
}

impl Watch {
    /// Starts both threads: `sid` is this client's session (its own messages are ignored);
    /// what is sent is counted in `stats`.
    pub fn start(
        &self,
        config: &::postgres::Config,
        tls: &Tls,
        sid: u64,
        sink: ChangeSink,
        stats: Arc<TxStats>,
    ) {
        let mut config = config.clone();
        // A peer that vanished without closing is noticed within seconds.
        config.tcp_user_timeout(Duration::from_secs(10));
        let (tx, rx) = mpsc::channel();
        let mut cfg = config.clone();
        cfg.application_name("unkai-notify");
        config.application_name("unkai-listen");
        let sender = crate::meta::spawn_background("unkai-notify", {
            let tls = tls.clone();
            move || send_loop(cfg, tls, sid, rx, stats)
        })
        .expect("spawn the notify thread");
        let stop = self.stop.clone();
        crate::meta::spawn_background("unkai-listen", {
            let tls = tls.clone();
            move || listen_loop(config, tls, sid, sink, stop)
        })
        .expect("spawn the listen thread");
        *self.tx.lock() = Some(tx);
        *self.sender.lock() = Some(sender);
        self.active.store(true, Ordering::Release);
    }

    /// Publishes changes just committed (nothing unless started; `f` is only called then).
    pub fn publish(&self, f: impl FnOnce() -> Vec<Change>) {
        if !self.active.load(Ordering::Acquire) {
            return;
        }
        if let Some(tx) = self.tx.lock().as_ref() {
            for c in f() {
                let _ = tx.send(c);
            }
        }
    }

    /// Sends what is still queued, then stops both threads.
    pub fn stop(&self) {
        self.active.store(false, Ordering::Release);
        self.stop.store(true, Ordering::Release);
        self.tx.lock().take();
        if let Some(h) = self.sender.lock().take() {
            let _ = h.join();
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

/// The payloads announcing `changes` (duplicates merged), each at most [`MAX_PAYLOAD`] bytes.
fn encode(sid: u64, changes: &[Change]) -> Vec<String> {
    let mut inodes: BTreeMap<Ino, bool> = BTreeMap::new();
    let mut entries: BTreeSet<(Ino, &[u8])> = BTreeSet::new();
    for c in changes {
        match c {
            Change::Inode { ino, data } => *inodes.entry(*ino).or_default() |= *data,
            Change::Entry { parent, name } => {
                entries.insert((*parent, name));
            }
            Change::Up | Change::Down => {}
        }
    }
    let items = inodes
        .into_iter()
        .map(|(ino, data)| format!("{}{ino}", if data { 'd' } else { 'i' }))
        .chain(
            entries
                .into_iter()
                .map(|(p, n)| format!("e{p}:{}", hex::encode(n))),
        );
    let head = sid.to_string();
    let mut out = Vec::new();
    let mut cur = head.clone();
    for item in items {
        if cur.len() + 1 + item.len() > MAX_PAYLOAD && cur.len() > head.len() {
            out.push(std::mem::replace(&mut cur, head.clone()));
        }
        cur.push(';');
        cur.push_str(&item);
    }
    if cur.len() > head.len() {
        out.push(cur);
    }
    out
}

/// The sender's session and the changes of a payload (None if it is not one of ours).
fn decode(payload: &str) -> Option<(u64, Vec<Change>)> {
    let mut parts = payload.split(';');
    let sid = parts.next()?.parse().ok()?;
    let mut out = Vec::new();
    for item in parts {
        let (tag, rest) = item.split_at_checked(1)?;
        out.push(match tag {
            "i" | "d" => Change::Inode {
                ino: rest.parse().ok()?,
                data: tag == "d",
            },
            "e" => {
                let (p, n) = rest.split_once(':')?;
                Change::Entry {
                    parent: p.parse().ok()?,
                    name: hex::decode(n).ok()?,
                }
            }
            _ => return None,
        });
    }
    Some((sid, out))
}

fn send_loop(
    config: ::postgres::Config,
    tls: Tls,
    sid: u64,
    rx: mpsc::Receiver<Change>,
    stats: Arc<TxStats>,
) {
    let mut conn: Option<Client> = None;
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        let until = Instant::now() + GATHER;
        while let Some(left) = until.checked_duration_since(Instant::now()) {
            match rx.recv_timeout(left) {
                Ok(c) => batch.push(c),
                Err(_) => break,
            }
        }
        batch.extend(rx.try_iter());
        let mut sql = String::from("BEGIN; SET LOCAL synchronous_commit TO off; ");
        for p in encode(sid, &batch) {
            sql.push_str(&format!("SELECT pg_notify('{CHANNEL}', '{p}'); "));
        }
        sql.push_str("COMMIT");
        for attempt in 0..2 {
            let c = match &mut conn {
                Some(c) if !c.is_closed() => c,
                _ => match config.connect(tls.clone()) {
                    Ok(c) => conn.insert(c),
                    Err(e) => {
                        tracing::warn!("cannot publish changes (other mounts see them late): {e}");
                        break;
                    }
                },
            };
            stats.notify_round_trip();
            match c.batch_execute(&sql) {
                Ok(()) => break,
                Err(e) => {
                    if attempt > 0 {
                        tracing::warn!("cannot publish changes (other mounts see them late): {e}");
                    }
                    if !c.is_closed() {
                        let _ = c.batch_execute("ROLLBACK");
                    }
                    conn = None;
                }
            }
        }
    }
}

fn listen_loop(
    config: ::postgres::Config,
    tls: Tls,
    sid: u64,
    sink: ChangeSink,
    stop: Arc<AtomicBool>,
) {
    let mut delay = Duration::from_millis(50);
    let mut warned = false;
    while !stop.load(Ordering::Acquire) {
        let mut client = match config
            .connect(tls.clone())
            .and_then(|mut c| c.batch_execute(&format!("LISTEN {CHANNEL}")).map(|()| c))
        {
            Ok(c) => c,
            Err(e) => {
                if !warned {
                    tracing::warn!("cannot listen for other mounts' changes, retrying: {e}");
                    warned = true;
                }
                std::thread::sleep(delay);
                delay = (delay * 2).min(MAX_RECONNECT_DELAY);
                continue;
            }
        };
        // Said once the changes flow (the cache answers from then on): tests, and people
        // reading the log, take the line to mean the mount keeps what it reads.
        sink(Change::Up);
        match warned {
            true => tracing::info!("listening for other mounts' changes again"),
            false => tracing::info!("listening for other mounts' changes"),
        }
        warned = false;
        delay = Duration::from_millis(50);
        let mut pinged = Instant::now();
        let lost = loop {
            if stop.load(Ordering::Acquire) {
                return;
            }
            let mut failed = None;
            {
                let mut notes = client.notifications();
                let mut it = notes.timeout_iter(TICK);
                let started = Instant::now();
                loop {
                    match ::postgres::fallible_iterator::FallibleIterator::next(&mut it) {
                        Ok(Some(n)) => {
                            if n.channel() != CHANNEL {
                                continue;
                            }
                            match decode(n.payload()) {
                                Some((from, _)) if from == sid => {}
                                Some((_, changes)) => changes.into_iter().for_each(&sink),
                                None => tracing::debug!("odd change payload {:?}", n.payload()),
                            }
                            // A steady stream must not keep us from our other duties.
                            if started.elapsed() > TICK || stop.load(Ordering::Acquire) {
                                break;
                            }
                        }
                        Ok(None) => break,
                        Err(e) => {
                            failed = Some(e.to_string());
                            break;
                        }
                    }
                }
            }
            if failed.is_none() && !client.is_closed() && pinged.elapsed() > PING_EVERY {
                pinged = Instant::now();
                if let Err(e) = client.simple_query("") {
                    failed = Some(e.to_string());
                }
            }
            if let Some(e) = failed {
                break e;
            }
            if client.is_closed() {
                break "connection closed".to_string();
            }
        };
        if stop.load(Ordering::Acquire) {
            return;
        }
        tracing::warn!("lost the channel of other mounts' changes ({lost}); reconnecting");
        sink(Change::Down);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_round_trip_and_split() {
        let mut changes = vec![
            Change::Inode {
                ino: 5,
                data: false,
            },
            Change::Inode { ino: 5, data: true },
            Change::Inode {
                ino: 7,
                data: false,
            },
            Change::Entry {
                parent: 1,
                name: b"a;b:c\xff".to_vec(),
            },
            Change::Entry {
                parent: 1,
                name: b"a;b:c\xff".to_vec(),
            },
        ];
        let p = encode(42, &changes);
        assert_eq!(p, vec!["42;d5;i7;e1:613b623a63ff".to_string()]);
        let (sid, got) = decode(&p[0]).unwrap();
        assert_eq!(sid, 42);
        assert_eq!(
            got,
            vec![
                Change::Inode { ino: 5, data: true },
                Change::Inode {
                    ino: 7,
                    data: false
                },
                changes[3].clone(),
            ]
        );
        // Many long names: several payloads, each within the limit, nothing lost.
        changes.clear();
        for i in 0..100u64 {
            changes.push(Change::Entry {
                parent: i,
                name: vec![b'x'; 255],
            });
        }
        let p = encode(1, &changes);
        assert!(
            p.len() > 1 && p.iter().all(|s| s.len() <= MAX_PAYLOAD),
            "{}",
            p.len()
        );
        let n: usize = p.iter().map(|s| decode(s).unwrap().1.len()).sum();
        assert_eq!(n, 100);
        assert!(decode("x;i1").is_none() && decode("1;q1").is_none());
    }
}
