//! A mount's figures: `/metrics` (Prometheus' text format, `mount --metrics ADDR`) scraped
//! with a real HTTP client during a workload, the listener's address, and `unkai stats`.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::common::*;

/// A port of 127.0.0.1 free a moment ago.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// GET `url` with reqwest (the HTTP client unkai's object stores use): status and body.
fn get(url: &str) -> (u16, String, String) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap();
        let res = client.get(url).send().await.expect("GET");
        let status = res.status().as_u16();
        let kind = res
            .headers()
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        (status, kind, res.text().await.unwrap())
    })
}

/// The samples of a scrape: `name{labels}` -> value, labels as the text has them.
struct Scrape(HashMap<String, f64>, String);

impl Scrape {
    fn of(port: u16) -> Scrape {
        let (status, kind, text) = get(&format!("http://127.0.0.1:{port}/metrics"));
        assert_eq!(status, 200, "{text}");
        assert!(kind.starts_with("text/plain; version=0.0.4"), "{kind}");
        let mut samples = HashMap::new();
        for l in text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
        {
            let (series, value) = l.rsplit_once(' ').expect("a sample line");
            samples.insert(series.to_string(), value.parse().expect("a number"));
        }
        Scrape(samples, text)
    }

    /// The value of `name` with `labels` (after the volume's, as `op="put"`); 0 if absent.
    fn get(&self, name: &str, labels: &str) -> f64 {
        let vol = "volume=\"testvol\"";
        let key = match labels {
            "" => format!("{name}{{{vol}}}"),
            l => format!("{name}{{{vol},{l}}}"),
        };
        self.0.get(&key).copied().unwrap_or(0.0)
    }

    /// How much `name` with `labels` moved since `before`.
    fn since(&self, before: &Scrape, name: &str, labels: &str) -> f64 {
        self.get(name, labels) - before.get(name, labels)
    }

    /// The round trips FUSE requests `op` made since `before`.
    fn trips_since(&self, before: &Scrape, op: &str) -> f64 {
        self.since(before, "unkai_op_round_trips_total", &fuse_op(op))
    }
}

/// The labels of the FUSE requests `op` (after the volume's).
fn fuse_op(op: &str) -> String {
    format!("op=\"{op}\",proto=\"fuse\"")
}

/// A workload of N bytes written and read back and K files created moves the counters by
/// as much; the histograms agree with themselves; every sample names the volume.
fn metrics_follow_a_workload(vol: &Volume) {
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let m = vol.mount_with(&["--metrics", &addr]);
    let before = Scrape::of(port);
    const N: usize = 9 << 20;
    const K: usize = 25;
    let data = pattern(N, 7);
    std::fs::write(m.p("big"), &data).unwrap();
    for i in 0..K {
        std::fs::write(m.p(&format!("f{i}")), b"small").unwrap();
    }
    let f = std::fs::File::open(m.p("big")).unwrap();
    drop_cache(&f);
    let mut back = Vec::new();
    (&f).read_to_end(&mut back).unwrap();
    assert!(back == data, "read back what was written");
    drop(f);
    // An fsync through a descriptor of its own makes what the closed one wrote durable: the
    // local bucket's objects of the file (9 MiB: 3 blocks at least) are counted.
    std::fs::File::open(m.p("big")).unwrap().sync_all().unwrap();

    let d = |after: &Scrape, name: &str, labels: &str| after.since(&before, name, labels);
    // What the kernel asked is counted once the reply is sent: wait for the last of it.
    let mut after = Scrape::of(port);
    let settled = eventually(Duration::from_secs(30), || {
        after = Scrape::of(port);
        d(
            &after,
            "unkai_op_duration_seconds_count",
            &fuse_op("create"),
        ) >= (K + 1) as f64
            && d(&after, "unkai_object_put_bytes_total", "") >= N as f64
    });
    assert!(settled, "creates and PUTs counted:\n{}", after.1);
    let fuse = "unkai_op_duration_seconds_count";
    assert_eq!(
        d(&after, fuse, &fuse_op("create")),
        (K + 1) as f64,
        "{}",
        after.1
    );
    assert!(
        d(&after, "unkai_written_bytes_total", "proto=\"fuse\"") >= N as f64,
        "{}",
        after.1
    );
    assert!(
        d(&after, "unkai_read_bytes_total", "proto=\"fuse\"") >= N as f64,
        "{}",
        after.1
    );
    assert!(
        d(&after, fuse, &fuse_op("write")) >= 9.0,
        "1 MiB writes at most: {}",
        after.1
    );
    assert!(d(&after, fuse, &fuse_op("read")) >= 1.0, "{}", after.1);
    assert!(
        d(&after, "unkai_object_synced_total", "") >= 3.0,
        "the fsync after the close: {}",
        after.1
    );
    // The bucket took at least the bytes written (checksums add to them); uploads run
    // behind the writer, so the wait above waited for them.
    assert!(
        d(
            &after,
            "unkai_object_request_duration_seconds_count",
            "op=\"put\""
        ) > 0.0,
        "{}",
        after.1
    );
    assert_eq!(
        after.get("unkai_object_request_errors_total", "op=\"put\""),
        0.0
    );
    // Each file's data and names are committed: at least a transaction per file.
    let writes = d(
        &after,
        "unkai_meta_transaction_duration_seconds_count",
        "kind=\"write\"",
    );
    assert!(writes >= K as f64, "{}", after.1);
    // Round trips to the database: each written file's close reaches PostgreSQL at least
    // once (its data commits durably; a create may join a group and cost none), and the
    // requests' tally never passes the engine's; SQLite makes none.
    let trips = d(&after, "unkai_meta_round_trips_total", "for=\"operations\"");
    let per_create = d(&after, "unkai_op_round_trips_total", &fuse_op("create"));
    let per_flush = d(&after, "unkai_op_round_trips_total", &fuse_op("flush"));
    match vol.db.is_some() {
        true => {
            assert!(per_create + per_flush >= (K + 1) as f64, "{}", after.1);
            assert!(trips >= per_create + per_flush, "{}", after.1);
        }
        false => assert_eq!((trips, per_create), (0.0, 0.0), "{}", after.1),
    }
    // What was just written is read back from the memory cache.
    assert!(
        d(&after, "unkai_cache_hits_total", "level=\"memory\"") > 0.0,
        "{}",
        after.1
    );

    // Histograms: buckets never decrease, the last (+Inf) is the count, the sum is positive
    // where there were observations.
    let text = &after.1;
    let mut checked = 0;
    for l in text.lines().filter(|l| l.contains("_count{")) {
        let (series, count) = l.rsplit_once(' ').unwrap();
        let count: f64 = count.parse().unwrap();
        let (name, labels) = series.split_once('{').unwrap();
        let base = name.trim_end_matches("_count");
        let labels = labels.trim_end_matches('}');
        let buckets: Vec<f64> = text
            .lines()
            .filter(|b| b.starts_with(&format!("{base}_bucket{{{labels},le=")))
            .map(|b| b.rsplit_once(' ').unwrap().1.parse().unwrap())
            .collect();
        assert_eq!(buckets.len(), 17, "16 bounds and +Inf: {l}");
        assert!(buckets.windows(2).all(|w| w[0] <= w[1]), "{l}");
        assert_eq!(*buckets.last().unwrap(), count, "+Inf is the count: {l}");
        let sum = after.0[&format!("{base}_sum{{{labels}}}")];
        assert_eq!(sum > 0.0, count > 0.0, "{l}");
        checked += 1;
    }
    assert!(checked >= 35 + 5 + 2, "every histogram checked: {checked}");
    // Every sample is labelled with the volume.
    for l in text.lines().filter(|l| !l.starts_with('#')) {
        assert!(l.contains("{volume=\"testvol\""), "{l}");
    }
    // Anything but /metrics is refused; `/` points to it.
    let (status, _, body) = get(&format!("http://{addr}/"));
    assert!(status == 200 && body.contains("/metrics"), "{body}");
    assert_eq!(get(&format!("http://{addr}/nope")).0, 404);
    m.unmount();
}

/// Directories cost the database nothing to open and close, and a listing that fits one
/// page one round trip: rm -rf and find open every directory, and the kernel reads each
/// listing once more past its end (answered from the handle, see `Vfs::readdir_open`). A
/// listing asked again before anything changed (rm -rf opens each directory twice) costs
/// nothing: each directory here is listed twice in a row. Every listing is still whole.
fn directories_open_and_list_in_one_round_trip(vol: &Volume) {
    let port = free_port();
    let m = vol.mount_with(&["--metrics", &format!("127.0.0.1:{port}")]);
    const D: usize = 20;
    for i in 0..D {
        std::fs::create_dir_all(m.p(&format!("t/d{i}"))).unwrap();
        for f in ["a", "b", "c"] {
            std::fs::write(m.p(&format!("t/d{i}/{f}")), b"x").unwrap();
        }
    }
    // What was made is committed (a group's reads would count otherwise).
    let dir = std::fs::File::open(m.p("t")).unwrap();
    nix::unistd::syncfs(&dir).unwrap();
    let before = Scrape::of(port);
    for i in 0..D {
        for _twice in 0..2 {
            let mut names: Vec<String> = std::fs::read_dir(m.p(&format!("t/d{i}")))
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            names.sort();
            assert_eq!(names, ["a", "b", "c"]);
        }
    }
    let fuse = "unkai_op_duration_seconds_count";
    let mut after = Scrape::of(port);
    let settled = eventually(Duration::from_secs(30), || {
        after = Scrape::of(port);
        after.since(&before, fuse, &fuse_op("releasedir")) >= 2.0 * D as f64
    });
    assert!(settled, "every releasedir counted:\n{}", after.1);
    let trips = |op: &str| after.trips_since(&before, op);
    let listings = after.since(&before, fuse, &fuse_op("readdir"))
        + after.since(&before, fuse, &fuse_op("readdirplus"));
    assert!(
        listings >= 4.0 * D as f64,
        "the kernel reads past each end: {}",
        after.1
    );
    // (On PostgreSQL a group the setup left open may have its commit paid by whichever
    // request comes first, under load an opendir: at most the two of the listings' note
    // below. A round trip per open or close would be 4 x D.)
    let opens = trips("opendir") + trips("releasedir");
    let slack = if vol.db.is_some() { 2.0 } else { 0.0 };
    assert!(
        opens <= slack,
        "{opens} round trips for {} opens and closes: {}",
        4 * D,
        after.1
    );
    let listed = trips("readdir") + trips("readdirplus");
    match vol.db.is_some() {
        // (The setup's group, which syncfs does not commit, and a background store of
        // access times may each leave a group whose commit the next listing pays; a store
        // between the two listings of a directory costs the second its page. Paid twice,
        // the listings cost 2 x D and more.)
        true => assert!(
            listed <= D as f64 + 6.0,
            "{listed} round trips for {D} directories listed twice: {}",
            after.1
        ),
        false => assert_eq!(listed, 0.0),
    }
    drop(dir);
    m.unmount();
}

/// A walk of a tree (`find`, `du`, `rm -rf`) on a second mount: a directory whose parent was
/// just listed is read with the first pages of the directories after it and below it (one
/// round trip for up to 64), which the walk then lists from memory; each page lasts until a
/// change touches it, so a file another mount makes afterwards is listed once its change
/// is pushed, and a file this mount removes is gone from the next listing at once.
fn a_walk_lists_a_tree_in_a_few_round_trips(vol: &Volume) {
    const D: usize = 10;
    const E: usize = 3;
    let w = vol.mount();
    for i in 0..D {
        for j in 0..E {
            let d = w.p(&format!("t/d{i}/e{j}"));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("f"), b"x").unwrap();
        }
    }
    // Unmounted before the walk's mount: the notifications of its changes, pushed after its
    // group commits, could otherwise reach the walk (under the suite's load: 42 round trips
    // once) and drop the pages read ahead with every other page of the mount.
    w.unmount();
    let port = free_port();
    // Without access times: the first listing of each directory would store one, and the
    // listing after it commit it (a round trip each, as many as the load interleaves).
    // A log of its own: the wait below must not be answered by the writer's line.
    let m = vol.mount_as(
        &["--metrics", &format!("127.0.0.1:{port}"), "-o", "noatime"],
        &[],
        "walk.log",
    );
    // Pages are kept only while other mounts' changes are pushed here: a walk begun before
    // the channel is up lists its first directories without keeping their pages, and
    // every directory below them costs a round trip (23-33 under the suite's load, when
    // this wait read the writer's log instead of this mount's).
    if vol.db.is_some() {
        assert!(
            m.logs(
                "listening for other mounts' changes",
                Duration::from_secs(60)
            ),
            "the mount never listened for changes; log:\n{}",
            m.log_text()
        );
    }
    fn walk(dir: &std::path::Path, out: &mut Vec<String>, root: &std::path::Path) {
        for e in std::fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            out.push(p.strip_prefix(root).unwrap().display().to_string());
            if e.file_type().unwrap().is_dir() {
                walk(&p, out, root);
            }
        }
    }
    let expected = |extra: &[&str]| {
        let mut v = Vec::new();
        for i in 0..D {
            v.push(format!("d{i}"));
            for j in 0..E {
                v.push(format!("d{i}/e{j}"));
                v.push(format!("d{i}/e{j}/f"));
            }
        }
        v.extend(extra.iter().map(|s| s.to_string()));
        v.sort();
        v
    };
    let root = m.p("t");
    let before = Scrape::of(port);
    let mut got = Vec::new();
    walk(&root, &mut got, &root);
    got.sort();
    assert_eq!(got, expected(&[]));
    let after = Scrape::of(port);
    let trips = |op: &str| after.trips_since(&before, op);
    let listed = trips("readdir") + trips("readdirplus");
    println!("{listed} round trips to list {} directories", 1 + D + D * E);
    match vol.db.is_some() {
        // 41 directories: `t` alone, then `d0` with the 63 after and below it (all), and
        // a few more for a group committed meanwhile.
        true => assert!(
            listed <= 8.0,
            "{}\nthe mount's log:\n{}\n{listed} round trips to list {} directories (above: the \
             metrics, then the log)",
            after.1,
            m.log_text(),
            1 + D + D * E,
        ),
        false => assert_eq!(listed, 0.0),
    }
    // Another mount's change reaches the walk's pages once pushed; this mount's own at once.
    let w = vol.mount();
    let top = std::fs::File::open(w.p("t")).unwrap();
    std::fs::write(w.p("t/d7/e2/new"), b"y").unwrap();
    nix::unistd::syncfs(&top).unwrap();
    let seen = eventually(Duration::from_secs(30), || {
        let mut got = Vec::new();
        walk(&root, &mut got, &root);
        got.sort();
        got == expected(&["d7/e2/new"])
    });
    assert!(seen, "another mount's new file listed");
    std::fs::remove_file(m.p("t/d3/e1/f")).unwrap();
    let names: Vec<_> = std::fs::read_dir(m.p("t/d3/e1")).unwrap().collect();
    assert!(names.is_empty(), "a removed file still listed: {names:?}");
    drop(top);
    m.unmount();
    w.unmount();
}

/// `rm -rf` of a tree of small directories (one file in each, as a source tree's) on
/// PostgreSQL: the deletions join the open group after a first one in each top directory
/// locked and listed the rows around it (`Reach::Around`), rather than paying a round trip at
/// the first deletion in each directory (one per file here, 48 in all, before). Another
/// mount finds the tree gone.
fn removing_a_tree_of_small_directories_costs_few_round_trips(vol: &Volume) {
    const D: usize = 8;
    const E: usize = 5;
    let port = free_port();
    let m = vol.mount_with(&["--metrics", &format!("127.0.0.1:{port}"), "-o", "noatime"]);
    let make = |top: &str| {
        for i in 0..D {
            for j in 0..E {
                let d = m.p(&format!("{top}/d{i}/e{j}"));
                std::fs::create_dir_all(&d).unwrap();
                std::fs::write(d.join("f"), b"x").unwrap();
            }
        }
    };
    // The first removal prepares the statements on the connections (a round trip each).
    make("w");
    make("t");
    std::fs::remove_dir_all(m.p("w")).unwrap();
    let before = Scrape::of(port);
    std::fs::remove_dir_all(m.p("t")).unwrap();
    let after = Scrape::of(port);
    let trips = |op: &str| after.trips_since(&before, op);
    let removed = trips("unlink") + trips("rmdir");
    match vol.db.is_some() {
        // About one per top directory (9 on a quiet machine); more where a loaded machine
        // let the group's rows go (24 once in the full suite). Without the read-ahead, 48.
        true => assert!(
            removed <= (D * E * 3 / 4) as f64,
            "{removed} round trips to remove {} files and {} directories: {}",
            D * E,
            1 + D + D * E,
            after.1
        ),
        false => assert_eq!(removed, 0.0),
    }
    let other = vol.mount();
    assert!(!other.p("t").exists(), "the tree still on another mount");
    other.unmount();
    m.unmount();
}

/// A file extracted as `tar -x` does (made, written, its mode and times set through the
/// open descriptor, closed) costs PostgreSQL one round trip: the commit that makes its data
/// durable, which carries the group's held changes and the data's statements in one message
/// (the first `fchown`/`futimens` commits the pending writes; the close then has nothing
/// left). A second mount reads every file whole, with the mode and times set.
fn an_extracted_file_costs_one_round_trip(vol: &Volume) {
    use std::os::unix::fs::PermissionsExt;
    let port = free_port();
    let m = vol.mount_with(&["--metrics", &format!("127.0.0.1:{port}")]);
    std::fs::create_dir(m.p("x")).unwrap();
    const N: usize = 30;
    // The first files prepare the statements on the connections (a round trip each, once).
    const WARM: usize = 5;
    let when = std::time::UNIX_EPOCH + Duration::from_secs(1_600_000_000);
    let mut before = Scrape::of(port);
    for i in 0..WARM + N {
        if i == WARM {
            let released =
                |s: &Scrape| s.get("unkai_op_duration_seconds_count", &fuse_op("release"));
            let warm = eventually(Duration::from_secs(30), || {
                before = Scrape::of(port);
                released(&before) >= WARM as f64
            });
            assert!(warm, "the first files released:\n{}", before.1);
        }
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(m.p(&format!("x/f{i}")))
            .unwrap();
        f.write_all(&pattern(300 + i * 97, i as u64)).unwrap();
        f.set_permissions(std::fs::Permissions::from_mode(0o640))
            .unwrap();
        f.set_times(
            std::fs::FileTimes::new()
                .set_modified(when)
                .set_accessed(when),
        )
        .unwrap();
        drop(f);
    }
    let mut after = Scrape::of(port);
    let fuse = "unkai_op_duration_seconds_count";
    let settled = eventually(Duration::from_secs(30), || {
        after = Scrape::of(port);
        after.get(fuse, &fuse_op("release")) >= (WARM + N) as f64
    });
    assert!(settled, "every release counted:\n{}", after.1);
    let trips: f64 = [
        "create", "write", "setattr", "flush", "release", "getattr", "lookup",
    ]
    .iter()
    .map(|op| after.trips_since(&before, op))
    .sum();
    eprintln!("{trips} round trips for {N} files");
    match vol.db.is_some() {
        // One per file (each cost three before: the data's statements waited for an
        // answer, then for their own message, before the commit), and a little spare.
        true => assert!(
            trips <= 1.2 * N as f64,
            "{trips} round trips for {N} files: {}",
            after.1
        ),
        false => assert_eq!(trips, 0.0),
    }
    let other = vol.mount();
    for i in 0..WARM + N {
        let p = other.p(&format!("x/f{i}"));
        assert!(
            std::fs::read(&p).unwrap() == pattern(300 + i * 97, i as u64),
            "f{i}"
        );
        let md = std::fs::metadata(&p).unwrap();
        assert_eq!(md.permissions().mode() & 0o7777, 0o640, "f{i}");
        assert_eq!(md.modified().unwrap(), when, "f{i}");
    }
    other.unmount();
    m.unmount();
}

both_engines!(
    metrics_follow_a_workload(Vec::new()),
    directories_open_and_list_in_one_round_trip(Vec::new()),
    a_walk_lists_a_tree_in_a_few_round_trips(Vec::new()),
    // Groups that stay open for a second: on a loaded machine more than their 10 ms can pass
    // between one file's calls, and each such commit costs the next call a round trip.
    an_extracted_file_costs_one_round_trip(vec![("UNKAI_PG_GROUP_MS".into(), "1000".into())]),
    // Into the trash, as by default (deletions for good ask the server whether the file is
    // open anywhere: the ordinary way).
    removing_a_tree_of_small_directories_costs_few_round_trips(vec![(
        "UNKAI_TRASH_DAYS".into(),
        "1".into()
    )]),
);

/// The inodes of the sockets the process `pid` holds.
fn socket_inodes(pid: u32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|l| {
            let l = l.to_string_lossy().into_owned();
            Some(
                l.strip_prefix("socket:[")?
                    .trim_end_matches(']')
                    .to_string(),
            )
        })
        .collect()
}

/// The TCP addresses (as /proc/net/tcp writes them: `0100007F:2557`) process `pid` listens
/// on, IPv4 and IPv6.
fn listening(pid: u32) -> Vec<String> {
    let mine = socket_inodes(pid);
    let mut out = Vec::new();
    for table in ["tcp", "tcp6"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
        for l in text.lines().skip(1) {
            let f: Vec<&str> = l.split_whitespace().collect();
            // local address, state (0A: LISTEN), inode
            if f.len() > 9 && f[3] == "0A" && mine.iter().any(|i| i == f[9]) {
                out.push(f[1].to_string());
            }
        }
    }
    out
}

/// `--metrics` listens where it is told and nowhere else; without it the mount listens on
/// no TCP port at all; an address already taken is refused before mounting.
#[test]
fn the_listener_binds_where_told_and_nowhere_else() {
    let vol = Volume::new();
    let m = vol.mount();
    assert_eq!(listening(m.pid()), Vec::<String>::new(), "off by default");
    m.unmount();

    let port = free_port();
    let m = vol.mount_with(&["--metrics", &format!("127.0.0.1:{port}")]);
    assert_eq!(
        listening(m.pid()),
        vec![format!("0100007F:{port:04X}")],
        "127.0.0.1:{port} alone"
    );
    assert_eq!(Scrape::of(port).get("unkai_meta_retries_total", ""), 0.0);
    // A second mount asking for the same address is refused, on the terminal, in one line.
    let mp = tempfile::tempdir().unwrap();
    let (ok, out, err) = run_env(
        &[
            "mount",
            "-d",
            "--log",
            &vol.dir.path().join("second.log").display().to_string(),
            "--metrics",
            &format!("127.0.0.1:{port}"),
            &vol.meta_url,
            mp.path().to_str().unwrap(),
        ],
        &vol.env,
    );
    assert!(!ok, "{out}{err}");
    assert!(
        err.contains(&format!("cannot serve metrics on 127.0.0.1:{port}"))
            && err.trim().lines().count() == 1,
        "{err}"
    );
    let (ok, _, err) = run_env(
        &[
            "mount",
            "--metrics",
            "9567",
            &vol.meta_url,
            mp.path().to_str().unwrap(),
        ],
        &vol.env,
    );
    assert!(
        !ok && err.contains("invalid --metrics '9567'") && err.contains("e.g. 127.0.0.1:9567"),
        "{err}"
    );
    m.unmount();
}

/// `unkai stats --count 2` prints a header and two lines of rates that show a workload
/// running meanwhile; without a terminal it prints no escape sequences.
#[test]
fn stats_shows_what_a_mount_is_doing() {
    let vol = Volume::new();
    let m = vol.mount();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (stop, dir) = (stop.clone(), m.path.clone());
        std::thread::spawn(move || {
            let start = Instant::now();
            let block = pattern(256 << 10, 3);
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) && start.elapsed() < Duration::from_secs(120) {
                let mut f = std::fs::File::create(dir.join(format!("w{}", i % 20))).unwrap();
                f.write_all(&block).unwrap();
                i += 1;
            }
            i
        })
    };
    let mut stats = None;
    // The stats socket is made once the mount is in place: its first moments may miss it.
    let served = eventually(Duration::from_secs(30), || {
        let (ok, out, err) = run(&["stats", "--count", "2", m.path.to_str().unwrap()]);
        stats = Some((ok, out, err));
        ok
    });
    stop.store(true, Ordering::Relaxed);
    let files = writer.join().unwrap();
    let (_, out, err) = stats.unwrap();
    assert!(served, "{out}{err}");
    assert!(files > 0);
    assert!(!out.contains('\x1b'), "no escapes into a pipe: {out:?}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 4, "two header lines, two samples: {out}");
    assert!(
        lines[0].contains("fuse") && lines[0].contains("object"),
        "{out}"
    );
    let names: Vec<&str> = lines[1].split_whitespace().collect();
    let col = |name: &str| names.iter().position(|n| *n == name).unwrap();
    let (ops, write) = (col("ops"), col("write"));
    let moved = lines[2..].iter().any(|l| {
        let cells: Vec<&str> = l.split_whitespace().collect();
        assert_eq!(cells.len(), names.len(), "{out}");
        cells[ops] != "0" && cells[write] != "0"
    });
    assert!(moved, "the writes show: {out}");

    // Not an unkai mount: one line saying so.
    let other = tempfile::tempdir().unwrap();
    let (ok, _, err) = run(&["stats", "--count", "1", other.path().to_str().unwrap()]);
    assert!(!ok && err.contains("is not mounted"), "{err}");
    m.unmount();
}

/// Who reaches a mount's stats socket, and what it tells them. A root mount serves every user
/// (`allow_other`), so its socket is open to all (0666), and an unprivileged user reads its
/// figures, with `unkai stats` and straight from the socket; those are counts, never the names
/// of what the mount holds.
#[test]
fn a_mounts_stats_socket_tells_other_users_counts_never_names() {
    use std::os::unix::fs::{PermissionsExt, symlink};
    use std::os::unix::process::CommandExt;
    let vol = Volume::new();
    let m = vol.mount();
    let secret = "payroll-of-the-board-7f3a";
    std::fs::create_dir(m.p(secret)).unwrap();
    std::fs::write(m.p(&format!("{secret}/{secret}.txt")), secret).unwrap();
    symlink(secret, m.p(&format!("{secret}-link"))).unwrap();
    // The socket, as /proc/net/unix lists the ones bound: `stats-PID.sock` of this mount.
    let name = format!("/stats-{}.sock", m.pid());
    let mut sock = None;
    let found = eventually(Duration::from_secs(30), || {
        let table = std::fs::read_to_string("/proc/net/unix").unwrap_or_default();
        sock = table
            .lines()
            .filter_map(|l| l.split_whitespace().nth(7))
            .find(|p| p.ends_with(&name))
            .map(std::path::PathBuf::from);
        sock.is_some()
    });
    assert!(found, "no socket ending in {name} in /proc/net/unix");
    let sock = sock.unwrap();
    let mode = std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777;
    assert_eq!(
        mode,
        0o666,
        "{} of a root (allow_other) mount",
        sock.display()
    );

    // As nobody: `unkai stats` works, and the socket's JSON names nothing on the volume.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_unkai"))
        .args(["stats", "--count", "1", m.path.to_str().unwrap()])
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "unkai stats as nobody: {text}");
    assert!(!text.contains(secret), "{text}");
    let reader = r#"
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
data = b""
while True:
    chunk = s.recv(65536)
    if not chunk:
        break
    data += chunk
sys.stdout.buffer.write(data)
"#;
    let read = std::process::Command::new("python3")
        .arg("-c")
        .arg(reader)
        .arg(&sock)
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    let json = String::from_utf8_lossy(&read.stdout).into_owned();
    assert!(
        read.status.success(),
        "{}",
        String::from_utf8_lossy(&read.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(&json).expect("the figures are JSON");
    assert!(!v.is_null() && json.len() > 100, "{json}");
    assert!(!json.contains(secret), "a name in the figures: {json}");
    m.unmount();
}
