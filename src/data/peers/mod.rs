//! The peer cache: the clients of a volume that join one group (`--peer-cache`) serve each
//! other's blocks, so that N machines reading one dataset read the bucket about once.
//!
//! Each block has an owner among the members (`place`, rendezvous hashing). A member that
//! misses a block in its own caches asks its owner ([`Group::object`]); the owner answers from
//! what it holds (staged, cached) or fetches the block from the bucket once for everyone who
//! asks at the same time (`flight`) and keeps it in its disk cache, so that the members'
//! caches add up. Requests are signed with the group's key and answers sealed with it (`auth`:
//! a request once, an answer for its request, AES-GCM); answers are the objects as the bucket
//! stores them (encrypted stays encrypted) and the asker decodes and checks them as any stored object: a
//! wrong answer costs a fetch from the bucket, and a member that fails or is slow is bypassed
//! (a time limit, then [`DOWN_FOR`] without asking it).
//!
//! Not for: who the members are (the `volume` layer learns them from the sessions and calls
//! [`Group::set_members`]), the key's keeping (`meta`), or decoding (`data`).

mod ask;
pub mod auth;
mod flight;
pub mod place;
mod serve;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::future::BoxFuture;
use parking_lot::{Mutex, RwLock};

use crate::metrics::{Families, Histogram};
use crate::object::{self, throttle::Rate};

/// How long a member that failed is not asked.
pub const DOWN_FOR: Duration = Duration::from_secs(10);

/// Objects fetched lately kept for askers that come just after (bytes).
const RECENT_BYTES: usize = 64 << 20;

/// Set to `corrupt` (tests only): every block this member serves has a byte flipped, and is
/// sealed so (a member that answers wrong). `forge`: the byte is flipped after the answer is
/// sealed (an answer altered on the network).
pub const FAULTS_ENV: &str = "UNKAI_PEER_FAULTS";

/// How a client takes part in a group; every field already checked by the caller.
#[derive(Clone, Debug)]
pub struct Config {
    /// Where to serve blocks to the others (None: serve nothing, only ask, `--no-sharing`).
    pub listen: Option<SocketAddr>,
    /// The group's name (`--cache-group`): clients of the volume in other groups are not asked.
    pub group: String,
    /// Bytes per second served at most (None: no limit).
    pub serve_limit: Option<u64>,
    /// Time limit of one request to a member.
    pub timeout: Duration,
}

/// What a member holds and fetches: the data store under the group.
pub trait Holder: Send + Sync + 'static {
    /// The object of block `key` if this member has it (staged, cached).
    fn held(&self, key: &str) -> BoxFuture<'static, Option<Bytes>>;
    /// Byte ranges `ranges` of the object of block `key`, one after the other, if this member
    /// has it (staged, cached; None: it does not, or a range is past its end): a small
    /// read's, read without the rest of the object where it can be.
    fn held_ranges(
        &self,
        key: &str,
        ranges: Vec<std::ops::Range<usize>>,
    ) -> BoxFuture<'static, Option<Vec<u8>>>;
    /// The object of block `key` from the bucket.
    fn fetch(&self, key: &str) -> BoxFuture<'static, object::Result<Bytes>>;
    /// Keeps the object of block `key`, fetched from the bucket (in the disk cache).
    fn keep(&self, key: &str, obj: Bytes) -> BoxFuture<'static, ()>;
    /// Whether `key` names a block of this volume (nothing else is served).
    fn is_block(&self, key: &str) -> bool;
}

/// The group's figures.
pub struct Stats {
    /// Blocks asked of other members and received, and their bytes.
    pub hits: AtomicU64,
    pub hit_bytes: AtomicU64,
    /// Requests to other members that failed (gone, slow, refused), then read from the bucket.
    pub errors: AtomicU64,
    /// Answers that failed their checksums (or decoding), then read from the bucket.
    pub wrong: AtomicU64,
    /// Small reads' ranges asked of a block's owner that did not hold it (then the bucket).
    pub not_held: AtomicU64,
    /// Blocks served to other members, and their bytes.
    pub served: AtomicU64,
    pub served_bytes: AtomicU64,
    /// Requests refused (no credentials or wrong ones).
    pub refused: AtomicU64,
    /// Fetches from the bucket made for the group (for this member's reads or others').
    pub fetches: AtomicU64,
    /// Time of each request to another member.
    pub latency: Histogram,
}

impl Default for Stats {
    fn default() -> Self {
        Stats {
            hits: AtomicU64::new(0),
            hit_bytes: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            wrong: AtomicU64::new(0),
            not_held: AtomicU64::new(0),
            served: AtomicU64::new(0),
            served_bytes: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            fetches: AtomicU64::new(0),
            latency: crate::metrics::latency(
                "unkai_peer_request_duration_seconds",
                "Time of each request for a block to another member of the peer cache group.",
                ("to", "owner"),
            ),
        }
    }
}

/// This client's view of its group.
pub struct Group {
    name: String,
    /// Where this member serves (None: it serves nothing).
    me: Option<SocketAddr>,
    /// The members that serve, this one included, as last learnt.
    members: RwLock<Arc<Vec<SocketAddr>>>,
    /// Members that failed, and since when.
    down: Mutex<HashMap<SocketAddr, Instant>>,
    auth: Arc<auth::Auth>,
    asker: ask::Asker,
    flights: flight::Flights,
    holder: Box<dyn Holder>,
    rate: Option<Rate>,
    /// Fault injection (tests): blocks served are damaged, before or after they are sealed.
    corrupt: bool,
    forge: bool,
    pub stats: Stats,
}

/// Where an object came from: a member (its address), or the bucket through this member.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    Peer(SocketAddr),
    Bucket,
}

impl Group {
    /// Joins group `cfg.group` with `key` (the volume's peer key), serving on `cfg.listen`
    /// (bound now, on `rt`) what `holder` has. Returns the group and where it serves.
    pub fn start(
        cfg: &Config,
        key: &str,
        holder: Box<dyn Holder>,
        rt: &tokio::runtime::Runtime,
    ) -> std::io::Result<Arc<Group>> {
        let listener = match cfg.listen {
            Some(addr) => {
                let l = std::net::TcpListener::bind(addr).map_err(|e| {
                    std::io::Error::new(
                        e.kind(),
                        format!("cannot listen for peers on {addr} (--peer-cache): {e}"),
                    )
                })?;
                l.set_nonblocking(true)?;
                Some(l)
            }
            None => None,
        };
        let me = listener.as_ref().map(|l| l.local_addr()).transpose()?;
        let auth = Arc::new(auth::Auth::new(key));
        let faults = std::env::var(FAULTS_ENV).unwrap_or_default();
        let (corrupt, forge) = (faults.contains("corrupt"), faults.contains("forge"));
        if corrupt || forge {
            tracing::warn!("{FAULTS_ENV}: every block served to the group is damaged (tests)");
        }
        let group = Arc::new(Group {
            name: cfg.group.clone(),
            me,
            members: RwLock::new(Arc::new(me.into_iter().collect())),
            down: Mutex::default(),
            asker: ask::Asker::new(auth.clone(), cfg.timeout)?,
            auth,
            flights: flight::Flights::new(RECENT_BYTES),
            holder,
            rate: cfg.serve_limit.map(Rate::new),
            corrupt,
            forge,
            stats: Stats::default(),
        });
        if let Some(l) = listener {
            let _in = rt.enter();
            let l = tokio::net::TcpListener::from_std(l)?;
            rt.spawn(serve::run(l, Arc::downgrade(&group)));
        }
        match me {
            Some(a) => tracing::info!("peer cache group '{}': serving blocks on {a}", cfg.group),
            None => tracing::info!(
                "peer cache group '{}': asking its members, serving nothing (--no-sharing)",
                cfg.group
            ),
        }
        Ok(group)
    }

    /// The group's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Where this member serves (None: nowhere).
    pub fn addr(&self) -> Option<SocketAddr> {
        self.me
    }

    /// The members that serve, as learnt last (this one included).
    pub fn members(&self) -> Arc<Vec<SocketAddr>> {
        self.members.read().clone()
    }

    /// Sets the members that serve (this one is added if it serves); logs who joined and left.
    pub fn set_members(&self, mut members: Vec<SocketAddr>) {
        members.extend(self.me);
        members.sort();
        members.dedup();
        let old = self.members();
        if *old == members {
            return;
        }
        let joined: Vec<_> = members.iter().filter(|m| !old.contains(m)).collect();
        let left: Vec<_> = old.iter().filter(|m| !members.contains(m)).collect();
        tracing::info!(
            "peer cache group '{}': {} member(s){}{}",
            self.name,
            members.len(),
            if joined.is_empty() {
                String::new()
            } else {
                format!("; joined: {joined:?}")
            },
            if left.is_empty() {
                String::new()
            } else {
                format!("; left: {left:?}")
            },
        );
        *self.members.write() = Arc::new(members);
    }

    /// The owner of block `key` if it is another member, not known to be down.
    fn other_owner(&self, key: &str) -> Option<SocketAddr> {
        let owner = place::owner(key, &self.members())?;
        if Some(owner) == self.me {
            return None;
        }
        let mut down = self.down.lock();
        match down.get(&owner) {
            Some(since) if since.elapsed() < DOWN_FOR => None,
            Some(_) => {
                down.remove(&owner);
                Some(owner)
            }
            None => Some(owner),
        }
    }

    /// The object of block `key`, from its owner when that is another member, else (or when
    /// the owner fails) from the bucket through [`Group::own`]; with where it came from. The
    /// caller checks it, and calls [`Group::wrong`] when a member's answer is wrong.
    pub async fn object(&self, key: &str) -> object::Result<(Bytes, Source)> {
        if let Some(owner) = self.other_owner(key) {
            let start = Instant::now();
            match self.asker.ask(owner, key).await {
                Ok(obj) => {
                    self.stats.latency.observe(start.elapsed().as_secs_f64());
                    self.stats.hits.fetch_add(1, Relaxed);
                    self.stats.hit_bytes.fetch_add(obj.len() as u64, Relaxed);
                    return Ok((obj, Source::Peer(owner)));
                }
                Err(e) => {
                    self.stats.latency.observe(start.elapsed().as_secs_f64());
                    self.stats.errors.fetch_add(1, Relaxed);
                    self.bypass(owner, &format!("asking it for block {key}: {e}"));
                }
            }
        }
        Ok((self.own(key).await?, Source::Bucket))
    }

    /// Byte ranges `ranges` of the object of block `key` (one after the other), from its
    /// owner when that is another member that holds the block; with which member it was.
    /// None: read them from the bucket (no such owner, it does not hold the block, or it
    /// failed: then bypassed). The caller checks them, and calls [`Group::wrong`] if wrong.
    pub async fn held_ranges(
        &self,
        key: &str,
        ranges: &[std::ops::Range<usize>],
    ) -> Option<(Bytes, SocketAddr)> {
        let owner = self.other_owner(key)?;
        let start = Instant::now();
        match self.asker.ask_held_ranges(owner, key, ranges).await {
            Ok(Some(got)) => {
                self.stats.latency.observe(start.elapsed().as_secs_f64());
                self.stats.hits.fetch_add(1, Relaxed);
                self.stats.hit_bytes.fetch_add(got.len() as u64, Relaxed);
                Some((got, owner))
            }
            Ok(None) => {
                self.stats.not_held.fetch_add(1, Relaxed);
                None
            }
            Err(e) => {
                self.stats.errors.fetch_add(1, Relaxed);
                self.bypass(owner, &format!("asking it for ranges of block {key}: {e}"));
                None
            }
        }
    }

    /// Says that `member` answered block `key` wrong (`problem`): logged naming it, and the
    /// member bypassed for a while.
    pub fn wrong(&self, member: SocketAddr, key: &str, problem: &str) {
        self.stats.wrong.fetch_add(1, Relaxed);
        tracing::error!(
            "peer cache: member {member} answered block {key} damaged ({problem}); reading it \
             from the bucket"
        );
        self.bypass(member, "it answered a damaged block");
    }

    /// Stops asking `member` for [`DOWN_FOR`] (said once per outage).
    fn bypass(&self, member: SocketAddr, why: &str) {
        let fresh = self.down.lock().insert(member, Instant::now()).is_none();
        if fresh {
            tracing::warn!(
                "peer cache: member {member} bypassed for {}s ({why}); reading from the bucket",
                DOWN_FOR.as_secs()
            );
        }
    }

    /// The object of block `key` from the bucket, fetched once for all who ask at the same
    /// time (this member's readers and other members) and kept in the disk cache.
    pub async fn own(&self, key: &str) -> object::Result<Bytes> {
        if let Some(obj) = self.flights.recent(key) {
            return Ok(obj);
        }
        let (res, ran) = self
            .flights
            .run(key, async {
                let obj = self.holder.fetch(key).await?;
                self.holder.keep(key, obj.clone()).await;
                Ok(obj)
            })
            .await;
        if ran && res.is_ok() {
            self.stats.fetches.fetch_add(1, Relaxed);
        }
        res
    }

    /// What is served for block `key`: what this member fetched lately (memory), what it
    /// holds (stage, disk cache), else the bucket's (None: it cannot be had).
    async fn serve_object(&self, key: &str) -> Option<Bytes> {
        // The askers just behind a fetch (four readers of one file) are answered from memory:
        // no disk read, no hop to a blocking thread; the block is sealed in a copy instead.
        if let Some(obj) = self.flights.recent(key) {
            return Some(obj);
        }
        if let Some(obj) = self.holder.held(key).await {
            return Some(obj);
        }
        match self.own(key).await {
            Ok(obj) => Some(obj),
            Err(e) => {
                tracing::warn!("peer cache: block {key} asked by a member: {e}");
                None
            }
        }
    }

    /// The group's figures as the mount's metrics.
    pub fn figures(&self, out: &mut Families) {
        let n = |a: &AtomicU64| a.load(Relaxed);
        let s = &self.stats;
        out.gauge(
            "unkai_peer_members",
            "Members of the peer cache group that serve blocks, this one included.",
            &[],
            self.members().len() as u64,
        );
        for (result, v) in [
            ("hit", n(&s.hits)),
            ("error", n(&s.errors)),
            ("wrong", n(&s.wrong)),
            ("not_held", n(&s.not_held)),
        ] {
            out.counter(
                "unkai_peer_requests_total",
                "Blocks (or a small read's ranges) asked of other members of the peer cache \
                 group, by result (hit; error: gone, slow or refused; wrong: failed its \
                 checksums; not_held: a small read's block the owner did not hold), all but \
                 hits then read from the bucket.",
                &[("result", result)],
                v,
            );
        }
        out.counter(
            "unkai_peer_received_bytes_total",
            "Bytes of blocks received from other members of the peer cache group.",
            &[],
            n(&s.hit_bytes),
        );
        out.counter(
            "unkai_peer_served_total",
            "Blocks served to other members of the peer cache group.",
            &[],
            n(&s.served),
        );
        out.counter(
            "unkai_peer_served_bytes_total",
            "Bytes of blocks served to other members of the peer cache group.",
            &[],
            n(&s.served_bytes),
        );
        out.counter(
            "unkai_peer_refused_total",
            "Requests to this member refused: no credentials, or not the group's key.",
            &[],
            n(&s.refused),
        );
        out.counter(
            "unkai_peer_bucket_fetches_total",
            "Blocks this member fetched from the bucket for the peer cache group (its own \
             reads of blocks it owns, and other members' requests).",
            &[],
            n(&s.fetches),
        );
        out.histograms([&s.latency]);
    }
}

/// `obj` with one byte flipped (fault injection, [`FAULTS_ENV`]).
fn corrupt(obj: Bytes) -> Bytes {
    let mut v = obj.to_vec();
    let mid = v.len() / 2;
    if let Some(b) = v.get_mut(mid) {
        *b ^= 0x5a;
    }
    Bytes::from(v)
}
