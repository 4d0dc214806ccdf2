//! The pods' labels as the container runtime gives them over CRI
//! (k8s.io/cri-api, pkg/apis/runtime/v1/api.proto): one ListPodSandbox
//! returns every sandbox with its metadata (pod name, namespace, uid) and
//! its labels, "the labels of the PodSandbox", which are those the kubelet
//! passed in PodSandboxConfig.labels (the pod's own and its
//! io.kubernetes.pod.*). containerd's bundles hold no labels (bundles.rs),
//! its CRI does.
//!
//! Asked only when a finding needs a pod's labels (a Calico denial's
//! NetworkPolicy), on a thread of its own with a deadline: enrichment is
//! synchronous code running inside kdrop's tokio runtime, and a runtime
//! that hangs must not hold it more than a second.
use std::{
    fmt, fs,
    os::unix::fs::FileTypeExt as _,
    path::PathBuf,
    sync::mpsc,
    time::{Duration, Instant},
};

use super::bundles::{self, Bundle};
use crate::model::pod::{Labels, PodId};

/// A pod sandbox as ListPodSandbox gives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sandbox {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// SANDBOX_READY rather than SANDBOX_NOTREADY (its processes gone).
    pub ready: bool,
    /// When the runtime created it, in nanoseconds.
    pub created_at: i64,
    /// The pod's own labels, without the kubelet's io.kubernetes.pod.*.
    pub labels: Labels,
}

/// The sandbox of `pod` among `all`, by namespace and name (by uid when
/// that is all the pod record has). One pod can have several: the kubelet
/// makes a new sandbox when the old one died (metadata.attempt + 1), and a
/// StatefulSet's pod keeps its name when it is recreated. The ready one,
/// else the newest.
pub fn sandbox_of<'a>(all: &'a [Sandbox], pod: &PodId) -> Option<&'a Sandbox> {
    all.iter()
        .filter(|s| match pod {
            PodId::Named { namespace, name } => s.namespace == *namespace && s.name == *name,
            PodId::Uid(uid) => s.uid == *uid,
            PodId::Container(_) => false,
        })
        .max_by_key(|s| (s.ready, s.created_at))
}

/// Where containerd (its default state directory, also k3s's) and CRI-O
/// serve CRI, as each runtime directory names them.
const SOCKET_NAMES: [&str; 2] = ["containerd.sock", "crio.sock"];
/// The runtimes' default sockets (containerd's, CRI-O's).
const DEFAULT_SOCKETS: [&str; 3] = [
    "/run/containerd/containerd.sock",
    "/var/run/crio/crio.sock",
    "/run/crio/crio.sock",
];

/// The containerd socket a shim was started with: containerd starts each
/// `containerd-shim-runc-v2 -namespace N -id ID -address SOCKET ...`
/// (runtime/v2/shim/util.go, Command, containerd v1.6 and v1.7), `cmdline`
/// as /proc/PID/cmdline holds it (NUL-separated).
pub fn shim_address(cmdline: &[u8]) -> Option<PathBuf> {
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    let exe = args.first()?;
    if !exe.ends_with(b"containerd-shim-runc-v2") && !exe.ends_with(b"containerd-shim") {
        return None;
    }
    let i = args.iter().position(|a| *a == b"-address")?;
    let v = std::str::from_utf8(args.get(i + 1)?).ok()?;
    let v = v.strip_prefix("unix://").unwrap_or(v);
    (!v.is_empty()).then(|| PathBuf::from(v))
}

/// The parent's pid in /proc/PID/stat (`pid (comm) state ppid ...`; comm
/// may hold spaces and parentheses).
pub fn ppid_of_stat(stat: &str) -> Option<u32> {
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// The sockets named by the shims that run these sandboxes: the shim is
/// the subreaper of the sandbox's first process, its parent.
fn shim_sockets(bundles: &[Bundle]) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    for b in bundles.iter().filter(|b| b.sandbox) {
        let Some(pid) = bundles::pid_of(b) else {
            continue;
        };
        let Some(ppid) = fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| ppid_of_stat(&s))
        else {
            continue;
        };
        let cmdline = fs::read(format!("/proc/{ppid}/cmdline")).unwrap_or_default();
        if let Some(s) = shim_address(&cmdline).filter(|s| !out.contains(s)) {
            out.push(s);
        }
    }
    out
}

/// Where CRI may be served, in order, each once: `containerd.sock` and
/// `crio.sock` in each runtime directory, the sockets the shims of the
/// pods name (a containerd whose socket is outside its state directory,
/// as the tests' is), the defaults.
pub fn candidates(dirs: &[PathBuf], shims: &[PathBuf]) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    let in_dirs = dirs.iter().flat_map(|d| SOCKET_NAMES.map(|n| d.join(n)));
    let defaults = DEFAULT_SOCKETS.iter().map(PathBuf::from);
    for s in in_dirs.chain(shims.iter().cloned()).chain(defaults) {
        if !out.contains(&s) {
            out.push(s);
        }
    }
    out
}

/// The candidates that are sockets, one path each (/var/run is often a
/// link to /run).
fn present(candidates: &[PathBuf]) -> Vec<PathBuf> {
    let mut seen = Vec::new();
    let mut out = Vec::new();
    for c in candidates {
        let is_socket = fs::metadata(c).is_ok_and(|m| m.file_type().is_socket());
        let real = fs::canonicalize(c).unwrap_or_else(|_| c.clone());
        if is_socket && !seen.contains(&real) {
            seen.push(real);
            out.push(c.clone());
        }
    }
    out
}

/// The CRI sockets present now and every path looked at.
pub fn sockets(dirs: &[PathBuf], bundles: &[Bundle]) -> (Vec<PathBuf>, Vec<PathBuf>) {
    let looked = candidates(dirs, &shim_sockets(bundles));
    (present(&looked), looked)
}

/// Each socket's answer: its sandboxes, or why none.
pub type Listing = Vec<(PathBuf, Result<Vec<Sandbox>, String>)>;

/// What asks the sockets (the gRPC calls; a fake in tests).
pub type Lister = Box<dyn FnMut(&[PathBuf]) -> Listing + Send>;
/// What finds the sockets and asks them once ahead of need, on a thread
/// of its own.
pub type Asker = Box<dyn FnOnce() -> Listing + Send>;

/// How long one ListPodSandbox may take, connecting included.
pub const DEADLINE: Duration = Duration::from_secs(1);
/// A pod absent from the last answer is asked for again after this (its
/// sandbox may be newer than the answer)...
const RETRY_MISS: Duration = Duration::from_secs(1);
/// ...or after this when a call failed: a runtime that does not answer
/// costs enrichment `DEADLINE` each time.
const RETRY_FAILED: Duration = Duration::from_secs(10);
/// A pod found is looked up again after this (a sandbox's labels do not
/// change, but a pod of the same name may be a new one).
const HIT_FRESH: Duration = Duration::from_secs(60);
/// How long the listing asked at start may take: nothing waits on it
/// until a finding needs labels, and then for `DEADLINE` at most. Under
/// TCG a containerd in the same guest took longer than `DEADLINE` for a
/// cold call (connect, HTTP/2, the listing) while three kdrops asked at
/// once, and the policies came out with `{}` selectors.
const AHEAD_DEADLINE: Duration = Duration::from_secs(10);

/// The listing asked at start, until it is taken.
struct Ahead {
    answer: mpsc::Receiver<Listing>,
    asked: Instant,
    /// A finding waited for it already: the next ones do not (a burst of
    /// policy drops would each hold enrichment `DEADLINE`).
    waited: bool,
}

/// The last ListPodSandbox answers, asked again on a miss.
pub struct Cri {
    sandboxes: Vec<Sandbox>,
    /// Why the last listing gave no answer (no socket, a call failed).
    trouble: Vec<String>,
    /// The sockets that answered the last listing.
    answered: Vec<PathBuf>,
    /// When the last listing was, and whether a call of it failed.
    listed: Option<(Instant, bool)>,
    list: Lister,
    ahead: Option<Ahead>,
}

impl fmt::Debug for Cri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cri")
            .field("sandboxes", &self.sandboxes)
            .field("trouble", &self.trouble)
            .field("answered", &self.answered)
            .finish_non_exhaustive()
    }
}

impl Default for Cri {
    fn default() -> Self {
        Self::new(Box::new(list_all))
    }
}

impl Cri {
    pub fn new(list: Lister) -> Self {
        Self {
            sandboxes: Vec::new(),
            trouble: Vec::new(),
            answered: Vec::new(),
            listed: None,
            list,
            ahead: None,
        }
    }

    /// Asks the runtimes now, on a thread of its own, so that the first
    /// finding that needs a pod's labels finds them listed (a session's
    /// start, after loading).
    pub fn ask_ahead(&mut self, ask: Asker) {
        if self.ahead.is_some() {
            return;
        }
        let (tx, rx) = mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("kdrop-cri-ahead".into())
            .spawn(move || {
                let _ = tx.send(ask());
            });
        match spawned {
            Ok(_) => {
                self.ahead = Some(Ahead {
                    answer: rx,
                    asked: Instant::now(),
                    waited: false,
                })
            }
            Err(e) => log::debug!("listing the pods ahead: {e}"),
        }
    }

    /// The answer to the listing asked ahead, the first time waiting
    /// `DEADLINE` at most: Some(why not) while it is still out (no second
    /// listing meanwhile).
    fn take_ahead(&mut self) -> Option<String> {
        let mut ahead = self.ahead.take()?;
        let wait = if ahead.waited {
            Duration::ZERO
        } else {
            DEADLINE
        };
        match ahead.answer.recv_timeout(wait) {
            // No socket then: nothing asked, the usual path says why.
            Ok(listing) if listing.is_empty() => None,
            Ok(listing) => {
                self.apply(listing);
                None
            }
            Err(mpsc::RecvTimeoutError::Timeout)
                if ahead.asked.elapsed() < AHEAD_DEADLINE + DEADLINE =>
            {
                let why = format!(
                    "ListPodSandbox asked at start has not answered in {:.1}s",
                    ahead.asked.elapsed().as_secs_f64()
                );
                ahead.waited = true;
                self.ahead = Some(ahead);
                Some(why)
            }
            // Its thread is gone, or kept no deadline: ask anew.
            Err(_) => None,
        }
    }

    /// The labels of `pod`, or why the runtime gave none. `sockets` finds
    /// the sockets (present, looked at) when a listing is due.
    pub fn labels(
        &mut self,
        pod: &PodId,
        sockets: impl FnOnce() -> (Vec<PathBuf>, Vec<PathBuf>),
    ) -> Result<Labels, String> {
        if let Some(why) = self.take_ahead() {
            return Err(why);
        }
        let found = sandbox_of(&self.sandboxes, pod).is_some();
        let due = match self.listed {
            None => true,
            Some((at, _)) if found => at.elapsed() >= HIT_FRESH,
            Some((at, failed)) => at.elapsed() >= if failed { RETRY_FAILED } else { RETRY_MISS },
        };
        if due {
            let (present, looked) = sockets();
            self.relist(&present, &looked);
        }
        match sandbox_of(&self.sandboxes, pod) {
            Some(s) => Ok(s.labels.clone()),
            None => Err(self.why_not(pod)),
        }
    }

    fn relist(&mut self, present: &[PathBuf], looked: &[PathBuf]) {
        self.trouble.clear();
        self.answered.clear();
        if present.is_empty() {
            let paths: Vec<String> = looked.iter().map(|p| p.display().to_string()).collect();
            self.trouble.push(format!(
                "no CRI socket found: looked for {}",
                paths.join(", ")
            ));
            self.listed = Some((Instant::now(), false));
            return;
        }
        let started = Instant::now();
        let listing = (self.list)(present);
        log::debug!(
            "ListPodSandbox on {} socket(s) in {:?}",
            present.len(),
            started.elapsed()
        );
        self.apply(listing);
    }

    fn apply(&mut self, listing: Listing) {
        self.trouble.clear();
        let mut sandboxes = Vec::new();
        let mut answered = Vec::new();
        for (socket, r) in listing {
            match r {
                Ok(s) => {
                    sandboxes.extend(s);
                    answered.push(socket);
                }
                Err(e) => self.trouble.push(format!(
                    "ListPodSandbox on {} failed: {e}",
                    socket.display()
                )),
            }
        }
        let failed = !self.trouble.is_empty();
        // When no runtime answered, their last answers stand: a sandbox's
        // labels do not change.
        if !answered.is_empty() {
            self.sandboxes = sandboxes;
        }
        self.answered = answered;
        self.listed = Some((Instant::now(), failed));
    }

    fn why_not(&self, pod: &PodId) -> String {
        let mut why = self.trouble.clone();
        if !self.answered.is_empty() {
            let on: Vec<String> = self
                .answered
                .iter()
                .map(|p| p.display().to_string())
                .collect();
            let who = match pod {
                PodId::Named { namespace, name } => format!("{namespace}/{name}"),
                PodId::Uid(uid) => uid.clone(),
                PodId::Container(id) => format!("container {id}"),
            };
            why.push(format!(
                "ListPodSandbox on {} gave no sandbox of pod {who}",
                on.join(", ")
            ));
        }
        why.join("; ")
    }
}

/// Every socket's sandboxes, each call given `AHEAD_DEADLINE`: for
/// `Cri::ask_ahead`, already on a thread of its own. No socket, no call.
pub fn ask_all(sockets: Vec<PathBuf>) -> Listing {
    if sockets.is_empty() {
        return Vec::new();
    }
    #[cfg(feature = "runtime")]
    return grpc::list_all(sockets, AHEAD_DEADLINE);
    #[cfg(not(feature = "runtime"))]
    return list_all(&sockets);
}

/// Every socket's sandboxes, asked at once on a thread of its own (with
/// its own current-thread tokio runtime: this one's caller may be on a
/// runtime's thread, where a runtime cannot be entered), each call given
/// `DEADLINE`.
#[cfg(feature = "runtime")]
fn list_all(sockets: &[PathBuf]) -> Listing {
    let every = |why: &str| {
        sockets
            .iter()
            .map(|s| (s.clone(), Err(why.to_string())))
            .collect()
    };
    let (tx, rx) = std::sync::mpsc::channel();
    let owned = sockets.to_vec();
    let spawned = std::thread::Builder::new()
        .name("kdrop-cri".into())
        .spawn(move || {
            let _ = tx.send(grpc::list_all(owned, DEADLINE));
        });
    if let Err(e) = spawned {
        return every(&format!("starting a thread: {e}"));
    }
    // The thread's own deadline ends it; this one is for a thread that
    // does not keep it.
    rx.recv_timeout(DEADLINE + Duration::from_millis(500))
        .unwrap_or_else(|_| every(&format!("no answer within {DEADLINE:?}")))
}

#[cfg(not(feature = "runtime"))]
fn list_all(sockets: &[PathBuf]) -> Listing {
    sockets
        .iter()
        .map(|s| (s.clone(), Err("kdrop built without its CRI client".into())))
        .collect()
}

#[cfg(feature = "runtime")]
mod grpc {
    use std::path::{Path, PathBuf};

    use anyhow::{anyhow, Context as _, Result};
    use hyper_util::rt::TokioIo;
    use k8s_cri::v1::{
        runtime_service_client::RuntimeServiceClient, ListPodSandboxRequest, PodSandbox,
        PodSandboxState,
    };
    use tonic::transport::{Endpoint, Uri};

    use super::{Listing, Sandbox};
    use crate::context::bundles;

    pub fn list_all(sockets: Vec<PathBuf>, deadline: std::time::Duration) -> Listing {
        let rt = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => rt,
            Err(e) => {
                return sockets
                    .into_iter()
                    .map(|s| (s, Err(format!("starting a tokio runtime: {e}"))))
                    .collect()
            }
        };
        rt.block_on(async move {
            let mut set = tokio::task::JoinSet::new();
            for (i, s) in sockets.into_iter().enumerate() {
                set.spawn(async move {
                    let r = match tokio::time::timeout(deadline, list(&s)).await {
                        Ok(r) => r.map_err(|e| causes(&e)),
                        Err(_) => Err(format!("no answer within {deadline:?}")),
                    };
                    (i, s, r)
                });
            }
            let mut out = Vec::new();
            while let Some(done) = set.join_next().await {
                out.extend(done.ok());
            }
            out.sort_by_key(|(i, _, _)| *i);
            out.into_iter().map(|(_, s, r)| (s, r)).collect()
        })
    }

    /// `{:#}` without repeats: tonic's transport error and the io error
    /// under it both say "Connection refused (os error 111)".
    fn causes(e: &anyhow::Error) -> String {
        let mut parts: Vec<String> = Vec::new();
        for c in e.chain().map(|c| c.to_string()) {
            if parts.last() != Some(&c) {
                parts.push(c);
            }
        }
        parts.join(": ")
    }

    async fn list(socket: &Path) -> Result<Vec<Sandbox>> {
        let path = socket.to_path_buf();
        // The URI is a placeholder: the connector dials the socket.
        let channel = Endpoint::from_static("http://[::]:50051")
            .connect_with_connector(tower::service_fn(move |_: Uri| {
                let path = path.clone();
                async move {
                    Ok::<_, std::io::Error>(TokioIo::new(
                        tokio::net::UnixStream::connect(path).await?,
                    ))
                }
            }))
            .await
            .context("connecting")?;
        let items = RuntimeServiceClient::new(channel)
            .list_pod_sandbox(ListPodSandboxRequest { filter: None })
            .await
            .map_err(|s| anyhow!("{:?}: {}", s.code(), s.message()))?
            .into_inner()
            .items;
        Ok(items.into_iter().filter_map(sandbox).collect())
    }

    /// A sandbox without metadata names no pod.
    pub fn sandbox(p: PodSandbox) -> Option<Sandbox> {
        let m = p.metadata?;
        Some(Sandbox {
            namespace: m.namespace,
            name: m.name,
            uid: m.uid,
            ready: p.state == PodSandboxState::SandboxReady as i32,
            created_at: p.created_at,
            labels: bundles::own_labels(p.labels),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    };

    use super::*;

    fn sb(ns: &str, name: &str, uid: &str, ready: bool, at: i64, app: &str) -> Sandbox {
        Sandbox {
            namespace: ns.into(),
            name: name.into(),
            uid: uid.into(),
            ready,
            created_at: at,
            labels: [("app".to_string(), app.to_string())].into(),
        }
    }

    fn named(ns: &str, name: &str) -> PodId {
        PodId::Named {
            namespace: ns.into(),
            name: name.into(),
        }
    }

    #[test]
    fn the_pods_sandbox() {
        let all = [
            sb("data", "db-0", "u1", false, 10, "old"),
            sb("data", "db-0", "u2", true, 5, "db"),
            sb("data", "db-0", "u3", false, 20, "newer-but-dead"),
            sb("shop", "db-0", "u4", true, 30, "other-namespace"),
            sb("shop", "cart", "u5", false, 1, "cart"),
        ];
        let app = |p: &PodId| sandbox_of(&all, p).map(|s| s.labels["app"].as_str());
        assert_eq!(app(&named("data", "db-0")), Some("db"), "the ready one");
        assert_eq!(
            app(&named("shop", "cart")),
            Some("cart"),
            "not ready, alone"
        );
        assert_eq!(app(&PodId::Uid("u3".into())), Some("newer-but-dead"));
        assert_eq!(app(&named("data", "web")), None);
        assert_eq!(app(&PodId::Container("u2".into())), None);
        let dead = [
            sb("data", "db-0", "u1", false, 10, "old"),
            sb("data", "db-0", "u3", false, 20, "new"),
        ];
        assert_eq!(
            sandbox_of(&dead, &named("data", "db-0")).map(|s| s.uid.as_str()),
            Some("u3"),
            "the newest"
        );
    }

    #[cfg(feature = "runtime")]
    #[test]
    fn the_sandboxes_labels_are_the_pods_own() {
        use k8s_cri::v1::{PodSandbox, PodSandboxMetadata, PodSandboxState};
        // What the kubelet passes (newPodLabels, pkg/kubelet/kuberuntime/
        // labels.go) and ListPodSandbox gives back.
        let p = PodSandbox {
            id: "0f4c".into(),
            metadata: Some(PodSandboxMetadata {
                name: "db-0".into(),
                uid: "3c1e9a4b".into(),
                namespace: "data".into(),
                attempt: 1,
            }),
            state: PodSandboxState::SandboxReady as i32,
            created_at: 7,
            labels: [
                ("app", "db"),
                ("tier", "true"),
                ("io.kubernetes.pod.name", "db-0"),
                ("io.kubernetes.pod.namespace", "data"),
                ("io.kubernetes.pod.uid", "3c1e9a4b"),
            ]
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .into(),
            ..Default::default()
        };
        let s = grpc::sandbox(p.clone()).unwrap();
        assert_eq!(
            s,
            Sandbox {
                namespace: "data".into(),
                name: "db-0".into(),
                uid: "3c1e9a4b".into(),
                ready: true,
                created_at: 7,
                labels: [("app", "db"), ("tier", "true")]
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .into(),
            }
        );
        let not_ready = PodSandbox {
            state: PodSandboxState::SandboxNotready as i32,
            ..p.clone()
        };
        assert!(!grpc::sandbox(not_ready).unwrap().ready);
        assert_eq!(
            grpc::sandbox(PodSandbox {
                metadata: None,
                ..p
            }),
            None
        );
    }

    #[test]
    fn shims_name_their_containerd() {
        let shim = b"/usr/bin/containerd-shim-runc-v2\0-namespace\0k8s.io\0-id\0af4c09c1\0-address\0/tmp/kdrop-ctd-1-calico/containerd.sock\0";
        assert_eq!(
            shim_address(shim),
            Some(PathBuf::from("/tmp/kdrop-ctd-1-calico/containerd.sock"))
        );
        let url =
            b"/usr/bin/containerd-shim-runc-v2\0-address\0unix:///run/containerd/containerd.sock\0";
        assert_eq!(
            shim_address(url),
            Some(PathBuf::from("/run/containerd/containerd.sock"))
        );
        // Another process naming an -address is no shim of containerd's.
        assert_eq!(shim_address(b"/usr/bin/other\0-address\0/x.sock\0"), None);
        assert_eq!(
            shim_address(b"/usr/bin/containerd-shim-runc-v2\0-address\0"),
            None
        );
        assert_eq!(shim_address(b""), None);
        assert_eq!(
            ppid_of_stat("4242 (sleep) S 4200 4242 4242 0 -1"),
            Some(4200)
        );
        assert_eq!(ppid_of_stat("7 (a) b (c)) S 1 7 7 0"), Some(1));
        assert_eq!(ppid_of_stat("garbage"), None);
    }

    #[test]
    fn where_cri_is_looked_for() {
        let dirs = [
            PathBuf::from("/tmp/ctd/state"),
            PathBuf::from("/run/containerd"),
        ];
        let shims = [PathBuf::from("/tmp/ctd/containerd.sock")];
        let c: Vec<String> = candidates(&dirs, &shims)
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        assert_eq!(
            c,
            [
                "/tmp/ctd/state/containerd.sock",
                "/tmp/ctd/state/crio.sock",
                "/run/containerd/containerd.sock",
                "/run/containerd/crio.sock",
                "/tmp/ctd/containerd.sock",
                "/var/run/crio/crio.sock",
                "/run/crio/crio.sock",
            ]
        );
    }

    /// A runtime answering `answers` in turn, counting the calls.
    fn fake(answers: Vec<Listing>) -> (Cri, Arc<AtomicUsize>) {
        let calls = Arc::new(AtomicUsize::new(0));
        let n = calls.clone();
        let mut answers = answers.into_iter();
        let cri = Cri::new(Box::new(move |_: &[PathBuf]| {
            n.fetch_add(1, Ordering::SeqCst);
            answers.next().unwrap_or_default()
        }));
        (cri, calls)
    }

    fn sock() -> (Vec<PathBuf>, Vec<PathBuf>) {
        let s = vec![PathBuf::from("/run/containerd/containerd.sock")];
        (s.clone(), s)
    }

    #[test]
    fn asked_once_and_again_on_a_miss() {
        let db = sb("data", "db-0", "u1", true, 1, "db");
        let cart = sb("shop", "cart", "u2", true, 2, "cart");
        let socket = PathBuf::from("/run/containerd/containerd.sock");
        let (mut cri, calls) = fake(vec![
            vec![(socket.clone(), Ok(vec![db.clone()]))],
            vec![(socket.clone(), Ok(vec![db.clone(), cart.clone()]))],
        ]);
        let want = |s: &Sandbox| Ok(s.labels.clone());
        assert_eq!(cri.labels(&named("data", "db-0"), sock), want(&db));
        assert_eq!(cri.labels(&named("data", "db-0"), sock), want(&db));
        assert_eq!(calls.load(Ordering::SeqCst), 1, "a hit is not asked again");
        // cart's sandbox came later: a miss asks again, not more than once
        // per RETRY_MISS.
        assert_eq!(
            cri.labels(&named("shop", "cart"), sock),
            Err(
                "ListPodSandbox on /run/containerd/containerd.sock gave no sandbox of pod \
                 shop/cart"
                    .into()
            )
        );
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        cri.listed = Some((Instant::now() - RETRY_MISS, false));
        assert_eq!(cri.labels(&named("shop", "cart"), sock), want(&cart));
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn the_listing_asked_at_start_answers_the_first_finding() {
        let db = sb("data", "db-0", "u1", true, 1, "db");
        let socket = PathBuf::from("/run/containerd/containerd.sock");
        let (mut cri, calls) = fake(Vec::new());
        let answer = vec![(socket.clone(), Ok(vec![db.clone()]))];
        cri.ask_ahead(Box::new(move || answer));
        assert_eq!(
            cri.labels(&named("data", "db-0"), sock),
            Ok(db.labels.clone())
        );
        assert_eq!(calls.load(Ordering::SeqCst), 0, "no call of its own");

        // Still out when a finding needs it: that finding waits DEADLINE at
        // most and is told so, no second listing meanwhile; the next one
        // takes the answer.
        let (mut cri, calls) = fake(Vec::new());
        let (go, wait) = mpsc::channel::<()>();
        let answer = vec![(socket.clone(), Ok(vec![db.clone()]))];
        cri.ask_ahead(Box::new(move || {
            let _ = wait.recv();
            answer
        }));
        let started = Instant::now();
        let why = cri.labels(&named("data", "db-0"), sock).unwrap_err();
        assert!(
            why.starts_with("ListPodSandbox asked at start has not answered in "),
            "{why}"
        );
        assert!(started.elapsed() >= DEADLINE, "{:?}", started.elapsed());
        // The next finding meanwhile does not wait again.
        let started = Instant::now();
        assert!(cri.labels(&named("data", "db-0"), sock).is_err());
        assert!(started.elapsed() < DEADLINE / 2, "{:?}", started.elapsed());
        go.send(()).unwrap();
        // Taken by the first finding after it came (its thread's send is
        // not observable from here: bounded polling).
        let until = Instant::now() + Duration::from_secs(5);
        let labels = loop {
            match cri.labels(&named("data", "db-0"), sock) {
                Err(_) if Instant::now() < until => std::thread::yield_now(),
                got => break got,
            }
        };
        assert_eq!(labels, Ok(db.labels.clone()));
        assert_eq!(calls.load(Ordering::SeqCst), 0);

        // No socket at start: the usual path asks, and says why not.
        let (mut cri, calls) = fake(vec![vec![(socket.clone(), Ok(vec![db.clone()]))]]);
        cri.ask_ahead(Box::new(Vec::new));
        assert_eq!(
            cri.labels(&named("data", "db-0"), sock),
            Ok(db.labels.clone())
        );
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn says_why_not() {
        let (mut cri, calls) = fake(Vec::new());
        let nothing = || {
            (
                Vec::new(),
                vec![
                    PathBuf::from("/run/containerd/containerd.sock"),
                    PathBuf::from("/run/crio/crio.sock"),
                ],
            )
        };
        assert_eq!(
            cri.labels(&named("data", "db-0"), nothing),
            Err(
                "no CRI socket found: looked for /run/containerd/containerd.sock, \
                 /run/crio/crio.sock"
                    .into()
            )
        );
        assert_eq!(calls.load(Ordering::SeqCst), 0, "no socket, no call");

        let db = sb("data", "db-0", "u1", true, 1, "db");
        let socket = PathBuf::from("/run/containerd/containerd.sock");
        let (mut cri, calls) = fake(vec![
            vec![(socket.clone(), Ok(vec![db.clone()]))],
            vec![(socket.clone(), Err("connecting: transport error".into()))],
        ]);
        assert!(cri.labels(&named("data", "db-0"), sock).is_ok());
        // The runtime stops answering: what it said last stands, and the
        // failure is said for a pod it never named.
        cri.listed = Some((Instant::now() - HIT_FRESH, false));
        assert_eq!(
            cri.labels(&named("data", "db-0"), sock),
            Ok(db.labels.clone())
        );
        assert_eq!(
            cri.labels(&named("shop", "cart"), sock),
            Err(
                "ListPodSandbox on /run/containerd/containerd.sock failed: connecting: \
                 transport error"
                    .into()
            )
        );
        // A failed call is not repeated for a second miss at once.
        cri.listed = Some((Instant::now() - RETRY_MISS, true));
        let _ = cri.labels(&named("shop", "cart"), sock);
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    /// The real client against sockets that are no CRI, called from
    /// inside a tokio runtime as enrichment is: an error each, within the
    /// deadline, no panic.
    #[cfg(feature = "runtime")]
    #[test]
    fn a_runtime_that_does_not_answer() {
        let dir = std::env::temp_dir().join(format!("kdrop-cri-mute-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        // Connections queue, nothing ever answers.
        let mute = dir.join("containerd.sock");
        let _held = std::os::unix::net::UnixListener::bind(&mute).unwrap();
        // Bound, then closed: the file stays, connecting is refused.
        let gone = dir.join("crio.sock");
        drop(std::os::unix::net::UnixListener::bind(&gone).unwrap());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let started = Instant::now();
        let why = rt.block_on(async {
            let mut cri = Cri::default();
            cri.labels(&named("data", "db-0"), || {
                sockets(std::slice::from_ref(&dir), &[])
            })
        });
        let took = started.elapsed();
        let why = why.unwrap_err();
        assert!(
            why.contains(&format!(
                "ListPodSandbox on {} failed: no answer within 1s",
                mute.display()
            )),
            "{why}"
        );
        assert!(
            why.contains(&format!(
                "ListPodSandbox on {} failed: connecting: transport error: Connection refused \
                 (os error 111)",
                gone.display()
            )),
            "{why}"
        );
        assert!(
            !why.contains("111): Connection refused"),
            "said once: {why}"
        );
        assert!(took < DEADLINE + Duration::from_millis(700), "{took:?}");
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_socket_that_is_there() {
        let dir = std::env::temp_dir().join(format!("kdrop-cri-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let s = dir.join("containerd.sock");
        let _l = std::os::unix::net::UnixListener::bind(&s).unwrap();
        fs::write(dir.join("crio.sock"), "not a socket").unwrap();
        let link = dir.join("link.sock");
        std::os::unix::fs::symlink(&s, &link).unwrap();
        let found = present(&[dir.join("crio.sock"), s.clone(), link, dir.join("none")]);
        assert_eq!(found, vec![s]);
        let _ = fs::remove_dir_all(&dir);
    }
}
