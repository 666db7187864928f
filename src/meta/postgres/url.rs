//! Where a PostgreSQL volume lives: the parts of a `postgres://` URL (libpq's meaning), and the
//! password, which no message ever shows. A URL may name several servers
//! (`postgres://user@h1:5432,h2:5432/db?target_session_attrs=read-write`, as libpq): they are
//! tried in order, and with `read-write` only a primary is taken, so a client follows a
//! failover to a promoted standby.
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
    /// A host name, an IP address, or (starting with `/`) a directory of Unix sockets: the
    /// first server named.
    pub host: String,
    pub port: u16,
    /// The other servers named (`h1:p1,h2:p2,...`), tried in order after the first.
    pub more_hosts: Vec<(String, u16)>,
    /// libpq's `target_session_attrs`: `any` (the default) or `read-write` (only a server that
    /// accepts writes, i.e. the primary, is taken).
    pub target_session_attrs: Option<String>,
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
        let show = |h: &str| match h.contains(':') {
            true => format!("[{h}]"),
            false => h.to_string(),
        };
        let host = if self.host.starts_with('/') {
            params.push(format!("host={}", enc(&self.host)));
            String::new()
        } else {
            show(&self.host)
        };
        write!(f, "@{host}:{}", self.port)?;
        for (h, p) in &self.more_hosts {
            write!(f, ",{}:{p}", show(h))?;
        }
        write!(f, "/{}", enc(&self.dbname))?;
        if let Some(t) = &self.target_session_attrs {
            params.push(format!("target_session_attrs={t}"));
        }
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
        // `h1:p1,h2:p2`: `url` takes the first; the others are parsed here.
        let at = auth.rfind('@').map_or(0, |i| i + 1);
        let (auth, more_hosts) = match auth[at..].split_once(',') {
            Some((first, others)) => (
                format!("{}{first}", &auth[..at]),
                others
                    .split(',')
                    .map(host_port)
                    .collect::<std::result::Result<Vec<_>, _>>()?,
            ),
            None => (auth.to_string(), Vec::new()),
        };
        let auth = auth.as_str();
        let unlisted;
        let s = match more_hosts.is_empty() {
            true => s,
            false => {
                unlisted = format!("{scheme}://{auth}{tail}");
                &unlisted
            }
        };
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
        let mut target_session_attrs = None;
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
                "target_session_attrs" => match &*v {
                    "any" | "read-write" => target_session_attrs = Some(v.into_owned()),
                    other => {
                        return Err(format!(
                            "unknown target_session_attrs '{other}' (any, or read-write to \
                             take only the primary of several hosts)"
                        ));
                    }
                },
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
                         passfile, host, connect_timeout, pool_max, pool_idle, \
                         target_session_attrs)"
                    ));
                }
            }
        }
        if host.is_empty() {
            return Err("no host (postgres://user@HOST/db, or ?host=/socket/dir)".into());
        }
        if !more_hosts.is_empty() && host.starts_with('/') {
            return Err(
                "a socket directory (?host=/dir) and a list of hosts (h1,h2) cannot be mixed; \
                 name the servers in the list only"
                    .into(),
            );
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
            more_hosts,
            target_session_attrs,
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

    /// Every server named, in order: (host, port).
    pub fn hosts(&self) -> impl Iterator<Item = (&str, u16)> {
        std::iter::once((self.host.as_str(), self.port))
            .chain(self.more_hosts.iter().map(|(h, p)| (h.as_str(), *p)))
    }

    /// The first matching line of a libpq password file (`host:port:db:user:password`, `*`
    /// matching anything, `\:` and `\\` escaped), for the first server named that has one
    /// (all servers are sent the same password).
    pub(crate) fn passfile_entry(&self, file: &Path) -> Option<Secret> {
        let text = std::fs::read_to_string(file).ok()?;
        self.hosts()
            .find_map(|(host, port)| self.passfile_line(&text, host, port))
    }

    fn passfile_line(&self, text: &str, host: &str, port: u16) -> Option<Secret> {
        let port = port.to_string();
        let host = if host.starts_with('/') {
            "localhost"
        } else {
            host
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
            let want = [host, port.as_str(), &self.dbname, &self.user];
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

/// One more server of a list: `host`, `host:port`, `[v6]` or `[v6]:port` (port 5432 if none).
fn host_port(item: &str) -> std::result::Result<(String, u16), String> {
    let bad = || {
        format!(
            "'{item}' in the list of hosts is not HOST[:PORT] (postgres://user@h1:5432,h2:5432/db)"
        )
    };
    let (host, port) = match item.strip_prefix('[') {
        Some(v6) => {
            let (h, rest) = v6.split_once(']').ok_or_else(bad)?;
            match rest {
                "" => (h, None),
                r => (h, Some(r.strip_prefix(':').ok_or_else(bad)?)),
            }
        }
        None => match item.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (item, None),
        },
    };
    let host = percent_decode_str(host)
        .decode_utf8()
        .map_err(|_| bad())?
        .into_owned();
    if host.is_empty() || host.contains(['/', '@']) {
        return Err(bad());
    }
    let port = match port {
        None => 5432,
        Some(p) => p.parse().ok().filter(|p| *p > 0).ok_or_else(bad)?,
    };
    Ok((host, port))
}
