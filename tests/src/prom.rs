//! A Prometheus server (Debian's package) in a namespace of the test's,
//! scraping one target every second; killed and its data removed on drop.
use std::{
    net::SocketAddr,
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::{scrape::http_get_in, Ns};

pub struct Prometheus {
    child: Child,
    dir: PathBuf,
    ns_path: PathBuf,
    pub api: SocketAddr,
}

impl Prometheus {
    /// Scrapes `target` as job `kdrop` (the job name a ServiceMonitor on
    /// the `kdrop` Service gives), listening on `api` inside `ns`.
    pub fn start(ns: &Ns, target: SocketAddr, api: SocketAddr) -> Self {
        let dir =
            std::env::temp_dir().join(format!("kdrop-prom-{}-{}", std::process::id(), ns.name));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  \
                 - job_name: kdrop\n    static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .unwrap();
        let child = Command::new("nsenter")
            .arg(format!("--net={}", ns.path().display()))
            .arg("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={api}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting prometheus (Debian package prometheus)");
        Prometheus {
            child,
            dir,
            ns_path: ns.path(),
            api,
        }
    }

    /// An instant query's result vector, or the error text.
    pub fn query(&self, q: &str) -> Result<Vec<Value>, String> {
        let path = format!("/api/v1/query?query={}", urlencode(q));
        let (status, body) =
            http_get_in(&self.ns_path, self.api, &path).map_err(|e| e.to_string())?;
        if !status.contains("200") {
            return Err(format!("{status}: {body}"));
        }
        let v: Value = serde_json::from_str(&body).map_err(|e| e.to_string())?;
        Ok(v["data"]["result"].as_array().cloned().unwrap_or_default())
    }

    /// Runs `q` until it returns at least one series (bounded: a rate needs
    /// two scrapes); the series, or a failure naming the query.
    pub fn series_of(&self, q: &str) -> Vec<Value> {
        let deadline = Instant::now() + crate::bound(Duration::from_secs(30));
        loop {
            let last = match self.query(q) {
                Ok(v) if !v.is_empty() => return v,
                Ok(_) => "no series".to_string(),
                Err(e) => e,
            };
            assert!(Instant::now() < deadline, "query {q}: {last}");
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' | b'.' | b'-' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}
