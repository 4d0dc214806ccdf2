//! The networks each test file owns: net N is 10.N.0.0/16 and fd00:N::/32.
//! No two files share one, so two test binaries run side by side (or two
//! runs on one kernel) never see each other's packets under the same
//! address. A unit test reads tests/tests/*.rs for the nets each uses (an
//! address literal `10.N.…` or `fd00:N:…`, and a number passed where a
//! helper takes `net: u8`: `Pair::new("t", 61)`) and fails on a net used
//! by a file the table does not give it to, or given to two files.

/// File (under tests/tests) and the nets it owns.
pub const NETS: &[(&str, &[u8])] = &[
    ("accounting.rs", &[61, 62]),
    ("caps.rs", &[65, 66]),
    ("causes.rs", &[191, 192, 193, 194, 197, 198, 199]),
    // 10.244.7.0/24 inside 244 is tests/src/containerd.rs's pod subnet,
    // every containerd file's (calico, cilium, image, kube_router, pods):
    // they run one after another, on the host as in a guest's one lane
    // (SAME_LANE in xtask/src/vm/guest.rs); conntrack.rs keeps to 10.244.1.
    ("conntrack.rs", &[70, 98, 100, 101, 244]),
    ("conntrack_table.rs", &[251]),
    ("ctnetlink.rs", &[168, 169]),
    ("drop_programs.rs", &[176]),
    ("drops.rs", &[31, 41, 42, 43, 44, 165, 166]),
    ("forwarding.rs", &[81, 82, 83, 84, 85]),
    ("image.rs", &[167]),
    ("incidents_traced.rs", &[1, 106, 245]),
    ("ipv6.rs", &[107, 108, 109, 110, 111]),
    // The fixture's cluster (tests/fixtures/kube-proxy): its rules are
    // restored as written, so its addresses are.
    ("kube_proxy.rs", &[0, 180]),
    ("lifecycle.rs", &[45, 46]),
    ("listeners.rs", &[181, 182, 183, 184, 185, 186]),
    ("monitor.rs", &[141, 142, 143, 144, 146, 147]),
    ("neighbours.rs", &[173, 174, 175]),
    (
        "netfilter.rs",
        &[
            121, 122, 123, 124, 125, 126, 127, 128, 129, 130, 131, 132, 133, 134, 135, 136, 137,
            138,
        ],
    ),
    (
        "nf_fixes.rs",
        &[233, 234, 235, 236, 237, 238, 239, 240, 241, 242, 243, 246],
    ),
    ("nf_verdicts.rs", &[91, 92, 94]),
    // Kubernetes' default Service range, as a cluster has it.
    ("pods.rs", &[96]),
    ("record.rs", &[151, 152, 153]),
    ("route_query.rs", &[154, 155, 156, 157, 158, 159]),
    ("routing.rs", &[51, 52, 56, 57, 58, 231, 232, 249]),
    ("rpfilter6.rs", &[161, 162, 163, 164]),
    ("silent.rs", &[211, 212, 213, 215, 216, 218, 219, 220, 222]),
    ("torture.rs", &[71]),
];

/// Address literals in the tests that are no network of theirs: `kdrop
/// lab rp-filter`'s own pod address, a `--host` argument that must be
/// refused.
#[cfg(test)]
const NOT_OURS: &[(&str, &str)] = &[
    ("lifecycle.rs", "10.0.2.20"),
    ("lifecycle.rs", "10.0.0.0/40"),
];

/// The nets `file` owns (empty for a file that owns none).
pub fn of(file: &str) -> &'static [u8] {
    NETS.iter()
        .find(|(f, _)| *f == file)
        .map_or(&[], |(_, n)| n)
}

/// The arguments of the call or definition whose `(` is at `open`, and
/// the index of its `)`; string literals are skipped whole.
#[cfg(test)]
fn args_at(text: &str, open: usize) -> Option<(Vec<&str>, usize)> {
    let b = text.as_bytes();
    let (mut depth, mut start, mut i, mut args) = (0usize, open + 1, open, Vec::new());
    while i < b.len() {
        match b[i] {
            b'"' => {
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
            }
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' => {
                depth -= 1;
                if depth == 0 {
                    args.push(&text[start..i]);
                    return Some((args, i));
                }
            }
            b',' if depth == 1 => {
                args.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
        i += 1;
    }
    None
}

#[cfg(test)]
fn ident_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// Functions of `text` that take `net: u8`, with its position: `topo`,
/// and `Pair::new` for a `new` (named by the `impl` it is in).
#[cfg(test)]
fn net_fns(text: &str) -> Vec<(String, usize)> {
    let mut out = Vec::new();
    for (at, _) in text.match_indices("fn ") {
        let rest = &text[at + 3..];
        let len = rest.bytes().take_while(|c| ident_char(*c)).count();
        let name = &rest[..len];
        let Some(open) = rest[len..].find('(').map(|o| at + 3 + len + o) else {
            continue;
        };
        if !text[at + 3 + len..open].trim_start().is_empty()
            && !text[at + 3 + len..open].trim_start().starts_with('<')
        {
            continue;
        }
        let Some((params, _)) = args_at(text, open) else {
            continue;
        };
        if params.iter().any(|p| p.contains("self")) {
            continue;
        }
        let Some(pos) = params.iter().position(|p| p.trim() == "net: u8") else {
            continue;
        };
        let name = if name == "new" {
            let Some(imp) = text[..at].rfind("impl ") else {
                continue;
            };
            let ty: String = text[imp + 5..]
                .trim_start()
                .bytes()
                .take_while(|c| ident_char(*c))
                .map(char::from)
                .collect();
            format!("{ty}::new")
        } else {
            name.to_string()
        };
        out.push((name, pos));
    }
    out
}

/// Every net `text` uses: address literals, and numbers given to `fns`.
#[cfg(test)]
fn nets_used(text: &str, fns: &[(String, usize)]) -> Result<Vec<u32>, String> {
    let b = text.as_bytes();
    let mut nets = Vec::new();
    let digits = |from: usize| b[from..].iter().take_while(|c| c.is_ascii_digit()).count();
    for (at, _) in text.match_indices("10.") {
        if at > 0 && (ident_char(b[at - 1]) || b[at - 1] == b'.') {
            continue;
        }
        let n = digits(at + 3);
        let next = b.get(at + 3 + n + 1).copied();
        if (1..=3).contains(&n)
            && b.get(at + 3 + n) == Some(&b'.')
            && (next.is_some_and(|c| c.is_ascii_digit()) || next == Some(b'{'))
        {
            nets.push(text[at + 3..at + 3 + n].parse().unwrap());
        }
    }
    for (at, _) in text.match_indices("fd00:") {
        if at > 0 && (ident_char(b[at - 1]) || b[at - 1] == b':') {
            continue;
        }
        let group: &str = &text[at + 5..];
        let len = group.bytes().take_while(u8::is_ascii_hexdigit).count();
        if len == 0 || group.as_bytes().get(len) != Some(&b':') {
            continue;
        }
        let g = &group[..len];
        if !g.bytes().all(|c| c.is_ascii_digit()) {
            return Err(format!("fd00:{g}: is no net (nets are written in decimal)"));
        }
        nets.push(g.parse().unwrap());
    }
    for (name, pos) in fns {
        for (at, _) in text.match_indices(&format!("{name}(")) {
            if at > 0 && (ident_char(b[at - 1]) || b[at - 1] == b':') {
                continue;
            }
            if text[..at].ends_with("fn ") {
                continue;
            }
            let Some((args, _)) = args_at(text, at + name.len()) else {
                continue;
            };
            if let Some(a) = args.get(*pos).map(|a| a.trim()) {
                if !a.is_empty() && a.bytes().all(|c| c.is_ascii_digit()) {
                    nets.push(a.parse().unwrap());
                }
            }
        }
    }
    for n in &nets {
        if *n > 255 {
            return Err(format!("net {n} is more than a byte"));
        }
    }
    nets.sort_unstable();
    nets.dedup();
    Ok(nets)
}

#[cfg(test)]
mod tests {
    use std::{collections::BTreeMap, path::Path};

    use super::*;

    fn sources(dir: &str) -> BTreeMap<String, String> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
        std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "rs"))
            .map(|p| {
                let name = p.file_name().unwrap().to_str().unwrap().to_string();
                (name, std::fs::read_to_string(&p).unwrap())
            })
            .collect()
    }

    #[test]
    fn no_net_is_given_to_two_files() {
        let mut owner = BTreeMap::new();
        for (file, nets) in NETS {
            for n in *nets {
                if let Some(other) = owner.insert(n, file) {
                    panic!("net {n} is given to both {other} and {file}");
                }
            }
        }
    }

    #[test]
    fn every_file_uses_only_its_own_nets() {
        let lib: Vec<_> = sources("src").values().flat_map(|t| net_fns(t)).collect();
        let files = sources("tests");
        for (file, _) in NETS {
            assert!(files.contains_key(*file), "{file} in NETS is no test file");
        }
        let mut wrong = Vec::new();
        for (file, text) in &files {
            let mut text = text.clone();
            for (f, addr) in NOT_OURS {
                if f == file {
                    text = text.replace(addr, "");
                }
            }
            let mut fns = lib.clone();
            fns.extend(net_fns(&text));
            let used = nets_used(&text, &fns).unwrap_or_else(|e| panic!("{file}: {e}"));
            for n in used {
                if !of(file).iter().any(|m| u32::from(*m) == n) {
                    let who = NETS
                        .iter()
                        .find(|(_, ns)| ns.iter().any(|m| u32::from(*m) == n))
                        .map_or("no file".to_string(), |(f, _)| f.to_string());
                    wrong.push(format!("{file} uses net {n}, allocated to {who}"));
                }
            }
        }
        assert!(
            wrong.is_empty(),
            "nets outside tests/src/nets.rs's table:\n{}",
            wrong.join("\n")
        );
    }

    #[test]
    fn the_scan_finds_literals_and_net_arguments() {
        let text = r#"
            fn lab(test: &str, net: u8) -> Lab { todo!() }
            impl Bridge { fn new(tag: &str, net: u8) -> Self { todo!() } }
            let a = "10.61.0.1"; let b = format!("10.{net}.0.1");
            let c = "fd00:62::1"; let d = "100.67.30.133"; let e = "110.1.2.3";
            let l = lab("t", 63); let p = Pair::new("p", 64); let q = Bridge::new("q", 65);
            let v = Ipv4Addr::new(10, 0, 66, 1); lab("t", net);
        "#;
        let mut fns = net_fns(text);
        fns.push(("Pair::new".into(), 1));
        assert_eq!(nets_used(text, &fns), Ok(vec![61, 62, 63, 64, 65]));
        assert!(nets_used("\"fd00:ab::1\"", &[]).is_err());
    }
}
