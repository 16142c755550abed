//! What this machine is: its instance type, as the cloud's metadata service names it (the
//! endpoints [`crate::notice`] speaks), and its size, which [`crate::price`] prices when
//! nobody said what it costs.
//!
//! * AWS: IMDSv2, `GET /latest/meta-data/instance-type` with a session token.
//! * GCP: `GET /computeMetadata/v1/instance/machine-type` (`projects/N/machineTypes/TYPE`).
//! * Azure: `GET /metadata/instance/compute/vmSize?api-version=..&format=text`.

use std::time::Duration;

use tracing::debug;

use crate::notice::{Aws, Azure, Bases, Cloud, Gcp, NoticeError};

const AWS_INSTANCE_TYPE_PATH: &str = "/latest/meta-data/instance-type";
const GCP_MACHINE_TYPE_PATH: &str = "/computeMetadata/v1/instance/machine-type";
const AZURE_VM_SIZE_PATH: &str = "/metadata/instance/compute/vmSize";

/// An instance type a metadata service named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Detected {
    pub cloud: Cloud,
    pub instance_type: String,
}

/// How big this machine is, as the catalog counts: vCPUs and GiB of memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size {
    pub vcpus: u32,
    pub memory_gib: u32,
}

impl Size {
    /// The CPUs this process may use and the machine's memory (whole GiB, rounded down:
    /// the kernel keeps some of a machine's nominal memory, so a "64 GiB" one shows ~62.8).
    pub fn this_machine() -> Size {
        let vcpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let memory_gib = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| mem_total_kib(&m))
            .map_or(0, |kib| kib >> 20);
        Size {
            vcpus: u32::try_from(vcpus).unwrap_or(u32::MAX),
            memory_gib: u32::try_from(memory_gib).unwrap_or(u32::MAX),
        }
    }
}

fn mem_total_kib(meminfo: &str) -> Option<u64> {
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()
}

/// Asks the three metadata services at once for this machine's instance type; the first
/// to answer wins. `None` when none does within `timeout`.
pub async fn instance_type(bases: &Bases, timeout: Duration) -> Option<Detected> {
    let mut asks = tokio::task::JoinSet::new();
    let aws = bases.aws.clone();
    asks.spawn(async move { aws_type(&aws, timeout).await });
    let gcp = bases.gcp.clone();
    asks.spawn(async move { gcp_type(&gcp, timeout).await });
    let azure = bases.azure.clone();
    asks.spawn(async move { azure_type(&azure, timeout).await });
    let race = async {
        while let Some(done) = asks.join_next().await {
            match done {
                Ok(Ok(found)) => return Some(found),
                Ok(Err(e)) => debug!(error = %e, "no instance type from this metadata service"),
                Err(e) => debug!(error = %e, "instance type task failed"),
            }
        }
        None
    };
    // Dropping the JoinSet aborts the asks still running.
    tokio::time::timeout(timeout, race).await.ok().flatten()
}

async fn aws_type(base: &str, timeout: Duration) -> Result<Detected, NoticeError> {
    let mut aws = Aws::new(base)?.with_timeout(timeout);
    let (url, body) = aws.get(AWS_INSTANCE_TYPE_PATH).await?;
    let found = body.as_deref().map(str::trim).unwrap_or_default();
    one_word(Cloud::Aws, &url, found)
}

async fn gcp_type(base: &str, timeout: Duration) -> Result<Detected, NoticeError> {
    let gcp = Gcp::new(base, Duration::ZERO)?;
    let url = format!("{}{GCP_MACHINE_TYPE_PATH}", gcp.base);
    let reply = gcp.get_google(&url, timeout).await?;
    // projects/123456/machineTypes/n1-standard-8
    let full = reply.body.trim();
    one_word(Cloud::Gcp, &url, full.rsplit('/').next().unwrap_or(full))
}

async fn azure_type(base: &str, timeout: Duration) -> Result<Detected, NoticeError> {
    let azure = Azure::new(base)?.with_timeout(timeout);
    let size = azure.instance_text(AZURE_VM_SIZE_PATH).await?;
    one_word(Cloud::Azure, AZURE_VM_SIZE_PATH, &size)
}

fn one_word(cloud: Cloud, url: &str, word: &str) -> Result<Detected, NoticeError> {
    if word.is_empty() || word.contains(char::is_whitespace) {
        return Err(NoticeError::NotMetadata {
            cloud,
            url: url.to_string(),
            reason: format!("{word:?} is not an instance type"),
        });
    }
    Ok(Detected {
        cloud,
        instance_type: word.to_string(),
    })
}

#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    use std::time::Instant;

    use axum::Router;
    use axum::extract::Query;
    use axum::http::{HeaderMap, StatusCode};
    use axum::response::IntoResponse;
    use axum::routing::{get, put};

    use frugal_testkit::loopback::{closed_port, serve, silent_port};

    use crate::notice::DETECT_TIMEOUT;

    type Params = Query<std::collections::HashMap<String, String>>;

    fn has(headers: &HeaderMap, name: &str, value: &str) -> bool {
        headers.get(name).is_some_and(|v| v == value)
    }

    /// A metadata server for `cloud` saying this is `instance_type`.
    pub(crate) async fn mock(cloud: Cloud, instance_type: &'static str) -> String {
        let router = match cloud {
            Cloud::Aws => Router::new()
                .route(
                    "/latest/api/token",
                    put(|h: HeaderMap| async move {
                        if h.contains_key("x-aws-ec2-metadata-token-ttl-seconds") {
                            "tok".into_response()
                        } else {
                            StatusCode::BAD_REQUEST.into_response()
                        }
                    }),
                )
                .route(
                    AWS_INSTANCE_TYPE_PATH,
                    get(move |h: HeaderMap| async move {
                        if has(&h, "x-aws-ec2-metadata-token", "tok") {
                            instance_type.into_response()
                        } else {
                            StatusCode::UNAUTHORIZED.into_response()
                        }
                    }),
                ),
            Cloud::Gcp => Router::new().route(
                GCP_MACHINE_TYPE_PATH,
                get(move |h: HeaderMap| async move {
                    if !has(&h, "metadata-flavor", "Google") {
                        return StatusCode::FORBIDDEN.into_response();
                    }
                    let body = format!("projects/123456/machineTypes/{instance_type}");
                    ([("metadata-flavor", "Google")], body).into_response()
                }),
            ),
            Cloud::Azure => Router::new().route(
                AZURE_VM_SIZE_PATH,
                get(move |h: HeaderMap, Query(q): Params| async move {
                    let text = q.get("format").is_some_and(|f| f == "text");
                    if !has(&h, "metadata", "true") || !q.contains_key("api-version") || !text {
                        return StatusCode::BAD_REQUEST.into_response();
                    }
                    instance_type.into_response()
                }),
            ),
        };
        serve(router).await
    }

    #[tokio::test]
    async fn each_clouds_metadata_names_the_instance_type() {
        let t = Duration::from_secs(2);
        for (cloud, name) in [
            (Cloud::Aws, "g5.xlarge"),
            (Cloud::Gcp, "a2-highgpu-1g"),
            (Cloud::Azure, "Standard_NC6s_v3"),
        ] {
            let base = mock(cloud, name).await;
            // The other two refuse connections or never answer.
            let (closed, silent) = (closed_port().await, silent_port().await);
            let bases = match cloud {
                Cloud::Aws => Bases {
                    aws: base,
                    gcp: closed,
                    azure: silent,
                },
                Cloud::Gcp => Bases {
                    aws: silent,
                    gcp: base,
                    azure: closed,
                },
                Cloud::Azure => Bases {
                    aws: closed,
                    gcp: silent,
                    azure: base,
                },
            };
            let found = instance_type(&bases, t).await;
            assert_eq!(
                found,
                Some(Detected {
                    cloud,
                    instance_type: name.to_string()
                })
            );
        }
    }

    #[tokio::test]
    async fn off_the_clouds_it_answers_within_the_timeout() {
        let bases = Bases {
            aws: silent_port().await,
            gcp: silent_port().await,
            azure: closed_port().await,
        };
        let started = Instant::now();
        assert_eq!(instance_type(&bases, DETECT_TIMEOUT).await, None);
        let took = started.elapsed();
        assert!(
            took < DETECT_TIMEOUT + Duration::from_millis(500),
            "{took:?}"
        );
        // Another server on the port is not a metadata service.
        let other = serve(Router::new().route("/", get(|| async { "hello" }))).await;
        let bases = Bases {
            aws: other.clone(),
            gcp: other.clone(),
            azure: other,
        };
        assert_eq!(instance_type(&bases, DETECT_TIMEOUT).await, None);
    }

    #[test]
    fn reads_this_machines_size() {
        assert_eq!(
            mem_total_kib("MemTotal:       65843412 kB\nMemFree: 1 kB\n"),
            Some(65_843_412)
        );
        assert_eq!(mem_total_kib("MemFree: 1 kB\n"), None);
        let size = Size::this_machine();
        assert!(size.vcpus >= 1 && size.memory_gib >= 1, "{size:?}");
    }
}
