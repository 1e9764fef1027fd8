//! The configuration parser and validator under random and mutated input:
//! every text gets an answer (a `Config` or a `ConfigError`), never a
//! panic, in bounded time; an error names the file and says something.
//!
//! Seeds are the example files and their own fragments; mutations delete,
//! duplicate and swap lines, splice YAML tokens and out-of-range values,
//! truncate, and nest. PROPTEST_CASES raises the count (`make fuzz`).

use std::path::Path;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use rivora_model::config::{parse, summary};

/// Far above what a well-behaved parse of these sizes takes here, far below
/// the seconds the quadratic inputs took.
const BUDGET: Duration = Duration::from_secs(2);

fn examples() -> Vec<String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let mut out: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "yaml"))
        .map(|e| std::fs::read_to_string(e.path()).expect("example file"))
        .collect();
    out.sort();
    assert!(!out.is_empty(), "no example YAML under {}", dir.display());
    out
}

/// Parse `text`; fail the case on a panic (proptest reports it with the
/// input), on a blown time budget, or on an error that says nothing.
fn check(text: &str) -> Result<(), TestCaseError> {
    let path = Path::new("/etc/rivora/fuzz.yaml");
    let start = Instant::now();
    let res = parse(path, text);
    let took = start.elapsed();
    prop_assert!(
        took < BUDGET,
        "parse took {took:?} for {} bytes",
        text.len()
    );
    match res {
        Ok(c) => {
            // What the daemon does next with a valid file.
            let _ = summary(&c);
            let _ = c.node_settings();
        }
        Err(e) => {
            let msg = e.to_string();
            prop_assert!(
                msg.starts_with("/etc/rivora/fuzz.yaml"),
                "error does not name the file: {msg}"
            );
            prop_assert!(!e.message.trim().is_empty(), "empty message: {msg}");
            // Item 7: an error about 5,000 VIPs was 70 KB. However large
            // the input, the message stays readable.
            prop_assert!(msg.len() < 4096, "a {} byte message", msg.len());
        }
    }
    Ok(())
}

const TOKENS: &[&str] = &[
    "{",
    "}",
    "[",
    "]",
    ":",
    ": ",
    "- ",
    ",",
    "\t",
    "  ",
    "\n",
    "#",
    "&a ",
    "*a",
    "!!str ",
    "!!binary ",
    "'",
    "\"",
    "|",
    ">",
    "?",
    "~",
    "null",
    "true",
    "false",
    "0",
    "-1",
    "65535",
    "65536",
    "4294967296",
    "1e400",
    "0x10",
    "500ms",
    "0s",
    "1h",
    "99999999d",
    "10.0.0.300",
    "::ffff:1.2.3.4",
    "255.255.255.255",
    "0.0.0.0",
    "fe80::1%eth0",
    "nat",
    "dsr",
    "l3dsr",
    "tcp",
    "udp",
    "sctp",
    "vips:",
    "backends:",
    "address: ",
    "port: ",
    "ports: ",
    "weight: ",
    "mode: ",
    "healthCheck: ",
    "affinity: ",
    "rateLimit: ",
    "name: ",
    "interfaces:",
    "node:",
    "api:",
    "metrics:",
    "<<: *a",
    "\u{feff}",
    "\u{0}",
    "é",
    "\r\n",
];

#[derive(Clone, Debug)]
enum Mutation {
    DeleteLine(usize),
    DuplicateLine(usize),
    SwapLines(usize, usize),
    Splice(usize, usize),
    Truncate(usize),
    Indent(usize, usize),
    Nest(usize, usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        any::<usize>().prop_map(Mutation::DeleteLine),
        any::<usize>().prop_map(Mutation::DuplicateLine),
        (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Mutation::SwapLines(a, b)),
        (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Mutation::Splice(a, b)),
        (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Mutation::Splice(a, b)),
        any::<usize>().prop_map(Mutation::Truncate),
        (any::<usize>(), 0usize..9).prop_map(|(a, n)| Mutation::Indent(a, n)),
        (any::<usize>(), 1usize..200).prop_map(|(a, n)| Mutation::Nest(a, n)),
    ]
}

fn char_floor(s: &str, i: usize) -> usize {
    let mut i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

fn apply(text: &str, m: &Mutation) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    if lines.is_empty() {
        lines.push(String::new());
    }
    let n = lines.len();
    match *m {
        Mutation::DeleteLine(i) => {
            lines.remove(i % n);
        }
        Mutation::DuplicateLine(i) => {
            let l = lines[i % n].clone();
            lines.insert(i % n, l);
        }
        Mutation::SwapLines(a, b) => lines.swap(a % n, b % n),
        Mutation::Splice(at, tok) => {
            let s = lines.join("\n");
            let at = char_floor(&s, at % (s.len() + 1));
            let mut s = s;
            s.insert_str(at, TOKENS[tok % TOKENS.len()]);
            return s;
        }
        Mutation::Truncate(at) => {
            let s = lines.join("\n");
            let at = char_floor(&s, at % (s.len() + 1));
            return s[..at].to_string();
        }
        Mutation::Indent(i, by) => {
            let l = &mut lines[i % n];
            *l = format!("{}{l}", " ".repeat(by));
        }
        Mutation::Nest(i, depth) => {
            // Flow collections nested `depth` deep in place of a value.
            let l = &mut lines[i % n];
            let open = if depth % 2 == 0 { "[" } else { "{a: " };
            let close = if depth % 2 == 0 { "]" } else { "}" };
            *l = format!("{l} {}{}", open.repeat(depth), close.repeat(depth));
        }
    }
    lines.join("\n")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// Mutants of the example files.
    #[test]
    fn mutated_examples_get_an_answer(
        which in any::<usize>(),
        muts in prop::collection::vec(mutation(), 1..6),
    ) {
        let ex = examples();
        let mut text = ex[which % ex.len()].clone();
        for m in &muts {
            text = apply(&text, m);
        }
        check(&text)?;
    }

    /// Text made of YAML tokens in any order.
    #[test]
    fn token_soup_gets_an_answer(toks in prop::collection::vec(any::<usize>(), 0..400)) {
        let text: String = toks.iter().map(|t| TOKENS[t % TOKENS.len()]).collect();
        check(&text)?;
    }

    /// Any string at all.
    #[test]
    fn any_text_gets_an_answer(text in ".{0,2000}") {
        check(&text)?;
    }
}

/// The shapes the issue timed (item 4), at sizes a parse must refuse or
/// accept quickly: deep nesting of either kind, long flat lists.
#[test]
fn deep_and_wide_inputs_are_answered_in_time() {
    for text in [
        "[".repeat(100_000),
        "{a: ".repeat(20_000),
        format!("vips: {}{}", "[".repeat(5_000), "]".repeat(5_000)),
        format!("vips:\n{}", "  - {}\n".repeat(20_000)),
        "- ".repeat(50_000),
    ] {
        check(&text).unwrap_or_else(|e| panic!("{} bytes: {e}", text.len()));
    }
}
