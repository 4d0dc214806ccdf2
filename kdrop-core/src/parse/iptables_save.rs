//! `iptables-save -c` (legacy or nft, IPv4 or IPv6) into [`Table`]s. The
//! save format is what `iptables-restore` reads back, so it is stable and
//! exact: `*table`, `:CHAIN POLICY [packets:bytes]`, `[packets:bytes] -A
//! CHAIN <spec>`, `COMMIT`.
use std::net::IpAddr;

use crate::model::netfilter::{
    Backend, BaseChain, Chain, CtState, Dir, Family, Hook, Match, Policy, Rule, Table, Verdict,
    PROTO_TCP,
};

/// Parses one tool's whole output.
pub fn parse_save(
    text: &str,
    backend: Backend,
    family: Family,
    source: &str,
) -> Result<Vec<Table>, String> {
    let mut tables = Vec::new();
    let mut current: Option<Table> = None;
    for (n, raw) in text.lines().enumerate() {
        let line = raw.trim();
        let bad = |what: &str| format!("{source} line {}: {what}: {line:?}", n + 1);
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(name) = line.strip_prefix('*') {
            if current.is_some() {
                return Err(bad("table without COMMIT before it"));
            }
            current = Some(Table {
                backend,
                family,
                name: name.to_string(),
                chains: Vec::new(),
                source: source.to_string(),
            });
            continue;
        }
        let Some(table) = current.as_mut() else {
            return Err(bad("outside a table"));
        };
        if line == "COMMIT" {
            tables.extend(current.take());
        } else if let Some(decl) = line.strip_prefix(':') {
            let chain = parse_chain_decl(&table.name, decl).ok_or_else(|| bad("bad chain"))?;
            table.chains.push(chain);
        } else {
            let (packets, spec) = split_counters(line).ok_or_else(|| bad("bad counters"))?;
            let toks = tokenize(spec).ok_or_else(|| bad("unbalanced quotes"))?;
            let chain_name = match toks.as_slice() {
                [a, c, ..] if a.text == "-A" => c.text.clone(),
                _ => return Err(bad("not an -A rule")),
            };
            let rule = parse_rule(spec, &toks[2..], packets, table);
            let chain = table
                .chains
                .iter_mut()
                .find(|c| c.name == chain_name)
                .ok_or_else(|| bad("rule for an undeclared chain"))?;
            chain.rules.push(rule);
        }
    }
    if current.is_some() {
        return Err(format!("{source}: output ends inside a table"));
    }
    Ok(tables)
}

/// `INPUT ACCEPT [12:3456]` or `KUBE-SERVICES - [0:0]`.
fn parse_chain_decl(table: &str, decl: &str) -> Option<Chain> {
    let mut parts = decl.split_whitespace();
    let name = parts.next()?.to_string();
    let policy = parts.next()?;
    let packets = parts.next().and_then(|c| parse_counters(c).map(|(p, _)| p));
    let base = match policy {
        "-" => None,
        p => {
            let hook = Hook::parse(&name)?;
            Some(BaseChain {
                hook,
                priority: table_priority(table, hook),
                policy: if p == "DROP" {
                    Policy::Drop
                } else {
                    Policy::Accept
                },
                policy_packets: packets,
            })
        }
    };
    Some(Chain {
        name,
        base,
        rules: Vec::new(),
    })
}

/// Where iptables registers its tables (NF_IP_PRI_*, include/uapi/linux/
/// netfilter_ipv4.h; the same for IPv6 and for iptables-nft's base chains).
pub fn table_priority(table: &str, hook: Hook) -> i32 {
    match (table, hook) {
        ("raw", _) => -300,
        ("mangle", _) => -150,
        ("nat", Hook::Prerouting | Hook::Output) => -100,
        ("nat", _) => 100,
        ("security", _) => 50,
        _ => 0,
    }
}

/// `[12:3456]` → (12, 3456).
fn parse_counters(s: &str) -> Option<(u64, u64)> {
    let inner = s.strip_prefix('[')?.strip_suffix(']')?;
    let (p, b) = inner.split_once(':')?;
    Some((p.parse().ok()?, b.parse().ok()?))
}

/// `[12:3456] -A INPUT ...` → (Some(12), "-A INPUT ..."); without `-c` the
/// counters are absent.
fn split_counters(line: &str) -> Option<(Option<u64>, &str)> {
    if line.starts_with('[') {
        let end = line.find(']')?;
        let (p, _) = parse_counters(&line[..=end])?;
        Some((Some(p), line[end + 1..].trim_start()))
    } else {
        Some((None, line))
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tok {
    pub text: String,
    /// Written in quotes: always an argument, never an option.
    pub quoted: bool,
}

/// Splits like iptables-save quotes: `"..."` with `\"` and `\\` inside.
pub fn tokenize(s: &str) -> Option<Vec<Tok>> {
    let mut out = Vec::new();
    let mut chars = s.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let Some(&c) = chars.peek() else { break };
        let mut text = String::new();
        let quoted = c == '"';
        if quoted {
            chars.next();
            loop {
                match chars.next()? {
                    '\\' => text.push(chars.next()?),
                    '"' => break,
                    ch => text.push(ch),
                }
            }
        } else {
            while let Some(ch) = chars.next_if(|c| !c.is_whitespace()) {
                text.push(ch);
            }
        }
        out.push(Tok { text, quoted });
    }
    Some(out)
}

/// An unquoted `!`: negates the option after it.
fn is_bang(t: &Tok) -> bool {
    !t.quoted && t.text == "!"
}

fn is_option(t: &Tok) -> bool {
    !t.quoted && t.text.starts_with('-') && t.text.len() > 1
}

/// IANA protocol numbers iptables accepts by name (the ones a rule in front
/// of TCP traffic is likely to name).
pub fn proto_number(name: &str) -> Option<u8> {
    if let Ok(n) = name.parse() {
        return Some(n);
    }
    Some(match name.to_ascii_lowercase().as_str() {
        "icmp" => 1,
        "igmp" => 2,
        "tcp" => 6,
        "udp" => 17,
        "gre" => 47,
        "esp" => 50,
        "ah" => 51,
        "ipv6-icmp" | "icmpv6" => 58,
        "sctp" => 132,
        "udplite" => 136,
        _ => return None,
    })
}

fn parse_net(s: &str) -> Option<(IpAddr, u8)> {
    match s.split_once('/') {
        Some((a, l)) => {
            let a: IpAddr = a.parse().ok()?;
            let len: u8 = l.parse().ok()?;
            (len <= if a.is_ipv4() { 32 } else { 128 }).then_some((a, len))
        }
        None => {
            let a: IpAddr = s.parse().ok()?;
            Some((a, if a.is_ipv4() { 32 } else { 128 }))
        }
    }
}

/// `80`, `1024:65535`, `:1023`, `80,443,8000:8080`.
fn parse_port_ranges(s: &str) -> Option<Vec<(u16, u16)>> {
    s.split(',')
        .map(|part| match part.split_once(':') {
            Some((lo, hi)) => {
                let lo = if lo.is_empty() { 0 } else { lo.parse().ok()? };
                let hi = if hi.is_empty() {
                    u16::MAX
                } else {
                    hi.parse().ok()?
                };
                Some((lo, hi))
            }
            None => part.parse().ok().map(|p| (p, p)),
        })
        .collect()
}

/// `FIN,SYN,RST,ACK`, `ALL`, `NONE`.
fn parse_tcp_flags(s: &str) -> Option<u8> {
    use kdrop_common::{TCP_ACK, TCP_CWR, TCP_ECE, TCP_FIN, TCP_PSH, TCP_RST, TCP_SYN, TCP_URG};
    s.split(',').try_fold(0u8, |acc, f| {
        Some(
            acc | match f {
                "FIN" => TCP_FIN,
                "SYN" => TCP_SYN,
                "RST" => TCP_RST,
                "PSH" => TCP_PSH,
                "ACK" => TCP_ACK,
                "URG" => TCP_URG,
                "ECE" => TCP_ECE,
                "CWR" => TCP_CWR,
                "ALL" => 0xff,
                "NONE" => 0,
                _ => return None,
            },
        )
    })
}

/// `0x4000/0x4000` or `16`.
fn parse_mark(s: &str) -> Option<(u32, u32)> {
    let num = |x: &str| match x.strip_prefix("0x") {
        Some(h) => u32::from_str_radix(h, 16).ok(),
        None => x.parse().ok(),
    };
    match s.split_once('/') {
        Some((v, m)) => Some((num(v)?, num(m)?)),
        None => Some((num(s)?, u32::MAX)),
    }
}

/// Built-in targets that end evaluation without dropping.
const TERMINAL_TARGETS: &[&str] = &[
    "QUEUE",
    "NFQUEUE",
    "DNAT",
    "SNAT",
    "MASQUERADE",
    "REDIRECT",
    "NETMAP",
    "TPROXY",
    "SYNPROXY",
];

/// The part after `-A CHAIN`: matches and target.
fn parse_rule(spec: &str, toks: &[Tok], packets: Option<u64>, table: &Table) -> Rule {
    let mut matches = Vec::new();
    let mut verdict = Verdict::Continue;
    let mut target = String::new();
    let mut module = String::new();
    let mut proto = PROTO_TCP;
    let mut i = 0;
    let mut neg = false;
    while i < toks.len() {
        let t = &toks[i];
        if is_bang(t) {
            neg = true;
            i += 1;
            continue;
        }
        let opt = t.text.as_str();
        let mut j = i + 1;
        while j < toks.len() && !is_option(&toks[j]) && !is_bang(&toks[j]) {
            j += 1;
        }
        let args: Vec<&str> = toks[i + 1..j].iter().map(|t| t.text.as_str()).collect();
        let arg = args.first().copied().unwrap_or("");
        let written = || {
            let mut w = if neg { "! ".to_string() } else { String::new() };
            if !module.is_empty() && opt.starts_with("--") {
                w.push_str(&format!("-m {module} "));
            }
            w.push_str(opt);
            for a in &args {
                w.push(' ');
                w.push_str(a);
            }
            w
        };
        let unknown = || Match::Unknown(written());
        match opt {
            "-j" | "--jump" => {
                // Target options run to the end of the rule.
                target = toks[i + 1..]
                    .iter()
                    .map(|t| t.text.as_str())
                    .collect::<Vec<_>>()
                    .join(" ");
                verdict = match arg {
                    "ACCEPT" => Verdict::Accept,
                    "DROP" => Verdict::Drop,
                    "REJECT" => Verdict::Reject,
                    "RETURN" => Verdict::Return,
                    t if TERMINAL_TARGETS.contains(&t) => Verdict::Terminal,
                    t if table.chain(t).is_some() => Verdict::Jump(t.to_string()),
                    _ => Verdict::Continue,
                };
                break;
            }
            "-g" | "--goto" => {
                target = format!("goto {arg}");
                verdict = Verdict::Goto(arg.to_string());
                break;
            }
            "-m" | "--match" => module = arg.to_string(),
            "-p" | "--protocol" => {
                if arg == "all" {
                    if neg {
                        matches.push(Match::Proto {
                            neg: false,
                            proto: 255,
                        });
                    }
                } else {
                    match proto_number(arg) {
                        Some(p) => {
                            if !neg {
                                proto = p;
                            }
                            matches.push(Match::Proto { neg, proto: p });
                        }
                        None => matches.push(unknown()),
                    }
                }
            }
            "-s" | "--source" | "-d" | "--destination" => {
                let dir = if opt.starts_with("-s") || opt == "--source" {
                    Dir::Src
                } else {
                    Dir::Dst
                };
                matches.push(match parse_net(arg) {
                    Some((net, len)) => Match::Addr { dir, neg, net, len },
                    None => unknown(),
                });
            }
            "-i" | "--in-interface" | "-o" | "--out-interface" => matches.push(Match::Iface {
                input: opt == "-i" || opt == "--in-interface",
                neg,
                name: arg.to_string(),
            }),
            // kdrop read the TCP header: a first fragment or none.
            "-f" | "--fragment" => matches.push(Match::Proto {
                neg: !neg,
                proto: PROTO_TCP,
            }),
            // A comment matches every packet.
            "--comment" if module == "comment" => {}
            _ => {
                matches.push(module_option(&module, opt, &args, neg, proto).unwrap_or_else(unknown))
            }
        }
        neg = false;
        i = j;
    }
    let text = spec.to_string();
    let counted_matches = matches.len();
    Rule {
        text,
        handle: None,
        matches,
        verdict,
        target,
        packets,
        counted_matches,
    }
}

/// Options of the match modules kdrop evaluates; `None` for the rest.
fn module_option(module: &str, opt: &str, args: &[&str], neg: bool, proto: u8) -> Option<Match> {
    let arg = args.first().copied().unwrap_or("");
    let l4 = match module {
        "tcp" => PROTO_TCP,
        "udp" => 17,
        "sctp" => 132,
        _ => proto,
    };
    Some(match (module, opt) {
        ("tcp" | "udp" | "sctp", "--dport" | "--destination-port")
        | ("multiport", "--dports" | "--destination-ports") => Match::Port {
            dir: Dir::Dst,
            neg,
            proto: l4,
            ranges: parse_port_ranges(arg)?,
        },
        ("tcp" | "udp" | "sctp", "--sport" | "--source-port")
        | ("multiport", "--sports" | "--source-ports") => Match::Port {
            dir: Dir::Src,
            neg,
            proto: l4,
            ranges: parse_port_ranges(arg)?,
        },
        ("multiport", "--ports") => Match::Port {
            dir: Dir::Either,
            neg,
            proto: l4,
            ranges: parse_port_ranges(arg)?,
        },
        ("tcp", "--syn") => Match::TcpFlags {
            neg,
            mask: parse_tcp_flags("FIN,SYN,RST,ACK")?,
            value: parse_tcp_flags("SYN")?,
            any: false,
        },
        ("tcp", "--tcp-flags") if args.len() == 2 => Match::TcpFlags {
            neg,
            mask: parse_tcp_flags(args[0])?,
            value: parse_tcp_flags(args[1])?,
            any: false,
        },
        ("conntrack", "--ctstate") | ("state", "--state") => Match::CtState {
            neg,
            states: arg
                .split(',')
                .map(CtState::parse)
                .collect::<Option<Vec<_>>>()?,
        },
        ("mark", "--mark") => {
            let (value, mask) = parse_mark(arg)?;
            Match::Mark { neg, value, mask }
        }
        ("iprange", "--src-range" | "--dst-range") => {
            let (lo, hi) = arg.split_once('-')?;
            Match::AddrRange {
                dir: if opt == "--src-range" {
                    Dir::Src
                } else {
                    Dir::Dst
                },
                neg,
                lo: lo.parse().ok()?,
                hi: hi.parse().ok()?,
            }
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diagnosis::netfilter::matching::{tests::syn, Tri, TCP_ACK, TCP_SYN};

    const SAVE: &str = r#"# Generated by iptables-save v1.8.9 on Sat Nov 21 06:33:26 2026
*raw
:PREROUTING ACCEPT [10:600]
:OUTPUT ACCEPT [3:180]
[2:120] -A PREROUTING -p tcp -m tcp --dport 9 --tcp-flags FIN,SYN,RST,ACK SYN -j DROP
COMMIT
# Completed on Sat Nov 21 06:33:26 2026
*filter
:INPUT ACCEPT [5:300]
:FORWARD DROP [7:420]
:OUTPUT ACCEPT [0:0]
:KUBE-FW - [0:0]
[1:60] -A INPUT -m conntrack --ctstate INVALID -j DROP
[0:0] -A INPUT -p tcp -m multiport --dports 80,443:445 -j REJECT --reject-with tcp-reset
[4:240] -A INPUT -s 10.0.0.0/8 -i eth+ ! -p udp -j LOG --log-prefix "in: \"x\" "
[9:540] -A INPUT -m comment --comment "hello world" -j KUBE-FW
[3:180] -A KUBE-FW ! -s 192.0.2.1/32 -p tcp -m tcp --dport 22 -m set --match-set allow src -j ACCEPT
[0:0] -A KUBE-FW -m mark --mark 0x4000/0x4000 -g KUBE-FW
[0:0] -A KUBE-FW -j RETURN
[0:0] -A FORWARD -o docker0 -j DNAT --to-destination 1.2.3.4
COMMIT
"#;

    fn tables() -> Vec<Table> {
        parse_save(
            SAVE,
            Backend::IptablesLegacy,
            Family::Ip,
            "iptables-save -c",
        )
        .unwrap()
    }

    #[test]
    fn tables_chains_policies() {
        let t = tables();
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].name, "raw");
        assert_eq!(t[1].name, "filter");
        assert_eq!(t[1].backend, Backend::IptablesLegacy);
        let fwd = t[1].chain("FORWARD").unwrap();
        let base = fwd.base.as_ref().unwrap();
        assert_eq!(base.hook, Hook::Forward);
        assert_eq!(base.policy, Policy::Drop);
        assert_eq!(base.policy_packets, Some(7));
        assert_eq!(base.priority, 0);
        assert_eq!(t[0].chains[0].base.as_ref().unwrap().priority, -300);
        assert!(t[1].chain("KUBE-FW").unwrap().base.is_none());
        assert_eq!(t[1].chain("INPUT").unwrap().rules.len(), 4);
    }

    #[test]
    fn rules_keep_the_iptables_s_text_and_counters() {
        let t = tables();
        let input = t[1].chain("INPUT").unwrap();
        assert_eq!(
            input.rules[1].text,
            "-A INPUT -p tcp -m multiport --dports 80,443:445 -j REJECT --reject-with tcp-reset"
        );
        assert_eq!(input.rules[1].target, "REJECT --reject-with tcp-reset");
        assert_eq!(input.rules[1].verdict, Verdict::Reject);
        assert_eq!(input.rules[0].packets, Some(1));
        assert_eq!(
            input.rules[2].text,
            r#"-A INPUT -s 10.0.0.0/8 -i eth+ ! -p udp -j LOG --log-prefix "in: \"x\" ""#
        );
        assert_eq!(input.rules[2].verdict, Verdict::Continue);
        assert_eq!(input.rules[3].verdict, Verdict::Jump("KUBE-FW".into()));
        let kube = t[1].chain("KUBE-FW").unwrap();
        assert_eq!(kube.rules[0].verdict, Verdict::Accept);
        assert_eq!(kube.rules[1].verdict, Verdict::Goto("KUBE-FW".into()));
        assert_eq!(kube.rules[2].verdict, Verdict::Return);
        let fwd = t[1].chain("FORWARD").unwrap();
        assert_eq!(fwd.rules[0].verdict, Verdict::Terminal);
    }

    #[test]
    fn matches_evaluate_against_a_packet() {
        let t = tables();
        let p = syn("10.1.1.1", 40000, "10.2.2.2", 9);
        let raw = &t[0].chains[0].rules[0];
        assert_eq!(raw.matches.len(), 3);
        assert_eq!(
            crate::diagnosis::netfilter::matching::eval_all(&raw.matches, &p),
            Tri::Yes
        );
        let mut synack = p.clone();
        synack.tcp_flags = TCP_SYN | TCP_ACK;
        assert_eq!(
            crate::diagnosis::netfilter::matching::eval_all(&raw.matches, &synack),
            Tri::No
        );
        let input = t[1].chain("INPUT").unwrap();
        let eval = |i: usize, p: &crate::diagnosis::netfilter::Packet| {
            crate::diagnosis::netfilter::matching::eval_all(&input.rules[i].matches, p)
        };
        assert_eq!(eval(0, &p), Tri::Maybe);
        assert_eq!(eval(1, &p), Tri::No);
        assert_eq!(eval(1, &syn("10.1.1.1", 1, "10.2.2.2", 444)), Tri::Yes);
        assert_eq!(eval(2, &p), Tri::Yes);
        assert_eq!(eval(3, &p), Tri::Yes);
        let kube = t[1].chain("KUBE-FW").unwrap();
        let ssh = syn("10.1.1.1", 40000, "10.2.2.2", 22);
        let m = &kube.rules[0].matches;
        assert_eq!(
            crate::diagnosis::netfilter::matching::eval_all(m, &ssh),
            Tri::Maybe
        );
        assert_eq!(
            m.last().unwrap(),
            &Match::Unknown("-m set --match-set allow src".into())
        );
        let blocked = syn("192.0.2.1", 40000, "10.2.2.2", 22);
        assert_eq!(
            crate::diagnosis::netfilter::matching::eval_all(m, &blocked),
            Tri::No
        );
        assert_eq!(
            kube.rules[1].matches,
            vec![Match::Mark {
                neg: false,
                value: 0x4000,
                mask: 0x4000
            }]
        );
    }

    #[test]
    fn ipv6_and_no_counters() {
        let text = "*filter\n:INPUT DROP\n-A INPUT -s fd00::/64 -p tcp -m tcp --sport 1024:65535 -j ACCEPT\nCOMMIT\n";
        let t = parse_save(
            text,
            Backend::IptablesNft,
            Family::Ip6,
            "ip6tables-nft-save -c",
        )
        .unwrap();
        let input = t[0].chain("INPUT").unwrap();
        assert_eq!(input.base.as_ref().unwrap().policy_packets, None);
        assert_eq!(input.rules[0].packets, None);
        let p = syn("fd00::1", 40000, "fd00::2", 80);
        assert_eq!(
            crate::diagnosis::netfilter::matching::eval_all(&input.rules[0].matches, &p),
            Tri::Yes
        );
    }

    #[test]
    fn bad_input_is_an_error_not_a_panic() {
        for text in [
            "-A INPUT -j DROP\n",
            "*filter\n[0:0] -A NOPE -j DROP\nCOMMIT\n",
            "*filter\n:INPUT ACCEPT [0:0]\n",
            "*filter\n:INPUT ACCEPT [0:0]\n[x:0] -A INPUT -j DROP\nCOMMIT\n",
            "*filter\n:INPUT ACCEPT [0:0]\n[0:0] -A INPUT -m comment --comment \"open\nCOMMIT\n",
            "*filter\n*nat\n",
        ] {
            assert!(
                parse_save(text, Backend::IptablesLegacy, Family::Ip, "t").is_err(),
                "{text:?}"
            );
        }
        assert_eq!(
            parse_save("", Backend::IptablesLegacy, Family::Ip, "t").unwrap(),
            vec![]
        );
    }

    #[test]
    fn tokens() {
        let t = tokenize(r#"-A X -m comment --comment "a \"b\" c" -j DROP"#).unwrap();
        assert_eq!(t[5].text, r#"a "b" c"#);
        assert!(t[5].quoted);
        assert!(!t[4].quoted);
        assert!(tokenize(r#"-A "x"#).is_none());
        assert_eq!(parse_port_ranges(":1023"), Some(vec![(0, 1023)]));
        assert_eq!(
            parse_port_ranges("80,8000:"),
            Some(vec![(80, 80), (8000, 65535)])
        );
        assert_eq!(parse_port_ranges("x"), None);
        assert_eq!(parse_tcp_flags("ALL"), Some(0xff));
        assert_eq!(parse_tcp_flags("BOGUS"), None);
        assert_eq!(parse_mark("16"), Some((16, u32::MAX)));
        assert_eq!(proto_number("TCP"), Some(6));
        assert_eq!(proto_number("17"), Some(17));
        assert_eq!(proto_number("nope"), None);
    }

    #[test]
    fn unknown_options_stay_unknown() {
        let text = "*filter\n:INPUT ACCEPT [0:0]\n[0:0] -A INPUT -p tcp -m tcp --dport 80 -m addrtype --dst-type LOCAL -m conntrack --ctstate NEW --ctorigdst 1.2.3.4 -j DROP\nCOMMIT\n";
        let t = parse_save(text, Backend::IptablesLegacy, Family::Ip, "t").unwrap();
        let m = &t[0].chains[0].rules[0].matches;
        assert!(m.contains(&Match::Unknown("-m addrtype --dst-type LOCAL".into())));
        assert!(m.contains(&Match::Unknown("-m conntrack --ctorigdst 1.2.3.4".into())));
        assert!(m.contains(&Match::CtState {
            neg: false,
            states: vec![CtState::New]
        }));
    }
}
