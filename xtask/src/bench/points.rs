//! The points kdrop attaches, read from its own readiness line, and a
//! bpftrace program on the same points: when kdrop changes what it
//! attaches, the comparison follows.
use anyhow::{bail, Result};

/// One attachment from `kdrop: tracing skb:kfree_skb via tp_btf, ...`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Point {
    /// `skb:kfree_skb`, or a function such as `fib_validate_source (return)`.
    pub name: String,
    /// `tp_btf`, `raw_tp`, `tracepoint`, `fexit`, `kretprobe`, ...
    pub rung: String,
}

/// Every `NAME via RUNG` of a readiness line; the rest (namespaces, ports,
/// conntrack events, the monitor's address) is not an attachment.
pub fn parse(line: &str) -> Vec<Point> {
    let rest = line.split_once("kdrop: tracing ").map_or(line, |(_, r)| r);
    // The monitor's `(monitor: ...)` tail holds commas of its own.
    let rest = rest.split_once(" (monitor").map_or(rest, |(r, _)| r);
    // `; on demand: ...` lists points attached only when a drop asks for
    // their evidence: healthy traffic never meets them.
    let rest = rest.split_once("; ").map_or(rest, |(r, _)| r);
    rest.split(", ")
        .filter_map(|item| {
            let (name, after) = item.split_once(" via ")?;
            let rung = after.split_whitespace().next()?;
            Some(Point {
                name: name.trim().to_string(),
                rung: rung.to_string(),
            })
        })
        .collect()
}

/// bpftrace's probe for one point. A tracepoint is a classic tracepoint
/// whichever way kdrop attached it: Debian 12's bpftrace (0.17) has no raw
/// tracepoints ("Invalid probe type") and its kfunc needs fentry, which
/// this kernel refuses; the classic path fills the tracepoint's record
/// before the program runs, which tp_btf does not. A function's return is
/// kretfunc or kretprobe, as kdrop's rung was.
fn probe(p: &Point) -> Result<String> {
    let func = p.name.strip_suffix(" (return)");
    match (p.rung.as_str(), p.name.split_once(':'), func) {
        ("tp_btf" | "raw_tp" | "tracepoint", Some((cat, event)), _) => {
            Ok(format!("tracepoint:{cat}:{event}"))
        }
        ("fexit", _, Some(f)) => Ok(format!("kretfunc:{f}")),
        ("kretprobe", _, Some(f)) => Ok(format!("kretprobe:{f}")),
        ("fentry", _, None) => Ok(format!("kfunc:{}", p.name)),
        ("kprobe", _, None) => Ok(format!("kprobe:{}", p.name)),
        _ => bail!("no bpftrace probe for {} via {}", p.name, p.rung),
    }
}

/// A bpftrace program counting calls of every point in the kernel, per
/// point; prints `ready` once attached.
pub fn bpftrace(points: &[Point]) -> Result<String> {
    if points.is_empty() {
        bail!("kdrop's readiness line names no point");
    }
    let probes = points.iter().map(probe).collect::<Result<Vec<_>>>()?;
    Ok(format!(
        "BEGIN {{ printf(\"ready\\n\") }} {} {{ @[probe] = count(); }}",
        probes.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn on_demand_points_are_not_attachments() {
        let p = parse(
            "kdrop: tracing skb:kfree_skb via tp_btf, tcp:tcp_retransmit_skb via tp_btf; \
             on demand: fib:fib_table_lookup via tp_btf (routes), conntrack destroy events in 1 namespace",
        );
        let names: Vec<&str> = p.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["skb:kfree_skb", "tcp:tcp_retransmit_skb"]);
        assert!(p.iter().all(|p| p.rung == "tp_btf"), "{p:?}");
    }

    #[test]
    fn points_of_readiness_lines() {
        let p = parse(
            "kdrop: tracing skb:kfree_skb via tp_btf, fib:fib_table_lookup via tp_btf, \
             net:net_dev_queue via raw_tp, conntrack destroy events in 2 namespaces",
        );
        let names: Vec<&str> = p.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(
            names,
            ["skb:kfree_skb", "fib:fib_table_lookup", "net:net_dev_queue"]
        );
        assert_eq!(p[2].rung, "raw_tp");
        // The flood's form, and the monitor's.
        let p = parse("kdrop: tracing skb:kfree_skb via tracepoint in netns n1, port 8080");
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].rung, "tracepoint");
        let p = parse(
            "kdrop: tracing skb:kfree_skb via tp_btf, fib_validate_source (return) via fexit \
             (monitor: metrics on http://127.0.0.1:1/metrics; events: 1 in 1 drops, at most 100/s per CPU)",
        );
        assert_eq!(p[1].name, "fib_validate_source (return)");
        assert_eq!(
            bpftrace(&p).unwrap(),
            "BEGIN { printf(\"ready\\n\") } tracepoint:skb:kfree_skb, kretfunc:fib_validate_source \
             { @[probe] = count(); }"
        );
        assert!(bpftrace(&parse("kdrop: tracing x via uprobe")).is_err());
        assert!(bpftrace(&[]).is_err());
    }
}
