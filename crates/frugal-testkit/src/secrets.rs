//! Generated secrets for property tests of what may show a URL.

use proptest::prelude::*;

/// A password as it is written in a URL's user part: every character a URL may hold,
/// some percent-encoded, and the raw `/`, `?`, `#`, `@` and `:` that users paste unencoded
/// (a base64 password holds `/`). 8 to 24 pieces, so that it cannot occur by chance in the
/// rest of a message.
pub fn url_password() -> impl Strategy<Value = String> {
    const LEGAL: &str = "ABCXYZabcxyz0189-._~!$&'()*+,;=/?#@:%";
    let raw = proptest::sample::select(LEGAL.chars().collect::<Vec<_>>()).prop_map(|c| match c {
        // `%` only starts an encoded byte.
        '%' => "%2F".to_owned(),
        c => c.to_string(),
    });
    let encoded = any::<u8>().prop_map(|b| format!("%{b:02X}"));
    proptest::collection::vec(prop_oneof![4 => raw, 1 => encoded], 8..24)
        .prop_map(|parts| parts.concat())
}

/// `password` encoded for a query parameter, where any parser ends a value at a raw `&`.
pub fn query_encoded(password: &str) -> String {
    password
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                char::from(b).to_string()
            }
            b => format!("%{b:02X}"),
        })
        .collect()
}
