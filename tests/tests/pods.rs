//! Pods from a real container runtime: containerd (Debian's package) with
//! its CRI plugin, driven as the kubelet drives it, pods networked by the
//! CNI bridge plugin. A drop inside such a pod names the pod and its
//! container as containerd recorded them, in JSON, text and metrics, and
//! the finding's summary starts with the pod; a connection through a
//! DNAT'd virtual address names its client and backend pods.
use std::{net::SocketAddr, path::PathBuf, process::Command};

use integration_tests::{
    containerd::{Containerd, BUSYBOX_IMAGE, NODE_POD_GW},
    cri::{cart_pod, recorded, ContainerSpec, PodSpec},
    expected_reason_label, reason_for,
    scrape::{http_get, metrics_addr, scrape_until, value},
    send_syn, send_syn_at, Kdrop, EVENT_TIMEOUT,
};

/// A bind mount of containerd's state directory: kdrop's view of it.
struct View {
    path: PathBuf,
    state: PathBuf,
}

impl View {
    fn new(ctd: &Containerd) -> Self {
        let v = View {
            path: ctd.dir.join("kdrop-view"),
            state: ctd.state(),
        };
        std::fs::create_dir_all(&v.path).unwrap();
        v.show();
        v
    }

    fn show(&self) {
        let ok = Command::new("mount")
            .arg("--bind")
            .arg(&self.state)
            .arg(&self.path)
            .status()
            .unwrap();
        assert!(ok.success());
    }

    /// Containerd's own state is untouched; only this view goes (the
    /// Containerd guard unmounts whatever is left under its directory).
    fn hide(&self) {
        let ok = Command::new("umount").arg(&self.path).status().unwrap();
        assert!(ok.success());
    }
}

#[test]
fn drops_in_a_cri_pod_name_the_pod_and_its_container() {
    let ctd = Containerd::start("pods");
    ctd.import_test_images();
    let mut cri = ctd.cri();
    let (pod, container_id) = cart_pod(&mut cri);
    let r = recorded(&mut cri, &pod, &container_id);
    assert_eq!(r.pod, "shop/cart-7d9f5c8b6-x2kqp");
    assert_eq!(r.container, "cart");

    // kdrop on the node, as root, told where this containerd keeps state
    // (through a view of it the test can take away).
    let view = View::new(&ctd);
    let state = view.path.display().to_string();
    let env = [("KDROP_RUNTIME_DIRS", state.as_str())];
    let json = Kdrop::start_env(&["--json", "-p", "8081", "-p", "8082"], &env);
    let text = Kdrop::start_env(&["-p", "8081"], &env);
    let mon = Kdrop::start_env(&["monitor", "-p", "8081", "--listen", "127.0.0.1:0"], &env);

    // A SYN from the node to a port nobody in the pod listens on: the
    // pod's kernel drops it (NO_SOCKET) in the pod's namespace.
    let src: SocketAddr = format!("{NODE_POD_GW}:46801").parse().unwrap();
    let dst: SocketAddr = format!("{}:8081", r.ip).parse().unwrap();
    let _syn = send_syn(&ctd.node, src, dst);

    let e = json.expect_record("the SYN dropped in the pod", |e| e.sport == 46801);
    assert_eq!(e.netns, u64::from(r.netns));
    assert_eq!(e.reason.as_deref(), reason_for("NO_SOCKET"));
    assert_eq!(e.pod.as_deref(), Some(r.pod.as_str()), "{e}");
    assert_eq!(e.container.as_deref(), Some(r.container.as_str()), "{e}");
    // The node's address is no pod's.
    assert!(e.client_pod.is_none(), "{e}");
    assert_eq!(e.backend_pod.as_deref(), Some(r.pod.as_str()), "{e}");
    let summary = e.finding().summary.as_str();
    assert!(
        summary.starts_with(&format!("pod {}: ", r.pod)),
        "{summary}"
    );

    let headline = std::iter::from_fn(|| text.next_line(EVENT_TIMEOUT))
        .find(|l| l.contains(":46801 -> "))
        .expect("a text headline for the SYN");
    assert!(
        headline.contains(&format!(
            " pod={} container={} if=eth0 ",
            r.pod, r.container
        )),
        "{headline}"
    );

    let addr = metrics_addr(&mon);
    let m = scrape_until(
        || http_get(addr, "/metrics"),
        "the pod's drop",
        |m| value(m, "kdrop_drops_total", &[("pod", &r.pod)]).is_some(),
    );
    let labels = [
        ("reason", expected_reason_label("NO_SOCKET")),
        ("pod", r.pod.as_str()),
        ("container", r.container.as_str()),
        ("ifname", "eth0"),
        ("port", "8081"),
    ];
    assert_eq!(value(&m, "kdrop_drops_total", &labels), Some(1), "{m}");
    // A flood from the pod costs no lookups: the answer is cached per
    // namespace. kdrop's view of the runtime's records goes away, and
    // every drop of the burst still names the pod (a lookup now would find
    // only the cgroup path, the pod's UID).
    view.hide();
    let burst: Vec<_> = (0..100)
        .map(|i| {
            let src: SocketAddr = format!("{NODE_POD_GW}:{}", 47000 + i).parse().unwrap();
            send_syn(&ctd.node, src, dst)
        })
        .collect();
    for i in 0..100 {
        let e = json.expect_record("the burst", |e| e.sport == 47000 + i);
        assert_eq!(e.pod.as_deref(), Some(r.pod.as_str()), "{e}");
        assert_eq!(e.container.as_deref(), Some(r.container.as_str()), "{e}");
    }
    drop(burst);
    view.show();

    // A pod of two containers: both share its namespace, both are named.
    let db = cri.run_pod(&PodSpec {
        namespace: "data".into(),
        name: "db-0".into(),
        uid: "7e2f0c1d-3b4a-4c5d-9e8f-1a2b3c4d5e6f".into(),
        labels: vec![("app".into(), "db".into())],
        host_network: false,
        host_pid: false,
    });
    let mut names = Vec::new();
    for name in ["postgres", "metrics"] {
        let id = cri.start_container(
            &db,
            &ContainerSpec {
                name: name.into(),
                image: BUSYBOX_IMAGE.into(),
                args: vec!["sleep".into(), "600".into()],
                ..Default::default()
            },
        );
        names.push(cri.container_name(&id));
    }
    names.sort();
    let (meta, db_ip, _) = cri.pod_status(&db.id);
    let src: SocketAddr = format!("{NODE_POD_GW}:46804").parse().unwrap();
    let _syn = send_syn(&ctd.node, src, format!("{db_ip}:8081").parse().unwrap());
    let e = json.expect_record("the SYN dropped in the db pod", |e| e.sport == 46804);
    assert_eq!(
        e.pod.as_deref(),
        Some(format!("{}/{}", meta.namespace, meta.name).as_str()),
        "{e}"
    );
    assert_eq!(
        e.container.as_deref(),
        Some(names.join(",").as_str()),
        "{e}"
    );

    // A Service's virtual address, DNAT'd on the node to the db pod as
    // kube-proxy's rules do: port 3306 to 8081, which the node then drops
    // (FORWARD, as a network policy would), and 3307 to 8082, where
    // nobody listens in the pod.
    let db_pod = format!("{}/{}", meta.namespace, meta.name);
    let vip = "10.96.0.10";
    for rule in [
        format!("-t nat -A PREROUTING -d {vip}/32 -p tcp --dport 3306 -j DNAT --to-destination {db_ip}:8081"),
        format!("-t nat -A PREROUTING -d {vip}/32 -p tcp --dport 3307 -j DNAT --to-destination {db_ip}:8082"),
        format!("-A FORWARD -d {db_ip}/32 -p tcp --dport 8081 -j DROP"),
    ] {
        let args: Vec<&str> = rule.split(' ').collect();
        ctd.node.exec("iptables", &args).unwrap();
    }
    let from_cart = |port: u16, vip_port: u16| {
        let src: SocketAddr = format!("{}:{port}", r.ip).parse().unwrap();
        let dst: SocketAddr = format!("{vip}:{vip_port}").parse().unwrap();
        send_syn_at(&r.netns_path, src, dst)
    };
    // Dropped on the node, after the DNAT: no pod's namespace, both
    // pods named from the conntrack entry's addresses.
    let _syn = from_cart(46810, 3306);
    let e = json.expect_record("the DNAT'd SYN dropped on the node", |e| e.sport == 46810);
    assert_eq!(e.daddr, db_ip.as_str(), "{e}");
    assert!(e.pod.is_none(), "{e}");
    assert_eq!(e.client_pod.as_deref(), Some(r.pod.as_str()), "{e}");
    assert_eq!(e.backend_pod.as_deref(), Some(db_pod.as_str()), "{e}");
    let summary = e.finding().summary.as_str();
    assert!(
        summary.starts_with(&format!("pod {} → pod {db_pod}: ", r.pod)),
        "{summary}"
    );
    // Refused in the backend pod: it leads, the client follows.
    let _syn = from_cart(46811, 3307);
    let e = json.expect_record("the DNAT'd SYN dropped in the db pod", |e| e.sport == 46811);
    assert_eq!(e.pod.as_deref(), Some(db_pod.as_str()), "{e}");
    assert_eq!(e.client_pod.as_deref(), Some(r.pod.as_str()), "{e}");
    let summary = e.finding().summary.as_str();
    assert!(
        summary.starts_with(&format!("pod {db_pod}, from pod {}: ", r.pod)),
        "{summary}"
    );

    for k in [json, text, mon] {
        let done = k.stop(libc::SIGTERM);
        assert!(done.status.success(), "{done:?}");
    }
}
