//! The report as a table (then, for each check that did not pass, why it
//! matters and the fix) or as JSON.

use std::fmt::Write;

use crate::{Report, Verdict};

pub fn table(r: &Report) -> String {
    let rows: Vec<[String; 4]> = r
        .checks
        .iter()
        .map(|c| {
            let verdict = if c.verdict == Verdict::Fail && !c.blocks_any(&r.modes) {
                // A failure that blocks only modes not asked about.
                "fail*".to_string()
            } else {
                c.verdict.as_str().to_string()
            };
            [
                c.id.clone(),
                c.subject.clone().unwrap_or_else(|| "-".into()),
                verdict,
                c.found.clone(),
            ]
        })
        .collect();
    let head = ["CHECK", "SUBJECT", "VERDICT", "FOUND"];
    let mut w = [head[0].len(), head[1].len(), head[2].len()];
    for row in &rows {
        for (i, cell) in row[..3].iter().enumerate() {
            w[i] = w[i].max(cell.len());
        }
    }
    let mut out = String::new();
    let line = |out: &mut String, c: [&str; 4]| {
        let _ = writeln!(
            out,
            "{:<w0$}  {:<w1$}  {:<w2$}  {}",
            c[0],
            c[1],
            c[2],
            c[3],
            w0 = w[0],
            w1 = w[1],
            w2 = w[2]
        );
    };
    line(&mut out, head);
    for row in &rows {
        line(&mut out, [&row[0], &row[1], &row[2], &row[3]]);
    }
    let modes: Vec<&str> = r.modes.iter().map(|m| m.as_str()).collect();
    for c in r.checks.iter().filter(|c| c.verdict != Verdict::Pass) {
        let subject = c
            .subject
            .as_deref()
            .map(|s| format!(" {s}"))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "\n{} {}{}: {}",
            c.verdict.as_str(),
            c.id,
            subject,
            c.found
        );
        let _ = writeln!(out, "  why: {}", c.why);
        if let Some(f) = &c.fix {
            let _ = writeln!(out, "  fix: {f}");
        }
        if !c.blocks.is_empty() {
            let b: Vec<&str> = c.blocks.iter().map(|m| m.as_str()).collect();
            let _ = writeln!(out, "  blocks: {}", b.join(", "));
        }
    }
    let _ = writeln!(
        out,
        "\nmodes: {}: {}",
        modes.join(", "),
        if r.blocking {
            "NOT READY (a failed check blocks one of them)"
        } else {
            "ready"
        }
    );
    if r.checks
        .iter()
        .any(|c| c.verdict == Verdict::Fail && !c.blocks_any(&r.modes))
    {
        let _ = writeln!(out, "fail*: blocks only modes not asked for (--mode)");
    }
    out
}

pub fn json(r: &Report) -> String {
    serde_json::to_string_pretty(r).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}
