//! What the file's text goes through around serde: limits checked before
//! parsing, errors turned into `field` + `line` + message, and the line of
//! a field named by a check that runs after deserialising.
//!
//! serde's data model has no spans, so a field's line is found by walking
//! the same text again with serde_yaml_ng down to that field and failing
//! there on purpose: the parser stamps the failure with the field's
//! position. This costs one more parse, only when there is an error.

use std::cell::Cell;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// Largest file accepted: a full-scale configuration (4,096 VIPs with
/// their backends) is a few hundred KiB.
pub const MAX_BYTES: u64 = 1 << 20;
/// Deepest nesting accepted; a real file is about 6 deep. libyaml's time
/// grows faster than linearly with depth (100,000 `[` took 38 s).
pub const MAX_DEPTH: usize = 64;

/// Characters after which `[`, `{` or a quote starts a value rather than
/// sitting inside a plain scalar.
fn starts_value(prev: Option<char>) -> bool {
    matches!(prev, None | Some(':' | ',' | '[' | '{' | '-' | '?'))
}

/// The first (1-based) line where `text` nests deeper than `max`,
/// estimated without parsing: block indentation levels, compact `- - x`
/// sequences and flow brackets, with quoted scalars, comments and block
/// scalars (`|`, `>`) skipped. It errs towards counting more, which only
/// matters for files far deeper than any real one.
pub fn too_deep(text: &str, max: usize) -> Option<usize> {
    let mut indents: Vec<usize> = Vec::new();
    let mut flow = 0usize;
    let mut flow_base = 0usize;
    let mut quote: Option<char> = None;
    let mut block_scalar: Option<usize> = None;
    for (n, line) in text.lines().enumerate() {
        let indent = line.len() - line.trim_start_matches(' ').len();
        let content = &line[indent..];
        if let Some(parent) = block_scalar {
            if content.trim().is_empty() || indent > parent {
                continue;
            }
            block_scalar = None;
        }
        let mut rest = content;
        let mut base = flow_base;
        if flow == 0 && quote.is_none() {
            if rest.is_empty() || rest.starts_with('#') {
                continue;
            }
            while indents.last().is_some_and(|&l| l > indent) {
                indents.pop();
            }
            if indents.last() != Some(&indent) {
                indents.push(indent);
            }
            let mut dashes = 0;
            while rest == "-" || rest.starts_with("- ") {
                dashes += 1;
                rest = rest[1..].trim_start_matches(' ');
            }
            base = indents.len() + dashes;
            if base > max {
                return Some(n + 1);
            }
        }
        let mut prev: Option<char> = None;
        let mut chars = rest.chars().peekable();
        let mut comment_at = rest.len();
        let mut pos = 0;
        while let Some(c) = chars.next() {
            let here = pos;
            pos += c.len_utf8();
            match quote {
                Some('"') => {
                    if c == '\\' {
                        if let Some(e) = chars.next() {
                            pos += e.len_utf8();
                        }
                    } else if c == '"' {
                        quote = None;
                        prev = Some(c);
                    }
                    continue;
                }
                Some(_) => {
                    if c == '\'' {
                        if chars.peek() == Some(&'\'') {
                            chars.next();
                            pos += 1;
                        } else {
                            quote = None;
                            prev = Some(c);
                        }
                    }
                    continue;
                }
                None => {}
            }
            match c {
                '#' if here == 0 || rest[..here].ends_with([' ', '\t']) => {
                    comment_at = here;
                    break;
                }
                '"' | '\'' if starts_value(prev) => quote = Some(c),
                '[' | '{' if flow > 0 || starts_value(prev) => {
                    if flow == 0 {
                        flow_base = base;
                    }
                    flow += 1;
                    if flow_base + flow > max {
                        return Some(n + 1);
                    }
                }
                ']' | '}' if flow > 0 => flow -= 1,
                _ => {}
            }
            if !c.is_whitespace() {
                prev = Some(c);
            }
        }
        // A block scalar's lines are text, however they are indented.
        if flow == 0 && quote.is_none() {
            let last = rest[..comment_at].split_whitespace().last().unwrap_or("");
            let mut ind = last.chars();
            if matches!(ind.next(), Some('|' | '>'))
                && ind.all(|c| c == '-' || c == '+' || c.is_ascii_digit())
            {
                block_scalar = Some(indent);
            }
        }
    }
    None
}

/// One step of a field path: `vips[3].backends[1].weight` is
/// `Key(vips) Index(3) Key(backends) Index(1) Key(weight)`.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Step {
    Key(String),
    Index(usize),
}

fn steps(path: &str) -> Vec<Step> {
    let mut out = Vec::new();
    for part in path.split('.').filter(|p| !p.is_empty()) {
        let (name, mut idx) = match part.find('[') {
            Some(i) => (&part[..i], &part[i..]),
            None => (part, ""),
        };
        if !name.is_empty() {
            out.push(Step::Key(name.to_string()));
        }
        while let Some(r) = idx.strip_prefix('[') {
            let Some((num, tail)) = r.split_once(']') else {
                break;
            };
            match num.parse() {
                Ok(i) => out.push(Step::Index(i)),
                Err(_) => break,
            }
            idx = tail;
        }
    }
    out
}

/// Where a field is in the text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Found {
    /// 1-based line.
    pub line: usize,
    /// The field itself (`false`: its nearest ancestor the file has).
    pub exact: bool,
}

/// The line of `path` in `text`, or of its nearest ancestor the text has.
pub fn line_of(text: &str, path: &str) -> Option<Found> {
    locate(text, &steps(path), None)
}

/// The line of the second `key:` in the mapping at `path` (serde reports
/// a duplicate field at the mapping's start).
pub fn line_of_duplicate(text: &str, path: &str, key: &str) -> Option<Found> {
    locate(text, &steps(path), Some(key)).filter(|f| f.exact)
}

fn locate(text: &str, steps: &[Step], duplicate: Option<&str>) -> Option<Found> {
    let exact = Cell::new(false);
    let probe = Probe {
        rest: steps,
        duplicate,
        exact: &exact,
    };
    let de = serde_yaml_ng::Deserializer::from_str(text);
    // The probe always fails: the failure's position is the answer.
    let err = probe.deserialize(de).err()?;
    let line = err.location()?.line();
    Some(Found {
        line,
        exact: exact.get(),
    })
}

/// The message of the probe's deliberate failure (never shown).
const HERE: &str = "here";

struct Probe<'a> {
    rest: &'a [Step],
    duplicate: Option<&'a str>,
    exact: &'a Cell<bool>,
}

impl Probe<'_> {
    /// Fail at the current node, marking whether it is the target.
    fn here<E: de::Error>(&self, exact: bool) -> E {
        self.exact.set(exact);
        E::custom(HERE)
    }

    fn at_scalar<T, E: de::Error>(&self) -> Result<T, E> {
        Err(self.here(self.rest.is_empty() && self.duplicate.is_none()))
    }
}

impl<'de> DeserializeSeed<'de> for Probe<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Probe<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("anything")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        self.at_scalar()
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        self.at_scalar()
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        self.at_scalar()
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        self.at_scalar()
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        self.at_scalar()
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.at_scalar()
    }
    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        self.at_scalar()
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        match self.rest.first() {
            Some(Step::Index(i)) => {
                for _ in 0..*i {
                    if seq.next_element::<IgnoredAny>()?.is_none() {
                        return Err(self.here(false));
                    }
                }
                let inner = Probe {
                    rest: &self.rest[1..],
                    duplicate: self.duplicate,
                    exact: self.exact,
                };
                match seq.next_element_seed(inner)? {
                    Some(()) => Err(self.here(false)),
                    None => Err(self.here(false)),
                }
            }
            None if self.duplicate.is_none() => Err(self.here(true)),
            _ => Err(self.here(false)),
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        match (self.rest.first(), self.duplicate) {
            (Some(Step::Key(want)), _) => {
                while let Some(key) = map.next_key::<Key>()? {
                    if key.0.as_deref() == Some(want.as_str()) {
                        map.next_value_seed(Probe {
                            rest: &self.rest[1..],
                            duplicate: self.duplicate,
                            exact: self.exact,
                        })?;
                        break;
                    }
                    map.next_value::<IgnoredAny>()?;
                }
                Err(self.here(false))
            }
            (None, Some(dup)) => {
                let seen = Cell::new(0);
                while map
                    .next_key_seed(DuplicateKey {
                        name: dup,
                        seen: &seen,
                        exact: self.exact,
                    })?
                    .is_some()
                {
                    map.next_value::<IgnoredAny>()?;
                }
                Err(self.here(false))
            }
            (None, None) => Err(self.here(true)),
            (Some(Step::Index(_)), _) => Err(self.here(false)),
        }
    }
}

/// A mapping key, as text when it is a scalar.
struct Key(Option<String>);

impl<'de> de::Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Key;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a key")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Key, E> {
                Ok(Key(Some(v.to_string())))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Key, E> {
                Ok(Key(Some(v.to_string())))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Key, E> {
                Ok(Key(Some(v.to_string())))
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Key, E> {
                Ok(Key(Some(v.to_string())))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Key, E> {
                Ok(Key(None))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Key, E> {
                Ok(Key(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<Key, A::Error> {
                while s.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Key(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Key, A::Error> {
                while m.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Key(None))
            }
        }
        d.deserialize_any(V)
    }
}

/// Reads keys and fails on the second one named `name`, at that key.
struct DuplicateKey<'a> {
    name: &'a str,
    seen: &'a Cell<usize>,
    exact: &'a Cell<bool>,
}

impl<'de> DeserializeSeed<'de> for DuplicateKey<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        // Fail inside the visitor, so that the position is the key's.
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for DuplicateKey<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a key")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        if v == self.name {
            if self.seen.get() == 1 {
                self.exact.set(true);
                return Err(E::custom(HERE));
            }
            self.seen.set(self.seen.get() + 1);
        }
        Ok(())
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<(), A::Error> {
        while s.next_element::<IgnoredAny>()?.is_some() {}
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<(), A::Error> {
        while m.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(())
    }
}

/// A deserialising error, in the file's words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeError {
    /// `vips[0].address`; `None` for the document itself.
    pub field: Option<String>,
    pub line: Option<usize>,
    pub message: String,
}

/// Deserialise `text`, naming the field (camelCase, as written) and the
/// line of the first error.
pub fn from_str<T: de::DeserializeOwned>(text: &str) -> Result<T, DeError> {
    let de = serde_yaml_ng::Deserializer::from_str(text);
    let e = match serde_path_to_error::deserialize(de) {
        Ok(v) => return Ok(v),
        Err(e) => e,
    };
    let path = e.path().to_string();
    let inner = e.into_inner();
    let loc = inner.location();
    let mut message = inner.to_string();
    // serde_yaml_ng puts its own copy of the path in front and the
    // position behind; both are said separately here.
    if let Some(l) = &loc {
        let at = format!(" at line {} column {}", l.line(), l.column());
        if let Some(i) = message.find(&at) {
            message.replace_range(i..i + at.len(), "");
        }
    }
    // A step serde_path_to_error could not follow shows as `?`.
    let path = path
        .split(".?")
        .next()
        .unwrap_or_default()
        .trim_end_matches('?')
        .to_string();
    let mut field = (path != "." && !path.is_empty()).then_some(path);
    if let Some(f) = &field {
        // serde_yaml_ng's path can stop short of serde_path_to_error's
        // (at an unknown key, or inside a hand-written visitor).
        if let Some((head, m)) = message.split_once(": ") {
            let ancestor = f
                .strip_prefix(head)
                .is_some_and(|t| t.is_empty() || t.starts_with('.') || t.starts_with('['));
            if ancestor {
                message = m.to_string();
            }
        }
    }
    let mut line = loc.map(|l| l.line());
    if let Some(name) = message
        .strip_prefix("duplicate field `")
        .and_then(|m| m.strip_suffix('`'))
    {
        let at = field.as_deref().unwrap_or("");
        if let Some(found) = line_of_duplicate(text, at, name) {
            line = Some(found.line);
        }
        let name = name.to_string();
        message = format!("duplicate key {name:?} (a key may appear once in a mapping)");
        field = Some(match field {
            Some(f) => format!("{f}.{name}"),
            None => name,
        });
    }
    if message.ends_with("expected a duration") {
        message.push_str(" like \"500ms\", \"2s\", \"1m30s\" or \"3h\"");
    }
    Err(DeError {
        field,
        line,
        message,
    })
}
