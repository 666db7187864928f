//! META-URL parsing and opening the engine it names.
//!
//! Not for: the engines themselves.

use std::path::PathBuf;
use std::sync::Arc;

use super::{Error, Meta, Result};

/// A parsed META-URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MetaUrl {
    /// `sqlite:///abs/path/meta.db` (also `sqlite3://`).
    Sqlite(PathBuf),
}

impl std::fmt::Display for MetaUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MetaUrl::Sqlite(p) => write!(f, "sqlite://{}", p.display()),
        }
    }
}

impl MetaUrl {
    pub fn parse(s: &str) -> Result<MetaUrl> {
        let bad = |why: &str| {
            Error::Refused(format!(
                "invalid META-URL '{s}': {why}; expected e.g. sqlite:///var/lib/unkai/meta.db"
            ))
        };
        let (scheme, rest) = s.split_once("://").ok_or_else(|| bad("no scheme"))?;
        match scheme {
            "sqlite" | "sqlite3" => {
                let path = rest.split('?').next().unwrap_or_default();
                if path.is_empty() || path.ends_with('/') {
                    return Err(bad("no database file path"));
                }
                if !path.starts_with('/') {
                    return Err(bad(
                        "the path must be absolute (three slashes: sqlite:///abs/path)",
                    ));
                }
                Ok(MetaUrl::Sqlite(PathBuf::from(path)))
            }
            "postgres" | "postgresql" => Err(bad("PostgreSQL is not supported by this build yet")),
            other => Err(bad(&format!("unknown scheme '{other}'"))),
        }
    }

    /// Whether a volume may already exist here (without creating anything).
    pub fn exists(&self) -> bool {
        match self {
            MetaUrl::Sqlite(p) => p.exists(),
        }
    }

    /// Opens the engine of an existing, formatted volume.
    pub fn open(&self) -> Result<Arc<dyn Meta>> {
        match self {
            MetaUrl::Sqlite(p) => Ok(Arc::new(super::sqlite::SqliteMeta::open(
                p,
                &self.to_string(),
            )?)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses() {
        assert_eq!(
            MetaUrl::parse("sqlite:///a/b.db").unwrap(),
            MetaUrl::Sqlite("/a/b.db".into())
        );
        assert_eq!(
            MetaUrl::parse("sqlite3:///a/b.db").unwrap(),
            MetaUrl::Sqlite("/a/b.db".into())
        );
        for bad in [
            "",
            "/a/b.db",
            "sqlite://rel.db",
            "sqlite:///",
            "redis://x",
            "sqlite:///dir/",
        ] {
            let e = MetaUrl::parse(bad).unwrap_err().to_string();
            assert!(e.contains("invalid META-URL"), "{bad}: {e}");
        }
    }
}
