//! aya's loader, made while kdrop reads the kernel, without a second parse
//! of vmlinux's BTF.
use std::{ptr, sync::Mutex, thread::JoinHandle};

use aya::EbpfLoader;

/// aya 0.14's `EbpfLoader::new()` parses /sys/kernel/btf/vmlinux on its
/// own (`Btf::from_sys_fs().ok()`, aya-0.14.0/src/bpf.rs:163), whatever BTF
/// it is then given, and kdrop gives it another (`load::attach_btf`): a
/// parse of 60 ms of CPU and ~10 MB at the start's peak, and seconds in a
/// TCG guest. The loader is made on a thread of its own that cannot see
/// that file (`hide_kernel_btf`): vmlinux is parsed once, by kdrop. Where
/// it cannot be hidden, aya parses it on that thread, beside kdrop's parse.
pub struct EarlyLoader(Mutex<Option<JoinHandle<EbpfLoader<'static>>>>);

impl EarlyLoader {
    pub fn start() -> Self {
        let thread = std::thread::Builder::new()
            .name("aya-loader".into())
            .spawn(|| {
                if let Err(e) = hide_kernel_btf() {
                    log::debug!("aya's loader parses vmlinux's BTF too: {e}");
                }
                EbpfLoader::new()
            });
        Self(Mutex::new(thread.ok()))
    }

    /// The loader started early, the first time; a new one after that (the
    /// tracefs reload).
    pub fn take(&self) -> EbpfLoader<'static> {
        let started = self.0.lock().ok().and_then(|mut h| h.take());
        started.and_then(|h| h.join().ok()).unwrap_or_default()
    }
}

/// Hides /sys/kernel/btf from the calling thread alone: a mount namespace
/// of its own (CLONE_NEWNS implies CLONE_FS; one thread of many may unshare
/// both, only CLONE_THREAD, CLONE_SIGHAND and CLONE_VM need a single thread:
/// kernel/fork.c `check_unshare_flags`, v6.12), every mount in it private so
/// nothing reaches the host's, an empty tmpfs over the directory. The
/// namespace ends with the thread. Needs CAP_SYS_ADMIN, as kdrop does
/// (`privileges`); without it nothing changes.
fn hide_kernel_btf() -> std::io::Result<()> {
    let check = |rc: libc::c_int| match rc {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    };
    // SAFETY: unshare and mount with constant, NUL-terminated paths; they
    // change this thread's namespace only.
    unsafe {
        check(libc::unshare(libc::CLONE_NEWNS))?;
        check(libc::mount(
            ptr::null(),
            c"/".as_ptr(),
            ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            ptr::null(),
        ))?;
        check(libc::mount(
            c"kdrop".as_ptr(),
            c"/sys/kernel/btf".as_ptr(),
            c"tmpfs".as_ptr(),
            libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            ptr::null(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    /// The loader's thread sees no vmlinux BTF; the rest of the process,
    /// and the host, still do.
    #[test]
    fn kernel_btf_hidden_from_one_thread_only() {
        let vmlinux = Path::new("/sys/kernel/btf/vmlinux");
        if !vmlinux.exists() {
            eprintln!(
                "SKIP kernel_btf_hidden_from_one_thread_only: no {}",
                vmlinux.display()
            );
            return;
        }
        let hidden = std::thread::spawn(move || hide_kernel_btf().map(|()| vmlinux.exists()))
            .join()
            .unwrap();
        match hidden {
            Ok(seen) => assert!(!seen, "vmlinux BTF still visible to the loader's thread"),
            // Not root (a developer's `cargo test`): said, not silent.
            Err(e) => eprintln!("SKIP kernel_btf_hidden_from_one_thread_only: {e}"),
        }
        assert!(vmlinux.exists(), "hidden from the whole process");
        let mounts = std::fs::read_to_string("/proc/thread-self/mountinfo").unwrap();
        assert!(
            !mounts.lines().any(|l| l.contains(" /sys/kernel/btf ")),
            "the tmpfs reached this thread's mounts"
        );
    }
}
