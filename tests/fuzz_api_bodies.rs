//! The API's routes under random and mutated requests, against the fake
//! state: every answer is a 2xx or a 4xx with an `ApiError` body that
//! says something (never a 5xx, never a panic), and a request the server
//! refuses leaves the state untouched.
//!
//! Bodies are any bytes, JSON-shaped token soup, and mutants of the valid
//! drain body; paths are the known routes and random tails under /v1/vips.
//! PROPTEST_CASES raises the count (`make fuzz`).

mod api_support;

use std::sync::Arc;

use api_support::{Fake, B1, B6, VIP4, VIP6};
use proptest::prelude::*;
use rivora::api::{api_routes, ApiError};
use warp::http::StatusCode;

const LIMIT: u64 = 1024;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// Send one request to fresh routes over a fresh fake; check the answer.
fn check(
    rt: &tokio::runtime::Runtime,
    method: &str,
    path: &str,
    body: &[u8],
) -> Result<(), TestCaseError> {
    let fake = Arc::new(Fake::default());
    let routes = api_routes(fake.clone(), LIMIT);
    let req = warp::test::request().method(method).path(path).body(body);
    let res = rt.block_on(req.reply(&routes));
    let status = res.status();
    let out = res.into_body();
    prop_assert!(
        status.is_success() || status.is_client_error(),
        "{method} {path}: {status} for body {:?}: {:?}",
        String::from_utf8_lossy(body),
        String::from_utf8_lossy(&out)
    );
    if status.is_client_error() {
        let e: ApiError = serde_json::from_slice(&out).map_err(|e| {
            TestCaseError::fail(format!(
                "{method} {path}: {status} without an ApiError body ({e}): {:?}",
                String::from_utf8_lossy(&out)
            ))
        })?;
        prop_assert!(!e.error.trim().is_empty(), "{status} with an empty message");
        // A refused write never reaches the state.
        if method == "POST" {
            prop_assert!(
                fake.calls().is_empty()
                    || status == StatusCode::NOT_FOUND
                    || status == StatusCode::CONFLICT,
                "{method} {path} {status}, yet the state saw {:?}",
                fake.calls()
            );
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
    ",",
    "\"",
    "\"target\"",
    "\"vip\"",
    "\"extra\"",
    "null",
    "true",
    "1",
    "-0",
    "1e999",
    "\"\\u0000\"",
    "\"\\ud800\"",
    "\"10.0.1.1:8080\"",
    "\"[2001:db8::10]:53\"",
    "\"10.0.0.300:80\"",
    "\"tcp/10.0.0.1:80\"",
    "\"udp/[2001:db8::1]:53\"",
    "\"tcp/\"",
    "\"\"",
    " ",
    "\n",
    "\u{feff}",
    "\"é\"",
];

#[derive(Clone, Debug)]
enum Edit {
    Flip(usize, u8),
    Cut(usize),
    Insert(usize, usize),
    Delete(usize),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Edit::Flip(i, b)),
        any::<usize>().prop_map(Edit::Cut),
        (any::<usize>(), any::<usize>()).prop_map(|(i, t)| Edit::Insert(i, t)),
        any::<usize>().prop_map(Edit::Delete),
    ]
}

fn mutate(mut b: Vec<u8>, edits: &[Edit]) -> Vec<u8> {
    for e in edits {
        let n = b.len() + 1;
        match *e {
            Edit::Flip(i, x) if !b.is_empty() => {
                let at = i % b.len();
                b[at] ^= x;
            }
            Edit::Cut(i) => b.truncate(i % n),
            Edit::Insert(i, t) => {
                let tok = TOKENS[t % TOKENS.len()].as_bytes();
                let at = i % n;
                b.splice(at..at, tok.iter().copied());
            }
            Edit::Delete(i) if !b.is_empty() => {
                b.remove(i % b.len());
            }
            _ => {}
        }
    }
    b
}

fn valid_bodies() -> Vec<String> {
    vec![
        format!(r#"{{"target":"{B1}","vip":"{VIP4}"}}"#),
        format!(r#"{{"target":"{B6}","vip":"{VIP6}"}}"#),
        format!(r#"{{"target":"{B1}"}}"#),
        "{}".to_string(),
    ]
}

const POSTS: &[&str] = &["/v1/drain", "/v1/undrain", "/v1/reload"];

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    #[test]
    fn any_bytes_as_a_body(route in 0usize..3, body in prop::collection::vec(any::<u8>(), 0..1500)) {
        check(&runtime(), "POST", POSTS[route], &body)?;
    }

    #[test]
    fn json_token_soup_as_a_body(route in 0usize..3, toks in prop::collection::vec(any::<usize>(), 0..60)) {
        let body: String = toks.iter().map(|t| TOKENS[t % TOKENS.len()]).collect();
        check(&runtime(), "POST", POSTS[route], body.as_bytes())?;
    }

    #[test]
    fn mutated_valid_bodies(route in 0usize..3, which in any::<usize>(), edits in prop::collection::vec(edit(), 1..8)) {
        let v = valid_bodies();
        let body = mutate(v[which % v.len()].clone().into_bytes(), &edits);
        check(&runtime(), "POST", POSTS[route], &body)?;
    }

    #[test]
    fn any_vip_name_in_the_path(tail in "[ -~]{0,80}", method in prop::sample::select(vec!["GET", "POST", "DELETE"])) {
        // Percent-encode what a request line cannot carry.
        let enc: String = tail
            .bytes()
            .map(|b| if b.is_ascii_alphanumeric() || b"/.:-_[]".contains(&b) { (b as char).to_string() } else { format!("%{b:02X}") })
            .collect();
        check(&runtime(), method, &format!("/v1/vips/{enc}"), b"")?;
    }
}
