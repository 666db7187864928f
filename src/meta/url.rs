//! META-URL parsing and opening the engine it names.
//!
//! Not for: the engines themselves.

use std::path::PathBuf;
use std::sync::Arc;

use super::{Error, Meta, Result};

pub use super::postgres::url::{PgUrl, Secret};

/// A parsed META-URL. Its `Display` (and `Debug`) never shows a password.
// Parsed once per command: its size does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MetaUrl {
    /// `sqlite:///abs/path/meta.db` (also `sqlite3://`).
    Sqlite(PathBuf),
    /// `postgres://user[:password]@host[:port]/db[?sslmode=...]` (also `postgresql://`).
    Postgres(PgUrl),
}

/// `s` with the password of a `scheme://user:password@...` URL replaced by `***`, for
/// messages about a URL that may not even parse.
pub fn redact(s: &str) -> String {
    let Some((scheme, rest)) = s.split_once("://") else {
        return s.to_string();
    };
    let auth_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let Some(at) = rest[..auth_end].rfind('@') else {
        return s.to_string();
    };
    match rest[..at].find(':') {
        Some(colon) => format!("{scheme}://{}:***{}", &rest[..colon], &rest[at..]),
        None => s.to_string(),
    }
}

impl std::fmt::Display for MetaUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MetaUrl::Sqlite(p) => write!(f, "sqlite://{}", p.display()),
            MetaUrl::Postgres(p) => p.fmt(f),
        }
    }
}

impl MetaUrl {
    pub fn parse(s: &str) -> Result<MetaUrl> {
        let bad = |why: &str| {
            Error::Refused(format!(
                "invalid META-URL '{}': {why}; expected e.g. sqlite:///var/lib/unkai/meta.db \
                 or postgres://user@host:5432/db",
                redact(s)
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
            "postgres" | "postgresql" => {
                Ok(MetaUrl::Postgres(PgUrl::parse(s).map_err(|e| bad(&e))?))
            }
            other => Err(bad(&format!("unknown scheme '{other}'"))),
        }
    }

    /// Whether a volume may already exist here (without creating anything).
    pub fn exists(&self) -> bool {
        match self {
            MetaUrl::Sqlite(p) => p.exists(),
            // A server is always there to ask; whether it holds a volume is `open`'s answer.
            MetaUrl::Postgres(_) => true,
        }
    }

    /// Creates a volume of settings `fmt` here, through the engine's own path (its schema,
    /// first counters and root directory); refuses an existing volume unless `force`.
    pub fn create(&self, fmt: &super::Format, force: bool) -> Result<()> {
        match self {
            MetaUrl::Sqlite(p) => {
                super::sqlite::SqliteMeta::create(p, &self.to_string(), fmt, force)
            }
            MetaUrl::Postgres(u) => super::postgres::PgMeta::create(u, fmt, force),
        }
    }

    /// Opens the engine of an existing, formatted volume.
    pub fn open(&self) -> Result<Arc<dyn Meta>> {
        match self {
            MetaUrl::Sqlite(p) => Ok(Arc::new(super::sqlite::SqliteMeta::open(
                p,
                &self.to_string(),
            )?)),
            MetaUrl::Postgres(u) => Ok(Arc::new(super::postgres::PgMeta::open(u)?)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

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

    fn pg(s: &str) -> PgUrl {
        match MetaUrl::parse(s).unwrap() {
            MetaUrl::Postgres(u) => u,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn parses_postgres() {
        let u = pg("postgres://alice:s%40cret@db.example:6543/vols?sslmode=disable");
        assert_eq!(u.user, "alice");
        assert_eq!(u.password.as_ref().map(|p| p.expose()), Some("s@cret"));
        assert_eq!((u.host.as_str(), u.port), ("db.example", 6543));
        assert_eq!((u.dbname.as_str(), u.sslmode.as_str()), ("vols", "disable"));
        let u = pg("postgresql://bob@10.0.0.1/meta");
        assert_eq!((u.port, u.password.is_none()), (5432, true));
        assert_eq!(u.sslmode, "prefer");
        let u = pg("postgres://bob@[::1]:5433/m?passfile=/etc/pw&connect_timeout=5");
        assert_eq!((u.host.as_str(), u.port), ("::1", 5433));
        assert_eq!(u.passfile, Some(PathBuf::from("/etc/pw")));
        assert_eq!(u.connect_timeout, Some(5));
        assert_eq!((u.pool_max, u.pool_idle), (None, None));
        let u = pg("postgres://bob@h/m?pool_max=3&pool_idle=10");
        assert_eq!((u.pool_max, u.pool_idle), (Some(3), Some(10)));
        assert_eq!(pg(&u.to_string()), u);
        let u = pg("postgres://bob@/m?host=/var/run/postgresql");
        assert_eq!(u.host, "/var/run/postgresql");
        // Printed without the password, and parsed back to the same place.
        for s in [
            "postgres://alice:s%40cret@db.example:6543/vols?sslmode=disable",
            "postgres://bob@[::1]:5433/m?passfile=/etc/pw",
            "postgres://bob@/m?host=/var/run/postgresql",
        ] {
            let u = pg(s);
            let shown = u.to_string();
            assert!(!shown.contains("cret"), "{shown}");
            assert!(!format!("{u:?}").contains("cret"));
            let back = pg(&shown);
            assert_eq!(
                (
                    &back.user,
                    &back.host,
                    back.port,
                    &back.dbname,
                    &back.passfile
                ),
                (&u.user, &u.host, u.port, &u.dbname, &u.passfile)
            );
        }
        assert_eq!(
            pg("postgres://a:pw@h/d").to_string(),
            "postgres://a:***@h:5432/d?sslmode=prefer"
        );
    }

    /// Several servers (a primary and its standbys), tried in order; with
    /// target_session_attrs=read-write only the primary is taken.
    #[test]
    fn parses_several_hosts() {
        let u = pg("postgres://al:pw@db1:5433,db2,[::1]:6000/v?target_session_attrs=read-write");
        assert_eq!((u.host.as_str(), u.port), ("db1", 5433));
        assert_eq!(
            u.hosts().collect::<Vec<_>>(),
            vec![("db1", 5433), ("db2", 5432), ("::1", 6000)]
        );
        assert_eq!(u.target_session_attrs.as_deref(), Some("read-write"));
        assert_eq!(u.password.as_ref().map(|p| p.expose()), Some("pw"));
        let shown = u.to_string();
        assert_eq!(
            shown,
            "postgres://al:***@db1:5433,db2:5432,[::1]:6000/v?sslmode=prefer&\
             target_session_attrs=read-write"
        );
        let back = pg(&shown);
        assert_eq!(back.more_hosts, u.more_hosts);
        assert_eq!(back.target_session_attrs, u.target_session_attrs);
        assert_eq!(pg("postgres://a@h/d").more_hosts, vec![]);
        for (bad, says) in [
            (
                "postgres://a:secretpw@h1:1,h2:x/d",
                "'h2:x' in the list of hosts",
            ),
            ("postgres://a:secretpw@h1,/d", "'' in the list of hosts"),
            (
                "postgres://a:secretpw@h1,[::1/d",
                "'[::1' in the list of hosts",
            ),
            (
                "postgres://a:secretpw@h1/d?target_session_attrs=primary",
                "target_session_attrs",
            ),
            (
                "postgres://a:secretpw@h1,h2/d?host=/run/pg",
                "cannot be mixed",
            ),
        ] {
            let e = MetaUrl::parse(bad).unwrap_err().to_string();
            assert!(e.contains(says) && !e.contains("secretpw"), "{bad}: {e}");
        }
    }

    /// The password file is searched for each server named, in order.
    #[test]
    fn passfile_for_several_hosts() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("pgpass");
        std::fs::write(&f, "db2:5432:v:al:second\n").unwrap();
        let u = pg("postgres://al@db1:5433,db2/v");
        assert_eq!(
            u.passfile_entry(&f).map(|p| p.expose().to_string()),
            Some("second".into())
        );
    }

    #[test]
    fn parses_tls_parameters() {
        for mode in [
            "disable",
            "allow",
            "prefer",
            "require",
            "verify-ca",
            "verify-full",
        ] {
            assert_eq!(
                pg(&format!("postgres://u@h/d?sslmode={mode}")).sslmode,
                mode
            );
        }
        let u = pg(
            "postgres://u@h/d?sslmode=verify-ca&sslrootcert=/etc/ca%20s.pem\
                    &sslcert=/c.pem&sslkey=/k.pem",
        );
        assert_eq!(u.sslrootcert.as_deref(), Some("/etc/ca s.pem"));
        assert_eq!(
            (u.sslcert.as_deref(), u.sslkey.as_deref()),
            (Some(Path::new("/c.pem")), Some(Path::new("/k.pem")))
        );
        // Printed and parsed back alike.
        assert_eq!(pg(&u.to_string()), u);
        // sslrootcert=system: verify-full by default, as libpq 16.
        let u = pg("postgres://u@h/d?sslrootcert=system");
        assert_eq!(u.sslmode, "verify-full");
        assert_eq!(pg(&u.to_string()), u);
    }

    #[test]
    fn refuses_bad_postgres_urls_without_showing_the_password() {
        for (bad, why) in [
            ("postgres://h/db", "no user"),
            ("postgres://u:topsecret@h", "no database"),
            ("postgres://u:topsecret@h/", "no database"),
            (
                "postgres://u:topsecret@h/db?sslmode=bogus",
                "unknown sslmode",
            ),
            (
                "postgres://u:topsecret@h/db?sslmode=require&sslrootcert=system",
                "weak sslmode=require",
            ),
            (
                "postgres://u:topsecret@h/db?sslmode=require&sslcert=/c.pem",
                "sslkey",
            ),
            ("postgres://u:topsecret@h/db?color=red", "unknown parameter"),
            ("postgres://u:topsecret@h:99999/db", "invalid port"),
            ("postgres://u:topsecret@/db", "no host"),
        ] {
            let e = MetaUrl::parse(bad).unwrap_err().to_string();
            assert!(e.contains("invalid META-URL"), "{bad}: {e}");
            assert!(e.contains(why), "{bad}: {e}");
            assert!(!e.contains("topsecret"), "{bad}: {e}");
            assert!(!e.contains('\n'), "one line: {e}");
        }
    }

    #[test]
    fn redacts() {
        assert_eq!(redact("postgres://u:p@h/db"), "postgres://u:***@h/db");
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(
            redact("postgres://u:p:q@h/d?x=@"),
            "postgres://u:***@h/d?x=@"
        );
        assert_eq!(redact("sqlite:///a/b@c.db"), "sqlite:///a/b@c.db");
        assert_eq!(redact("garbage"), "garbage");
    }

    #[test]
    fn password_file() {
        let dir = std::env::temp_dir().join(format!("unkai-pgpass-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("pgpass");
        std::fs::write(
            &f,
            "# comment\nh:5432:other:u:no\nh:5432:db:u:pa\\:ss\n*:*:*:*:fallback\n",
        )
        .unwrap();
        let url = |db: &str| pg(&format!("postgres://u@h/{db}?passfile={}", f.display()));
        assert_eq!(url("db").passfile_entry(&f).unwrap().expose(), "pa:ss");
        assert_eq!(url("zzz").passfile_entry(&f).unwrap().expose(), "fallback");
        // The URL's own password comes first.
        let u = pg(&format!("postgres://u:inurl@h/db?passfile={}", f.display()));
        assert_eq!(u.resolve_password().unwrap().expose(), "inurl");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
