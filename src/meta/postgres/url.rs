//! Where a PostgreSQL volume lives: the parts of a `postgres://` URL (libpq's meaning), and the
//! password, which no message ever shows.
//!
//! Not for: telling engines' URLs apart (`meta::url`), connecting (`pool`).

use std::path::{Path, PathBuf};

use percent_encoding::percent_decode_str;

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
    /// `pool_max`: connections one client keeps at most for its operations (its listening
    /// connection aside); `pool::POOL_SIZE` when absent.
    pub pool_max: Option<usize>,
    /// `pool_idle`: seconds a connection beyond the first stays open unused before it is
    /// closed; `pool::IDLE_CLOSE` when absent.
    pub pool_idle: Option<u64>,
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
        if let Some(n) = self.pool_max {
            params.push(format!("pool_max={n}"));
        }
        if let Some(t) = self.pool_idle {
            params.push(format!("pool_idle={t}"));
        }
        write!(f, "?{}", params.join("&"))
    }
}

impl PgUrl {
    pub(crate) fn parse(s: &str) -> std::result::Result<PgUrl, String> {
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
        let mut pool_max = None;
        let mut pool_idle = None;
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
                "pool_max" => {
                    pool_max = Some(
                        v.parse()
                            .ok()
                            .filter(|n| (1..=1000).contains(n))
                            .ok_or_else(|| {
                                format!(
                                    "pool_max={v} is not a number of connections from 1 to 1000"
                                )
                            })?,
                    )
                }
                "pool_idle" => {
                    pool_idle = Some(v.parse().ok().filter(|t| *t > 0).ok_or_else(|| {
                        format!("pool_idle={v} is not a number of seconds (1 or more)")
                    })?)
                }
                other => {
                    return Err(format!(
                        "unknown parameter '{other}' (sslmode, sslrootcert, sslcert, sslkey, \
                         passfile, host, connect_timeout, pool_max, pool_idle)"
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
            pool_max,
            pool_idle,
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
    pub(crate) fn passfile_entry(&self, file: &Path) -> Option<Secret> {
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
