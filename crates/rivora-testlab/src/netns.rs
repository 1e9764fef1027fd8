//! Named network namespaces and threads inside them, held in RAII guards
//! so a failing test still cleans up.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::process::Command;
use std::thread::JoinHandle;

use crate::cmd::{try_sh, CmdError};

/// A named network namespace (`ip netns add`), deleted on drop: its veths
/// go with it, and so do their peers in other namespaces.
pub struct Netns {
    pub name: String,
}

impl Netns {
    /// A namespace called `name` with `lo` up; one left by an earlier run
    /// under the same name is removed first.
    pub fn try_new(name: &str) -> Result<Self, CmdError> {
        let _ = Command::new("ip").args(["netns", "del", name]).output();
        try_sh(&format!("ip netns add {name}"))?;
        // From here the drop removes it, also when the next step fails.
        let ns = Self {
            name: name.to_string(),
        };
        ns.try_exec("ip link set lo up")?;
        Ok(ns)
    }

    /// [`Netns::try_new`] for tests: a failure panics.
    pub fn new(name: &str) -> Self {
        Self::try_new(name).unwrap_or_else(|e| panic!("{e}"))
    }

    /// The namespace's file, for `nsenter --net=` and `setns`.
    pub fn path(&self) -> String {
        path_of(&self.name)
    }

    /// A shell command inside the namespace. `nsenter --net` rather than
    /// `ip netns exec`, which remounts /sys and hides bpffs.
    pub fn try_exec(&self, cmd: &str) -> Result<String, CmdError> {
        try_sh(&format!(
            "nsenter --net={} sh -c '{}'",
            self.path(),
            cmd.replace('\'', "'\\''")
        ))
    }

    /// [`Netns::try_exec`] for tests: a failure panics with the output.
    pub fn exec(&self, cmd: &str) -> String {
        self.try_exec(cmd).unwrap_or_else(|e| panic!("{e}"))
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

    /// The MAC of `dev` here (sysfs would show the caller's namespace).
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

fn path_of(name: &str) -> String {
    format!("/run/netns/{name}")
}

fn setns(file: &File) -> std::io::Result<()> {
    // SAFETY: setns on the calling thread only; the fd is valid for the
    // call.
    let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The calling thread in another network namespace until dropped (then
/// back where it was): BPF_PROG_TEST_RUN's ingress device, its FIB lookups
/// and the sysctls they read are the namespace's. For a skeleton that is
/// not Send: the thread moves rather than the program.
pub struct InNetns {
    home: File,
}

impl InNetns {
    pub fn enter(ns: &Netns) -> Self {
        let home = File::open("/proc/thread-self/ns/net").expect("own netns");
        let target = File::open(ns.path()).expect("netns");
        setns(&target).unwrap_or_else(|e| panic!("setns into {}: {e}", ns.name));
        Self { home }
    }
}

impl Drop for InNetns {
    fn drop(&mut self) {
        setns(&self.home).unwrap_or_else(|e| panic!("setns back: {e}"));
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
    spawn_in_named(&ns.name, f)
}

/// [`spawn_in`] for a namespace known by name (one a lab made with `ip
/// netns add` and removes itself).
pub fn spawn_in_named<T: Send + 'static>(
    name: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> JoinHandle<T> {
    let path = path_of(name);
    std::thread::spawn(move || {
        let file = File::open(&path).unwrap_or_else(|e| panic!("opening {path}: {e}"));
        setns(&file).unwrap_or_else(|e| panic!("setns into {path}: {e}"));
        f()
    })
}
