//! Reading an HTTP body whole, up to a bound: a scrape's or a Prometheus answer's.

use frugal_cost::causes::with_causes;

/// The most of one scrape body or Prometheus answer read, in bytes. A busy vLLM's
/// `/metrics` is a few hundred KB and a fleet's Prometheus answer a few MB; a body past
/// 16 MiB comes from a broken or hostile server, and reading on would hold all of it.
pub const MAX_BODY: usize = 16 << 20;

/// A response's body as text, read a chunk at a time and refused past [`MAX_BODY`]; `what`
/// names it (`{url}'s body`) in errors.
pub(crate) async fn bounded_text(
    mut response: reqwest::Response,
    what: &str,
) -> Result<String, String> {
    let too_big = || {
        format!(
            "{what} is larger than {} MiB: not read past that",
            MAX_BODY >> 20
        )
    };
    if response
        .content_length()
        .is_some_and(|n| n > MAX_BODY as u64)
    {
        return Err(too_big());
    }
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| format!("cannot read {what}: {}", with_causes(&e)))?
    {
        if body.len() + chunk.len() > MAX_BODY {
            return Err(too_big());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(String::from_utf8(body)
        .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    /// Issue 31: a server whose answer never ends is refused at the bound, named, for a
    /// scrape and for a Prometheus query alike; nothing past the bound is held.
    #[tokio::test]
    async fn an_endless_body_is_refused_at_the_bound() {
        let base = frugal_testkit::loopback::endless_body().await;
        let client = reqwest::Client::new();
        let url = format!("{base}/metrics");
        let response = client.get(&url).send().await.unwrap();
        let err = super::bounded_text(response, &format!("{url}'s body"))
            .await
            .unwrap_err();
        assert_eq!(
            err,
            format!("{url}'s body is larger than 16 MiB: not read past that")
        );
        let err = crate::prom_api::fetch(&client, &base, "up", Duration::from_secs(600))
            .await
            .unwrap_err();
        assert_eq!(
            err,
            format!("{base}/api/v1/query's answer is larger than 16 MiB: not read past that")
        );
    }
}
