//! The configuration parser and validator: any bytes that are UTF-8 get a
//! `Config` or a `ConfigError` naming the file, never a panic.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use rivora_model::config::{parse, summary};

fuzz_target!(|data: &[u8]| {
    // The daemon refuses non-UTF-8 files before parsing (config::load).
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match parse(Path::new("/fuzz.yaml"), text) {
        Ok(c) => {
            let _ = summary(&c);
            let _ = c.node_settings();
        }
        Err(e) => assert!(e.to_string().starts_with("/fuzz.yaml")),
    }
});
