//! What Rivora's binaries share on their command lines.

/// Go-style single-dash long flags (`-config rivora.yaml`, as the design
/// card writes them) are accepted beside `--config`: every argument after
/// the program's name that starts with one dash and is longer than a
/// short flag gets a second dash.
pub fn go_style_flags(args: impl Iterator<Item = String>) -> Vec<String> {
    args.enumerate()
        .map(|(i, a)| {
            if i > 0 && a.starts_with('-') && !a.starts_with("--") && a.len() > 2 {
                format!("-{a}")
            } else {
                a
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_dash_long_flags_get_a_second_dash() {
        let a = go_style_flags(
            ["-x", "-config", "f", "--kube", "-v", "-", "--"]
                .iter()
                .map(|s| s.to_string()),
        );
        assert_eq!(a, ["-x", "--config", "f", "--kube", "-v", "-", "--"]);
    }
}
