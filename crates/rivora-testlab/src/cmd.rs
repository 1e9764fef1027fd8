//! Shell commands for labs: a failure names the command and carries what
//! it printed, so a broken lab says why.

use std::process::{Command, ExitStatus};

#[derive(Debug, thiserror::Error)]
pub enum CmdError {
    #[error("spawning `{cmd}`: {source}")]
    Spawn {
        cmd: String,
        #[source]
        source: std::io::Error,
    },
    #[error("`{cmd}` failed ({status}):\n{stdout}{stderr}")]
    Failed {
        cmd: String,
        status: ExitStatus,
        stdout: String,
        stderr: String,
    },
}

/// Run `cmd` with `sh -c`; its standard output, or what it printed and
/// how it ended.
pub fn try_sh(cmd: &str) -> Result<String, CmdError> {
    let out = Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .output()
        .map_err(|source| CmdError::Spawn {
            cmd: cmd.to_string(),
            source,
        })?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        return Err(CmdError::Failed {
            cmd: cmd.to_string(),
            status: out.status,
            stdout,
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    Ok(stdout)
}

/// [`try_sh`] for tests: a failure panics with the command's output.
pub fn sh(cmd: &str) -> String {
    try_sh(cmd).unwrap_or_else(|e| panic!("{e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_names_the_command_and_carries_its_output() {
        assert_eq!(try_sh("printf ok").expect("printf runs"), "ok");
        let e = try_sh("echo out; echo err >&2; exit 3").expect_err("exit 3 fails");
        let text = e.to_string();
        for part in ["`echo out; echo err >&2; exit 3`", "out\n", "err\n", "3"] {
            assert!(text.contains(part), "{part:?} missing from {text:?}");
        }
    }
}
