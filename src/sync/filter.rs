//! `--include` / `--exclude` rules of `unkai sync`, with rsync's meaning: the rules are tried
//! in the order given, the first that matches decides; a rule is tried on every directory of
//! a key from the top down, and an excluded directory excludes everything under it.
//!
//! A pattern without `/` matches a name at any depth (`*.tmp`); one starting with `/` is
//! anchored at the root of the sync (`/logs`); one with a `/` inside matches the end of the
//! path (`cache/*.bin`); one ending in `/` matches directories only (`.git/`). `*` does not
//! cross `/`, `**` does, `?` and `[...]` as in the shell (globset's syntax).
//!
//! Not for: listing or copying (that is [`super`]).

use globset::{GlobBuilder, GlobMatcher};

/// One rule.
struct Rule {
    include: bool,
    /// Matched against the whole path (anchored, or with a `/` inside).
    whole: Vec<GlobMatcher>,
    /// Matched against the last name only (no `/` in the pattern).
    name: Option<GlobMatcher>,
    dir_only: bool,
}

/// The rules, in their order.
#[derive(Default)]
pub struct Filter {
    rules: Vec<Rule>,
}

fn glob(p: &str) -> Result<GlobMatcher, String> {
    GlobBuilder::new(p)
        .literal_separator(true)
        .build()
        .map(|g| g.compile_matcher())
        .map_err(|e| format!("invalid pattern '{p}': {e}"))
}

impl Filter {
    /// Adds a rule (`include` true for `--include`). A bad pattern gets a one-line error.
    pub fn push(&mut self, include: bool, pattern: &str) -> Result<(), String> {
        let dir_only = pattern.ends_with('/') && pattern.len() > 1;
        let p = pattern.trim_end_matches('/');
        let anchored = p.starts_with('/');
        let p = p.trim_start_matches('/');
        if p.is_empty() {
            return Err(format!(
                "invalid pattern '{pattern}': empty; give a name or glob such as '*.tmp' or '/logs/'"
            ));
        }
        let rule = if anchored {
            Rule {
                include,
                whole: vec![glob(p)?],
                name: None,
                dir_only,
            }
        } else if p.contains('/') {
            Rule {
                include,
                whole: vec![glob(p)?, glob(&format!("**/{p}"))?],
                name: None,
                dir_only,
            }
        } else {
            Rule {
                include,
                whole: vec![],
                name: Some(glob(p)?),
                dir_only,
            }
        };
        self.rules.push(rule);
        Ok(())
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Whether `key` (a relative path, `/`-separated) is to be synced.
    pub fn accepts(&self, key: &str) -> bool {
        self.accepts_as(key, false)
    }

    /// Whether directory `key` is to be synced (with `--dirs`): as a file would be, its
    /// last name matched as a directory's.
    pub fn accepts_dir(&self, key: &str) -> bool {
        self.accepts_as(key, true)
    }

    fn accepts_as(&self, key: &str, last_is_dir: bool) -> bool {
        if self.rules.is_empty() {
            return true;
        }
        let parts: Vec<&str> = key.split('/').filter(|p| !p.is_empty()).collect();
        let mut end = 0;
        for (i, name) in parts.iter().enumerate() {
            end += name.len() + usize::from(i > 0);
            let path = &key.trim_start_matches('/')[..end];
            let is_dir = i + 1 < parts.len() || last_is_dir;
            let hit = self.rules.iter().find(|r| {
                (!r.dir_only || is_dir)
                    && (r.name.as_ref().is_some_and(|g| g.is_match(name))
                        || r.whole.iter().any(|g| g.is_match(path)))
            });
            match hit {
                Some(r) if !r.include => return false,
                Some(_) if i + 1 == parts.len() => return true,
                _ => {}
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filter(rules: &[(bool, &str)]) -> Filter {
        let mut f = Filter::default();
        for (inc, p) in rules {
            f.push(*inc, p).unwrap();
        }
        f
    }

    #[test]
    fn rsync_rules() {
        let f = filter(&[(false, "*.tmp")]);
        assert!(!f.accepts("a/b/x.tmp"));
        assert!(f.accepts("a/b/x.txt"));
        let f = filter(&[(false, ".git/")]);
        assert!(!f.accepts("src/.git/config"));
        assert!(f.accepts(".git"), "a file named like the directory stays");
        let f = filter(&[(false, "/logs")]);
        assert!(!f.accepts("logs/a"));
        assert!(f.accepts("x/logs/a"));
        let f = filter(&[(true, "*/"), (true, "*.txt"), (false, "*")]);
        assert!(f.accepts("a/b/c.txt"));
        assert!(!f.accepts("a/b/c.bin"));
        let f = filter(&[(true, "keep.tmp"), (false, "*.tmp")]);
        assert!(f.accepts("d/keep.tmp"));
        assert!(!f.accepts("d/other.tmp"));
        let f = filter(&[(false, "cache/*.bin")]);
        assert!(!f.accepts("x/cache/a.bin"));
        assert!(f.accepts("x/cache/sub/a.bin"));
        assert!(Filter::default().push(false, "[").is_err());
    }

    #[test]
    fn directories_are_matched_as_directories() {
        // A rule for directories only: the directory goes, a file of that name stays.
        let f = filter(&[(false, "cache/")]);
        assert!(!f.accepts_dir("cache"));
        assert!(!f.accepts_dir("a/cache"));
        assert!(f.accepts("cache"));
        assert!(f.accepts_dir("other"));
        // "Only CSV files": every directory is kept (so that --dirs makes them), other files
        // are not.
        let f = filter(&[(true, "*/"), (true, "*.csv"), (false, "*")]);
        assert!(f.accepts_dir("a") && f.accepts_dir("a/b"));
        assert!(f.accepts("a/b/x.csv"));
        assert!(!f.accepts("a/b/x.bin"));
        // An excluded directory takes what is under it, directories included.
        let f = filter(&[(false, "/a")]);
        assert!(!f.accepts_dir("a") && !f.accepts_dir("a/b"));
        assert!(f.accepts_dir("x/a"));
        // An include of a directory does not decide for the files under it.
        let f = filter(&[(true, "keep/"), (false, "*.tmp")]);
        assert!(f.accepts_dir("keep"));
        assert!(!f.accepts("keep/x.tmp"));
    }
}
