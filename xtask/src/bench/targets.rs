//! The healthy-traffic targets (issue 12), judged on the median ratio per
//! CPU second (the lead figure), with the wall-clock median alongside.
use super::{measure::Sample, report::spread, variants::Variant};

/// kdrop variant, the least median ratio it must reach, and on which
/// workloads (empty: all).
const TARGETS: &[(&str, f64, &[&str])] = &[
    ("mon", 0.99, &[]),
    ("kd-none", 0.98, &[]),
    ("kd-match", 0.95, &["h2"]),
];
/// What kdrop must do at least as well as.
const OTHERS: &[&str] = &["bt-kfree", "bt-points", "tcpdump"];

fn medians(rows: &[(&Variant, &Vec<Sample>)], key: &str) -> Option<(f64, f64)> {
    let (_, xs) = rows.iter().find(|(v, _)| v.key == key)?;
    let cpu = spread(xs.iter().map(|x| x.ratio_cpu).collect())?.1;
    let wall = spread(xs.iter().map(|x| x.ratio).collect())?.1;
    Some((cpu, wall))
}

fn verdict(got: f64, want: f64) -> String {
    if got >= want {
        "met".into()
    } else {
        format!("MISSED by {:.2}", want - got)
    }
}

pub fn verdicts(workload: &str, rows: &[(&Variant, &Vec<Sample>)]) -> String {
    let mut s =
        String::from("\ntargets (median ratio per CPU s; wall-clock median in brackets):\n");
    for (key, want, only) in TARGETS {
        if !only.is_empty() && !only.contains(&workload) {
            continue;
        }
        let Some((v, _)) = rows.iter().find(|(v, _)| v.key == *key) else {
            continue;
        };
        let line = match medians(rows, key) {
            Some((cpu, wall)) => format!(
                "{cpu:.2} [{wall:.2}]: {} [{}]",
                verdict(cpu, *want),
                verdict(wall, *want)
            ),
            None => "not measured".into(),
        };
        s.push_str(&format!("  ({key}) {} >= {want:.2}: {line}\n", v.label));
    }
    for (key, _, only) in TARGETS {
        if !only.is_empty() && !only.contains(&workload) {
            continue;
        }
        let Some((cpu, wall)) = medians(rows, key) else {
            continue;
        };
        let against: Vec<String> = OTHERS
            .iter()
            .filter_map(|o| {
                let (ocpu, owall) = medians(rows, o)?;
                Some(format!(
                    "({o}) {ocpu:.2} [{owall:.2}]: {} [{}]",
                    if cpu >= ocpu { "met" } else { "MISSED" },
                    if wall >= owall { "met" } else { "MISSED" }
                ))
            })
            .collect();
        if !against.is_empty() {
            s.push_str(&format!(
                "  ({key}) {cpu:.2} [{wall:.2}] at least as good as {}\n",
                against.join(", ")
            ));
        }
    }
    s
}
