//! META-URL parsing and opening the engine it names.
//!
//! Not for: the engines themselves.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use percent_encoding::percent_decode_str;

use super::{Error, Meta, Result};

/// A parsed META-URL. Its `Display` (and `Debug`) never shows a password.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MetaUrl {
    /// `sqlite:///abs/path/meta.db` (also `sqlite3://`).
    Sqlite(PathBuf),
    /// `postgres://user[:password]@host[:port]/db[?sslmode=...]` (also `postgresql://`).
    Postgres(PgUrl),
}

/// A password: shown as `***` by `Debug`, never by `Display` (it has none).
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Secret {
        Secret(s.into())
    }
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("***")
    }
}

/// Where a PostgreSQL volume lives. The password comes, in this order, from the URL, from
/// `PGPASSWORD`, or from a password file (`?passfile=`, `PGPASSFILE`, else `~/.pgpass`), in
/// libpq's format `host:port:db:user:password`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PgUrl {
    pub user: String,
    /// The password written in the URL itself, if any.
    pub password: Option<Secret>,
    /// A host name, an IP address, or (starting with `/`) a directory of Unix sockets.
    pub host: String,
    pub port: u16,
    pub dbname: String,
    /// libpq's `disable`, `allow`, `prefer` (the default), `require`, `verify-ca` or
    /// `verify-full` (see `postgres_tls`).
    pub sslmode: String,
    /// `sslrootcert`: a PEM file of the roots to trust, or `system` (the system's roots, and
    /// then `verify-full` is the only mode allowed). `PGSSLROOTCERT` when absent.
    pub sslrootcert: Option<String>,
    /// `sslcert` and `sslkey`: a client certificate (PEM, chain allowed) and its key (PEM).
    pub sslcert: Option<PathBuf>,
    pub sslkey: Option<PathBuf>,
    pub passfile: Option<PathBuf>,
    pub connect_timeout: Option<u64>,
}

impl std::fmt::Display for PgUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Paths stay readable: `/`, `.`, `-`, `_` and `~` need no escape in a query.
        const PATHISH: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
            .remove(b'/')
            .remove(b'.')
            .remove(b'-')
            .remove(b'_')
            .remove(b'~');
        let enc = |s: &str| percent_encoding::utf8_percent_encode(s, PATHISH).to_string();
        write!(f, "postgres://{}", enc(&self.user))?;
        if self.password.is_some() {
            f.write_str(":***")?;
        }
        let mut params = vec![format!("sslmode={}", self.sslmode)];
        let host = if self.host.starts_with('/') {
            params.push(format!("host={}", enc(&self.host)));
            String::new()
        } else if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        write!(f, "@{host}:{}/{}", self.port, enc(&self.dbname))?;
        if let Some(p) = &self.passfile {
            params.push(format!("passfile={}", enc(&p.display().to_string())));
        }
        if let Some(r) = &self.sslrootcert {
            params.push(format!("sslrootcert={}", enc(r)));
        }
        for (k, v) in [("sslcert", &self.sslcert), ("sslkey", &self.sslkey)] {
            if let Some(p) = v {
                params.push(format!("{k}={}", enc(&p.display().to_string())));
            }
        }
        if let Some(t) = self.connect_timeout {
            params.push(format!("connect_timeout={t}"));
        }
        write!(f, "?{}", params.join("&"))
    }
}

impl PgUrl {
    fn parse(s: &str) -> std::result::Result<PgUrl, String> {
        // `user@/db?host=/socket/dir` has no host, which `url` refuses: stand one in.
        let (scheme, rest) = s.split_once("://").unwrap_or(("", s));
        let auth_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let (auth, tail) = rest.split_at(auth_end);
        let hostless = auth.is_empty() || auth.ends_with('@') || auth.contains("@:");
        let patched;
        let s = if hostless {
            let auth = match auth.split_once('@') {
                Some((user, port)) => format!("{user}@unkai.invalid{port}"),
                None => "unkai.invalid".to_string(),
            };
            patched = format!("{scheme}://{auth}{tail}");
            &patched
        } else {
            s
        };
        let u = url::Url::parse(s).map_err(|e| format!("{e}"))?;
        let dec = |x: &str, what: &str| {
            percent_decode_str(x)
                .decode_utf8()
                .map(|c| c.into_owned())
                .map_err(|_| format!("the {what} is not valid UTF-8 once decoded"))
        };
        let user = dec(u.username(), "user name")?;
        if user.is_empty() {
            return Err("no user name (postgres://USER@host/db)".into());
        }
        let password = u
            .password()
            .map(|p| dec(p, "password"))
            .transpose()?
            .map(Secret);
        let mut host = match u.host() {
            _ if hostless => String::new(),
            Some(url::Host::Ipv6(a)) => a.to_string(),
            Some(h) => dec(&h.to_string(), "host")?,
            None => String::new(),
        };
        let port = u.port().unwrap_or(5432);
        let path = u.path();
        let dbname = dec(path.strip_prefix('/').unwrap_or(path), "database name")?;
        if dbname.is_empty() || dbname.contains('/') {
            return Err("no database name (postgres://user@host/DB)".into());
        }
        let mut sslmode = None;
        let mut sslrootcert = None;
        let mut sslcert = None;
        let mut sslkey = None;
        let mut passfile = None;
        let mut connect_timeout = None;
        for (k, v) in u.query_pairs() {
            match &*k {
                "sslmode" => match &*v {
                    "disable" | "allow" | "prefer" | "require" | "verify-ca" | "verify-full" => {
                        sslmode = Some(v.into_owned())
                    }
                    other => {
                        return Err(format!(
                            "unknown sslmode '{other}' (disable, allow, prefer, require, \
                             verify-ca, verify-full)"
                        ));
                    }
                },
                "passfile" => passfile = Some(PathBuf::from(&*v)),
                "sslrootcert" if !v.is_empty() => sslrootcert = Some(v.into_owned()),
                "sslcert" if !v.is_empty() => sslcert = Some(PathBuf::from(&*v)),
                "sslkey" if !v.is_empty() => sslkey = Some(PathBuf::from(&*v)),
                "host" => host = v.into_owned(),
                "connect_timeout" => {
                    connect_timeout =
                        Some(v.parse().map_err(|_| {
                            format!("connect_timeout={v} is not a number of seconds")
                        })?)
                }
                other => {
                    return Err(format!(
                        "unknown parameter '{other}' (sslmode, sslrootcert, sslcert, sslkey, \
                         passfile, host, connect_timeout)"
                    ));
                }
            }
        }
        if host.is_empty() {
            return Err("no host (postgres://user@HOST/db, or ?host=/socket/dir)".into());
        }
        // As libpq 16: the system's roots make verify-full the default, and the only mode.
        let sslmode = match (sslmode, sslrootcert.as_deref()) {
            (None, Some("system")) => "verify-full".to_string(),
            (Some(m), Some("system")) if m != "verify-full" => {
                return Err(format!(
                    "weak sslmode={m} may not be used with sslrootcert=system (use \
                     sslmode=verify-full)"
                ));
            }
            (m, _) => m.unwrap_or_else(|| "prefer".to_string()),
        };
        if sslcert.is_some() != sslkey.is_some() {
            return Err(
                "a client certificate needs both sslcert=CERT.pem and sslkey=KEY.pem".into(),
            );
        }
        Ok(PgUrl {
            user,
            password,
            host,
            port,
            dbname,
            sslmode,
            sslrootcert,
            sslcert,
            sslkey,
            passfile,
            connect_timeout,
        })
    }

    /// The password to send: from the URL, `PGPASSWORD`, or a password file.
    pub fn resolve_password(&self) -> Option<Secret> {
        if let Some(p) = &self.password {
            return Some(p.clone());
        }
        if let Ok(p) = std::env::var("PGPASSWORD") {
            return Some(Secret(p));
        }
        let file = self
            .passfile
            .clone()
            .or_else(|| std::env::var_os("PGPASSFILE").map(PathBuf::from))
            .or_else(|| dirs::home_dir().map(|h| h.join(".pgpass")))?;
        self.passfile_entry(&file)
    }

    /// The first matching line of a libpq password file (`host:port:db:user:password`, `*`
    /// matching anything, `\:` and `\\` escaped).
    fn passfile_entry(&self, file: &Path) -> Option<Secret> {
        let text = std::fs::read_to_string(file).ok()?;
        let port = self.port.to_string();
        let host = if self.host.starts_with('/') {
            "localhost"
        } else {
            &self.host
        };
        for line in text.lines() {
            if line.trim().is_empty() || line.starts_with('#') {
                continue;
            }
            let mut fields = Vec::new();
            let mut cur = String::new();
            let mut chars = line.chars();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => cur.extend(chars.next()),
                    ':' if fields.len() < 4 => fields.push(std::mem::take(&mut cur)),
                    c => cur.push(c),
                }
            }
            fields.push(cur);
            if fields.len() != 5 {
                continue;
            }
            let want = [host, &port, &self.dbname, &self.user];
            if fields[..4]
                .iter()
                .zip(want)
                .all(|(f, w)| f == "*" || f == w)
            {
                return Some(Secret(fields.pop().unwrap_or_default()));
            }
        }
        None
    }
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
