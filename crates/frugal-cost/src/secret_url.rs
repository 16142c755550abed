//! URLs that may carry a secret (the ledger's PostgreSQL URL, a Redis URL): where the
//! secret lies in one, the URL as messages may show it, and whether it holds one at all
//! (what decides that `frugal deploy kubernetes` puts it in a Secret).
//!
//! The grammar is read for the worst case, a password pasted unencoded: it may hold `/`,
//! `?`, `#`, `@` and `:`, so the user part runs from `://` to the *last* `@`, not to the
//! first `/` or `@`. Where a path or query holds an `@` too, more than the secret is hidden,
//! never less. Query parameters that name a password (`password`, `sslpassword`, Redis'
//! `pass`) are hidden wherever they appear after the user part.

use std::ops::Range;

/// How much of a URL's user part is secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hide {
    /// The password only: `user:***@` (PostgreSQL's user name helps read a refused login).
    Password,
    /// The whole user part: `***@` (a Redis ACL user name may be a token).
    UserInfo,
}

/// A URL read for its secrets; it borrows the text and copies nothing.
#[derive(Debug, Clone)]
pub struct SecretUrl<'a> {
    text: &'a str,
    /// `user[:password]`, between `://` and the last `@`.
    userinfo: Option<Range<usize>>,
}

impl<'a> SecretUrl<'a> {
    pub fn parse(text: &'a str) -> SecretUrl<'a> {
        let userinfo = text.find("://").and_then(|scheme| {
            let start = scheme + 3;
            text[start..].rfind('@').map(|at| start..start + at)
        });
        SecretUrl { text, userinfo }
    }

    /// Where the text after the user part (`@host...`, or all of it without one) begins.
    fn tail_start(&self) -> usize {
        self.userinfo.as_ref().map_or(0, |r| r.end)
    }

    /// The URL up to its query, and the query (after its `?`), if it has one: a `?` inside
    /// the user part is the password's, not the query's start.
    pub fn split_query(&self) -> (&'a str, Option<&'a str>) {
        let tail = self.tail_start();
        match self.text[tail..].find('?') {
            Some(q) => (&self.text[..tail + q], Some(&self.text[tail + q + 1..])),
            None => (self.text, None),
        }
    }

    /// Whether the URL carries something `hide` would hide.
    pub fn has_secret(&self, hide: Hide) -> bool {
        let in_user = self.userinfo.as_ref().is_some_and(|r| {
            let user = &self.text[r.clone()];
            match hide {
                Hide::Password => user.contains(':'),
                Hide::UserInfo => !user.is_empty(),
            }
        });
        in_user || self.pieces().any(|(piece, _)| secret_param(piece))
    }

    /// The URL as it may be shown: the secret parts as `***`.
    pub fn shown(&self, hide: Hide) -> String {
        let mut out = String::with_capacity(self.text.len());
        if let Some(r) = &self.userinfo {
            out.push_str(&self.text[..r.start]);
            match (hide, self.text[r.clone()].split_once(':')) {
                (Hide::Password, Some((user, _))) => {
                    out.push_str(user);
                    out.push_str(":***");
                }
                (Hide::Password, None) => out.push_str(&self.text[r.clone()]),
                (Hide::UserInfo, _) => out.push_str("***"),
            }
        }
        for (piece, separator) in self.pieces() {
            match piece.split_once('=') {
                Some((key, _)) if secret_param(piece) => {
                    out.push_str(key);
                    out.push_str("=***");
                }
                _ => out.push_str(piece),
            }
            out.push_str(separator);
        }
        out
    }

    /// The text after the user part cut at each `?` and `&`, with the separator that ends
    /// each piece: a parameter in a path or a query, or one after an `@` misread as the
    /// user part's end, is looked at all the same.
    fn pieces(&self) -> impl Iterator<Item = (&'a str, &'a str)> {
        self.text[self.tail_start()..]
            .split_inclusive(['?', '&'])
            .map(|p| match p.strip_suffix(['?', '&']) {
                Some(piece) => (piece, &p[piece.len()..]),
                None => (p, ""),
            })
    }
}

/// `key=value` whose key (percent-decoded) names a password.
fn secret_param(piece: &str) -> bool {
    let Some((key, _)) = piece.split_once('=') else {
        return false;
    };
    url::form_urlencoded::parse(key.as_bytes())
        .next()
        .is_some_and(|(key, _)| {
            let key = key.to_ascii_lowercase();
            key == "pass" || key.contains("password")
        })
}

#[cfg(test)]
mod tests {
    use super::{Hide, SecretUrl};
    use frugal_testkit::secrets::{query_encoded, url_password};
    use proptest::prelude::*;

    fn shown(url: &str, hide: Hide) -> String {
        SecretUrl::parse(url).shown(hide)
    }

    #[test]
    fn passwords_are_hidden_wherever_they_are() {
        let pw = Hide::Password;
        // Issue 31: a base64 password holds `/`; the user part ran to the first `/`.
        assert_eq!(
            shown("postgres://user:Zm9v/YmFy@host/db", pw),
            "postgres://user:***@host/db"
        );
        assert_eq!(
            shown("postgres://u:p@ss?w#rd:x@db:5432/l?sslmode=require", pw),
            "postgres://u:***@db:5432/l?sslmode=require"
        );
        assert_eq!(
            shown("postgres://db/l?user=me&Pass%77ord=s3cret", pw),
            "postgres://db/l?user=me&Pass%77ord=***"
        );
        assert_eq!(
            shown("postgres://me@db/l?sslpassword=k", pw),
            "postgres://me@db/l?sslpassword=***"
        );
        assert_eq!(
            shown("redis://:hunter2@cache:6379/0", Hide::UserInfo),
            "redis://***@cache:6379/0"
        );
        assert_eq!(
            shown(
                "redis+unix:///run/redis.sock?db=1&pass=hunter2",
                Hide::UserInfo
            ),
            "redis+unix:///run/redis.sock?db=1&pass=***"
        );
        // An `@` in a query is taken for the user part's end: too much hidden, not too little.
        assert_eq!(
            shown("rediss://user:pw@h/1?x=y@z", Hide::UserInfo),
            "rediss://***@z"
        );
        for plain in ["postgres://db:5432/l", "redis://127.0.0.1:6379", "l.sqlite"] {
            assert_eq!(shown(plain, pw), plain);
            assert!(!SecretUrl::parse(plain).has_secret(Hide::UserInfo));
        }
        assert!(!SecretUrl::parse("postgres://me@db/l").has_secret(pw));
        assert!(SecretUrl::parse("postgres://me@db/l").has_secret(Hide::UserInfo));
        assert!(SecretUrl::parse("postgres://me:Zm9v/YmFy@db/l").has_secret(pw));
    }

    #[test]
    fn the_query_starts_after_the_user_part() {
        let url = SecretUrl::parse("postgres://u:a?b@h/db?sslmode=require");
        assert_eq!(
            url.split_query(),
            ("postgres://u:a?b@h/db", Some("sslmode=require"))
        );
        assert_eq!(
            SecretUrl::parse("postgres://u:a?b@h/db").split_query(),
            ("postgres://u:a?b@h/db", None)
        );
    }

    proptest! {
        #[test]
        fn no_password_is_ever_shown(pw in url_password(), query in any::<bool>()) {
            let q = if query { "?sslmode=disable&application_name=frugal" } else { "" };
            let encoded = query_encoded(&pw);
            for (url, hide) in [
                (format!("postgres://frugal:{pw}@db.data:5432/ledger{q}"), Hide::Password),
                (format!("postgresql://:{pw}@db.data/ledger{q}"), Hide::Password),
                (format!("postgres://db.data/ledger?user=frugal&password={encoded}"), Hide::Password),
                (format!("redis://:{pw}@cache:6379/0"), Hide::UserInfo),
                (format!("rediss://frugal:{pw}@cache:6379"), Hide::UserInfo),
            ] {
                let parsed = SecretUrl::parse(&url);
                let text = parsed.shown(hide);
                prop_assert!(!text.contains(&pw) && !text.contains(&encoded), "{url} shown as {text}");
                prop_assert!(parsed.has_secret(hide), "{url}");
            }
        }
    }
}
