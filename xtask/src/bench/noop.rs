//! The floor for kdrop's kernel side (variant `n`): a program that returns
//! at once, attached to each of kdrop's points the way kdrop attached it,
//! so the flood pays for the attachment alone (the trampoline or the raw
//! tracepoint's call) and nothing kdrop's programs do. Two instructions
//! need no object file: loaded with bpf(2) directly, by `cargo xtask
//! bench-noop` (hidden), which the bench runs as it runs any tool.
use std::os::fd::{FromRawFd, OwnedFd};

use anyhow::{bail, Context as _, Result};
use kdrop_core::kernel::btf::{Btf, Kind};

use super::points::Point;

// include/uapi/linux/bpf.h (v6.12): commands, program and attach types.
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_RAW_TRACEPOINT_OPEN: libc::c_long = 17;
const BPF_PROG_TYPE_RAW_TRACEPOINT: u32 = 17;
const BPF_PROG_TYPE_TRACING: u32 = 26;
const BPF_TRACE_RAW_TP: u32 = 23;

/// `r0 = 0; exit`.
const RETURN_0: [u8; 16] = [0xb7, 0, 0, 0, 0, 0, 0, 0, 0x95, 0, 0, 0, 0, 0, 0, 0];

/// What the bench's readiness check waits for on stderr.
pub const READY: &str = "noop: attached";

/// The argument `cargo xtask bench-noop` gets for a point.
pub fn arg(p: &Point) -> String {
    format!("{} via {}", p.name, p.rung)
}

/// Attaches a no-op program to every point (`NAME via RUNG`), says so, and
/// holds them until a signal ends the process (the kernel detaches them
/// when its descriptors close).
pub fn run(points: &[String]) -> Result<()> {
    let mut btf = None;
    let mut held = Vec::new();
    for p in points {
        let (name, rung) = p
            .split_once(" via ")
            .with_context(|| format!("{p:?}: not NAME via RUNG"))?;
        let (_, event) = name
            .split_once(':')
            .with_context(|| format!("{name}: not a tracepoint (category:event)"))?;
        let fds = match rung {
            "tp_btf" => {
                if btf.is_none() {
                    let raw = std::fs::read("/sys/kernel/btf/vmlinux")
                        .context("reading /sys/kernel/btf/vmlinux")?;
                    btf = Some(Btf::parse(&raw, None).context("parsing vmlinux BTF")?);
                }
                let typedef = format!("btf_trace_{event}");
                let id = btf
                    .as_ref()
                    .and_then(|b| b.find(&typedef, Kind::Typedef))
                    .with_context(|| format!("no {typedef} in vmlinux BTF"))?;
                let prog = load(BPF_PROG_TYPE_TRACING, BPF_TRACE_RAW_TP, id)?;
                let link = open_raw_tp(&prog, None)?;
                (prog, link)
            }
            "raw_tp" => {
                let prog = load(BPF_PROG_TYPE_RAW_TRACEPOINT, 0, 0)?;
                let link = open_raw_tp(&prog, Some(event))?;
                (prog, link)
            }
            _ => bail!("{p}: the no-op floor attaches tp_btf and raw_tp only"),
        };
        held.push(fds);
    }
    // SAFETY: default dispositions (a shell may have started us with
    // SIGINT ignored); pause(2) only waits, and either signal ends us.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_DFL);
        libc::signal(libc::SIGTERM, libc::SIG_DFL);
    }
    eprintln!("{READY} {}", points.join(", "));
    loop {
        // SAFETY: as above.
        unsafe { libc::pause() };
    }
}

fn bpf(cmd: libc::c_long, attr: &mut [u8; 128]) -> Result<OwnedFd> {
    // SAFETY: `attr` is a zeroed bpf_attr large enough for both commands.
    let fd = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), attr.len()) };
    if fd < 0 {
        bail!("bpf({cmd}): {}", std::io::Error::last_os_error());
    }
    // SAFETY: a new descriptor the kernel just returned, owned here.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// BPF_PROG_LOAD of `RETURN_0`; `union bpf_attr` offsets as in
/// include/uapi/linux/bpf.h (v6.12).
fn load(prog_type: u32, attach_type: u32, attach_btf_id: u32) -> Result<OwnedFd> {
    let mut a = [0u8; 128];
    let put32 =
        |a: &mut [u8; 128], at: usize, v: u32| a[at..at + 4].copy_from_slice(&v.to_ne_bytes());
    let put64 =
        |a: &mut [u8; 128], at: usize, v: u64| a[at..at + 8].copy_from_slice(&v.to_ne_bytes());
    put32(&mut a, 0, prog_type);
    put32(&mut a, 4, 2); // insn_cnt
    put64(&mut a, 8, RETURN_0.as_ptr() as u64);
    put64(&mut a, 16, c"GPL".as_ptr() as u64);
    a[48..58].copy_from_slice(b"kdrop_noop");
    put32(&mut a, 68, attach_type); // expected_attach_type
    put32(&mut a, 108, attach_btf_id);
    bpf(BPF_PROG_LOAD, &mut a).context("loading the no-op program")
}

/// BPF_RAW_TRACEPOINT_OPEN: `name` for raw_tp, none for tp_btf (the
/// program's attach_btf_id names the tracepoint).
fn open_raw_tp(prog: &OwnedFd, name: Option<&str>) -> Result<OwnedFd> {
    use std::os::fd::AsRawFd;
    let name = name.map(std::ffi::CString::new).transpose()?;
    let mut a = [0u8; 128];
    let ptr = name.as_ref().map_or(0, |n| n.as_ptr() as u64);
    a[0..8].copy_from_slice(&ptr.to_ne_bytes());
    a[8..12].copy_from_slice(&(prog.as_raw_fd() as u32).to_ne_bytes());
    bpf(BPF_RAW_TRACEPOINT_OPEN, &mut a).context("attaching the no-op program")
}
