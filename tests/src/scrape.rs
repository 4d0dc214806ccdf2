//! Reading kdrop monitor's /metrics: one GET, a sample's value, a bounded
//! wait for counters to move.
use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    path::Path,
    time::{Duration, Instant},
};

use kdrop::context::netns::in_netns;

use crate::Kdrop;

/// One GET, `Connection: close`; the status line and the body (a chunked
/// one, as Prometheus' API sends a large answer, put back together).
pub fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<(String, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut resp = String::new();
    s.read_to_string(&mut resp)?;
    let (head, body) = resp.split_once("\r\n\r\n").unwrap_or((&resp, ""));
    let chunked = head
        .lines()
        .any(|l| l.eq_ignore_ascii_case("transfer-encoding: chunked"));
    let body = if chunked {
        dechunk(body).ok_or_else(|| std::io::Error::other("a bad chunked body"))?
    } else {
        body.to_string()
    };
    Ok((head.lines().next().unwrap_or("").to_string(), body))
}

/// A `Transfer-Encoding: chunked` body (RFC 9112, 7.1): hex size, CRLF,
/// the data, CRLF, until a size of 0.
fn dechunk(mut rest: &str) -> Option<String> {
    let mut out = String::new();
    loop {
        let (size, after) = rest.split_once("\r\n")?;
        let size = usize::from_str_radix(size.split(';').next()?.trim(), 16).ok()?;
        if size == 0 {
            return Some(out);
        }
        out.push_str(after.get(..size)?);
        rest = after.get(size..)?.strip_prefix("\r\n")?;
    }
}

/// A GET from inside the namespace at `netns` (its addresses and loopback
/// are its own).
pub fn http_get_in(
    netns: &Path,
    addr: SocketAddr,
    path: &str,
) -> std::io::Result<(String, String)> {
    let path = path.to_string();
    in_netns(netns, move || http_get(addr, &path)).expect("entering the namespace")
}

/// The metrics address from kdrop monitor's readiness line.
pub fn metrics_addr(k: &Kdrop) -> SocketAddr {
    let line = k
        .stderr_seen
        .iter()
        .find(|l| l.starts_with("kdrop: tracing"))
        .expect("a readiness line");
    let rest = line.split("http://").nth(1).expect("a metrics address");
    rest.split("/metrics").next().unwrap().parse().unwrap()
}

/// The value of the one sample named `name` whose labels include `want`.
pub fn value(metrics: &str, name: &str, want: &[(&str, &str)]) -> Option<u64> {
    metrics
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.split(['{', ' ']).next() == Some(name))
        .find(|l| {
            want.iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .and_then(|l| l.rsplit(' ').next())
        .map(|v| v.parse().unwrap())
}

/// Scrapes (through `get`) until `done` accepts the text, for at most
/// 10 s: counters move as the kernel frees packets, nothing else to wait on.
pub fn scrape_until(
    get: impl Fn() -> std::io::Result<(String, String)>,
    what: &str,
    done: impl Fn(&str) -> bool,
) -> String {
    let deadline = Instant::now() + crate::bound(Duration::from_secs(10));
    let mut last = String::new();
    loop {
        if let Ok((status, body)) = get() {
            assert!(status.contains("200"), "{status}");
            if done(&body) {
                return body;
            }
            last = body;
        }
        assert!(Instant::now() < deadline, "{what} never shown:\n{last}");
        std::thread::sleep(Duration::from_millis(50));
    }
}
