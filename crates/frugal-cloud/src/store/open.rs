//! Opening a run's checkpoints: a local directory or a cloud's object store, from a URL,
//! the environment and options.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{ObjectStore, RetryConfig};

use super::error::StoreError;
use super::{CheckpointStore, RUNS_DIR};

/// The retry settings that `open_with_options` takes besides the builders' own keys.
const RETRY_KEYS: [&str; 4] = [
    "max_retries",
    "retry_timeout",
    "retry_init_backoff",
    "retry_max_backoff",
];

impl CheckpointStore {
    /// Opens the checkpoints of `run_id` in the store at `url`: a plain path or `file://` URL
    /// (a local directory, created if missing), or `s3://bucket/prefix`, `gs://bucket/prefix`,
    /// `az://container/prefix`. Cloud stores take their settings from the environment
    /// (`AWS_*`, `GOOGLE_*`, `AZURE_*`; e.g. `AWS_ENDPOINT` and `AWS_ALLOW_HTTP` for MinIO).
    pub fn open(url: &str, run_id: &str) -> Result<Self, StoreError> {
        Self::open_with_options(url, run_id, &[])
    }

    /// Like [`open`](Self::open), with builder options (key, value) applied after the
    /// environment: the keys of object_store's builders (`aws_endpoint`, `google_service_account`,
    /// `azure_storage_account_name`, ...), plus `max_retries`, `retry_timeout`,
    /// `retry_init_backoff` and `retry_max_backoff` (durations like `500ms`, `30s`, `2m`) for
    /// the client's retries of each request.
    pub fn open_with_options(
        url: &str,
        run_id: &str,
        options: &[(&str, &str)],
    ) -> Result<Self, StoreError> {
        check_run_id(url, run_id)?;
        let mut retry = RetryConfig::default();
        let mut builder_options = Vec::new();
        for &(key, value) in options {
            if RETRY_KEYS.contains(&key) {
                apply_retry_option(&mut retry, key, value).map_err(|reason| {
                    StoreError::InvalidOption {
                        url: url.to_string(),
                        key: key.to_string(),
                        value: value.to_string(),
                        reason,
                    }
                })?;
            } else {
                builder_options.push((key, value));
            }
        }

        if !url.contains("://") {
            return Self::open_local(url, PathBuf::from(url), run_id, &builder_options);
        }
        let parsed = url::Url::parse(url).map_err(|e| StoreError::InvalidUrl {
            url: url.to_string(),
            reason: e.to_string(),
        })?;
        let scheme = parsed.scheme().to_ascii_lowercase();
        if scheme == "file" {
            let dir = parsed.to_file_path().map_err(|()| StoreError::InvalidUrl {
                url: url.to_string(),
                reason: "a file:// URL must name an absolute local path (no host)".to_string(),
            })?;
            return Self::open_local(url, dir, run_id, &builder_options);
        }
        if !matches!(
            scheme.as_str(),
            "s3" | "s3a" | "gs" | "az" | "azure" | "abfs" | "abfss"
        ) {
            return Err(StoreError::UnknownScheme {
                url: url.to_string(),
                scheme,
            });
        }
        if parsed.host_str().is_none_or(str::is_empty) {
            return Err(StoreError::InvalidUrl {
                url: url.to_string(),
                reason: "no bucket or container after the scheme".to_string(),
            });
        }
        let prefix = Path::from_url_path(parsed.path()).map_err(|e| StoreError::InvalidUrl {
            url: url.to_string(),
            reason: format!("bad prefix: {e}"),
        })?;
        let root_url: Arc<str> = format!("{}://{}", scheme, parsed.authority()).into();
        let bad_option = |key: &str, value: &str, reason: String| StoreError::InvalidOption {
            url: url.to_string(),
            key: key.to_string(),
            value: value.to_string(),
            reason,
        };
        let open_error = |source| StoreError::Open {
            url: url.to_string(),
            source,
        };
        // The same for each cloud: its builder from the environment, the options by the
        // cloud's own key names (an unknown key is an error, not ignored as
        // `object_store::parse_url_opts` does), then the URL and the retry policy.
        macro_rules! build {
            ($builder:ty, $key:ty) => {{
                let mut builder = <$builder>::from_env();
                for &(key, value) in &builder_options {
                    let parsed_key: $key = key
                        .parse()
                        .map_err(|e: object_store::Error| bad_option(key, value, e.to_string()))?;
                    builder = builder.with_config(parsed_key, value);
                }
                let store = builder
                    .with_url(url)
                    .with_retry(retry)
                    .build()
                    .map_err(open_error)?;
                Arc::new(store) as Arc<dyn ObjectStore>
            }};
        }
        let store = match scheme.as_str() {
            "s3" | "s3a" => build!(AmazonS3Builder, AmazonS3ConfigKey),
            "gs" => build!(GoogleCloudStorageBuilder, GoogleConfigKey),
            _ => build!(MicrosoftAzureBuilder, AzureConfigKey),
        };
        let base = prefix.clone().join(RUNS_DIR).join(run_id);
        Ok(Self::new(store, root_url, base, run_id))
    }

    fn open_local(
        url: &str,
        dir: PathBuf,
        run_id: &str,
        builder_options: &[(&str, &str)],
    ) -> Result<Self, StoreError> {
        if let Some(&(key, value)) = builder_options.first() {
            return Err(StoreError::InvalidOption {
                url: url.to_string(),
                key: key.to_string(),
                value: value.to_string(),
                reason: "a local store takes no options".to_string(),
            });
        }
        let run_dir = dir.join(RUNS_DIR).join(run_id);
        std::fs::create_dir_all(&run_dir).map_err(|source| StoreError::LocalStore {
            url: url.to_string(),
            path: run_dir.clone(),
            source,
        })?;
        let local = LocalFileSystem::new_with_prefix(&dir)
            .map_err(|source| StoreError::Open {
                url: url.to_string(),
                source,
            })?
            .with_automatic_cleanup(true)
            .with_fsync(true);
        let canonical = std::fs::canonicalize(&dir).map_err(|source| StoreError::LocalStore {
            url: url.to_string(),
            path: dir.clone(),
            source,
        })?;
        let root_url = url::Url::from_directory_path(&canonical)
            .map(|u| u.as_str().trim_end_matches('/').to_string())
            .unwrap_or_else(|()| format!("file://{}", canonical.display()));
        let base = Path::default().join(RUNS_DIR).join(run_id);
        Ok(Self::new(Arc::new(local), root_url.into(), base, run_id))
    }
}

fn check_run_id(url: &str, run_id: &str) -> Result<(), StoreError> {
    let reason = if run_id.is_empty() {
        Some("empty")
    } else if run_id.starts_with('.') {
        Some("starts with '.'")
    } else if !run_id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        Some("only ASCII letters, digits, '-', '_' and '.' are allowed")
    } else {
        None
    };
    match reason {
        None => Ok(()),
        Some(reason) => Err(StoreError::InvalidRunId {
            url: url.to_string(),
            run_id: run_id.to_string(),
            reason: reason.to_string(),
        }),
    }
}

fn apply_retry_option(retry: &mut RetryConfig, key: &str, value: &str) -> Result<(), String> {
    match key {
        "max_retries" => {
            retry.max_retries = value
                .trim()
                .parse()
                .map_err(|e| format!("not a count: {e}"))?;
        }
        "retry_timeout" => retry.retry_timeout = parse_duration(value)?,
        "retry_init_backoff" => retry.backoff.init_backoff = parse_duration(value)?,
        "retry_max_backoff" => retry.backoff.max_backoff = parse_duration(value)?,
        _ => return Err("unknown retry option".to_string()),
    }
    Ok(())
}

/// `250ms`, `30s`, `2m`, `1h`, or a bare number of seconds.
fn parse_duration(value: &str) -> Result<Duration, String> {
    let value = value.trim();
    let (number, scale) = if let Some(n) = value.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = value.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = value.strip_suffix('m') {
        (n, 60.0)
    } else if let Some(n) = value.strip_suffix('h') {
        (n, 3600.0)
    } else {
        (value, 1.0)
    };
    let number: f64 = number
        .trim()
        .parse()
        .map_err(|_| format!("not a duration (e.g. 500ms, 30s, 2m): {value:?}"))?;
    Duration::try_from_secs_f64(number * scale)
        .map_err(|e| format!("not a duration (e.g. 500ms, 30s, 2m): {value:?}: {e}"))
}

#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#[cfg(test)]
mod tests {
    use super::*;

    const RUN: &str = "run-1";

    #[test]
    fn opening_bad_urls_says_why() {
        let err = CheckpointStore::open("ftp://x/y", RUN).unwrap_err();
        assert!(matches!(err, StoreError::UnknownScheme { .. }), "{err}");
        assert!(err.to_string().contains("\"ftp\""), "{err}");

        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("a-file");
        std::fs::write(&file, b"x").unwrap();
        let under_file = file.join("store");
        let err = CheckpointStore::open(under_file.to_str().unwrap(), RUN).unwrap_err();
        assert!(matches!(err, StoreError::LocalStore { .. }), "{err}");
        assert!(err.to_string().contains("a-file/store"), "{err}");

        let err = CheckpointStore::open(tmp.path().to_str().unwrap(), "../up").unwrap_err();
        assert!(matches!(err, StoreError::InvalidRunId { .. }), "{err}");
        let err = CheckpointStore::open("s3:///prefix", RUN).unwrap_err();
        assert!(matches!(err, StoreError::InvalidUrl { .. }), "{err}");
        let err = CheckpointStore::open_with_options("s3://b/p", RUN, &[("no_such_key", "1")])
            .unwrap_err();
        assert!(err.to_string().contains("no_such_key"), "{err}");
        let err = CheckpointStore::open_with_options("s3://b/p", RUN, &[("max_retries", "x")])
            .unwrap_err();
        assert!(matches!(err, StoreError::InvalidOption { .. }), "{err}");
        let err = CheckpointStore::open_with_options(
            tmp.path().to_str().unwrap(),
            RUN,
            &[("aws_region", "x")],
        )
        .unwrap_err();
        assert!(matches!(err, StoreError::InvalidOption { .. }), "{err}");
    }

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("3s").unwrap(), Duration::from_secs(3));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("-1s").is_err());
    }
}
