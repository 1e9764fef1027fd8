//! A real kube-apiserver and etcd on loopback for one test
//! (`scripts/apiserver.sh`): certificates made for this run, RBAC on, a
//! `system:masters` client. [`ApiServer::start`] fails the test with the
//! script's output when the binary is missing (`make apiserver`) or the
//! servers do not come up: a Kubernetes test never passes without a server.
//! Dropping it stops both and removes the state directory, also when the
//! test panics; a watchdog started with them does the same if this process
//! dies before the destructor runs.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use super::unique;

pub struct ApiServer {
    /// The state directory: certificates, logs, etcd's data.
    pub dir: PathBuf,
    /// A kubeconfig for a `system:masters` client (absolute paths inside).
    pub kubeconfig: PathBuf,
    /// `https://127.0.0.1:PORT`.
    pub url: String,
    /// The CA that signed the server's and the client's certificates.
    pub ca_cert: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/apiserver.sh")
}

fn describe(out: &Output) -> String {
    format!(
        "({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

impl ApiServer {
    /// Where it listens (from `url`), for proxies and rivorad's kubeconfig.
    pub fn addr(&self) -> std::net::SocketAddr {
        self.url
            .strip_prefix("https://")
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("API server URL {:?} is not https://ADDR", self.url))
    }

    pub fn start() -> Self {
        let dir = std::env::temp_dir().join(unique("rivora-apiserver-"));
        let out = Command::new("bash")
            .arg(script())
            .arg("start")
            .arg(&dir)
            .env("APISERVER_WATCH_PID", std::process::id().to_string())
            .output()
            .expect("spawning scripts/apiserver.sh");
        if !out.status.success() {
            // The script cleans up after a failed start; stop again in case
            // it was killed half-way.
            let _ = Command::new("bash")
                .arg(script())
                .arg("stop")
                .arg(&dir)
                .output();
            panic!(
                "scripts/apiserver.sh start {} failed {}",
                dir.display(),
                describe(&out)
            );
        }
        // From here the servers run: a panic below must still stop them.
        let mut server = Self {
            kubeconfig: dir.join("kubeconfig"),
            url: String::new(),
            ca_cert: dir.join("ca.crt"),
            client_cert: dir.join("admin.crt"),
            client_key: dir.join("admin.key"),
            dir,
        };
        let printed = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            printed.trim(),
            server.kubeconfig.to_string_lossy(),
            "scripts/apiserver.sh start printed an unexpected kubeconfig path"
        );
        let url = std::fs::read_to_string(server.dir.join("server"))
            .unwrap_or_else(|e| panic!("reading {}/server: {e}", server.dir.display()));
        server.url = url.trim().to_string();
        assert!(
            server.url.starts_with("https://127.0.0.1:"),
            "unexpected server URL {:?}",
            server.url
        );
        server
    }

    /// The kube-apiserver log so far, for a failing test's message.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("apiserver.log")).unwrap_or_default()
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        match Command::new("bash")
            .arg(script())
            .arg("stop")
            .arg(&self.dir)
            .output()
        {
            Ok(out) if out.status.success() => {}
            // Not a panic: this may run while the test is already unwinding.
            Ok(out) => eprintln!(
                "scripts/apiserver.sh stop {} failed {}",
                self.dir.display(),
                describe(&out)
            ),
            Err(e) => eprintln!("spawning scripts/apiserver.sh stop: {e}"),
        }
    }
}
