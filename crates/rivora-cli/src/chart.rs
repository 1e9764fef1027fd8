//! The Helm chart this binary carries (`helm/`, embedded by build.rs):
//! written out for helm to read, and its CRDs for `rivora crds`.

use std::io;
use std::path::Path;

use serde::Deserialize;

include!(concat!(env!("OUT_DIR"), "/chart_files.rs"));

/// A Gateway API channel the chart can install.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Channel {
    Standard,
    Experimental,
}

impl Channel {
    pub fn as_str(self) -> &'static str {
        match self {
            Channel::Standard => "standard",
            Channel::Experimental => "experimental",
        }
    }
}

fn file(path: &str) -> Option<&'static [u8]> {
    FILES.iter().find(|(p, _)| *p == path).map(|(_, b)| *b)
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ChartYaml {
    version: String,
    app_version: String,
}

/// The chart's `version` and `appVersion`.
pub fn versions() -> (String, String) {
    let text = file("Chart.yaml").expect("the embedded chart has a Chart.yaml");
    let c: ChartYaml = serde_yaml_ng::from_slice(text)
        .expect("the embedded Chart.yaml has version and appVersion");
    (c.version, c.app_version)
}

/// Write the chart into `dir` (which becomes the chart's root).
pub fn write_to(dir: &Path) -> io::Result<()> {
    for (rel, bytes) in FILES {
        let p = dir.join(rel);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&p, bytes)?;
    }
    Ok(())
}

fn yaml_files(prefix: &str) -> Vec<(&'static str, &'static str)> {
    let mut v: Vec<(&str, &str)> = FILES
        .iter()
        .filter(|(p, _)| p.starts_with(prefix) && p.ends_with(".yaml"))
        .map(|(p, b)| {
            (
                *p,
                std::str::from_utf8(b).expect("the chart's YAML is UTF-8"),
            )
        })
        .collect();
    v.sort();
    v
}

/// Rivora's own CRD files (`crds/`).
pub fn rivora_crd_files() -> Vec<(&'static str, &'static str)> {
    yaml_files("crds/")
}

/// One Gateway API channel's CRD files.
pub fn gateway_api_crd_files(c: Channel) -> Vec<(&'static str, &'static str)> {
    yaml_files(&format!("charts/gateway-api-{}/crds/", c.as_str()))
}

#[derive(Deserialize)]
struct Named {
    metadata: Meta,
}

#[derive(Deserialize)]
struct Meta {
    name: String,
}

/// The `metadata.name` of a CRD file.
pub fn crd_name(yaml: &str) -> String {
    let n: Named = serde_yaml_ng::from_str(yaml).expect("the chart's CRDs have a metadata.name");
    n.metadata.name
}

/// `rivora crds`: Rivora's CRDs, then the channel's if asked, as one
/// YAML stream for `kubectl apply -f -`.
pub fn crds_stream(gateway_api: Option<Channel>) -> String {
    let mut files = rivora_crd_files();
    if let Some(c) = gateway_api {
        files.extend(gateway_api_crd_files(c));
    }
    let mut out = String::new();
    for (_, text) in files {
        let body = text.trim_start_matches('\n');
        // Each file is one document; a separator before each keeps the
        // stream valid whatever the file starts with.
        if !body.lines().any(|l| l == "---") {
            out.push_str("---\n");
        }
        out.push_str(body);
        if !body.ends_with('\n') {
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One version: the chart's, its appVersion (the image tag) and this
    /// binary's are the workspace's.
    #[test]
    fn the_chart_is_this_binarys_version() {
        let (version, app) = versions();
        assert_eq!(version, env!("CARGO_PKG_VERSION"), "Chart.yaml version");
        assert_eq!(app, env!("CARGO_PKG_VERSION"), "Chart.yaml appVersion");
    }

    #[test]
    fn the_embedded_chart_is_whole() {
        for f in [
            "Chart.yaml",
            "values.yaml",
            "values.schema.json",
            "templates/NOTES.txt",
        ] {
            assert!(file(f).is_some(), "{f} embedded");
        }
        let names: Vec<String> = rivora_crd_files()
            .iter()
            .map(|(_, y)| crd_name(y))
            .collect();
        assert!(
            names.contains(&"servicepolicies.rivora.io".to_string()),
            "{names:?}"
        );
        assert!(
            names.contains(&"addresspools.rivora.io".to_string()),
            "{names:?}"
        );
        for c in [Channel::Standard, Channel::Experimental] {
            assert_eq!(
                gateway_api_crd_files(c).len(),
                5,
                "{c:?}: five Gateway API CRDs"
            );
        }
        // .helmignore'd: the subcharts carry these.
        assert!(!FILES
            .iter()
            .any(|(p, _)| p.starts_with("gateway-api-crds/")));
    }

    /// What `rivora crds` prints is the chart's CRDs, each one document.
    #[test]
    fn crds_stream_is_every_crd() {
        let s = crds_stream(None);
        let docs: Vec<serde_yaml_ng::Value> = serde_yaml_ng::Deserializer::from_str(&s)
            .map(serde_yaml_ng::Value::deserialize)
            .collect::<Result<_, _>>()
            .expect("one YAML stream");
        let docs: Vec<_> = docs.into_iter().filter(|d| !d.is_null()).collect();
        assert_eq!(docs.len(), rivora_crd_files().len());
        for d in &docs {
            assert_eq!(d["kind"], "CustomResourceDefinition");
        }
        let with_gw = crds_stream(Some(Channel::Experimental));
        assert_eq!(
            with_gw.matches("kind: CustomResourceDefinition").count(),
            docs.len() + 5
        );
    }
}
