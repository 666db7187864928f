//! The keys of a bucket in S3's order: a walk of the bucket's directory tree, each directory
//! read whole and sorted so that the keys come out in byte order, pruned by the prefix and
//! the resume point, with keys folded into common prefixes at a delimiter; stops one item
//! past the page.
//!
//! Not for: the S3 messages (`objects` builds them), or anything that changes the volume.

use std::ops::ControlFlow;

use crate::meta::{Attr, Ctx, Ino, Kind};
use crate::vfs::{self, Vfs, may, paths};

/// A page of a listing.
#[derive(Debug, Default)]
pub struct Page {
    /// The objects: key and attributes.
    pub keys: Vec<(String, Attr)>,
    /// The common prefixes (each ends with the delimiter).
    pub prefixes: Vec<String>,
    /// More items follow; resume after `next`.
    pub truncated: bool,
    /// The last item of the page (key or common prefix), when truncated.
    pub next: Option<String>,
}

/// What to list.
pub struct Query<'a> {
    pub prefix: &'a str,
    pub delimiter: Option<&'a str>,
    /// Only items (keys or common prefixes) after this one.
    pub after: &'a str,
    pub max: usize,
}

/// A page of the keys under directory `bucket` (as `ctx`; directories it may not read are
/// left out). Only regular files are objects; names that are not UTF-8 are left out.
pub fn list(vfs: &Vfs, ctx: &Ctx, bucket: Ino, q: &Query) -> vfs::Result<Page> {
    let mut page = Page::default();
    if q.max == 0 {
        return Ok(page);
    }
    // Start where the prefix's directories end: "a/b/c" lists from directory a/b.
    let base = match q.prefix.rfind('/') {
        Some(i) => &q.prefix[..=i],
        None => "",
    };
    let start = match paths::resolve(vfs, ctx, bucket, base.as_bytes()) {
        Ok(a) if a.kind == Kind::Dir => a,
        Ok(_) => return Ok(page),
        Err(e) if matches!(e.errno(), libc::ENOENT | libc::ENOTDIR) => return Ok(page),
        Err(e) => return Err(e),
    };
    let mut walk = Walk {
        vfs,
        ctx,
        q,
        page: &mut page,
    };
    let _ = walk.dir(&start, base)?;
    Ok(page)
}

struct Walk<'a> {
    vfs: &'a Vfs,
    ctx: &'a Ctx,
    q: &'a Query<'a>,
    page: &'a mut Page,
}

impl Walk<'_> {
    /// Lists directory `dir`, whose keys start with `key` (empty or ending with '/').
    fn dir(&mut self, dir: &Attr, key: &str) -> vfs::Result<ControlFlow<()>> {
        if !may(self.ctx, dir, 5) {
            return Ok(ControlFlow::Continue(()));
        }
        let mut entries = Vec::new();
        let mut cookie = 0;
        loop {
            let page = self.vfs.readdir(self.ctx, dir.ino, cookie, 512, true)?;
            let Some(last) = page.last() else { break };
            cookie = last.cookie;
            for e in page {
                if e.name == b"." || e.name == b".." {
                    continue;
                }
                let Ok(name) = String::from_utf8(e.name) else {
                    continue;
                };
                let Some(attr) = e.attr else { continue };
                // A directory's keys all start with "name/": it sorts as that.
                let sort = match attr.kind {
                    Kind::Dir => format!("{key}{name}/"),
                    Kind::File => format!("{key}{name}"),
                    _ => continue,
                };
                entries.push((sort, attr));
            }
        }
        entries.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let (prefix, after) = (self.q.prefix, self.q.after);
        for (full, attr) in entries {
            if attr.kind == Kind::Dir {
                if !(full.starts_with(prefix) || prefix.starts_with(&full)) {
                    continue;
                }
                // Everything under it sorts before the resume point.
                if full.as_str() < after && !after.starts_with(&full) {
                    continue;
                }
                if self.q.delimiter == Some("/") && full.len() > prefix.len() {
                    // Every key under it folds into this common prefix (an empty directory
                    // too: it is listed as a prefix, as a "folder").
                    if full.as_str() > after && self.item(full, None).is_break() {
                        return Ok(ControlFlow::Break(()));
                    }
                    continue;
                }
                if self.dir(&attr, &full)?.is_break() {
                    return Ok(ControlFlow::Break(()));
                }
                continue;
            }
            if !full.starts_with(prefix) {
                continue;
            }
            let folded = self.q.delimiter.filter(|d| !d.is_empty()).and_then(|d| {
                full[prefix.len()..]
                    .find(d)
                    .map(|i| full[..prefix.len() + i + d.len()].to_string())
            });
            let item = folded.as_deref().unwrap_or(&full);
            if item <= after {
                continue;
            }
            let res = match folded {
                Some(p) => self.item(p, None),
                None => self.item(full, Some(attr)),
            };
            if res.is_break() {
                return Ok(ControlFlow::Break(()));
            }
        }
        Ok(ControlFlow::Continue(()))
    }

    /// Adds a key (with its attributes) or a common prefix (without); Break once an item
    /// past the page is found.
    fn item(&mut self, name: String, attr: Option<Attr>) -> ControlFlow<()> {
        if attr.is_none() && self.page.prefixes.last() == Some(&name) {
            return ControlFlow::Continue(());
        }
        if self.page.keys.len() + self.page.prefixes.len() == self.q.max {
            self.page.truncated = true;
            return ControlFlow::Break(());
        }
        self.page.next = Some(name.clone());
        match attr {
            Some(a) => self.page.keys.push((name, a)),
            None => self.page.prefixes.push(name),
        }
        ControlFlow::Continue(())
    }
}
