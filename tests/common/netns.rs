//! Network namespaces, links and commands for tests, held in RAII guards so
//! a failing test still cleans up.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::process::Command;

/// Run a command; panic with its output if it fails.
pub fn sh(cmd: &str) -> String {
    let out = Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .output()
        .expect("spawning sh");
    if !out.status.success() {
        panic!(
            "`{cmd}` failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A named network namespace (`ip netns add`), deleted on drop.
pub struct Netns {
    pub name: String,
}

impl Netns {
    pub fn new(name: &str) -> Self {
        let _ = Command::new("ip").args(["netns", "del", name]).output();
        sh(&format!("ip netns add {name}"));
        let ns = Self {
            name: name.to_string(),
        };
        ns.exec("ip link set lo up");
        ns
    }

    /// A shell command inside the namespace. `nsenter --net` rather than
    /// `ip netns exec`, which remounts /sys and hides bpffs.
    pub fn exec(&self, cmd: &str) -> String {
        sh(&format!(
            "nsenter --net=/run/netns/{} sh -c '{}'",
            self.name,
            cmd.replace('\'', "'\\''")
        ))
    }

    /// Run `f` on a thread whose network namespace is this one.
    pub fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        let path = format!("/run/netns/{}", self.name);
        std::thread::spawn(move || {
            let file = File::open(&path).expect("opening netns");
            // SAFETY: setns on this thread only; the fd is valid.
            let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
            f()
        })
        .join()
        .expect("netns thread panicked")
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}
