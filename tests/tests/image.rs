//! The image `cargo xtask image` builds, run as the kubelet would run
//! deploy/base/daemonset.yaml's pod: through containerd's CRI, with the
//! DaemonSet's security context (non-root, its capabilities only,
//! read-only root), host network and PID namespaces and its host mounts.
//! Inside it kdrop traces drops provoked in a pod containerd created and
//! in a test namespace, names the pod as containerd recorded it and serves
//! /metrics, which a real Prometheus scrapes and the Grafana dashboard's
//! queries read.
use std::{
    net::SocketAddr,
    path::PathBuf,
    time::{Duration, Instant},
};

use integration_tests::{
    bound,
    caps::{cap_bit, memlock},
    containerd::{Containerd, NODE_POD_GW},
    cri::{cart_pod, recorded, Cri, Pod},
    expected_reason_label,
    manifest::{daemonset_pod, deploy_dir},
    prom::Prometheus,
    scrape::{http_get_in, scrape_until, value},
    send_syn, Pair, Record,
};
use serde_json::Value;

/// The OCI archive `cargo xtask image` (and `cargo xtask test`) writes.
fn image_archive() -> PathBuf {
    let path = std::env::var_os("KDROP_IMAGE")
        .map(PathBuf::from)
        .unwrap_or_else(|| deploy_dir().join("../target/image/kdrop.oci.tar"));
    assert!(
        path.exists(),
        "{} missing: build it with `cargo xtask image` (cargo xtask test does)",
        path.display()
    );
    path
}

/// The contents of a container's CRI log lines (`<time> <stream> <tag> <text>`).
fn log_lines(cri: &Cri, pod: &Pod, container: &str) -> Vec<String> {
    std::fs::read_to_string(cri.log_path(pod, container))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.splitn(4, ' ').nth(3).map(str::to_string))
        .collect()
}

/// Waits for a log line `want` accepts (the log file is the container's
/// only output; kdrop writes its readiness line there), failing early if
/// the container exits.
fn wait_log(cri: &mut Cri, pod: &Pod, id: &str, what: &str, want: impl Fn(&str) -> bool) -> String {
    let limit = bound(Duration::from_secs(20));
    let deadline = Instant::now() + limit;
    loop {
        let lines = log_lines(cri, pod, "kdrop");
        if let Some(l) = lines.iter().find(|l| want(l)) {
            return l.clone();
        }
        let running = cri.container_running(id);
        assert!(
            running && Instant::now() < deadline,
            "{what}: not within {limit:?} (running: {running}); kdrop's log:\n{}",
            lines.join("\n")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn the_image_runs_as_the_daemonset_and_names_a_pods_drop() {
    let archive = image_archive();
    let ctd = Containerd::start("image");
    ctd.import_test_images();
    ctd.import(&archive);
    let mut cri = ctd.cri();
    let (cart, cart_id) = cart_pod(&mut cri);
    let r = recorded(&mut cri, &cart, &cart_id);
    // A namespace of the test's on the node, there before kdrop starts (a
    // series' labels are fixed when kdrop first sees it).
    let pair = Pair::new("img", 167);

    // The node's address (status.hostIP) is its address on the pod network
    // here; the runtime's state is under the test's directory, not /run.
    let task_dir = ctd.state().join("io.containerd.runtime.v2.task");
    let task_dir = task_dir.to_str().unwrap();
    let (pod_spec, mut container) = daemonset_pod(
        (
            "kdrop",
            "kdrop-x7k2p",
            "9c1d2e3f-4a5b-4c6d-8e7f-0a1b2c3d4e5f",
        ),
        NODE_POD_GW,
        &[("/run/containerd/io.containerd.runtime.v2.task", task_dir)],
    );
    assert!(pod_spec.host_network && pod_spec.host_pid, "{pod_spec:?}");
    if !integration_tests::kernel_at_least(5, 11) {
        // Maps are charged to RLIMIT_MEMLOCK before 5.11 (64 KiB in this
        // runtime's containers): the README says to add SYS_RESOURCE to
        // the manifest's list there, the image unchanged. (Without it kdrop
        // names the limit and exits: caps.rs.)
        container.cap_add.push("SYS_RESOURCE".into());
    }
    let kdrop_pod = cri.run_pod(&pod_spec);
    let kdrop_id = cri.start_container(&kdrop_pod, &container);
    let ready = wait_log(&mut cri, &kdrop_pod, &kdrop_id, "kdrop: tracing", |l| {
        l.starts_with("kdrop: tracing")
    });
    let listen = format!("{NODE_POD_GW}:9464");
    assert!(
        ready.contains(&format!("http://{listen}/metrics")),
        "{ready}"
    );

    // The process is what the DaemonSet asks for: user 65534, exactly its
    // capabilities, a read-only root.
    let pid = cri.container_pid(&kdrop_id);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |k: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(k))
            .map(|v| v.trim().to_string())
            .unwrap()
    };
    assert!(field("Uid:").starts_with("65534\t65534"), "{status}");
    let want: u64 = container.cap_add.iter().map(|c| cap_bit(c)).sum();
    assert_eq!(
        u64::from_str_radix(&field("CapEff:"), 16).unwrap(),
        want,
        "{:?}: {status}",
        container.cap_add
    );
    assert_eq!(u64::from_str_radix(&field("CapBnd:"), 16).unwrap(), want);
    if container.cap_add.iter().any(|c| c == "SYS_RESOURCE") {
        assert_eq!(memlock(pid), ["unlimited", "unlimited"]);
    }
    let mountinfo = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    let root = mountinfo
        .lines()
        .find(|l| l.split(' ').nth(4) == Some("/"))
        .expect("a root mount");
    assert!(
        root.split(' ')
            .nth(5)
            .unwrap()
            .split(',')
            .any(|o| o == "ro"),
        "{root}"
    );

    // Drops: a SYN into the pod (NO_SOCKET in the pod's namespace), and one
    // in a namespace of the test's own on the node.
    let to_pod = send_syn(
        &ctd.node,
        format!("{NODE_POD_GW}:46802").parse().unwrap(),
        format!("{}:8082", r.ip).parse().unwrap(),
    );
    let in_ns = send_syn(&pair.client, pair.client_v4(46803), pair.server_v4(8083));

    let metrics: SocketAddr = listen.parse().unwrap();
    let node = ctd.node.path();
    let reason = expected_reason_label("NO_SOCKET");
    let m = scrape_until(
        || http_get_in(&node, metrics, "/metrics"),
        "both drops",
        |m| {
            value(
                m,
                "kdrop_drops_total",
                &[("port", "8082"), ("reason", reason)],
            )
            .is_some()
                && value(
                    m,
                    "kdrop_drops_total",
                    &[("port", "8083"), ("reason", reason)],
                )
                .is_some()
        },
    );
    // The pod's namespace is named by the runtime's pin under /run/netns.
    let netns_name = std::fs::read_dir("/run/netns")
        .unwrap()
        .flatten()
        .find(|e| kdrop::context::netns::inode_of(&e.path()).ok() == Some(r.netns))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .expect("the pod's pinned namespace");
    let pod_labels = [
        ("reason", reason),
        ("netns", netns_name.as_str()),
        ("pod", r.pod.as_str()),
        ("container", r.container.as_str()),
        ("port", "8082"),
    ];
    assert_eq!(value(&m, "kdrop_drops_total", &pod_labels), Some(1), "{m}");
    let ns_labels = [
        ("reason", reason),
        ("netns", pair.server.name.as_str()),
        ("pod", ""),
        ("container", ""),
        ("port", "8083"),
    ];
    assert_eq!(value(&m, "kdrop_drops_total", &ns_labels), Some(1), "{m}");

    // The detailed event, a JSON line on kdrop's stdout (the container log).
    let line = wait_log(
        &mut cri,
        &kdrop_pod,
        &kdrop_id,
        "the pod's JSON event",
        |l| l.starts_with('{') && l.contains("\"sport\":46802"),
    );
    let e = Record::parse(&line);
    assert_eq!(
        (e.pod.as_deref(), e.container.as_deref()),
        (Some(r.pod.as_str()), Some(r.container.as_str()))
    );
    assert_eq!(e.netns, u64::from(r.netns));
    // The pod found by its address too, without setns or ptrace: through
    // the sandbox's pid containerd wrote and /proc/PID/net.
    assert_eq!(e.backend_pod.as_deref(), Some(r.pod.as_str()), "{e}");
    let summary = e.finding().summary.as_str();
    assert!(
        summary.starts_with(&format!("pod {}: ", r.pod)),
        "{summary}"
    );
    drop((to_pod, in_ns));

    dashboard_queries_return_series(&ctd, metrics);
}

/// Every query of the Grafana dashboard, run by a real Prometheus scraping
/// the kdrop of this test, returns series (its variables at "All").
fn dashboard_queries_return_series(ctd: &Containerd, metrics: SocketAddr) {
    let prom = Prometheus::start(&ctd.node, metrics, "127.0.0.1:9090".parse().unwrap());
    let path = deploy_dir().join("monitoring/dashboard.json");
    let dash: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let mut queries: Vec<String> = dash["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .map(|t| t["expr"].as_str().expect("a PromQL expr").to_string())
        .collect();
    assert!(queries.len() >= 5, "{queries:?}");
    // The node variable's own query, as Grafana runs it (label_values is
    // Grafana's: the series it reads must exist).
    let var = dash["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "node")
        .expect("a node variable");
    let metric = var["definition"]
        .as_str()
        .and_then(|d| d.strip_prefix("label_values("))
        .and_then(|d| d.split(',').next())
        .expect("label_values(<metric>, node)");
    queries.push(metric.to_string());
    for q in queries {
        let q = q
            .replace("$__rate_interval", "1m")
            .replace("$node", var["allValue"].as_str().unwrap());
        let series = prom.series_of(&q);
        println!("{q}: {} series", series.len());
    }
}

/// The archive is one manifest list with an image per architecture, each
/// holding kdrop built for that architecture (its ELF header's machine,
/// include/uapi/linux/elf-em.h), with the DaemonSet's file capabilities.
#[test]
fn the_image_is_one_manifest_list_for_amd64_and_arm64() {
    let dir = std::env::temp_dir().join(format!("kdrop-oci-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let tar = |args: &[&str]| {
        let out = std::process::Command::new("tar")
            .args(args)
            .current_dir(&dir)
            .output()
            .unwrap();
        assert!(out.status.success(), "tar {args:?}: {out:?}");
    };
    tar(&["-xf", image_archive().to_str().unwrap()]);
    let manifest_caps = daemonset_pod(("k", "k", "u"), NODE_POD_GW, &[]).1.cap_add;
    let blob = |digest: &str| {
        let hex = digest.strip_prefix("sha256:").unwrap();
        dir.join("blobs/sha256").join(hex)
    };
    let json =
        |p: PathBuf| -> Value { serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap() };
    let top = json(dir.join("index.json"));
    let list = json(blob(top["manifests"][0]["digest"].as_str().unwrap()));
    assert_eq!(
        list["mediaType"], "application/vnd.oci.image.index.v1+json",
        "{list}"
    );
    let mut arches = Vec::new();
    for m in list["manifests"].as_array().unwrap() {
        let arch = m["platform"]["architecture"].as_str().unwrap().to_string();
        assert_eq!(m["platform"]["os"], "linux", "{m}");
        let manifest = json(blob(m["digest"].as_str().unwrap()));
        let layers = manifest["layers"].as_array().unwrap();
        assert_eq!(layers.len(), 1, "{manifest}");
        let layer = blob(layers[0]["digest"].as_str().unwrap());
        let out = dir.join(&arch);
        std::fs::create_dir_all(&out).unwrap();
        tar(&[
            "--xattrs",
            "--xattrs-include=security.capability",
            "-xf",
            layer.to_str().unwrap(),
            "-C",
            out.to_str().unwrap(),
        ]);
        let bin = out.join("usr/local/bin/kdrop");
        let elf = std::fs::read(&bin).unwrap();
        let machine = u16::from_le_bytes([elf[18], elf[19]]);
        let want = match arch.as_str() {
            "amd64" => 62,
            "arm64" => 183,
            other => panic!("an image for {other}"),
        };
        assert_eq!(machine, want, "{arch}'s kdrop");
        let caps = std::process::Command::new("getcap")
            .arg(&bin)
            .output()
            .unwrap();
        let caps = String::from_utf8_lossy(&caps.stdout);
        // The list and SYS_RESOURCE, permitted only (no effective bit: a
        // pod not granted SYS_RESOURCE could not exec it).
        let (_, set) = caps.trim().rsplit_once(' ').unwrap();
        let (names, flags) = set.split_once('=').unwrap();
        assert_eq!(flags, "p", "{arch}: {caps}");
        let mut names: Vec<&str> = names.split(',').collect();
        names.sort_unstable();
        let mut want: Vec<String> = manifest_caps
            .iter()
            .chain(std::iter::once(&"SYS_RESOURCE".to_string()))
            .map(|c| format!("cap_{}", c.to_ascii_lowercase()))
            .collect();
        want.sort_unstable();
        assert_eq!(names, want, "{arch}: {caps}");
        arches.push(arch);
    }
    arches.sort();
    assert_eq!(arches, ["amd64", "arm64"]);
    let _ = std::fs::remove_dir_all(&dir);
}
