//! The documentation holds together: every relative link in README.md,
//! BENCHMARKS.md and docs/ names a file that exists and, with `#anchor`,
//! a heading of that file (as GitHub makes its anchors); and the README
//! stays a front door (at most 300 lines).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn documents() -> Vec<PathBuf> {
    let mut out = vec![root().join("README.md"), root().join("BENCHMARKS.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("docs/")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    out.extend(docs);
    out
}

/// A heading's anchor, as GitHub derives it: lower case, punctuation
/// other than `-` and `_` dropped, spaces to `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_' || *c == ' ')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown file's headings (outside code fences).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut fence = false;
    let mut out = BTreeSet::new();
    for line in text.lines() {
        if line.starts_with("```") {
            fence = !fence;
            continue;
        }
        if fence {
            continue;
        }
        let hashes = line.chars().take_while(|c| *c == '#').count();
        if hashes > 0 && line[hashes..].starts_with(' ') {
            out.insert(slug(&line[hashes..]));
        }
    }
    out
}

/// Every `](target)` of a Markdown text, outside code fences.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut fence = false;
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.starts_with("```") {
            fence = !fence;
            continue;
        }
        if fence {
            continue;
        }
        let mut rest = line;
        while let Some(i) = rest.find("](") {
            let after = &rest[i + 2..];
            let Some(end) = after.find(')') else { break };
            out.push((n + 1, after[..end].to_string()));
            rest = &after[end..];
        }
    }
    out
}

#[test]
fn every_relative_link_names_a_file_and_heading_that_exist() {
    let mut broken = Vec::new();
    for doc in documents() {
        let text = std::fs::read_to_string(&doc).expect("a document");
        let dir = doc.parent().unwrap_or(Path::new("."));
        for (line, target) in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, anchor) = match target.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (target.as_str(), None),
            };
            let file = if path.is_empty() {
                doc.clone()
            } else {
                dir.join(path)
            };
            let shown = format!("{}:{line}: {target}", doc.display());
            if !file.exists() {
                broken.push(format!("{shown}: no file {}", file.display()));
                continue;
            }
            if let Some(a) = anchor {
                let Ok(t) = std::fs::read_to_string(&file) else {
                    broken.push(format!("{shown}: an anchor into a directory"));
                    continue;
                };
                if !anchors(&t).contains(a) {
                    broken.push(format!("{shown}: no heading #{a} in {}", file.display()));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_readme_is_a_front_door() {
    let text = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let lines = text.lines().count();
    assert!(
        lines <= 300,
        "README.md has {lines} lines: operating detail belongs in docs/"
    );
}

#[test]
fn anchors_are_made_as_github_makes_them() {
    assert_eq!(
        slug("The API's listeners: limits, token, TLS"),
        "the-apis-listeners-limits-token-tls"
    );
    assert_eq!(
        slug("Installing on Kubernetes: the chart, `rivora` and `rivora-doctor`"),
        "installing-on-kubernetes-the-chart-rivora-and-rivora-doctor"
    );
    assert_eq!(
        links("see [a](b.md#c) and [d](#e)"),
        [(1, "b.md#c".into()), (1, "#e".into())]
    );
}
