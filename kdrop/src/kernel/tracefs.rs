//! The classic tracepoint's record layout, from its tracefs `format` file,
//! and mounting tracefs when nothing has.
use std::{collections::HashMap, fs, path::Path};

use anyhow::{bail, Context as _, Result};
use kdrop_common::{KfreeSkbArgs, ABSENT};

use super::facts::Reasons;

/// Where tracefs may be mounted.
pub const TRACEFS: [&str; 2] = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

/// Mounts tracefs at /sys/kernel/tracing (its place since 4.1) unless it is
/// there already; only for the classic tracepoint rung when nothing better
/// attached. It stays mounted, where systemd would have mounted it.
pub fn mount_tracefs() -> Result<()> {
    let target = TRACEFS[0];
    if Path::new(target).join("events").is_dir() {
        return Ok(());
    }
    // SAFETY: mount(2) with NUL-terminated literals and no data.
    let rc = unsafe {
        libc::mount(
            c"tracefs".as_ptr(),
            c"/sys/kernel/tracing".as_ptr(),
            c"tracefs".as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        bail!(
            "mounting tracefs at {target}: {}",
            std::io::Error::last_os_error()
        );
    }
    log::info!("mounted tracefs at {target} for the classic tracepoint");
    Ok(())
}

/// Record offsets of `skb:kfree_skb` from its format file.
pub fn kfree_skb_fields(reasons: &Reasons) -> Result<KfreeSkbArgs> {
    let mut errors = Vec::new();
    for dir in TRACEFS {
        let path = Path::new(dir).join("events/skb/kfree_skb/format");
        match fs::read_to_string(&path) {
            Ok(text) => return parse_kfree_skb_format(&text, reasons),
            Err(e) => errors.push(format!("{}: {e}", path.display())),
        }
    }
    bail!("tracepoint format not readable ({})", errors.join("; "))
}

pub fn parse_kfree_skb_format(text: &str, reasons: &Reasons) -> Result<KfreeSkbArgs> {
    let fields = parse_format(text);
    let get = |name: &str, size: u32| {
        fields
            .get(name)
            .filter(|(_, s)| *s == size)
            .map(|(o, _)| *o)
    };
    Ok(KfreeSkbArgs {
        skb: get("skbaddr", 8).context("kfree_skb format has no 8-byte skbaddr")?,
        location: get("location", 8).unwrap_or(ABSENT),
        reason: get("reason", 4).unwrap_or(ABSENT),
        consumed: reasons.consumed().unwrap_or(ABSENT),
    })
}

/// `field:void * skbaddr;\toffset:8;\tsize:8;\tsigned:0;` → name → (offset, size).
fn parse_format(text: &str) -> HashMap<String, (u32, u32)> {
    let mut out = HashMap::new();
    for line in text.lines() {
        let mut name = None;
        let mut offset = None;
        let mut size = None;
        for part in line.trim().split(';') {
            let part = part.trim();
            if let Some(decl) = part.strip_prefix("field:") {
                // The name is the last word, without any array suffix.
                name = decl
                    .rsplit(|c: char| c.is_whitespace() || c == '*')
                    .next()
                    .map(|n| n.split('[').next().unwrap_or(n).to_string());
            } else if let Some(v) = part.strip_prefix("offset:") {
                offset = v.parse().ok();
            } else if let Some(v) = part.strip_prefix("size:") {
                size = v.parse().ok();
            }
        }
        if let (Some(n), Some(o), Some(s)) = (name, offset, size) {
            out.insert(n, (o, s));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const FORMAT_6_18: &str = "name: kfree_skb\nID: 2310\nformat:\n\
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n\
\tfield:void * skbaddr;\toffset:8;\tsize:8;\tsigned:0;\n\
\tfield:void * location;\toffset:16;\tsize:8;\tsigned:0;\n\
\tfield:void * rx_sk;\toffset:24;\tsize:8;\tsigned:0;\n\
\tfield:unsigned short protocol;\toffset:32;\tsize:2;\tsigned:0;\n\
\tfield:enum skb_drop_reason reason;\toffset:36;\tsize:4;\tsigned:0;\n";

    const FORMAT_5_10: &str = "format:\n\
\tfield:void * skbaddr;\toffset:8;\tsize:8;\tsigned:0;\n\
\tfield:void * location;\toffset:16;\tsize:8;\tsigned:0;\n\
\tfield:unsigned short protocol;\toffset:24;\tsize:2;\tsigned:0;\n";

    #[test]
    fn tracepoint_format() {
        let r = Reasons::default();
        let a = parse_kfree_skb_format(FORMAT_6_18, &r).unwrap();
        assert_eq!((a.skb, a.location, a.reason), (8, 16, 36));
        let a = parse_kfree_skb_format(FORMAT_5_10, &r).unwrap();
        assert_eq!((a.skb, a.location, a.reason), (8, 16, ABSENT));
        assert!(parse_kfree_skb_format("garbage", &r).is_err());
    }
}
