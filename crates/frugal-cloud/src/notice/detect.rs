//! Which cloud this machine is on: the three metadata services probed at once, and the
//! source of notices a command watches.

use std::time::Duration;

use tracing::{debug, info, warn};

use super::gcp::GCP_ROOT_PATH;
use super::{
    AWS_BASE, AZURE_BASE, Aws, Azure, Cloud, DEFAULT_TIMEOUT, GCP_BASE, GCP_DEFAULT_WAIT, Gcp,
    Notice, NoticeError, NoticeSource,
};

/// How long [`choose`] and [`crate::machine::instance_type`] wait for the metadata services,
/// all three together: a machine off the clouds answers within it.
pub const DETECT_TIMEOUT: Duration = Duration::from_secs(1);

/// Which notices a command watches, as its user chose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice {
    /// None: only a signal announces a preemption.
    None,
    /// The cloud whose metadata service answers, on spot capacity only.
    Auto,
    Aws,
    Gcp,
    Azure,
}

/// The notices to watch: `Auto` probes the metadata services only on `spot` capacity;
/// each at `metadata_url` (a mock's, a proxy's) or the cloud's own. A GCP source long-polls
/// for up to `poll`.
pub async fn choose(
    choice: Choice,
    spot: bool,
    metadata_url: Option<&str>,
    poll: Duration,
) -> Result<Option<AnySource>, NoticeError> {
    let bases = Bases::at(metadata_url);
    let source = match choice {
        Choice::None => None,
        Choice::Auto if !spot => None,
        Choice::Auto => {
            let found = detect(&bases, DETECT_TIMEOUT).await;
            if found.is_none() {
                warn!(
                    "no cloud metadata endpoint answers: only SIGTERM will announce a preemption"
                );
            }
            found
        }
        Choice::Aws => Some(AnySource::Aws(Aws::new(&bases.aws)?)),
        Choice::Gcp => Some(AnySource::Gcp(Gcp::new(&bases.gcp, poll)?)),
        Choice::Azure => Some(AnySource::Azure(Azure::new(&bases.azure)?)),
    };
    if let Some(s) = &source {
        info!("watching {} preemption notices", s.cloud());
    }
    Ok(source)
}

/// One of the clouds' sources, chosen at run time (e.g. by [`detect`]).
#[derive(Debug)]
pub enum AnySource {
    Aws(Aws),
    Gcp(Gcp),
    Azure(Azure),
}

impl AnySource {
    /// Sets the GCP long-poll wait (the supervisor's poll period); the other
    /// clouds answer at once and ignore it.
    pub fn set_poll_wait(&mut self, wait: Duration) {
        if let AnySource::Gcp(g) = self {
            g.set_wait(wait);
        }
    }
}

impl From<Aws> for AnySource {
    fn from(s: Aws) -> Self {
        AnySource::Aws(s)
    }
}

impl From<Gcp> for AnySource {
    fn from(s: Gcp) -> Self {
        AnySource::Gcp(s)
    }
}

impl From<Azure> for AnySource {
    fn from(s: Azure) -> Self {
        AnySource::Azure(s)
    }
}

impl NoticeSource for AnySource {
    fn cloud(&self) -> Cloud {
        match self {
            AnySource::Aws(s) => s.cloud(),
            AnySource::Gcp(s) => s.cloud(),
            AnySource::Azure(s) => s.cloud(),
        }
    }

    async fn check(&mut self) -> Result<Option<Notice>, NoticeError> {
        match self {
            AnySource::Aws(s) => s.check().await,
            AnySource::Gcp(s) => s.check().await,
            AnySource::Azure(s) => s.check().await,
        }
    }

    async fn acknowledge(&mut self, notice: &Notice) -> Result<(), NoticeError> {
        match self {
            AnySource::Aws(s) => s.acknowledge(notice).await,
            AnySource::Gcp(s) => s.acknowledge(notice).await,
            AnySource::Azure(s) => s.acknowledge(notice).await,
        }
    }
}

/// Metadata base URLs that [`detect`] probes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bases {
    pub aws: String,
    pub gcp: String,
    pub azure: String,
}

impl Default for Bases {
    /// The real endpoints.
    fn default() -> Self {
        Self {
            aws: AWS_BASE.to_string(),
            gcp: GCP_BASE.to_string(),
            azure: AZURE_BASE.to_string(),
        }
    }
}

impl Bases {
    /// Every cloud's service at `url` when one is given, else each at its own.
    pub fn at(url: Option<&str>) -> Bases {
        match url {
            Some(url) => Bases {
                aws: url.to_owned(),
                gcp: url.to_owned(),
                azure: url.to_owned(),
            },
            None => Bases::default(),
        }
    }
}

/// Probes the three metadata services concurrently, each request limited to
/// `timeout`, and returns the source of the first that answers like its
/// cloud: AWS when the IMDSv2 token PUT succeeds, GCP when
/// `/computeMetadata/v1/` answers with `Metadata-Flavor: Google`, Azure when
/// Scheduled Events answers JSON with a `DocumentIncarnation`. `None` when
/// none does within `timeout`. The returned source has the default request
/// limit; a GCP one the wait [`GCP_DEFAULT_WAIT`] (see
/// [`AnySource::set_poll_wait`]).
pub async fn detect(bases: &Bases, timeout: Duration) -> Option<AnySource> {
    let mut probes = tokio::task::JoinSet::new();
    let aws = bases.aws.clone();
    probes.spawn(async move { probe_aws(&aws, timeout).await });
    let gcp = bases.gcp.clone();
    probes.spawn(async move { probe_gcp(&gcp, timeout).await });
    let azure = bases.azure.clone();
    probes.spawn(async move { probe_azure(&azure, timeout).await });
    let race = async {
        while let Some(done) = probes.join_next().await {
            match done {
                Ok(Ok(source)) => {
                    info!(cloud = %source.cloud(), "detected the cloud's metadata service");
                    return Some(source);
                }
                Ok(Err(e)) => debug!(error = %e, "metadata probe failed"),
                Err(e) => debug!(error = %e, "metadata probe task failed"),
            }
        }
        None
    };
    // Dropping the JoinSet aborts the probes still running.
    tokio::time::timeout(timeout, race).await.ok().flatten()
}

async fn probe_aws(base: &str, timeout: Duration) -> Result<AnySource, NoticeError> {
    let mut aws = Aws::new(base)?.with_timeout(timeout);
    aws.token().await?;
    Ok(AnySource::Aws(aws.with_timeout(DEFAULT_TIMEOUT)))
}

async fn probe_gcp(base: &str, timeout: Duration) -> Result<AnySource, NoticeError> {
    let gcp = Gcp::new(base, GCP_DEFAULT_WAIT)?;
    let url = format!("{}{GCP_ROOT_PATH}", gcp.base);
    gcp.get_google(&url, timeout).await?;
    Ok(AnySource::Gcp(gcp))
}

async fn probe_azure(base: &str, timeout: Duration) -> Result<AnySource, NoticeError> {
    let azure = Azure::new(base)?.with_timeout(timeout);
    azure.document().await?;
    Ok(AnySource::Azure(azure.with_timeout(DEFAULT_TIMEOUT)))
}

#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#[cfg(test)]
mod tests {
    use super::*;

    use std::time::Instant;

    use frugal_testkit::loopback::{closed_port, silent_port};

    use super::super::GCP_BASE;
    use super::super::aws::tests::aws_mock;
    use super::super::azure::tests::azure_mock;
    use super::super::gcp::tests::gcp_mock;

    // -- detect, errors -----------------------------------------------------

    fn same(base: &str) -> Bases {
        Bases {
            aws: base.to_string(),
            gcp: base.to_string(),
            azure: base.to_string(),
        }
    }

    #[tokio::test]
    async fn detect_picks_the_answering_cloud() {
        let t = Duration::from_secs(2);
        let (aws, _) = aws_mock().await;
        let (gcp, _) = gcp_mock().await;
        let (azure, _) = azure_mock().await;

        // Each mock answers only its own cloud's probe.
        let mut found = detect(&same(&aws), t).await.unwrap();
        assert!(matches!(found, AnySource::Aws(_)), "{found:?}");
        assert_eq!(
            found.check().await.unwrap(),
            None,
            "the detected source works"
        );
        let found = detect(&same(&gcp), t).await.unwrap();
        assert!(matches!(found, AnySource::Gcp(_)), "{found:?}");
        let mut found = detect(&same(&azure), t).await.unwrap();
        assert!(matches!(found, AnySource::Azure(_)), "{found:?}");
        assert_eq!(found.check().await.unwrap(), None);

        // The answering one wins over refusing and silent endpoints.
        let bases = Bases {
            aws: closed_port().await,
            gcp,
            azure: silent_port().await,
        };
        let started = Instant::now();
        let mut found = detect(&bases, t).await.unwrap();
        assert!(started.elapsed() < Duration::from_secs(1));
        assert_eq!(found.cloud(), Cloud::Gcp);
        found.set_poll_wait(Duration::from_secs(1));
        assert_eq!(found.check().await.unwrap(), None);
    }

    #[tokio::test]
    async fn detect_none_within_the_timeout() {
        let timeout = Duration::from_millis(300);
        let started = Instant::now();
        assert!(detect(&same(&closed_port().await), timeout).await.is_none());
        let bases = Bases {
            aws: silent_port().await,
            gcp: silent_port().await,
            azure: closed_port().await,
        };
        assert!(detect(&bases, timeout).await.is_none());
        let took = started.elapsed();
        assert!(took < Duration::from_millis(1_500), "{took:?}");
    }

    #[tokio::test]
    async fn unreachable_endpoints_are_clear_errors() {
        let base = closed_port().await;
        let checks = [
            Aws::new(&base).unwrap().check().await.unwrap_err(),
            Gcp::new(&base, Duration::from_secs(1))
                .unwrap()
                .check()
                .await
                .unwrap_err(),
            Azure::new(&base).unwrap().check().await.unwrap_err(),
        ];
        for err in checks {
            let msg = err.to_string();
            assert!(matches!(err, NoticeError::Request { .. }), "{msg}");
            assert!(msg.contains(&base), "{msg}");
            assert!(msg.contains("cannot connect"), "{msg}");
        }

        let silent = silent_port().await;
        let err = Aws::new(&silent)
            .unwrap()
            .with_timeout(Duration::from_millis(200))
            .check()
            .await
            .unwrap_err();
        assert!(err.to_string().contains("timed out"), "{err}");
    }

    #[test]
    fn bad_base_urls_are_rejected() {
        for bad in [
            "",
            "169.254.169.254",
            "https://169.254.169.254",
            "http://x/?a=1",
            "ftp://h",
        ] {
            let err = Aws::new(bad).unwrap_err();
            assert!(matches!(err, NoticeError::BadUrl { .. }), "{bad:?}: {err}");
        }
        assert!(Gcp::new("http://metadata.google.internal/", Duration::ZERO).is_ok());
        assert!(Azure::new(AZURE_BASE).is_ok());
        assert_eq!(Bases::default().gcp, GCP_BASE);
    }

    #[tokio::test]
    async fn the_choice_names_the_source_and_auto_asks_only_on_spot() {
        let (aws, _) = aws_mock().await;
        let poll = Duration::from_secs(1);
        let none = choose(Choice::None, true, Some(&aws), poll).await.unwrap();
        assert!(none.is_none());
        let on_demand = choose(Choice::Auto, false, Some(&aws), poll).await;
        assert!(on_demand.unwrap().is_none(), "auto asks on spot only");
        let found = choose(Choice::Auto, true, Some(&aws), poll).await.unwrap();
        assert_eq!(found.map(|s| s.cloud()), Some(Cloud::Aws));
        let named = choose(Choice::Azure, false, Some(&aws), poll)
            .await
            .unwrap();
        assert_eq!(named.map(|s| s.cloud()), Some(Cloud::Azure));
        let bad = choose(Choice::Gcp, false, Some("ftp://h"), poll).await;
        assert!(matches!(bad, Err(NoticeError::BadUrl { .. })));
        assert_eq!(Bases::at(None), Bases::default());
        assert_eq!(Bases::at(Some(&aws)).gcp, aws);
    }
}
