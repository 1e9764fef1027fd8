//! What an end-to-end test needs from the machine, checked in one place.
//! A missing piece fails the test with what to do about it: a test that
//! skipped itself here would pass without having run.

use std::path::Path;

/// Tools the namespace tests run.
const TOOLS: &[&str] = &["ip", "nsenter", "ethtool", "sh"];

/// bpffs's `f_type` (include/uapi/linux/magic.h).
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// Panic unless this process is root, every tool in `TOOLS` is on PATH and
/// bpffs is mounted at /sys/fs/bpf. `test` names the suite in the message.
pub fn root_and_tools(test: &str) {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "{test} needs root (network namespaces, BPF); run it as root"
    );
    let missing = not_on_path(TOOLS);
    assert!(
        missing.is_empty(),
        "{test} needs {missing:?} on PATH: run scripts/deps.sh"
    );
    assert!(
        is_bpffs(Path::new("/sys/fs/bpf")),
        "{test} needs bpffs at /sys/fs/bpf: run scripts/bpffs.sh"
    );
}

fn is_bpffs(p: &Path) -> bool {
    let Ok(c) = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: a zeroed statfs is a valid out buffer; the path is a C string.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let rc = unsafe { libc::statfs(c.as_ptr(), &mut st) };
    rc == 0 && st.f_type as i64 == BPF_FS_MAGIC
}

/// Panic unless each of `tools` is on PATH (beside [`root_and_tools`]'s):
/// the L2 tests run arping, ndisc6 and tcpdump.
pub fn tools(test: &str, tools: &[&str]) {
    let missing = not_on_path(tools);
    assert!(
        missing.is_empty(),
        "{test} needs {missing:?} on PATH: run scripts/deps.sh with the Makefile's TEST_PKGS"
    );
}

/// Those of `tools` no directory of PATH holds.
fn not_on_path<'a>(tools: &[&'a str]) -> Vec<&'a str> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    tools
        .iter()
        .copied()
        .filter(|t| !std::env::split_paths(&path).any(|d| d.join(t).is_file()))
        .collect()
}
