//! The API's request bodies as the server reads them: a drain or undrain
//! body (JSON, then its syntax check), a reload body, a VIP name from a
//! path. Any bytes get a value or an error, never a panic.
#![no_main]

use std::str::FromStr;

use libfuzzer_sys::fuzz_target;
use rivora_api::{DrainRequest, ReloadRequest, VipName};

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = serde_json::from_slice::<DrainRequest>(data) {
        let _ = r.validate();
    }
    let _ = serde_json::from_slice::<ReloadRequest>(data);
    if let Ok(s) = std::str::from_utf8(data) {
        let _ = VipName::from_str(s);
    }
});
