//! `dump` and `load`: a volume's metadata as a stream of JSON lines, one record per line
//! (docs/dump-format.md), and back into an empty database of any engine (SQLite to
//! PostgreSQL and back). Both are written once over the engine's rows
//! ([`Txn`](crate::meta::engine::Txn)); a dump reads them in one snapshot, so that it is
//! consistent even while the volume is mounted, and neither ever holds the volume in memory.
//!
//! A dump describes a volume at rest: its settings (the `Format`, an encrypted volume's data
//! key only wrapped), counters, inodes (every attribute, flags, times to the nanosecond),
//! entries, symlinks, xattrs (ACLs included), chunks, slice reference counts, the deletion
//! queue, quotas and the rows of external slices (`unkai import`: which object a file's bytes
//! are, not the object); the trash is a directory like any other. Left out: sessions,
//! open-file records, locks and reserved slice ids (what mounted clients hold), and the
//! backup claim.
//!
//! Not for: file data (the bucket is untouched: a loaded volume reads the same objects, under
//! the same keys), where dumps go or come from (the command line; `backup`).

use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, bail};
use indicatif::ProgressBar;
use serde::{Deserialize, Serialize};

use crate::meta::engine::{TxError, TxResult, Txn};
use crate::meta::format::{LAYOUT_VERSION, SCHEMA_VERSION};
use crate::meta::url::MetaUrl;
use crate::meta::{
    Attr, DeadSlice, EngineKind, Error, External, Format, Kind, Meta, Quota, ROOT_INO, SliceRec,
};

/// The version of the dump format this binary writes; it reads this one and older.
pub const VERSION: u32 = 1;
/// The setting naming when a client last claimed the volume's backup (`backup`): a mount's
/// business, not the volume's, so never dumped.
pub(crate) const CLAIM_SETTING: &str = "lastBackup";
/// Counters that are locks, not counts (PostgreSQL's rename lock): made by the engine.
const LOCK_COUNTERS: &[&str] = &["renameLock"];
/// Records loaded per transaction.
const BATCH: usize = 10_000;
/// zstd's level for compressed dumps: its default, which metadata (repetitive JSON)
/// compresses well at, at hundreds of MB/s.
const ZSTD_LEVEL: i32 = 3;
/// The first bytes of a zstd frame.
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];

/// One line of a dump. Each kind of row is a record kind of its own, named by the line's one
/// key (`{"node":{...}}`); a new kind of row is a new variant, its scan in [`dump`] and its
/// insert in [`apply`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Record {
    /// The first line: what wrote the dump.
    UnkaiDump(Header),
    /// The second line: the volume's settings.
    Format(Format),
    Setting(Setting),
    Counter(Counter),
    Node(Node),
    Edge(Edge),
    Symlink(Symlink),
    Xattr(Xattr),
    Chunk(Chunk),
    Slice(SliceRef),
    DeadSlice(Dead),
    /// A directory's quota, its usage as the snapshot had it (`meta::quota`).
    Quota(Quota),
    /// An external slice's row (`unkai import`): which object, at which version, its bytes
    /// are. After the chunks and slices that name it.
    External(External),
    /// The last line: how many records of each kind came before (a dump cut short is told
    /// from a whole one).
    End(Counts),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Header {
    /// The dump format's version ([`VERSION`]).
    pub version: u32,
    /// The unkai that wrote it.
    pub unkai: String,
    /// The engine it was dumped from: `sqlite` or `postgres`.
    pub engine: String,
    /// When (ns since the epoch).
    pub created: i64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Setting {
    pub name: String,
    pub value: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counter {
    pub name: String,
    pub value: i64,
}

/// An inode: [`Attr`] with its kind named.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Node {
    pub ino: u64,
    pub kind: KindName,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub length: u64,
    pub rdev: u32,
    pub atime: i64,
    pub mtime: i64,
    pub ctime: i64,
    pub parent: u64,
    pub flags: u32,
    pub stored: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Edge {
    pub parent: u64,
    pub name: Bytes,
    pub ino: u64,
    pub kind: KindName,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Symlink {
    pub ino: u64,
    pub target: Bytes,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Xattr {
    pub ino: u64,
    pub name: Bytes,
    pub value: Bytes,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Chunk {
    pub ino: u64,
    pub index: u32,
    /// Its slice records, oldest first.
    pub slices: Vec<Rec>,
}

/// A slice record ([`SliceRec`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rec {
    pub pos: u32,
    pub id: u64,
    pub size: u32,
    pub off: u32,
    pub len: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SliceRef {
    pub id: u64,
    pub size: u32,
    pub refs: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dead {
    pub id: u64,
    pub size: u32,
    /// When it lost its last reference (ns): its objects go `trash_days` later.
    pub died: i64,
}

/// Records of each kind (the dump's last line; what a load found).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    pub settings: u64,
    pub counters: u64,
    pub nodes: u64,
    pub edges: u64,
    pub symlinks: u64,
    pub xattrs: u64,
    pub chunks: u64,
    pub slices: u64,
    pub dead_slices: u64,
    /// Dumps of volumes without quotas (and of binaries before them) have none.
    #[serde(default)]
    pub quotas: u64,
    /// Dumps of volumes without imported objects (and of binaries before them) have none.
    #[serde(default)]
    pub externals: u64,
}

impl Counts {
    fn add(&mut self, r: &Record) {
        let n = match r {
            Record::Setting(_) => &mut self.settings,
            Record::Counter(_) => &mut self.counters,
            Record::Node(_) => &mut self.nodes,
            Record::Edge(_) => &mut self.edges,
            Record::Symlink(_) => &mut self.symlinks,
            Record::Xattr(_) => &mut self.xattrs,
            Record::Chunk(_) => &mut self.chunks,
            Record::Slice(_) => &mut self.slices,
            Record::DeadSlice(_) => &mut self.dead_slices,
            Record::Quota(_) => &mut self.quotas,
            Record::External(_) => &mut self.externals,
            Record::UnkaiDump(_) | Record::Format(_) | Record::End(_) => return,
        };
        *n += 1;
    }
}

/// An inode's kind, by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KindName {
    File,
    Dir,
    Symlink,
    Fifo,
    Chardev,
    Blockdev,
    Socket,
}

impl From<Kind> for KindName {
    fn from(k: Kind) -> KindName {
        match k {
            Kind::File => KindName::File,
            Kind::Dir => KindName::Dir,
            Kind::Symlink => KindName::Symlink,
            Kind::Fifo => KindName::Fifo,
            Kind::CharDev => KindName::Chardev,
            Kind::BlockDev => KindName::Blockdev,
            Kind::Socket => KindName::Socket,
        }
    }
}

impl From<KindName> for Kind {
    fn from(k: KindName) -> Kind {
        match k {
            KindName::File => Kind::File,
            KindName::Dir => Kind::Dir,
            KindName::Symlink => Kind::Symlink,
            KindName::Fifo => Kind::Fifo,
            KindName::Chardev => Kind::CharDev,
            KindName::Blockdev => Kind::BlockDev,
            KindName::Socket => Kind::Socket,
        }
    }
}

impl From<&Attr> for Node {
    fn from(a: &Attr) -> Node {
        Node {
            ino: a.ino,
            kind: a.kind.into(),
            mode: a.mode,
            uid: a.uid,
            gid: a.gid,
            nlink: a.nlink,
            length: a.length,
            rdev: a.rdev,
            atime: a.atime,
            mtime: a.mtime,
            ctime: a.ctime,
            parent: a.parent,
            flags: a.flags,
            stored: a.stored,
        }
    }
}

impl From<&Node> for Attr {
    fn from(n: &Node) -> Attr {
        Attr {
            ino: n.ino,
            kind: n.kind.into(),
            mode: n.mode,
            uid: n.uid,
            gid: n.gid,
            nlink: n.nlink,
            length: n.length,
            rdev: n.rdev,
            atime: n.atime,
            mtime: n.mtime,
            ctime: n.ctime,
            parent: n.parent,
            flags: n.flags,
            stored: n.stored,
        }
    }
}

/// Bytes (names, targets, xattr values): a JSON string when they are UTF-8, else
/// `{"hex": "..."}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bytes(pub Vec<u8>);

impl Serialize for Bytes {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        match std::str::from_utf8(&self.0) {
            Ok(text) => s.serialize_str(text),
            Err(_) => {
                let hex: String = self.0.iter().map(|b| format!("{b:02x}")).collect();
                let mut m = s.serialize_map(Some(1))?;
                m.serialize_entry("hex", &hex)?;
                m.end()
            }
        }
    }
}

impl<'de> Deserialize<'de> for Bytes {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Bytes, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Bytes;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str(r#"a string, or {"hex": "..."}"#)
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Bytes, E> {
                Ok(Bytes(v.as_bytes().to_vec()))
            }
            fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Bytes, E> {
                Ok(Bytes(v.into_bytes()))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut m: A) -> Result<Bytes, A::Error> {
                use serde::de::Error as _;
                let mut out = None;
                while let Some(k) = m.next_key::<String>()? {
                    if k != "hex" {
                        return Err(A::Error::unknown_field(&k, &["hex"]));
                    }
                    let hex: String = m.next_value()?;
                    out = Some(
                        hex::decode(&hex)
                            .ok()
                            .ok_or_else(|| A::Error::custom("invalid hex"))?,
                    );
                }
                out.map(Bytes).ok_or_else(|| A::Error::missing_field("hex"))
            }
        }
        d.deserialize_any(V)
    }
}

/// Writes records, counting them; keeps the first failure of the output (or the stop asked
/// for), which a scan learns as an error that ends it.
struct Out<'a> {
    w: &'a mut dyn Write,
    counts: Counts,
    written: u64,
    failure: Option<anyhow::Error>,
    progress: &'a ProgressBar,
    stop: Option<&'a AtomicBool>,
}

impl Out<'_> {
    fn put(&mut self, r: &Record) -> TxResult<()> {
        if self.stop.is_some_and(|s| s.load(Ordering::Relaxed)) {
            return self.fail(anyhow::anyhow!("stopped"));
        }
        let res = serde_json::to_writer(&mut *self.w, r)
            .map_err(anyhow::Error::from)
            .and_then(|()| Ok(self.w.write_all(b"\n")?));
        if let Err(e) = res {
            return self.fail(e.context("writing the dump"));
        }
        self.counts.add(r);
        self.written += 1;
        if self.written % 4096 == 0 {
            self.progress.set_position(self.written);
        }
        Ok(())
    }

    /// Ends the scan with `e` (reported as it is, not as the engine's).
    fn fail(&mut self, e: anyhow::Error) -> TxResult<()> {
        let msg = e.to_string();
        self.failure.get_or_insert(e);
        Err(TxError::Meta(Error::Engine(msg)))
    }
}

/// A volume that cannot be dumped as it is: `fsck --repair` first.
fn damaged(what: String) -> TxError {
    TxError::Meta(Error::Refused(format!(
        "{what}: run `unkai fsck --repair` on the volume, then dump it"
    )))
}

fn engine_name(k: EngineKind) -> &'static str {
    match k {
        EngineKind::Sqlite => "sqlite",
        EngineKind::Postgres => "postgres",
    }
}

/// Writes the volume's metadata to `w`, one record per line, from one read snapshot; returns
/// what it wrote. `progress` shows the records written; with `stop`, the dump ends (with an
/// error) soon after it is set.
pub fn dump(
    meta: &dyn Meta,
    w: &mut dyn Write,
    progress: &ProgressBar,
    stop: Option<&AtomicBool>,
) -> anyhow::Result<Counts> {
    let mut out = Out {
        w,
        counts: Counts::default(),
        written: 0,
        failure: None,
        progress,
        stop,
    };
    let engine = engine_name(meta.engine());
    let res = meta.read_rows(&mut |tx| {
        if out.written > 0 {
            // Run again after a conflict, with lines out already: they may not agree.
            return out.fail(anyhow::anyhow!(
                "the metadata database was busy in the middle of the dump; run it again"
            ));
        }
        dump_rows(tx, &mut out, engine)
    });
    progress.set_position(out.written);
    if let Some(e) = out.failure {
        return Err(e);
    }
    res?;
    out.w.flush().context("writing the dump")?;
    Ok(out.counts)
}

/// Every record of a dump, in the order a load needs them: the settings first (a load
/// creates the volume from them), then inodes before what names or fills them.
fn dump_rows(tx: &mut dyn Txn, out: &mut Out<'_>, engine: &str) -> TxResult<()> {
    out.put(&Record::UnkaiDump(Header {
        version: VERSION,
        unkai: env!("CARGO_PKG_VERSION").into(),
        engine: engine.into(),
        created: crate::meta::now_nanos(),
    }))?;
    let json = tx
        .setting("format")?
        .ok_or_else(|| damaged("the volume's settings are missing".into()))?;
    let format: Format = serde_json::from_str(&json)
        .map_err(|e| damaged(format!("the volume's settings are unreadable ({e})")))?;
    out.put(&Record::Format(format))?;
    tx.each_setting(&mut |name, value| {
        if name == "format"
            || name == CLAIM_SETTING
            || name == crate::meta::trash::PURGER
            || name == crate::meta::PEER_KEY
        {
            return Ok(());
        }
        out.put(&Record::Setting(Setting { name, value }))
    })?;
    tx.each_counter(&mut |name, value| {
        if LOCK_COUNTERS.contains(&name.as_str()) {
            return Ok(());
        }
        out.put(&Record::Counter(Counter { name, value }))
    })?;
    tx.each_node(&mut |a| out.put(&Record::Node(Node::from(&a))))?;
    tx.each_entry(&mut |parent, name, ino, kind| {
        let Some(kind) = kind else {
            return Err(damaged(format!(
                "the entry {} of directory {parent} records no valid kind",
                String::from_utf8_lossy(&name)
            )));
        };
        out.put(&Record::Edge(Edge {
            parent,
            name: Bytes(name),
            ino,
            kind: kind.into(),
        }))
    })?;
    tx.each_symlink(&mut |ino, target| {
        out.put(&Record::Symlink(Symlink {
            ino,
            target: Bytes(target),
        }))
    })?;
    tx.each_xattr(&mut |ino, name, value| {
        out.put(&Record::Xattr(Xattr {
            ino,
            name: Bytes(name),
            value: Bytes(value),
        }))
    })?;
    tx.each_chunk(&mut |ino, index, recs| {
        let Some(recs) = recs else {
            return Err(damaged(format!(
                "chunk {index} of inode {ino} cannot be decoded"
            )));
        };
        let slices = recs
            .iter()
            .map(|r| Rec {
                pos: r.pos,
                id: r.id,
                size: r.size,
                off: r.off,
                len: r.len,
            })
            .collect();
        out.put(&Record::Chunk(Chunk { ino, index, slices }))
    })?;
    tx.each_slice_ref(&mut |id, size, refs| out.put(&Record::Slice(SliceRef { id, size, refs })))?;
    tx.each_dead_slice(&mut |d, died| {
        out.put(&Record::DeadSlice(Dead {
            id: d.id,
            size: d.size,
            died,
        }))
    })?;
    for q in tx.quotas()? {
        out.put(&Record::Quota(q))?;
    }
    for e in tx.externals()? {
        out.put(&Record::External(e))?;
    }
    let counts = out.counts.clone();
    out.put(&Record::End(counts))
}

/// Dumps to the file `path` ('-': standard output), zstd-compressed when its name ends in
/// `.zst`. A file is written under a temporary name beside it, fsynced and renamed when
/// whole: a dump that fails leaves nothing that looks like one.
pub fn dump_to(
    meta: &dyn Meta,
    path: &str,
    progress: &ProgressBar,
    stop: Option<&AtomicBool>,
) -> anyhow::Result<Counts> {
    if path == "-" {
        let mut w = BufWriter::new(std::io::stdout().lock());
        return dump(meta, &mut w, progress, stop);
    }
    let tmp = format!("{path}.tmp-{}", std::process::id());
    let file = File::create(&tmp).with_context(|| format!("cannot create {tmp}"))?;
    let res = (|| {
        let mut w = BufWriter::with_capacity(1 << 20, file);
        let counts = if path.ends_with(".zst") {
            let mut z = zstd::stream::write::Encoder::new(w, ZSTD_LEVEL)?;
            let counts = dump(meta, &mut z, progress, stop)?;
            w = z.finish()?;
            counts
        } else {
            dump(meta, &mut w, progress, stop)?
        };
        let file = w.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)?;
        anyhow::Ok(counts)
    })();
    if res.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    res.with_context(|| format!("dumping to {path}"))
}

/// Opens a dump to load: the file `path` ('-': standard input), decompressed if it is zstd
/// (told by its first bytes, whatever its name). `progress` counts the file's bytes read.
pub fn open_dump(path: &str, progress: &ProgressBar) -> anyhow::Result<Box<dyn BufRead>> {
    let raw: Box<dyn Read> = if path == "-" {
        Box::new(std::io::stdin().lock())
    } else {
        let f = File::open(path).with_context(|| format!("cannot open the dump {path}"))?;
        if let Ok(m) = f.metadata() {
            progress.set_length(m.len());
        }
        Box::new(progress.wrap_read(f))
    };
    let mut r = BufReader::with_capacity(1 << 20, raw);
    let head = r
        .fill_buf()
        .with_context(|| format!("cannot read the dump {path}"))?;
    if head.starts_with(&ZSTD_MAGIC) {
        let z = zstd::stream::read::Decoder::with_buffer(r)?;
        return Ok(Box::new(BufReader::with_capacity(1 << 20, z)));
    }
    Ok(Box::new(r))
}

/// The records of a dump, line by line.
struct Lines<'a> {
    r: &'a mut dyn BufRead,
    line: u64,
    buf: String,
}

impl Lines<'_> {
    fn next(&mut self) -> anyhow::Result<Option<Record>> {
        loop {
            self.buf.clear();
            self.line += 1;
            if self
                .r
                .read_line(&mut self.buf)
                .context("reading the dump")?
                == 0
            {
                return Ok(None);
            }
            if self.buf.trim().is_empty() {
                continue;
            }
            return serde_json::from_str(&self.buf)
                .map(Some)
                .with_context(|| format!("line {} of the dump", self.line));
        }
    }
}

/// Loads a dump into the database `url` names, which must hold no volume: the volume is
/// created through the engine's own path (its schema, counters and root), then every record
/// goes in, [`BATCH`] to a transaction. A load that fails leaves the database empty again.
/// Returns the volume's settings and what was loaded.
pub fn load(url: &MetaUrl, r: &mut dyn BufRead) -> anyhow::Result<(Format, Counts)> {
    match url.open() {
        Ok(m) => bail!(
            "{url} already holds volume '{}': load restores into an empty database only; \
             give another (a new SQLite file, or an empty PostgreSQL database)",
            m.format().name
        ),
        Err(Error::NotFormatted(_)) => {}
        Err(e) => return Err(e.into()),
    }
    let mut lines = Lines {
        r,
        line: 0,
        buf: String::new(),
    };
    match lines.next()? {
        Some(Record::UnkaiDump(h)) if h.version <= VERSION => {}
        Some(Record::UnkaiDump(h)) => bail!(
            "the dump is of format version {}, newer than this unkai reads ({VERSION}): \
             upgrade unkai",
            h.version
        ),
        _ => bail!("not an unkai dump: its first line is no `unkai_dump` header"),
    }
    let Some(Record::Format(mut fmt)) = lines.next()? else {
        bail!("not an unkai dump: its second line is not the volume's `format`");
    };
    if fmt.schema > SCHEMA_VERSION || fmt.layout > LAYOUT_VERSION {
        bail!(
            "the dumped volume is of metadata schema {} and block layout {}, newer than this \
             unkai understands ({SCHEMA_VERSION}, {LAYOUT_VERSION}): upgrade unkai",
            fmt.schema,
            fmt.layout
        );
    }
    fmt.schema = SCHEMA_VERSION;
    url.create(&fmt, false)?;
    let meta = url.open()?;
    let res = load_records(&*meta, &mut lines);
    if let Err(e) = res {
        // Nothing half-loaded is left to be mistaken for a volume.
        let erased = meta.write_rows(&mut |tx| tx.erase_volume());
        let left = match erased {
            Ok(()) => "nothing was kept",
            Err(_) => "the database holds part of it: drop it",
        };
        return Err(e.context(format!("loading into {url} failed ({left})")));
    }
    Ok((fmt, res?))
}

fn load_records(meta: &dyn Meta, lines: &mut Lines<'_>) -> anyhow::Result<Counts> {
    let mut counts = Counts::default();
    let mut batch = Vec::with_capacity(BATCH);
    let end = loop {
        let rec = lines.next()?;
        let end = match rec {
            None => bail!(
                "the dump ends at line {} without its `end` record: it is cut short",
                lines.line
            ),
            Some(Record::End(c)) => Some(c),
            Some(Record::UnkaiDump(_) | Record::Format(_)) => bail!(
                "line {} of the dump: a second header or format record",
                lines.line
            ),
            Some(r) => {
                counts.add(&r);
                batch.push(r);
                None
            }
        };
        if batch.len() >= BATCH || (end.is_some() && !batch.is_empty()) {
            meta.write_rows(&mut |tx| {
                for r in &batch {
                    apply(tx, r)?;
                }
                Ok(())
            })
            .with_context(|| format!("loading the records before line {}", lines.line))?;
            batch.clear();
        }
        if let Some(end) = end {
            break end;
        }
    };
    if end != counts {
        bail!("the dump's records do not match its `end` record ({end:?}): it is damaged");
    }
    if lines.next()?.is_some() {
        bail!(
            "line {} of the dump: records after the `end` record",
            lines.line
        );
    }
    Ok(counts)
}

/// Inserts one record's row.
fn apply(tx: &mut dyn Txn, r: &Record) -> TxResult<()> {
    match r {
        Record::Setting(s) => tx.put_setting(&s.name, &s.value),
        Record::Counter(c) => tx.put_counter(&c.name, c.value),
        // The root was made with the volume: it takes the dumped attributes.
        Record::Node(n) if n.ino == ROOT_INO => tx.update_node(&Attr::from(n)),
        Record::Node(n) => tx.insert_node(&Attr::from(n)),
        Record::Edge(e) => tx.insert_edge(e.parent, &e.name.0, e.ino, e.kind.into()),
        Record::Symlink(s) => tx.insert_symlink(s.ino, &s.target.0),
        Record::Xattr(x) => tx.put_xattr(x.ino, &x.name.0, &x.value.0),
        Record::Chunk(c) => {
            let recs: Vec<SliceRec> = c
                .slices
                .iter()
                .map(|r| SliceRec {
                    pos: r.pos,
                    id: r.id,
                    size: r.size,
                    off: r.off,
                    len: r.len,
                })
                .collect();
            tx.insert_chunk(c.ino, c.index, &recs)
        }
        Record::Slice(s) => tx.insert_slice_ref(s.id, s.size, s.refs),
        Record::Quota(q) => tx.put_quota(q),
        Record::External(e) => tx.insert_external(e),
        Record::DeadSlice(d) => tx.insert_dead_slice(
            DeadSlice {
                id: d.id,
                size: d.size,
            },
            d.died,
        ),
        Record::UnkaiDump(_) | Record::Format(_) | Record::End(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_round_trip() {
        for b in [
            b"plain".to_vec(),
            "é\n\"q\"".as_bytes().to_vec(),
            vec![0xff, 0, 1, 2],
            Vec::new(),
        ] {
            let json = serde_json::to_string(&Bytes(b.clone())).unwrap();
            let back: Bytes = serde_json::from_str(&json).unwrap();
            assert_eq!(back.0, b, "{json}");
        }
        assert_eq!(
            serde_json::to_string(&Bytes(vec![0xff, 0x01])).unwrap(),
            r#"{"hex":"ff01"}"#
        );
        assert!(serde_json::from_str::<Bytes>(r#"{"hex":"f"}"#).is_err());
        assert!(serde_json::from_str::<Bytes>(r#"{"b64":"AA=="}"#).is_err());
    }

    /// The record kinds as docs/dump-format.md shows them: one key per line, the kind.
    #[test]
    fn records_are_tagged_by_kind() {
        let r = Record::Edge(Edge {
            parent: 1,
            name: Bytes(b"a".to_vec()),
            ino: 2,
            kind: KindName::File,
        });
        let json = serde_json::to_string(&r).unwrap();
        assert_eq!(
            json,
            r#"{"edge":{"parent":1,"name":"a","ino":2,"kind":"file"}}"#
        );
        assert_eq!(serde_json::from_str::<Record>(&json).unwrap(), r);
        let e = serde_json::from_str::<Record>(r#"{"unheard_of":{"ino":1}}"#).unwrap_err();
        assert!(
            e.to_string().contains("unknown variant `unheard_of`"),
            "{e}"
        );
        let q = Record::Quota(Quota {
            ino: 5,
            max_bytes: 1 << 30,
            max_inodes: 0,
            used_bytes: 4096,
            used_inodes: 1,
        });
        let json = serde_json::to_string(&q).unwrap();
        assert!(json.starts_with(r#"{"quota":{"ino":5,"#), "{json}");
        assert_eq!(serde_json::from_str::<Record>(&json).unwrap(), q);
    }
}
