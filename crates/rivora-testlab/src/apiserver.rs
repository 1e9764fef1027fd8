//! A real kube-apiserver and etcd on loopback (`scripts/apiserver.sh`):
//! certificates made for this run, RBAC on, a `system:masters` client.
//! Starting fails with the script's output when the binary is missing
//! (`make apiserver`) or the servers do not come up: a Kubernetes test
//! never passes without a server. Dropping it stops both and removes the
//! state directory, also when a test panics; a watchdog started with them
//! does the same if this process dies before the destructor runs.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

#[derive(Debug, thiserror::Error)]
pub enum ApiServerError {
    #[error("spawning scripts/apiserver.sh: {0}")]
    Spawn(#[source] std::io::Error),
    #[error("scripts/apiserver.sh start {dir} failed {output} (is target/apiserver/kube-apiserver built? `make apiserver`)")]
    Start { dir: String, output: String },
    #[error("scripts/apiserver.sh start {dir}: {what}")]
    Unexpected { dir: String, what: String },
}

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

/// The workspace's script (this crate is crates/rivora-testlab).
fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/apiserver.sh")
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
    /// Start both with their state in `dir` (made by the script; it must
    /// not exist).
    pub fn try_start_in(dir: PathBuf) -> Result<Self, ApiServerError> {
        let out = Command::new("bash")
            .arg(script())
            .arg("start")
            .arg(&dir)
            .env("APISERVER_WATCH_PID", std::process::id().to_string())
            .output()
            .map_err(ApiServerError::Spawn)?;
        if !out.status.success() {
            // The script cleans up after a failed start; stop again in
            // case it was killed half-way.
            let _ = Command::new("bash")
                .arg(script())
                .arg("stop")
                .arg(&dir)
                .output();
            return Err(ApiServerError::Start {
                dir: dir.display().to_string(),
                output: describe(&out),
            });
        }
        // From here the servers run: an error below must still stop them,
        // which the drop does.
        let mut server = Self {
            kubeconfig: dir.join("kubeconfig"),
            url: String::new(),
            ca_cert: dir.join("ca.crt"),
            client_cert: dir.join("admin.crt"),
            client_key: dir.join("admin.key"),
            dir,
        };
        let unexpected = |s: &Self, what: String| ApiServerError::Unexpected {
            dir: s.dir.display().to_string(),
            what,
        };
        let printed = String::from_utf8_lossy(&out.stdout);
        if printed.trim() != server.kubeconfig.to_string_lossy() {
            return Err(unexpected(
                &server,
                format!("printed {printed:?}, not its kubeconfig's path"),
            ));
        }
        let url = std::fs::read_to_string(server.dir.join("server"))
            .map_err(|e| unexpected(&server, format!("reading its server file: {e}")))?;
        server.url = url.trim().to_string();
        if !server.url.starts_with("https://127.0.0.1:") {
            return Err(unexpected(
                &server,
                format!("server URL {:?} is not on loopback", server.url),
            ));
        }
        Ok(server)
    }

    /// For tests: state under the temporary directory, a failure panics
    /// with the script's output.
    pub fn start() -> Self {
        let dir = std::env::temp_dir().join(crate::unique("rivora-apiserver-"));
        Self::try_start_in(dir).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Where it listens (from `url`), for proxies and rivorad's kubeconfig.
    pub fn addr(&self) -> std::net::SocketAddr {
        self.url
            .strip_prefix("https://")
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("API server URL {:?} is not https://ADDR", self.url))
    }

    /// The loopback port it listens on.
    pub fn port(&self) -> u16 {
        self.addr().port()
    }

    /// The kube-apiserver log so far, for a failure's message.
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
            // Not a panic: this may run while a test is already unwinding.
            Ok(out) => eprintln!(
                "scripts/apiserver.sh stop {} failed {}",
                self.dir.display(),
                describe(&out)
            ),
            Err(e) => eprintln!("spawning scripts/apiserver.sh stop: {e}"),
        }
    }
}
