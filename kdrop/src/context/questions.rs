//! The questions enrichment asks the node whose answer is plain data, in
//! one list, from which the `Node` trait declares them: each one's name (the first element of its key in a bundle,
//! `["ifname", netns, ifindex]`), its arguments (the rest of the key) and
//! its answer, with what a node that does not know answers (a replayed
//! bundle recorded by a kdrop that never asked it). `Recorder` and
//! `Replay` are written from this list (`plain_questions!(their_macro)`),
//! so a key is spelt once and a question they lack does not compile; the
//! tests' fake node (a `Replay` given answers) sets them through
//! [`asked`], written from the same list, so a question's name and its
//! answer's type are checked by the compiler there too. The
//! questions whose answers are large shared objects (routing contexts,
//! netfilter snapshots, kube-proxy's Services) are kept as blobs and
//! written out by hand in both.

/// Calls `$m!` with every plain question:
/// `/// doc name(arg: Type, ...) -> Answer = answer when unknown;`. The
/// `Node` trait declares them from here too.
macro_rules! plain_questions {
    ($m:ident) => {
        $m! {
            /// The namespace with this inode, if it still exists.
            netns(inode: u32) -> Option<crate::context::NetnsName> = None;
            /// The interface's name in its namespace (`ifN` when it is gone).
            ifname(netns: u32, ifindex: u32) -> String = format!("if{ifindex}");
            /// The conntrack entry of the namespace whose reply tuple is `reply`,
            /// as `orig A -> B, state S`.
            reply_holder(netns: u32, reply: &crate::model::packet::Tuple) -> Option<String> = None;
            /// The reverse-path lookup `fib_validate_source` makes for an IPv4
            /// packet `src -> dst`, asked of the kernel now (netlink), and the query
            /// that asked it.
            reverse_route(
                netns: u32,
                src: std::net::Ipv4Addr,
                dst: std::net::Ipv4Addr,
                mark: u32,
                src_valid_mark: bool
            ) -> Option<(crate::model::routing::RouteQuery, crate::model::routing::RouteLookup)> = None;
            /// The kernel's answer to a route query in the namespace, asked now.
            route_get(netns: u32, q: &crate::model::routing::RouteQuery)
                -> Option<crate::model::routing::RouteLookup> = None;
            /// The neighbour entry of `addr` on device `ifindex` of the namespace.
            neighbour(netns: u32, ifindex: u32, addr: std::net::IpAddr)
                -> Option<crate::model::neighbour::Neighbour> = None;
            /// The neighbour entries on device `ifindex` of the namespace whose
            /// link-layer address is `lladdr` (one host's IPv4, IPv6 link-local and
            /// global addresses share it); None when they cannot be read.
            neighbours_with(netns: u32, ifindex: u32, lladdr: [u8; 6])
                -> Option<Vec<crate::model::neighbour::Neighbour>> = None;
            /// The device the namespace routes `dst` out of now (`ip route get`).
            route_out(netns: u32, dst: std::net::IpAddr) -> Option<u32> = None;
            /// The conntrack entry whose `side` tuple is `t`, in namespace `netns`,
            /// or in any namespace of the node (a SYN-ACK that should have been
            /// un-NAT'd is the reply side of one).
            conntrack_find(
                side: crate::context::conntrack_lookup::Side,
                t: &crate::model::packet::Tuple,
                netns: Option<u32>
            ) -> Option<crate::model::packet::CtSeen> = None;
            /// The TCP entries of namespace `netns` whose original source is
            /// `client` (address and port): where it sent its SYNs, NAT'd or not.
            conntrack_from(netns: u32, client: std::net::SocketAddr)
                -> Vec<crate::model::packet::CtSeen> = Vec::new();
            /// The remote a client's SYN-SENT socket bound to `local` waits for,
            /// looked for in `netns` first, then in every namespace of the node.
            waiting_for(netns: u32, local: std::net::SocketAddr)
                -> Option<std::net::SocketAddr> = None;
            /// Is br_netfilter loaded (bridged packets pass iptables)?
            br_netfilter_loaded() -> bool = false;
            /// `symbol+0xoff` for a kernel code address.
            symbol(addr: u64) -> Option<String> = None;
            /// The pod whose network namespace this is, as the container runtime
            /// recorded it; None for kdrop's own (the node's) and for a namespace
            /// no runtime claims.
            pod(netns: u32) -> Option<crate::model::pod::Pod> = None;
            /// The pod one of whose addresses `addr` is, among the pods the
            /// runtime recorded (never the node's own addresses).
            pod_of_addr(addr: std::net::IpAddr) -> Option<crate::model::pod::Pod> = None;
            /// The labels of a pod whose runtime's records (`pod`, `pod_of_addr`)
            /// gave none, asked of the container runtime over CRI; else why not
            /// (no CRI socket, the call failed, no such sandbox), in words. Asked
            /// only by findings that need them. Required, not defaulted, as `kube`.
            pod_labels(pod: &crate::model::pod::PodId)
                -> Result<crate::model::pod::Labels, String>
                = Err("the recording holds no answer of the runtime".into());
            /// The Service `namespace/name:port` that `addr` reaches in `netns`: its
            /// virtual address or node port, or a backend endpoint it serves, as
            /// kube-proxy's rules there name it (their comments).
            service(netns: u32, addr: std::net::SocketAddr) -> Option<String> = None;
            /// The listener a connection to `dst` reaches: in `near` first, then in
            /// every namespace of the node where `dst` is a local address; with its
            /// queues, sysctls, counters and owning processes.
            listener(near: u32, dst: std::net::SocketAddr)
                -> Option<crate::model::listen::ListenerFound> = None;
            /// The namespaces whose listeners the listen watch reads: kdrop's own
            /// and every one with a TCP listener on one of `ports` (any port when
            /// empty).
            listen_spaces(ports: &[u16]) -> Vec<u32> = Vec::new();
            /// The namespace's TcpExt listen counters now (one file read).
            listen_counters(netns: u32) -> Option<crate::model::listen::ListenCounters> = None;
            /// The namespace's listeners on `ports` (every one when empty), each
            /// with its queues, sysctls, counters and owning processes
            /// (`counters_before` None).
            listeners_of(netns: u32, ports: &[u16])
                -> Vec<crate::model::listen::ListenerFound> = Vec::new();
            /// Does a request socket `local` <- `remote` (SYN-RECV) wait in the
            /// namespace now? None when it cannot be read.
            request_pending(netns: u32, local: std::net::SocketAddr, remote: std::net::SocketAddr)
                -> Option<bool> = None;
            /// What runs on `hook` (`ingress`, `egress` or `xdp`) of a device:
            /// tc filters, tcx and XDP programs, each program described.
            hook_programs(netns: u32, ifindex: u32, hook: &str)
                -> Option<crate::model::progs::HookProgs> = None;
            /// The cgroup programs on `hook` for the local socket bound to `local`
            /// (its owner's cgroup and the ancestors').
            cgroup_programs(netns: u32, local: std::net::SocketAddr, hook: &str)
                -> Option<crate::model::progs::CgroupProgs> = None;
        }
    };
}

pub(crate) use plain_questions;

/// The key a plain question's answer is kept under: `["name", args...]`.
macro_rules! key {
    ($name:ident $(, $arg:expr)*) => {
        serde_json::json!([stringify!($name) $(, $arg)*])
    };
}

pub(crate) use key;

/// A plain question as a value: its key, and the type of its answer.
#[cfg(test)]
pub struct Asked<A> {
    pub(crate) key: serde_json::Value,
    answer: std::marker::PhantomData<fn() -> A>,
}

#[cfg(test)]
macro_rules! asked_fns {
    ($($(#[$doc:meta])* $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty = $unknown:expr;)*) => {
        $(
            pub fn $name($($arg: $ty),*) -> super::Asked<$ret> {
                super::Asked {
                    key: super::key!($name $(, $arg)*),
                    answer: std::marker::PhantomData,
                }
            }
        )*
    };
}

/// Every plain question as a function of its arguments, giving the
/// question the fake node answers (`Replay::set`).
#[cfg(test)]
#[allow(dead_code)] // every question can be answered; each test sets a few
pub mod asked {
    plain_questions!(asked_fns);
}
