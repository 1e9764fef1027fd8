//! Network namespaces, links and commands for tests, held in RAII guards so
//! a failing test still cleans up.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::process::Command;
use std::thread::JoinHandle;

/// The calling thread in another network namespace until dropped (then
/// back where it was): BPF_PROG_TEST_RUN's FIB lookups and the sysctls
/// they read are the namespace's.
pub struct InNetns {
    home: File,
}

impl InNetns {
    pub fn enter(ns: &Netns) -> Self {
        let home = File::open("/proc/thread-self/ns/net").expect("own netns");
        let target = File::open(ns.path()).expect("netns");
        // SAFETY: setns on this thread only; both fds are valid.
        let rc = unsafe { libc::setns(target.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
        Self { home }
    }
}

impl Drop for InNetns {
    fn drop(&mut self) {
        // SAFETY: as above; back to the namespace the thread came from.
        let rc = unsafe { libc::setns(self.home.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns back: {}", std::io::Error::last_os_error());
    }
}

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

/// A named network namespace (`ip netns add`), deleted on drop: its veths
/// go with it, and so do their peers in other namespaces.
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

    /// The namespace's file, for `nsenter --net=` and `setns`.
    pub fn path(&self) -> String {
        format!("/run/netns/{}", self.name)
    }

    /// A shell command inside the namespace. `nsenter --net` rather than
    /// `ip netns exec`, which remounts /sys and hides bpffs.
    pub fn exec(&self, cmd: &str) -> String {
        sh(&format!(
            "nsenter --net={} sh -c '{}'",
            self.path(),
            cmd.replace('\'', "'\\''")
        ))
    }

    /// Run `f` on a thread whose network namespace is this one.
    pub fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        spawn_in(self, f).join().expect("netns thread panicked")
    }

    /// Set sysctls here by writing /proc/sys, which shows the writer's
    /// network namespace (no dependence on procps' `sysctl`).
    pub fn sysctls(&self, settings: &[(&str, &str)]) {
        let cmd: Vec<String> = settings
            .iter()
            .map(|(k, v)| format!("echo {v} > /proc/sys/{}", k.replace('.', "/")))
            .collect();
        self.exec(&cmd.join(" && "));
    }

    /// The MAC of `dev` here (sysfs would show the test's own namespace).
    pub fn mac_of(&self, dev: &str) -> [u8; 6] {
        let out = self.exec(&format!("ip -o link show dev {dev}"));
        let mac = out
            .split_whitespace()
            .skip_while(|w| *w != "link/ether")
            .nth(1)
            .unwrap_or_else(|| panic!("no link/ether in `{out}`"));
        let bytes: Vec<u8> = mac
            .split(':')
            .map(|h| u8::from_str_radix(h, 16).expect("hex MAC octet"))
            .collect();
        bytes.try_into().expect("six MAC octets")
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// Run `f` on a new thread inside namespace `ns` and return its handle:
/// for servers that outlive the call. The thread enters the namespace
/// before `f` runs, so every socket it opens (and every thread it starts)
/// lives there.
pub fn spawn_in<T: Send + 'static>(
    ns: &Netns,
    f: impl FnOnce() -> T + Send + 'static,
) -> JoinHandle<T> {
    let path = ns.path();
    std::thread::spawn(move || {
        let file = File::open(&path).expect("opening netns");
        // SAFETY: setns on this thread only; the fd is valid.
        let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
        f()
    })
}
