//! The questions enrichment asks the node whose answer is plain data, in
//! one list: each one's name (the first element of its key in a bundle,
//! `["ifname", netns, ifindex]`), its arguments (the rest of the key) and
//! its answer, with what a node that does not know answers (a replayed
//! bundle recorded by a kdrop that never asked it). `Recorder` and
//! `Replay` are written from this list (`plain_questions!(their_macro)`),
//! so a key is spelt once and a question they lack does not compile. The
//! questions whose answers are large shared objects (routing contexts,
//! netfilter snapshots, kube-proxy's Services) are kept as blobs and
//! written out by hand in both.

/// Calls `$m!` with every plain question:
/// `name(arg: Type, ...) -> Answer = answer when unknown;`.
macro_rules! plain_questions {
    ($m:ident) => {
        $m! {
            netns(inode: u32) -> Option<crate::context::NetnsName> = None;
            ifname(netns: u32, ifindex: u32) -> String = format!("if{ifindex}");
            reply_holder(netns: u32, reply: &crate::model::packet::Tuple) -> Option<String> = None;
            reverse_route(
                netns: u32,
                src: std::net::Ipv4Addr,
                dst: std::net::Ipv4Addr,
                mark: u32,
                src_valid_mark: bool
            ) -> Option<(crate::model::routing::RouteQuery, crate::model::routing::RouteLookup)> = None;
            route_get(netns: u32, q: &crate::model::routing::RouteQuery)
                -> Option<crate::model::routing::RouteLookup> = None;
            neighbour(netns: u32, ifindex: u32, addr: std::net::IpAddr)
                -> Option<crate::model::neighbour::Neighbour> = None;
            neighbours_with(netns: u32, ifindex: u32, lladdr: [u8; 6])
                -> Option<Vec<crate::model::neighbour::Neighbour>> = None;
            route_out(netns: u32, dst: std::net::IpAddr) -> Option<u32> = None;
            conntrack_find(
                side: crate::context::conntrack_lookup::Side,
                t: &crate::model::packet::Tuple,
                netns: Option<u32>
            ) -> Option<crate::model::packet::CtSeen> = None;
            conntrack_from(netns: u32, client: std::net::SocketAddr)
                -> Vec<crate::model::packet::CtSeen> = Vec::new();
            waiting_for(netns: u32, local: std::net::SocketAddr)
                -> Option<std::net::SocketAddr> = None;
            br_netfilter_loaded() -> bool = false;
            symbol(addr: u64) -> Option<String> = None;
            pod(netns: u32) -> Option<crate::model::pod::Pod> = None;
            pod_of_addr(addr: std::net::IpAddr) -> Option<crate::model::pod::Pod> = None;
            pod_labels(pod: &crate::model::pod::PodId)
                -> Result<crate::model::pod::Labels, String>
                = Err("the recording holds no answer of the runtime".into());
            service(netns: u32, addr: std::net::SocketAddr) -> Option<String> = None;
            listener(near: u32, dst: std::net::SocketAddr)
                -> Option<crate::model::listen::ListenerFound> = None;
            listen_spaces(ports: &[u16]) -> Vec<u32> = Vec::new();
            listen_counters(netns: u32) -> Option<crate::model::listen::ListenCounters> = None;
            listeners_of(netns: u32, ports: &[u16])
                -> Vec<crate::model::listen::ListenerFound> = Vec::new();
            request_pending(netns: u32, local: std::net::SocketAddr, remote: std::net::SocketAddr)
                -> Option<bool> = None;
            hook_programs(netns: u32, ifindex: u32, hook: &str)
                -> Option<crate::model::progs::HookProgs> = None;
            cgroup_programs(netns: u32, local: std::net::SocketAddr, hook: &str)
                -> Option<crate::model::progs::CgroupProgs> = None;
        }
    };
}

pub(crate) use plain_questions;
